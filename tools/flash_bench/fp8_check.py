"""One GPU run for triton_flash's FP8 (e4m3) Gluon forward: right on many shapes, and how fast its
call is beside the Triton FP8 forward and the bf16 forwards (issue 42, goal 3; NOTES.md v20, v20.1).

Usage, on the Hopper machine after tools/install_offline.sh, from the repository root (about two
minutes on an H200; run it under ``timeout``: a configuration that hangs hangs the run):

    python3 tools/flash_bench/fp8_check.py --out DIR [--configs n128s3-eager,n128s2-eager,...]
        [--skip-correctness] [--skip-timing]

1. correctness: every shape of ``gluon_check.CORRECTNESS_SHAPES`` (odd lengths, Nq != Nk both
   ways, GQA and MQA, one row, one key, 16k) at d64 and d128, causal and not, in e4m3 with the
   harness's FP8 inputs (a descale per batch and kv head), judged by the harness itself
   (``pytest_attnkit.worker.correctness.run_correctness``, FlashAttention-3's FP8 rule), through
   the Gluon FP8 forward in each configuration of ``--configs``. Each case also says whether the
   Gluon kernel took it (a call the Gluon path refuses goes to the Triton FP8 kernel and would
   pass without testing it); then a negative q descale, which the harness's inputs never have,
   against the float64 oracle within 2x the Triton FP8 kernel's error.
2. timing: the speed suite's FP8 shapes (16k tokens x 2048, d128 and d64, N 4k and 16k), causal
   and not: each FP8 call timed as the speed suite times it
   (``pytest_attnkit.worker.speed.measure_speed``: its input sets in rotation, L2 flushed and the
   stream held before each call, so the host's launch time is not in the figure; median), for the
   Gluon FP8 forward in each configuration and the Triton FP8 forward; the Gluon bf16 forward on
   the dequantized values and cuDNN's bf16 by the same timer on one input set; then, for the
   first configuration, the CUDA time of each kernel one call launches (torch.profiler), so that
   a copy outside the attention kernel shows.

Writes DIR/fp8_check.json and DIR/fp8_check.md; exit status 1 when a case failed or the Gluon
kernel took none of a configuration's cases.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

#: Configurations tried by default: two consumers and three, at d64 and d128 (the softmax sets the
#: pace: on an H200 three consumers ran 1.16-1.33x two at 16k; NOTES.md, v20.5, where
#: gluon_forward.fp8_config took three except causal under 16k keys). At d128 FP8's three consumers fit 160
#: registers, as bf16's do not (P lives in shared memory); n128s2-eager-c3-r160 takes 164 KB of
#: shared memory where s3 takes 197 KB. Others that compile for sm_90a without spills:
#: n128s2-eager, n64s3-eager (``--configs``).
DEFAULT_CONFIGS = "n128s3-eager,n128s3-eager-c3-r160,n128s2-eager-c3-r160"
#: (batch, heads, N, head dim): the speed suite's FP8 shapes (pytest_attnkit.cases.speed_cases).
TIMING_SHAPES = ((1, 16, 16384, 128), (4, 16, 4096, 128), (1, 32, 16384, 64), (4, 32, 4096, 64))
#: The seed of the timed inputs.
SEED = 1234


def _fits(gf, config, head_dim: int) -> bool:
    """Whether the configuration's registers fit, and its FP8 tiles fit shared memory
    (``gluon_forward.fp8_shared_bytes``)."""
    if not config.eager or gf.register_reason(config) is not None:
        return False  # three consumers fit at d128 too: P lives in shared memory (compiled without spills)
    return gf.fp8_shared_bytes(config, head_dim) <= gf.SHARED_LIMIT


def _fitting(gf, configs: list[str], head_dim: int):
    """(name, Config) of each configuration that can run at this head dim (:func:`_fits`)."""
    for text in configs:
        config = gf.Config.parse(text)
        if _fits(gf, config, head_dim):
            yield text, config


class GluonCalls:
    """Counts the calls the Gluon FP8 forward takes, and sets the configuration it launches."""

    def __init__(self, gf) -> None:
        self.gf, self.count, self.config = gf, 0, None
        original = gf.flash_fwd_fp8

        def counted(q, k, v_t, causal, scale, descales=(None, None, None), config=None):
            self.count += 1
            return original(q, k, v_t, causal, scale, descales, self.config if config is None else config)

        gf.flash_fwd_fp8 = counted


def correctness(impl, gf, calls: GluonCalls, configs: list[str]) -> list[dict]:
    from gluon_check import CORRECTNESS_SHAPES

    from pytest_attnkit.contract import Case
    from pytest_attnkit.worker.correctness import run_correctness

    results = []
    for text in configs:
        config = gf.Config.parse(text)
        calls.config = config
        for head_dim in (64, 128):
            if not _fits(gf, config, head_dim):
                continue
            for causal in (False, True):
                for seed, (batch, heads_q, heads_kv, n_q, n_k) in enumerate(CORRECTNESS_SHAPES):
                    case = Case(batch, heads_q, heads_kv, n_q, n_k, head_dim, "float8_e4m3fn", causal=causal)
                    before = calls.count
                    started = time.perf_counter()
                    reply = run_correctness(impl, case, device="cuda", base_seed=seed, trials=2, backward=False)
                    took = time.perf_counter() - started
                    _keep(results, {"config": text, "case": case.id, "status": reply.status.value, "ok": reply.ok,
                                    "gluon_calls": calls.count - before, "seconds": round(took, 2),
                                    "message": "" if reply.ok else reply.message[:600]},
                          f"{took:.1f} s" + ("" if reply.ok else " " + reply.message[:200]))
    calls.config = None
    return results


def _keep(results: list[dict], record: dict, detail: str) -> None:
    """Add one correctness record and print its line."""
    results.append(record)
    print(f"  {'ok  ' if record['ok'] else 'FAIL'} [{record['config']}] {record['case']}: "
          f"gluon calls {record['gluon_calls']}, {detail}", flush=True)


def signs(impl, gf, calls: GluonCalls, configs: list[str]) -> list[dict]:
    """A negative q descale (the scores' scale negative: the Gluon kernel's whole tiles then take the
    raw scores' minimum, NOTES.md v20.2): each configuration's output against the float64 oracle,
    within 2x the Triton FP8 kernel's error (FlashAttention-3's FP8 rule with that kernel as the
    plain reference). The harness's inputs have positive descales only."""
    import torch

    from pytest_attnkit.contract import Case
    from pytest_attnkit.oracle import attention_math
    from pytest_attnkit.worker.calls import call_implementation
    from pytest_attnkit.worker.inputs import dequantized, make_inputs
    from pytest_attnkit.worker.tolerance import compare

    results = []
    for head_dim in (64, 128):
        for causal in (False, True):
            case = Case(1, 2, 2, 1000, 1000, head_dim, "float8_e4m3fn", causal=causal)
            inputs = make_inputs(case, "cuda", 7)
            inputs.q_descale = -inputs.q_descale
            q, k, v = (t.double() for t in dequantized(case, inputs))
            oracle = attention_math(q, k, v, causal=causal)
            os.environ["ATTNKIT_TRITON_FLASH_GLUON_FP8"] = "0"
            plain = call_implementation(impl, case, inputs.q, inputs.k, inputs.v, inputs)
            os.environ["ATTNKIT_TRITON_FLASH_GLUON_FP8"] = "1"
            for text, config in _fitting(gf, configs, head_dim):
                calls.config, before = config, calls.count
                out = call_implementation(impl, case, inputs.q, inputs.k, inputs.v, inputs)
                verdict = compare("out", out, oracle, plain, dtype=torch.bfloat16, factor=2.0, rule="fp8")
                _keep(results, {"config": text, "case": case.id + " (q descale < 0)", "ok": verdict.passed,
                                "gluon_calls": calls.count - before, "max_error": verdict.max_error,
                                "allowed": verdict.allowed},
                      f"error {verdict.max_error:.2e}, allowed {verdict.allowed:.2e}")
            calls.config = None
    return results


