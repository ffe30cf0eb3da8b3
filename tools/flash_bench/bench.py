"""triton_flash against torch SDPA's backends, forced one at a time, on one GPU, in one run.

Issue 5's benchmark. Every figure uses the speed suite's own conventions: the timer
(`pytest_attnkit.worker.timer.time_call`: CUDA events, L2 flushed before each call, median), FLOPs
and bytes (`pytest_attnkit.counts`), and the ceilings measured in the same run. Shapes follow
FlashAttention's papers (batch x seqlen = 16k tokens, heads x head_dim = 2048), plus short and odd
lengths, and decode (one query against a KV cache, GQA 32/8, small batch).

Usage (on the GPU machine): python3 tools/flash_bench/bench.py --out DIR [--quick] [--tune] [--fp8]
Writes DIR/bench.json (every measurement, the tuner's records, the environment) and DIR/bench.md
(the tables, with each target and whether it was met), and prints the tables. triton_flash runs its
fixed default tiles; --tune installs the timing tuner (tuner.py beside this file) first, so each
kind of problem times its tile candidates on first use.

--fp8 (the row group "fp8", issue 19) times triton_flash's FP8 e4m3 forward next to its bf16
forward on the same values (the FP8 inputs dequantized to bf16), forward only, at the dense
shapes (d128 and d64, N 4k to 16k, causal and not): ``fp8`` gets V as [B, H, N, D] and pays for
its transposition inside the call, ``fp8 V^T`` gets V with its keys already on the contiguous axis
(the tutorial's layout; a cache kept that way), ``fp8 V in-kernel`` hands the kernel V as given
(head dim contiguous; Triton then stages each V tile through registers instead of pipelining it,
``sm90_compile.py --untransposed-v``), and ``V^T copy`` times the transposition alone. The
target is >= 1.4x the bf16 forward; ``max |fp8 - bf16|`` is the FP8 output's largest difference
from the bf16 output (on the same values).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import torch
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

from pytest_attnkit.contract import Case
from pytest_attnkit.counts import byte_count, flop_count
from pytest_attnkit.implementations.torch_sdpa import sdpa_attention
from pytest_attnkit.implementations.triton_flash import flash_attention
from pytest_attnkit.implementations.triton_flash import launch as triton_flash_launch
from pytest_attnkit.implementations.triton_flash.launch import keys_contiguous
from pytest_attnkit.worker.speed import gpu_state, measure_ceilings
from pytest_attnkit.worker.timer import time_call

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tuner  # noqa: E402

BACKENDS = {"FLASH": SDPBackend.FLASH_ATTENTION, "CUDNN": SDPBackend.CUDNN_ATTENTION,
            "EFFICIENT": SDPBackend.EFFICIENT_ATTENTION}
IMPLS = ("triton_flash", *(f"sdpa_{name}" for name in BACKENDS))
#: The fp8 group's columns: triton_flash in bf16 (on the dequantized values), in FP8 with V as
#: [B, H, N, D], in FP8 with V already transposed (keys contiguous), and in FP8 with V handed to
#: the kernel untransposed (no copy; the kernel's PV operand then goes through registers).
FP8_IMPLS = ("triton_flash_bf16", "triton_flash_fp8", "triton_flash_fp8_vt", "triton_flash_fp8_vin")
FP8_LABELS = {"triton_flash_bf16": "bf16", "triton_flash_fp8": "fp8", "triton_flash_fp8_vt": "fp8 V^T",
              "triton_flash_fp8_vin": "fp8 V in-kernel"}
#: Issue 19's target: the FP8 forward at least this many times the bf16 forward's TFLOP/s.
FP8_TARGET = 1.4


@dataclass(frozen=True)
class Row:
    group: str  # dense, short, odd, decode, fp8
    mode: str
    case: Case

    @property
    def label(self) -> str:
        c = self.case
        shape = f"b{c.batch} h{c.heads_q}/{c.heads_kv} q{c.seqlen_q} k{c.seqlen_k} d{c.head_dim}"
        return f"{shape}{' causal' if c.causal else ''} {c.dtype}"


def plan(quick: bool) -> list[Row]:
    rows: list[Row] = []
    dtypes = ("bfloat16",) if quick else ("bfloat16", "float16")

    def fa_case(n: int, d: int, causal: bool, dtype: str) -> Case:
        return Case(max(1, 16384 // n), 2048 // d, 2048 // d, n, n, d, dtype, causal=causal)

    for dtype in dtypes:
        for d in (128, 64):
            for n in ((4096, 16384) if quick else (4096, 8192, 16384)):
                for causal in (False, True):
                    rows += [Row("dense", mode, fa_case(n, d, causal, dtype)) for mode in ("forward", "backward")]
    for d in (128, 64):
        for n in (512, 1024):
            for causal in (False, True):
                rows += [Row("short", mode, fa_case(n, d, causal, "bfloat16")) for mode in ("forward", "backward")]
    for n in (1000, 3001):
        for causal in (False, True):
            rows += [Row("odd", mode, fa_case(n, 128, causal, "bfloat16")) for mode in ("forward", "backward")]
    for dtype in dtypes:
        for batch in (1, 4):
            for n in (4096, 16384, 32768, 131072):
                rows.append(Row("decode", "forward", Case(batch, 32, 8, 1, n, 128, dtype)))
    for d in (128, 64):
        for n in ((4096, 16384) if quick else (4096, 8192, 16384)):
            for causal in (False, True):
                rows.append(Row("fp8", "forward", fa_case(n, d, causal, "float8_e4m3fn")))
    return rows


def make_inputs(case: Case, seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    dtype = getattr(torch, case.dtype)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device="cuda", dtype=dtype, generator=gen)

    q = randn(case.batch, case.heads_q, case.seqlen_q, case.head_dim)
    k = randn(case.batch, case.heads_kv, case.seqlen_k, case.head_dim)
    v = randn(case.batch, case.heads_kv, case.seqlen_k, case.head_dim)
    return q, k, v, randn(*q.shape)


def attention_fn(impl: str) -> Callable[..., torch.Tensor]:
    if impl == "triton_flash":
        return flash_attention
    backend = BACKENDS[impl.removeprefix("sdpa_")]

    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool) -> torch.Tensor:
        with sdpa_kernel([backend]):
            return sdpa_attention(q, k, v, causal=causal)

    return run


def measure(impl: str, row: Row, inputs: tuple[torch.Tensor, ...], budget_ms: float) -> dict[str, Any]:
    fn = attention_fn(impl)
    q, k, v, dout = inputs
    case = row.case
    backward = row.mode == "backward"
    q, k, v = (t.detach().requires_grad_(backward) for t in (q, k, v))
    torch.cuda.synchronize()
    started = time.perf_counter()
    if backward:
        out = fn(q, k, v, causal=case.causal)

        def call() -> Any:
            return torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    else:
        def call() -> Any:
            with torch.no_grad():
                return fn(q, k, v, causal=case.causal)
    result = call()  # the first call: compilation and tuning, where the implementation has them
    torch.cuda.synchronize()
    first_call_s = time.perf_counter() - started
    timing = time_call(call, "cuda", budget_ms=budget_ms, min_samples=10, max_samples=60, warmup=2)
    ms = timing.median_ms
    entry = {"impl": impl, "group": row.group, "mode": row.mode, "case": row.label, "ms": ms,
             "iqr_ms": timing.iqr_ms, "samples": len(timing.samples_ms), "first_call_s": first_call_s,
             "tflops": flop_count(case, row.mode) / (ms * 1e-3) / 1e12,
             "gbps": byte_count(case, row.mode) / (ms * 1e-3) / 1e9}
    entry["output"] = result if not backward else None
    return entry


def fp8_matmul_tflops(size: int = 8192) -> float | None:
    """The e4m3 matmul ceiling, measured like the bf16 one (``measure_ceilings``): torch's FP8 GEMM
    (``torch._scaled_mm``, per-tensor scales, fast accumulation as the kernel's wgmma accumulates),
    or None where this torch has none."""
    generator = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(size, size, device="cuda", generator=generator).to(torch.float8_e4m3fn)
    b = torch.randn(size, size, device="cuda", generator=generator).to(torch.float8_e4m3fn)
    one = torch.ones((), device="cuda")
    try:
        timing = time_call(lambda: torch._scaled_mm(a, b.t(), one, one, out_dtype=torch.bfloat16,
                                                    use_fast_accum=True), "cuda", budget_ms=300)
    except (AttributeError, RuntimeError, TypeError) as error:
        print(f"no FP8 matmul ceiling: {type(error).__name__}: {str(error).splitlines()[0][:160]}", file=sys.stderr)
        return None
    finally:
        del a, b
        torch.cuda.empty_cache()
    return 2 * size**3 / (timing.median_ms * 1e-3) / 1e12


def fp8_inputs(case: Case, seed: int) -> dict[str, torch.Tensor]:
    """FP8 q, k, v with float32 descales per (batch, kv head), quantized as the harness does (each
    slice's largest magnitude over e4m3's largest value), and the bf16 values they stand for."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    fp8 = torch.float8_e4m3fn
    out: dict[str, torch.Tensor] = {}
    for name, heads in (("q", case.heads_q), ("k", case.heads_kv), ("v", case.heads_kv)):
        n = case.seqlen_q if name == "q" else case.seqlen_k
        x = torch.randn(case.batch, heads, n, case.head_dim, device="cuda", dtype=torch.float32, generator=gen)
        amax = x.reshape(case.batch, case.heads_kv, heads // case.heads_kv, n, case.head_dim).abs().amax(dim=(2, 3, 4))
        descale = (amax.clamp_min(1e-12) / torch.finfo(fp8).max).to(torch.float32)
        per_head = descale.repeat_interleave(heads // case.heads_kv, dim=1)[:, :, None, None]
        quantized = (x / per_head).to(fp8)
        out[name], out[f"{name}_descale"] = quantized, descale
        out[f"{name}_bf16"] = (quantized.to(torch.float32) * per_head).to(torch.bfloat16)
        del x
    out["v_t"] = keys_contiguous(out["v"])
    return out


def fp8_v_in_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, descales: dict[str, torch.Tensor],
                    causal: bool) -> torch.Tensor:
    """The FP8 kernel on V as given (head dim contiguous), past the launcher's transposition: an
    experiment only, through the launcher's private pieces (default tiles, contiguous inputs)."""
    o = torch.empty(q.shape, dtype=torch.bfloat16, device=q.device)
    tiles = triton_flash_launch.default_tiles("fp8", q.shape[-1], q.dtype, causal, k.shape[2])
    triton_flash_launch._launch_fwd_fp8(q, k, v, o, (descales["q"], descales["k"], descales["v"]), causal,
                                        1.0 / math.sqrt(q.shape[-1]), tiles)
    return o


def measure_fp8(row: Row, inputs: dict[str, torch.Tensor], budget_ms: float) -> list[dict[str, Any]]:
    """The fp8 group's four timings of one row (see the module docstring), and the copy's."""
    case = row.case
    descales = {name: inputs[f"{name}_descale"] for name in ("q", "k", "v")}
    calls = {
        "triton_flash_bf16": lambda: flash_attention(inputs["q_bf16"], inputs["k_bf16"], inputs["v_bf16"],
                                                     causal=case.causal),
        "triton_flash_fp8": lambda: flash_attention(inputs["q"], inputs["k"], inputs["v"], causal=case.causal,
                                                    q_descale=descales["q"], k_descale=descales["k"],
                                                    v_descale=descales["v"]),
        "triton_flash_fp8_vt": lambda: flash_attention(inputs["q"], inputs["k"], inputs["v_t"], causal=case.causal,
                                                       q_descale=descales["q"], k_descale=descales["k"],
                                                       v_descale=descales["v"]),
        "triton_flash_fp8_vin": lambda: fp8_v_in_kernel(inputs["q"], inputs["k"], inputs["v"], descales, case.causal),
    }
    entries: list[dict[str, Any]] = []
    outputs: dict[str, torch.Tensor] = {}
    for impl, fn in calls.items():
        base = {"impl": impl, "group": row.group, "mode": row.mode, "case": row.label}
        try:
            with torch.no_grad():
                torch.cuda.synchronize()
                started = time.perf_counter()
                outputs[impl] = fn()
                torch.cuda.synchronize()
                first_call_s = time.perf_counter() - started
                timing = time_call(fn, "cuda", budget_ms=budget_ms, min_samples=10, max_samples=60, warmup=2)
        except Exception as error:  # recorded, not fatal
            entries.append({**base, "error": f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"})
            continue
        ms = timing.median_ms
        entries.append({**base, "ms": ms, "iqr_ms": timing.iqr_ms, "samples": len(timing.samples_ms),
                        "first_call_s": first_call_s, "tflops": flop_count(case, row.mode) / (ms * 1e-3) / 1e12,
                        "gbps": byte_count(case, row.mode) / (ms * 1e-3) / 1e9})
    reference = outputs.get("triton_flash_bf16")
    for entry in entries:
        out = outputs.get(entry["impl"])
        if out is not None and reference is not None and entry["impl"] != "triton_flash_bf16":
            entry["max_abs_diff_vs_bf16"] = (out.float() - reference.float()).abs().max().item()
    ours = next((e for e in entries if e["impl"] == "triton_flash_fp8" and "error" not in e), None)
    if ours is not None:
        copy = time_call(lambda: keys_contiguous(inputs["v"]), "cuda", budget_ms=budget_ms / 4, min_samples=10,
                         max_samples=60, warmup=2)
        ours["v_transpose_ms"] = copy.median_ms
    return entries


def fmt(value: float | None, digits: int = 0) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def verdicts(row: Row, figures: dict[str, dict[str, Any]], copy_gbps: float) -> tuple[str, str]:
    """(target, met) for triton_flash on this row, from issue 5."""
    if row.group == "fp8":
        fp8, bf16 = figures.get("triton_flash_fp8"), figures.get("triton_flash_bf16")
        if fp8 is None or bf16 is None:
            return f">= {FP8_TARGET}x bf16", "no result"
        ratio = fp8["tflops"] / bf16["tflops"]
        return f">= {FP8_TARGET}x bf16", f"{'yes' if ratio >= FP8_TARGET else 'no'} ({ratio:.2f}x)"
    ours = figures.get("triton_flash")
    if ours is None:
        return "-", "no result"
    flash = figures.get("sdpa_FLASH", {}).get("tflops")
    if row.group == "decode":
        sdpa_best = max((f["gbps"] for name, f in figures.items() if name != "triton_flash"), default=0.0)
        share = ours["gbps"] / copy_gbps
        ok = share >= 0.70 and ours["gbps"] >= sdpa_best
        return ">= 70% copy BW and >= best SDPA", f"{'yes' if ok else 'no'} ({share:.0%} of copy, {ours['gbps'] / max(sdpa_best, 1e-9):.2f}x best SDPA)"
    if flash is None:
        return "-", "no SDPA-FLASH figure"
    factor = {("dense", "forward"): 1.3, ("dense", "backward"): 1.0}.get((row.group, row.mode), 0.9)
    ratio = ours["tflops"] / flash
    return f">= {factor}x FLASH", f"{'yes' if ratio >= factor else 'no'} ({ratio:.2f}x)"


def tables(results: list[dict[str, Any]], rows: list[Row], ceilings: dict[str, float]) -> str:
    copy_gbps = ceilings.get("copy_gbps", float("nan"))
    by_row: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    for entry in results:
        by_row.setdefault((entry["mode"], entry["case"]), {})[entry["impl"]] = entry
    lines = []
    for group, unit in (("dense", "TFLOP/s"), ("short", "TFLOP/s"), ("odd", "TFLOP/s"), ("decode", "GB/s"),
                        ("fp8", "TFLOP/s")):
        picked = [row for row in rows if row.group == group]
        if not picked:
            continue
        key = "gbps" if unit == "GB/s" else "tflops"
        fp8 = group == "fp8"
        impls = FP8_IMPLS if fp8 else IMPLS
        names = [FP8_LABELS[impl] for impl in impls] if fp8 else list(impls)
        extra = ["V^T copy (ms)", "max abs fp8 - bf16"] if fp8 else []
        ours = "triton_flash_fp8" if fp8 else "triton_flash"
        title = "triton_flash fp8 (FP8 e4m3 forward vs bf16)" if fp8 else group
        lines += [f"\n### {title} ({unit})\n",
                  "| mode | case | " + " | ".join(names + extra) + f" | {ours} first call (s) | target | met |",
                  "|---|---|" + "---|" * (len(impls) + len(extra) + 3)]
        for row in picked:
            figures = {name: entry for name, entry in by_row.get((row.mode, row.label), {}).items() if "error" not in entry}
            cells = []
            for impl in impls:
                entry = by_row.get((row.mode, row.label), {}).get(impl)
                cells.append("n/a" if entry is None or "error" in entry else fmt(entry[key]))
            if fp8:
                entry = figures.get("triton_flash_fp8", {})
                cells += [fmt(entry.get("v_transpose_ms"), 3), fmt(entry.get("max_abs_diff_vs_bf16"), 4)]
            target, met = verdicts(row, figures, copy_gbps)
            first = figures.get(ours, {}).get("first_call_s")
            lines.append(f"| {row.mode} | {row.label} | " + " | ".join(cells) + f" | {fmt(first, 2)} | {target} | {met} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--quick", action="store_true", help="bf16 only and fewer lengths")
    parser.add_argument("--budget-ms", type=float, default=120.0, help="timing budget per measurement")
    parser.add_argument("--groups", default="dense,short,odd,decode",
                        help="comma-separated row groups to run (dense, short, odd, decode, fp8)")
    parser.add_argument("--fp8", action="store_true",
                        help="only the fp8 group: triton_flash's FP8 e4m3 forward against its bf16 forward "
                             "(same as --groups fp8)")
    parser.add_argument("--tune", action="store_true",
                        help="time triton_flash's tile candidates on first use instead of its fixed defaults")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("this benchmark needs a CUDA GPU", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    tile_tuner = tuner.install() if args.tune else None
    started = time.perf_counter()
    env = {"device": torch.cuda.get_device_name(), "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda,
           "command": " ".join(sys.argv), "gpu_state_before": gpu_state()}
    try:
        env["nvidia_smi"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm",
                                            "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
    except OSError:
        pass
    ceilings = measure_ceilings("cuda")
    groups = {"fp8"} if args.fp8 else set(args.groups.split(","))
    if "fp8" in groups:
        ceilings["matmul_fp8_tflops"] = fp8_matmul_tflops()
    print(f"{env['device']}  torch {env['torch']}  triton {env['triton']}  ceilings: "
          f"matmul {ceilings['matmul_bf16_tflops']:.0f} TFLOP/s"
          + (f" (e4m3: {fmt(ceilings['matmul_fp8_tflops'])})" if "matmul_fp8_tflops" in ceilings else "")
          + f", copy {ceilings['copy_gbps']:.0f} GB/s", flush=True)
    rows = [row for row in plan(args.quick) if row.group in groups]
    results: list[dict[str, Any]] = []
    for index, row in enumerate(rows):
        if row.group == "fp8":
            fp8_in = fp8_inputs(row.case, seed=index)
            entries = measure_fp8(row, fp8_in, args.budget_ms)
            results += entries
            shown = {FP8_LABELS[e["impl"]]: (fmt(e["tflops"]) if "error" not in e else "n/a") for e in entries}
            print(f"[{index + 1}/{len(rows)}] {row.mode:8s} {row.label:45s} {shown}", flush=True)
            del fp8_in, entries
            torch.cuda.empty_cache()
            continue
        inputs = make_inputs(row.case, seed=index)
        reference = None
        for impl in IMPLS:
            try:
                entry = measure(impl, row, inputs, args.budget_ms)
            except Exception as error:  # a backend that refuses this shape: recorded, not fatal
                entry = {"impl": impl, "group": row.group, "mode": row.mode, "case": row.label,
                         "error": f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"}
            output = entry.pop("output", None)
            if output is not None and impl != "triton_flash" and reference is None:
                reference = output
            if impl == "triton_flash" and output is not None:
                entry["_out"] = output
            results.append(entry)
        ours = next(e for e in results[-len(IMPLS):] if e["impl"] == "triton_flash")
        out = ours.pop("_out", None)
        if out is not None and reference is not None:
            ours["max_abs_diff_vs_sdpa"] = (out.float() - reference.float()).abs().max().item()
        shown = {e["impl"]: (fmt(e.get("gbps" if row.group == "decode" else "tflops")) if "error" not in e else "n/a")
                 for e in results[-len(IMPLS):]}
        print(f"[{index + 1}/{len(rows)}] {row.mode:8s} {row.label:45s} {shown}", flush=True)
        del inputs, reference, out
        torch.cuda.empty_cache()
    env["gpu_state_after"] = gpu_state()
    env["wall_s"] = time.perf_counter() - started
    tuning = {"tuned": args.tune, "seconds": tile_tuner.seconds() if tile_tuner else 0.0,
              "records": tile_tuner.records if tile_tuner else []}
    markdown = (f"# triton_flash vs SDPA backends\n\n{env['device']} ({env.get('nvidia_smi', '')}), {env['date']}, "
                f"torch {env['torch']}, triton {env['triton']}.\nCommand: `{env['command']}`.\n"
                f"Ceilings measured in this run: bf16 matmul {ceilings['matmul_bf16_tflops']:.0f} TFLOP/s, "
                + (f"e4m3 matmul {fmt(ceilings['matmul_fp8_tflops'])} TFLOP/s, " if "matmul_fp8_tflops" in ceilings
                   else "")
                + f"copy {ceilings['copy_gbps']:.0f} GB/s (read + write).\n"
                + (f"triton_flash tuning (--tune): {len(tuning['records'])} problem classes tuned, "
                   f"{tuning['seconds']:.1f} s (compilation included)" if args.tune else
                   "triton_flash tiles: the fixed defaults (no --tune)")
                + "; the first call of each row is in the 'first call' column.\n"
                + tables(results, rows, ceilings) + "\n")
    (args.out / "bench.json").write_text(json.dumps({"env": env, "ceilings": ceilings, "results": results,
                                                     "tuning": tuning}, indent=1, default=str))
    (args.out / "bench.md").write_text(markdown)
    print(markdown)
    errors = [e for e in results if "error" in e and e["impl"].startswith("triton_flash")]
    for entry in errors:
        print(f"triton_flash failed: {entry['mode']} {entry['case']}: {entry['error']}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