def timing(impl, gf, calls: GluonCalls, configs: list[str]) -> list[dict]:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    from pytest_attnkit.contract import Case
    from versions import kernel_times

    from pytest_attnkit.counts import flop_count
    from pytest_attnkit.worker.calls import call_implementation
    from pytest_attnkit.worker.inputs import dequantized, make_inputs
    from pytest_attnkit.worker.speed import measure_speed
    from pytest_attnkit.worker.timer import time_call

    def bench(fn) -> float:
        """A call that is not a harness case (bf16 on the dequantized values, cuDNN): the harness's
        timer on one input set."""
        return time_call(fn, "cuda", budget_ms=400.0).median_ms

    def bench_case(case) -> float:
        """The FP8 call as the speed suite times it (``measure_speed``: its input sets in rotation,
        L2 flushed, the stream held), not triton's do_bench: on an H200 (session 10) do_bench put the
        Triton FP8 call 6-10% below what the speed suite timed, and the Gluon one level with it, and
        a default chosen on its figures was slower in the harness (NOTES.md, v20.4)."""
        return measure_speed(impl, case, "forward", device="cuda", seed=SEED, budget_ms=400.0)["timing"]["median_ms"]

    rows = []
    for batch, heads, n, head_dim in TIMING_SHAPES:
        for causal in (False, True):
            case = Case(batch, heads, heads, n, n, head_dim, "float8_e4m3fn", causal=causal)
            inputs = make_inputs(case, "cuda", SEED)
            # The harness's call; which FP8 path it takes is the environment's and calls.config's.
            call = lambda: call_implementation(impl, case, inputs.q, inputs.k, inputs.v, inputs)  # noqa: E731
            flops = flop_count(case, "forward")
            row = {"case": case.id, "flops": flops, "ms": {}, "gluon_took": {}}
            os.environ["ATTNKIT_TRITON_FLASH_GLUON_FP8"] = "1"
            for text, config in _fitting(gf, configs, head_dim):
                calls.config, before = config, calls.count
                try:
                    call()
                    row["gluon_took"][text] = calls.count > before
                    row["ms"][f"gluon fp8 {text}"] = bench_case(case)
                except Exception as error:  # one configuration that fails must not lose the others
                    row.setdefault("errors", {})[text] = f"{type(error).__name__}: {str(error)[:300]}"
            calls.config = None
            os.environ["ATTNKIT_TRITON_FLASH_GLUON_FP8"] = "0"
            row["ms"]["triton fp8"] = bench_case(case)
            # bf16 on the dequantized values (each tensor times its descale per batch and kv head).
            q, k, v = (t.to(torch.bfloat16) for t in dequantized(case, inputs))
            row["ms"]["gluon bf16"] = bench(lambda: impl(q, k, v, causal=causal))
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                row["ms"]["cudnn bf16"] = bench(lambda: sdpa(q, k, v, is_causal=causal))
            row["tflops"] = {name: flops / ms / 1e9 for name, ms in row["ms"].items()}
            if configs:
                os.environ["ATTNKIT_TRITON_FLASH_GLUON_FP8"] = "1"
                calls.config = gf.Config.parse(configs[0])
                call()
                row["kernels_ms"] = kernel_times(call, calls=20, match="")
                calls.config = None
            rows.append(row)
            print(f"  {case.id}: " + ", ".join(f"{name} {value:.0f}" for name, value in row["tflops"].items())
                  + " TFLOP/s", flush=True)
            inputs = q = k = v = None  # this case's tensors go before the next case's are made
            torch.cuda.empty_cache()
    return rows


def report(correct: list[dict], rows: list[dict], configs: list[str], device: str) -> str:
    lines = [f"# FP8 Gluon forward check ({device})", ""]
    if correct:
        failed = [r for r in correct if not r["ok"]]
        untested = [r for r in correct if r["ok"] and not r["gluon_calls"]]
        lines.append(f"## Correctness: {len(correct) - len(failed)} of {len(correct)} cases passed; "
                     f"{len(untested)} passed without the Gluon kernel taking them")
        lines += [f"- FAIL [{r['config']}] {r['case']}: {r.get('message') or r.get('max_error')}"[:400] for r in failed]
        lines.append("")
    if rows:
        names = list(rows[0]["ms"])
        lines.append("## Speed (TFLOP/s of the whole call, the harness's timer: median, L2 flushed, stream held)")
        lines.append("")
        lines.append("| case | " + " | ".join(names) + " | best right gluon fp8 / triton fp8 | / gluon bf16 |")
        lines.append("|---|" + "---|" * (len(names) + 2))
        wrong = {r["config"] for r in correct if not r["ok"]}
        for row in rows:
            t = row["tflops"]
            gluon = [value for name, value in t.items()
                     if name.startswith("gluon fp8") and name.removeprefix("gluon fp8 ") not in wrong]
            best = max(gluon) if gluon else None
            ratios = [f"{best / t[name]:.2f}" if best and name in t else "-" for name in ("triton fp8", "gluon bf16")]
            lines.append(f"| {row['case']} | " + " | ".join(f"{t[name]:.0f}" if name in t else "-" for name in names)
                         + " | " + " | ".join(ratios) + " |")
        lines.append("")
        lines.append(f"Kernels of one call, first configuration ({configs[0] if configs else '-'}; CUDA ms per call):")
        lines.append("")
        for row in rows:
            kernels = ", ".join(f"{name.split('(')[0][:40]} {ms:.3f}" for name, ms in row.get("kernels_ms", {}).items())
            lines.append(f"- {row['case']}: {kernels}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for fp8_check.json and fp8_check.md")
    parser.add_argument("--configs", default=DEFAULT_CONFIGS, help=f"Gluon configurations (default {DEFAULT_CONFIGS})")
    parser.add_argument("--skip-correctness", action="store_true")
    parser.add_argument("--skip-timing", action="store_true")
    args = parser.parse_args()

    import torch

    if not torch.cuda.is_available():
        print("fp8_check needs a CUDA GPU (Hopper)", file=sys.stderr)
        return 4
    from pytest_attnkit import registry
    from pytest_attnkit.implementations.triton_flash import gluon_forward as gf

    configs = [text.strip() for text in args.configs.split(",") if text.strip()]
    for text in configs:
        gf.Config.parse(text)  # a typo fails here
    refs = registry.select(registry.discover(), ["triton_flash"])
    impl = registry.load_implementation(refs[0].name, refs[0].value)
    calls = GluonCalls(gf)
    os.environ["ATTNKIT_TRITON_FLASH_GLUON_FP8"] = "1"
    device = f"{torch.cuda.get_device_name()}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    print(f"fp8_check on {device}; configurations {', '.join(configs)}", flush=True)
    correct = [] if args.skip_correctness else correctness(impl, gf, calls, configs) + signs(impl, gf, calls, configs)
    rows = [] if args.skip_timing else timing(impl, gf, calls, configs)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "fp8_check.json").write_text(json.dumps({"device": device, "configs": configs, "correctness": correct,
                                                    "timing": rows}, indent=1))
    text = report(correct, rows, configs, device)
    (out / "fp8_check.md").write_text(text + "\n")
    print("\n" + text)
    bad = any(not r["ok"] for r in correct) or any(
        correct and not any(r["gluon_calls"] for r in correct if r["config"] == text) for text in configs)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
