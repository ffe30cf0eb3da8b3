"""One GPU run for triton_flash's Gluon backward (issue 42, goal 2): is it right, does it hang, how fast.

Usage, on the Hopper machine, from the repository root (85-100 s on an H100 with two variants
before the variants' timings took three rounds; a little more now):

    python3 tools/flash_bench/gluon_bwd_check.py --out DIR [--quick] [--variants m64s2-split,...] [--case-timeout 60]
        [--alibi-window-only | --no-alibi-window]

The sibling of ``gluon_check.py`` (the forward's), with the machinery both share (children with
deadlines, a hang stops the run, a crash moves on in a fresh child; ``gluon_harness.py``).
Needs torch with CUDA and triton 3.6; the project need not be installed. Four phases:

1. compile: every backward kernel the run needs, and the Gluon forwards its correctness cases
   run, in parallel children that only compile.
2. correctness: bf16/fp16 x d64/d128 x causal or not over lengths 1k, odd ones (113, 1000, 4097),
   Nq != Nk both ways (rows that see no key under causal), GQA and MQA, batch > 1; each
   ``--variants`` configuration on three of them. The forward is triton_flash's (``launch.flash_fwd``:
   the Gluon forward on Hopper), its O and base-2 LSE go to ``gluon_backward.flash_bwd`` with a
   random dO; dK and dV are poisoned with NaN first. The rule is the harness's
   (``pytest_attnkit.worker.tolerance.compare`` with ``GRADIENT_FACTOR``): each of dQ, dK, dV's
   max error against float64 autograd at most 3x the plain same-precision autograd's plus twice
   the dtype's rounding. The backward runs twice more: dK and dV must give the same bits; dQ is
   summed by float atomics in whatever order the CTAs arrive, so it may differ run to run
   (reported, not required: each repeat's dQ must pass the rule instead). (The Triton backward
   is not run here: its compiles would eat the time budget; it is timed in phase 3.) ALiBi and
   sliding windows at d64 and d128 (``ALIBI_SHAPES``, ``WINDOW_CASES``, both dtypes, causal or
   not, some with both): slopes per (batch, head), windows two-sided, one-sided and narrower than
   a tile; the forward and the oracle with the same variants, the backward given them
   (``gluon_backward.flash_bwd`` runs them whatever ``TAKES_ALIBI`` and ``TAKES_WINDOW`` say).
3. timing: the issue's cases (bf16; b1-h16-q16384 d128, b4-h16-q4096 d128, b4-h32-q4096 d64,
   b8-h16-q1024 d128; each causal and not) with the harness's timer (the median of
   ``pytest_attnkit.worker.timer.time_call``: the L2 emptied and the stream held before each
   call, as the speed suite times; ``do_bench`` read the Triton backward 4-14% slower at 16k and
   7% at 4k causal, moving up to 9% between readings, results/2026-11-28-session16/bwdtime): the Gluon
   backward (with its delta preprocess and dQ's conversion, what a caller pays), SDPA cuDNN's
   backward (``torch.autograd.grad`` of its output, the forward outside the timing), and the
   Triton backward (``launch.flash_bwd(..., gluon=False)``). FLOPs are 2.5 x the forward's
   (``pytest_attnkit.counts``); causal counts the visible pairs. Each ``--variants`` configuration
   is timed too, beside the default in three rounds that take turns (the table's default column is
   that case's; its max difference from cuDNN's gradients recorded), and ``TIMING_ONLY``: v15's
   adds path with ``-noadds`` (dQ's adds left out, dQ wrong: timing only), what the float atomics
   cost. ALiBi's and windows' cases (``EXTRA_BENCH``): the Gluon backward beside the Triton
   backward with the same variant (cuDNN takes neither), their max difference recorded.
4. report: the tables, printed and written to DIR (``check.md``, ``check.json``; the compile
   times in ``compile.log``).

Exit status 0 when everything ran and passed, 1 on a failed case, 2 on a hang, 3 on a compile failure.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

import gluon_check  # noqa: E402
import gluon_harness as harness  # noqa: E402
from gluon_check import _flops, _inputs  # noqa: E402

DTYPES = ("bfloat16", "float16")
HEAD_DIMS = (64, 128, 192)  # 192: MLA, V's head dim 128 (gluon_check.value_dim); its default config only
#: The configurations the defaults were chosen between (NOTES.md v20.8): one dQ reduce a tile or
#: two, at d64's and d128's tiles (m64s3 does not fit at d128 and is skipped there).
DEFAULT_VARIANTS = "m64s2-tmar-sw,m64s2-tmar-sw-pair,m64s3-tmar-sw,m64s3-tmar-sw-pair"
#: Timed only (never checked for correctness): v15's per-thread dQ adds left out, dQ wrong: what the
#: adds path costs without its adds (the defaults reduce by TMA since v17, which -noadds cannot join).
TIMING_ONLY = ("m64s2-noadds", "m64s3-noadds")
#: Rounds of a variants case's timings (the default and each variant in turn, the median kept).
VARIANT_ROUNDS = 3
#: (batch, heads_q, heads_kv, n_q, n_k): each runs for every dtype, head dim and causal flag.
CORRECTNESS_SHAPES = (
    (1, 2, 2, 1024, 1024),
    (1, 4, 2, 1000, 1000),       # GQA 2:1, a partial tile
    (2, 4, 2, 113, 113),         # batch > 1
    (1, 2, 2, 4097, 4097),       # one row past a whole tile
    (1, 2, 2, 1000, 4097),       # Nq < Nk
    (1, 2, 2, 4097, 1000),       # Nq > Nk: under causal, rows that see no key
    (1, 4, 1, 300, 129),         # MQA, Nq > Nk
    (1, 2, 2, 1, 1000),          # one query row
    (1, 2, 2, 64, 1),            # one key
)
#: ALiBi's correctness shapes (d64 and d128, both dtypes, causal or not): GQA with a partial tile,
#: Nq > Nk and Nq < Nk (the bias's diagonal moves with Nk - Nq), batch > 1 (slopes per batch), MQA.
ALIBI_SHAPES = ((1, 4, 2, 1000, 1000), (1, 2, 2, 4097, 1000), (1, 2, 2, 1000, 4097), (2, 4, 2, 113, 113),
                (1, 4, 1, 300, 129))
#: Windows' correctness cases (shape, the contract's window (left, right), -1 unbounded, ALiBi
#: too), each causal and not (causal folds into the right side): narrower than a tile, two-sided
#: over Nq > Nk and Nq < Nk, one-sided each way, with ALiBi, and key blocks that no query sees
#: (their CTAs walk no tile and store zeros).
WINDOW_CASES = (((1, 4, 2, 1000, 1000), (256, 0), False), ((1, 2, 2, 4097, 1000), (300, 100), False),
                ((1, 2, 2, 1000, 4097), (-1, 64), False), ((2, 4, 2, 113, 113), (5, 3), False),
                ((1, 4, 1, 300, 129), (64, -1), True),
                ((1, 2, 2, 1000, 4097), (300, 0), False))  # key blocks no query sees: dK, dV zero
#: The timing cases of ALiBi and windows (bf16): (batch, heads, n, head dim, causal, ALiBi,
#: window): the harness's (b1-h16-q16384 d128, ALiBi causal or not; the window w4096:0 causal)
#: and 4k d64 ones.
EXTRA_BENCH = ((1, 16, 16384, 128, False, True, None), (1, 16, 16384, 128, True, True, None),
               (4, 32, 4096, 64, False, True, None), (4, 32, 4096, 64, True, True, None),
               (1, 16, 16384, 128, True, False, (4096, 0)), (4, 32, 4096, 64, False, False, (512, 512)))
#: The head dims ALiBi and windows take in the Gluon backward (MLA takes neither).
EXTRA_HEAD_DIMS = (64, 128)
#: --quick's correctness shapes: GQA with a partial tile, Nq > Nk (rows with no key), 4097.
QUICK_SHAPES = ((1, 4, 2, 1000, 1000), (1, 2, 2, 4097, 1000), (1, 2, 2, 4097, 4097))
VARIANT_SHAPES = ((1, 2, 2, 1000, 1000), (1, 4, 2, 4097, 4097), (1, 2, 2, 4097, 1000))
BENCH_SHAPES = (
    (1, 16, 16384, 128),
    (4, 16, 4096, 128),
    (4, 32, 4096, 64),
    (8, 16, 1024, 128),
)
#: Timed without variants (MLA's backward takes its default only).
MLA_BENCH_SHAPES = ((4, 16, 4096, 192), )
IMPLS = ("gluon", "sdpa_cudnn", "triton_flash")


def _module():
    from gluon_compile import ensure_package

    ensure_package()
    import importlib

    gb = importlib.import_module("pytest_attnkit.implementations.triton_flash.gluon_backward")
    from pytest_attnkit.implementations.triton_flash import launch as tf_launch

    return gb, tf_launch


# ---------------------------------------------------------------------------------------------
# Child side (touches CUDA)
# ---------------------------------------------------------------------------------------------


def alibi_slopes(batch: int, heads: int, device: str):
    """ALiBi slopes [B, Hq] float32 for a check: the usual geometric ones (2^(-8 (h + 1) / Hq)),
    each batch's a different multiple, so that a kernel reading another batch's or head's slope
    is off."""
    import torch

    heads_pow = torch.arange(1, heads + 1, dtype=torch.float32, device=device)
    return (2.0 ** (-8.0 * heads_pow / heads))[None, :] * (1.0 + 0.5 * torch.arange(batch, device=device))[:, None]


def _oracle_grads(q, k, v, do, causal: bool, scale: float, dtype64: bool, slopes=None, window=None):
    """dq, dk, dv of pytest_attnkit.oracle.attention_math (float64 or the inputs' dtype);
    ``slopes`` ALiBi's [B, Hq], each batch's own (the oracle takes [Hq]: a batch at a time);
    ``window`` the contract's (left, right)."""
    import torch

    if slopes is not None:
        per_batch = [_oracle_one(q[b:b + 1], k[b:b + 1], v[b:b + 1], do[b:b + 1], causal, scale, dtype64, slopes[b],
                                 window) for b in range(q.shape[0])]
        return tuple(torch.cat(parts) for parts in zip(*per_batch))
    return _oracle_one(q, k, v, do, causal, scale, dtype64, None, window)


def _oracle_one(q, k, v, do, causal: bool, scale: float, dtype64: bool, slopes, window):
    import torch

    from pytest_attnkit.oracle import attention_math

    cast = (lambda t: t.double()) if dtype64 else (lambda t: t)
    leaves = [cast(t).detach().requires_grad_(True) for t in (q, k, v)]
    out = attention_math(*leaves, causal=causal, scale=scale, window=window,
                         alibi_slopes=None if slopes is None else cast(slopes))
    return torch.autograd.grad(out, leaves, cast(do))


def _case_variants(case: dict, q, tf_launch, device: str):
    """(slopes or None, window or None, launch.Variants or None, the Gluon backward's keywords)
    of a case with ALiBi (``alibi``) or a window (``window``: [left, right])."""
    slopes = alibi_slopes(q.shape[0], q.shape[1], device) if case.get("alibi") else None
    window = tuple(case["window"]) if case.get("window") else None
    if slopes is None and window is None:
        return None, None, None, {}
    variants = tf_launch.Variants(causal=case["causal"], alibi_slopes=slopes, window=window)
    return slopes, window, variants, {"alibi_slopes": slopes, "window": window}


def _check_case(case: dict, gb, tf_launch, device: str = "cuda") -> dict:
    """One correctness case (``device`` other than cuda: only for testing this check on the CPU
    with stand-ins for ``gb`` and ``tf_launch``, as gluon_bwd_model's selftest does)."""
    import torch

    from pytest_attnkit.worker.tolerance import GRADIENT_FACTOR, compare

    shape, causal, head_dim = tuple(case["shape"]), case["causal"], case["head_dim"]
    q, k, v = _inputs(shape, case["dtype"], head_dim, case["seed"], device)
    generator = torch.Generator(device=device).manual_seed(case["seed"] + 1000)
    do = torch.randn((*q.shape[:3], v.shape[-1]), device=device, dtype=q.dtype, generator=generator)  # like O
    scale = head_dim ** -0.5
    reason = gb.unsupported_reason(q, k, v, causal, scale)
    if reason is not None:
        return {"passed": False, "error": f"unsupported_reason(): {reason}"}
    config = gb.Config.parse(case["config"])
    slopes, window, variants, extra = _case_variants(case, q, tf_launch, device)
    if variants is not None:
        o, lse = tf_launch.flash_fwd(q, k, v, causal, scale, variants=variants)
    else:
        o, lse = tf_launch.flash_fwd(q, k, v, causal, scale)

    def run():
        dk = torch.full_like(k, float("nan"))
        dv = torch.full_like(v, float("nan"))
        return gb.flash_bwd(do, q, k, v, o, lse, causal, scale, config, out=(dk, dv), **extra)

    start = time.perf_counter()
    grads = run()
    if q.is_cuda:
        torch.cuda.synchronize()
    first_call_s = time.perf_counter() - start
    repeats = [run() for _ in range(2)]
    dkdv_equal = all(torch.equal(r[1], grads[1]) and torch.equal(r[2], grads[2]) for r in repeats)
    dq_equal = all(torch.equal(r[0], grads[0]) for r in repeats)
    oracle = _oracle_grads(q, k, v, do, causal, scale, True, slopes, window)
    plain = _oracle_grads(q, k, v, do, causal, scale, False, slopes, window)
    result = {"repeats_dkdv_bitwise_equal": dkdv_equal, "repeats_dq_bitwise_equal": dq_equal,
              "first_call_s": round(first_call_s, 3)}
    passed = dkdv_equal
    for index, name in enumerate(("dq", "dk", "dv")):
        cmp = compare(name, grads[index], oracle[index], plain[index], dtype=q.dtype, factor=GRADIENT_FACTOR)
        result[name] = {"max_error": cmp.max_error, "allowed": cmp.allowed, "plain_error": cmp.plain_error,
                        "nonfinite": cmp.nonfinite, "worst_index": list(cmp.worst_index)}
        passed &= cmp.passed
    for r in repeats:  # each repeat's dQ must pass too (its order of adds differs)
        cmp = compare("dq", r[0], oracle[0], plain[0], dtype=q.dtype, factor=GRADIENT_FACTOR)
        passed &= cmp.passed
        result["dq"]["max_error_repeats"] = max(result["dq"].get("max_error_repeats", 0.0), cmp.max_error)
    result["passed"] = bool(passed)
    return result


def _bench_case(case: dict, gb, tf_launch) -> dict:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    from pytest_attnkit.worker.timer import time_call

    batch, heads, n, head_dim = case["shape"]
    causal = case["causal"]
    q, k, v = _inputs((batch, heads, heads, n, n), "bfloat16", head_dim, 1234)
    do = torch.randn((*q.shape[:3], v.shape[-1]), device=q.device, dtype=q.dtype)  # like O
    scale = head_dim ** -0.5
    flops = 2.5 * _flops(batch, heads, n, head_dim, causal)
    result = {"flops": flops, "ms": {}, "tflops": {}, "max_diff_vs_cudnn": {}}
    if case.get("alibi") or case.get("window"):
        return _bench_extra(case, gb, tf_launch, q, k, v, do, scale, result)

    qg, kg, vg = (t.detach().requires_grad_(True) for t in (q, k, v))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        out_cudnn = sdpa(qg, kg, vg, is_causal=causal, scale=scale)
        expected = torch.autograd.grad(out_cudnn, (qg, kg, vg), do, retain_graph=True)
    o, lse = tf_launch.flash_fwd(q, k, v, causal, scale)

    samples = result["rounds_ms"] = {}

    def refused(name, exc):  # one refusing must not lose the others; its partial timings go
        result.setdefault("errors", {})[name] = f"{type(exc).__name__}: {str(exc)[:300]}"
        result["ms"].pop(name, None)
        result["tflops"].pop(name, None)

    def timed(name, fn):
        if name in result.get("errors", {}):
            return
        try:
            samples.setdefault(name, []).append(time_call(fn, "cuda").median_ms)
        except Exception as exc:
            refused(name, exc)
            return
        ms = sorted(samples[name])[(len(samples[name]) - 1) // 2]  # the median; of two, the faster
        result["ms"][name] = ms
        result["tflops"][name] = flops / ms / 1e9

    def diff(name, call):
        try:
            got = call()
        except Exception as exc:
            refused(name, exc)
            return
        result["max_diff_vs_cudnn"][name] = [float((g.float() - e.float()).abs().max().item())
                                             for g, e in zip(got, expected)]

    # A variants case times the default beside them, in VARIANT_ROUNDS rounds, each starting one
    # configuration later (so none is always first), each configuration's median round kept: the
    # same kernel timed in two cases of one run differed by 13% (results/2026-11-28-session15), so
    # configurations are compared only within one case. Every round's time is in check.json.
    texts = [None] + case["configs"] if case.get("configs") else [None]
    chosen = {text: None if text is None else gb.Config.parse(text) for text in texts}
    name_of = {text: "gluon" if text is None else f"gluon {text}" for text in texts}
    for text in texts:
        diff(name_of[text], lambda config=chosen[text]: gb.flash_bwd(do, q, k, v, o, lse, causal, scale, config))
    torch.cuda.synchronize()
    for r in range(VARIANT_ROUNDS if case.get("configs") else 1):
        for text in texts[r % len(texts):] + texts[:r % len(texts)]:
            timed(name_of[text], lambda config=chosen[text]: gb.flash_bwd(do, q, k, v, o, lse, causal, scale, config))
    if case.get("baselines", True):
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            timed("sdpa_cudnn", lambda: torch.autograd.grad(out_cudnn, (qg, kg, vg), do, retain_graph=True))
        diff("triton_flash", lambda: tf_launch.flash_bwd(do, q, k, v, o, lse, causal, scale, gluon=False)[:3])
        timed("triton_flash", lambda: tf_launch.flash_bwd(do, q, k, v, o, lse, causal, scale, gluon=False))
    return result


def _bench_extra(case: dict, gb, tf_launch, q, k, v, do, scale: float, result: dict) -> dict:
    """A timing case with ALiBi or a window: the Gluon backward and the Triton backward with the
    same variant (what triton_flash runs where ``TAKES_ALIBI`` / ``TAKES_WINDOW`` are False), in
    VARIANT_ROUNDS rounds taking turns; cuDNN takes neither. ``max_diff_vs_cudnn`` holds, under
    "gluon", the Gluon backward's max difference from the Triton backward's gradients here.
    FLOPs count the visible pairs (``pytest_attnkit.counts``, as the speed suite does)."""
    from pytest_attnkit.contract import Case
    from pytest_attnkit.counts import flop_count
    from pytest_attnkit.worker.timer import time_call

    causal = case["causal"]
    _, window, variants, extra = _case_variants(case, q, tf_launch, "cuda")
    counted = Case(batch=q.shape[0], heads_q=q.shape[1], heads_kv=k.shape[1], seqlen_q=q.shape[2], seqlen_k=k.shape[2],
                   head_dim=q.shape[3], dtype="bfloat16", causal=causal, window=window)
    result["flops"] = float(flop_count(counted, "backward"))
    o, lse = tf_launch.flash_fwd(q, k, v, causal, scale, variants=variants)
    calls = {"gluon": lambda: gb.flash_bwd(do, q, k, v, o, lse, causal, scale, **extra),
             "triton_flash": lambda: tf_launch.flash_bwd(do, q, k, v, o, lse, causal, scale, variants=variants,
                                                         gluon=False)}
    samples = result["rounds_ms"] = {name: [] for name in calls}
    try:
        got, want = calls["gluon"](), calls["triton_flash"]()[:3]
        result["max_diff_vs_cudnn"]["gluon"] = [float((g.float() - w.float()).abs().max().item())
                                                for g, w in zip(got, want)]
        names = list(calls)
        for r in range(VARIANT_ROUNDS):
            for name in names[r % 2:] + names[:r % 2]:
                samples[name].append(time_call(calls[name], "cuda").median_ms)
    except Exception as exc:
        result["errors"] = {"variant": f"{type(exc).__name__}: {str(exc)[:300]}"}
        return result
    for name, times in samples.items():
        result["ms"][name] = sorted(times)[(len(times) - 1) // 2]
        result["tflops"][name] = result["flops"] / result["ms"][name] / 1e9
    return result


def child(mode: str, cases_path: str) -> int:
    cases = json.loads(Path(cases_path).read_text())
    if mode == "selftest":
        return harness.selftest_child(cases)
    gb, tf_launch = _module()
    if mode == "compile":
        def compile_one(case: dict) -> None:
            q, k, v = _inputs((1, 2, 2, 256, 256), case["dtype"], case["head_dim"], 0)
            window = tuple(case["window"]) if case.get("window") else None
            if case.get("forward"):  # the forward the correctness cases run (Triton's disk cache keeps it)
                from gluon_compile import load_gluon_forward

                load_gluon_forward().warmup(q, k, v, case["causal"], 0.1, alibi=case.get("alibi", False),
                                            window=window)
            else:
                gb.warmup(q, k, v, case["causal"], 0.1, gb.Config.parse(case["config"]), alibi=case.get("alibi", False),
                          window=window)

        return harness.compile_each(cases, compile_one)
    harness.hello()
    if mode == "correct":
        return harness.run_each(cases, lambda case: _check_case(case, gb, tf_launch))
    return harness.run_each(cases, lambda case: _bench_case(case, gb, tf_launch))


# ---------------------------------------------------------------------------------------------
# Parent side (no CUDA here)
# ---------------------------------------------------------------------------------------------


def _describe(mode: str, event: dict) -> str:
    if mode == "correct":
        if "dq" not in event:
            return f"  {event['id']}: FAIL {event.get('error', '')}"
        verdict = "ok  " if event["passed"] else "FAIL"
        figures = ", ".join(f"{n} {event[n]['max_error']:.2e} <= {event[n]['allowed']:.2e}" for n in ("dq", "dk", "dv"))
        extra = "" if event["repeats_dkdv_bitwise_equal"] else " (dK/dV REPEATS DIFFER)"
        extra += "" if event["repeats_dq_bitwise_equal"] else " (dQ repeats differ: atomics)"
        return f"  {verdict} {event['id']}: {figures}{extra}"
    if event.get("error") and "tflops" not in event:
        return f"  {event['id']}: ERROR {event['error'][:300]}"
    figures = ", ".join(f"{name} {value:.0f}" for name, value in event.get("tflops", {}).items())
    return f"  {event['id']}: TFLOP/s {figures}" + (f"; errors {event['errors']}" if event.get("errors") else "")



def correctness_cases(variants: list[str], default_config) -> list[dict]:
    cases = []
    for dtype in DTYPES:
        for head_dim in HEAD_DIMS:
            for causal in (False, True):
                config = str(default_config(head_dim, causal))
                for seed, shape in enumerate(CORRECTNESS_SHAPES):
                    cases.append(gluon_check._correctness_case(dtype, head_dim, causal, config, shape, seed))
    for variant in variants:
        for head_dim in HEAD_DIMS:
            for causal in (False, True):
                for seed, shape in enumerate(VARIANT_SHAPES):
                    cases.append(gluon_check._correctness_case("bfloat16", head_dim, causal, variant, shape, 100 + seed))
    return cases + extra_cases(default_config)


def extra_cases(default_config) -> list[dict]:
    """ALiBi's and windows' correctness cases: the default configuration at d64 and d128 (MLA
    takes neither)."""
    cases = []
    for dtype in DTYPES:
        for head_dim in EXTRA_HEAD_DIMS:
            for causal in (False, True):
                config = str(default_config(head_dim, causal))
                for seed, shape in enumerate(ALIBI_SHAPES):
                    case = gluon_check._correctness_case(dtype, head_dim, causal, config, shape, 200 + seed)
                    case.update(id=case["id"] + " alibi", alibi=True)
                    cases.append(case)
                for seed, (shape, window, alibi) in enumerate(WINDOW_CASES):
                    case = gluon_check._correctness_case(dtype, head_dim, causal, config, shape, 300 + seed)
                    case.update(id=case["id"] + f" w{window[0]}:{window[1]}" + " alibi" * alibi, alibi=alibi,
                                window=list(window))
                    cases.append(case)
    return cases


def extra_label(batch: int, heads: int, n: int, head_dim: int, causal: bool, alibi: bool, window) -> str:
    """A timing case's name with its ALiBi or window: ``b1-h16-q16384 d128 causal w4096:0``."""
    words = [harness.case_label(batch, heads, n, head_dim, causal)]
    words += [f"w{window[0]}:{window[1]}"] if window else []
    return " ".join(words + ["alibi"] * alibi)


def bench_cases(variants: list[str]) -> list[dict]:
    cases = []
    for batch, heads, n, head_dim in BENCH_SHAPES + MLA_BENCH_SHAPES:
        for causal in (False, True):
            label = harness.case_label(batch, heads, n, head_dim, causal)
            cases.append({"id": label, "shape": [batch, heads, n, head_dim], "causal": causal})
    if variants:
        for batch, heads, n, head_dim in BENCH_SHAPES:
            for causal in (False, True):
                label = f"{harness.case_label(batch, heads, n, head_dim, causal)} variants"
                cases.append({"id": label, "shape": [batch, heads, n, head_dim], "causal": causal,
                              "configs": variants, "baselines": False})
    for batch, heads, n, head_dim, causal, alibi, window in EXTRA_BENCH:
        cases.append({"id": extra_label(batch, heads, n, head_dim, causal, alibi, window),
                      "shape": [batch, heads, n, head_dim], "causal": causal, "alibi": alibi,
                      "window": list(window) if window else None})
    return cases


def report(correct: dict, bench: dict, variants: list[str], hello: dict, gb) -> str:
    lines = []
    passed = sum(1 for r in correct.values() if r.get("passed"))
    lines.append(f"## Correctness of the Gluon backward: {passed} of {len(correct)} cases passed")
    for case_id, r in correct.items():
        if r.get("passed"):
            continue
        detail = r.get("error") or ", ".join(
            f"{n} {r[n]['max_error']:.2e} (allowed {r[n]['allowed']:.2e}, nonfinite {r[n]['nonfinite']})"
            for n in ("dq", "dk", "dv")) + f", dK/dV repeats equal {r['repeats_dkdv_bitwise_equal']}"
        lines.append(f"- FAIL {case_id}: {detail}")
    ran = [r for r in correct.values() if "dq" in r]
    if ran:
        worst = max(((r[n]["max_error"] / r[n]["allowed"], n, r["id"]) for r in ran for n in ("dq", "dk", "dv")
                     if r[n]["allowed"] > 0), default=None)
        if worst:
            lines.append(f"- worst headroom (error / allowed): {worst[0]:.2f} ({worst[1]}, {worst[2]})")
        differ = sum(not r["repeats_dq_bitwise_equal"] for r in ran)
        lines.append(f"- dQ differed between repeats in {differ} of {len(ran)} cases (float atomics; each "
                     "repeat checked against the rule)")
    lines.append("")
    lines.append(f"## Backward speed (bf16, TFLOP/s = 2.5 x forward FLOPs / time, the harness timer's median; "
                 f"{hello.get('device', '?')})")
    lines.append("")
    lines.append("| case | gluon bwd | sdpa cuDNN bwd | triton_flash bwd | gluon / cuDNN | triton_flash / cuDNN |")
    lines.append("|---|---|---|---|---|---|")
    for batch, heads, n, head_dim in BENCH_SHAPES + MLA_BENCH_SHAPES:
        for causal in (False, True):
            label = harness.case_label(batch, heads, n, head_dim, causal)
            t = bench.get(label, {}).get("tflops", {})
            cells = [f"{t[name]:.0f}" if name in t else "-" for name in IMPLS]
            ratios = [f"{t[name] / t['sdpa_cudnn']:.2f}" if name in t and "sdpa_cudnn" in t else "-"
                      for name in ("gluon", "triton_flash")]
            lines.append(f"| {label} | " + " | ".join(cells + ratios) + " |")
    lines += ["", "ALiBi's and windows' backward (bf16, TFLOP/s of the visible pairs; the Triton backward takes them "
              f"where gluon_backward.TAKES_ALIBI / TAKES_WINDOW are False; {VARIANT_ROUNDS} rounds taking turns, the "
              "median; max |gluon - triton_flash| per gradient):",
              "", "| case | gluon bwd | triton_flash bwd | gluon / triton_flash | max diff dq, dk, dv |", "|---|---|---|---|---|"]
    for batch, heads, n, head_dim, causal, alibi, window in EXTRA_BENCH:
        label = extra_label(batch, heads, n, head_dim, causal, alibi, window)
        r = bench.get(label, {})
        t = r.get("tflops", {})
        cells = [f"{t[name]:.0f}" if name in t else "-" for name in ("gluon", "triton_flash")]
        ratio = f"{t['gluon'] / t['triton_flash']:.2f}" if len(t) == 2 else "-"
        diffs = r.get("max_diff_vs_cudnn", {}).get("gluon")
        lines.append(f"| {label} | " + " | ".join(cells + [ratio, ", ".join(f"{d:.1e}" for d in diffs) if diffs
                                                             else str(r.get("errors", "-"))[:80]]) + " |")
    if variants:
        defaults = harness.defaults_words(gb.default_config)
        lines.append("")
        lines.append(f"Gluon backward configurations (TFLOP/s; the default is {defaults}; max |grad - cuDNN's| "
                     "of each in check.json):")
        lines.append("")
        lines += harness.variants_table(bench, variants, BENCH_SHAPES, mark_single=True)
        lines += ["", f"(Each row's default and variants: one case, {VARIANT_ROUNDS} rounds taking turns, the median; "
                  "the speed table above times the default once, in its own case. A default cell marked * is "
                  "that single timing: the variants case's own failed.)"]
    return "\n".join(lines)


def selftest() -> int:
    """The parent's deadlines and crash handling with this file's children, without a GPU."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        cases = [{"id": "a"}, {"id": "b", "crash": True}, {"id": "c"}, {"id": "d", "hang": True}, {"id": "e"}]
        results, hello, hung = harness.run_cases(Path(__file__), "selftest", cases, Path(folder), 3.0,
                                                 lambda text: None, _describe)
    ok = (hung == "d" and sorted(results) == ["a", "b", "c", "d"] and "died" in results["b"]["error"]
          and "HUNG" in results["d"]["error"] and hello.get("device") == "none")
    print(f"selftest: {'ok' if ok else 'FAILED'}: results {sorted(results)}, hung {hung}")
    return 0 if ok else 1


def main() -> int:
    parser = harness.check_parser(__doc__, "backward", DEFAULT_VARIANTS)
    parser.add_argument("--quick", action="store_true",
                        help="a first look (about a minute): the defaults on three shapes each, no --variants, "
                             "the timing of the defaults and -noadds only")
    parser.add_argument("--alibi-window-only", action="store_true",
                        help="ALiBi's and windows' cases alone (their compiles, 88 correctness cases, 6 timings; no "
                             "--variants)")
    parser.add_argument("--no-alibi-window", action="store_true",
                        help="leave ALiBi's and windows' cases out (a shorter run)")
    parser.add_argument("--selftest", action="store_true",
                        help="no GPU: run the child machinery on planted results, a crash and a hang (about 10 s)")
    parser.add_argument("--child", nargs=2, metavar=("MODE", "CASES"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(*args.child)
    if args.selftest:
        return selftest()
    if not args.out:
        parser.error("--out DIR is required")

    gb, _ = _module()  # no CUDA in this process: the Config parser and the defaults only
    variants = [] if args.quick or args.alibi_window_only else [v.strip() for v in args.variants.split(",") if v.strip()]
    for text in variants:
        gb.Config.parse(text)  # a typo fails here, not in a child
    record = harness.check_record(variants)

    specs, seen = [], set()
    for dtype in DTYPES:
        for head_dim in HEAD_DIMS:
            for causal in (False, True):
                extra = variants + [v for v in TIMING_ONLY if v not in variants] if dtype == "bfloat16" else []
                if gluon_check.value_dim(head_dim) != head_dim:
                    extra = []  # MLA: the default configuration only (launch_arguments refuses others)
                for config in [str(gb.default_config(head_dim, causal))] + extra:
                    key = (dtype, head_dim, causal, config)
                    need = gb.shared_bytes(gb.Config.parse(config), head_dim,
                                           head_dim_v=gluon_check.value_dim(head_dim))
                    if key not in seen and need <= gb.SHARED_LIMIT:
                        seen.add(key)
                        specs.append({"id": f"{dtype} d{head_dim} {'causal' if causal else 'full'} {config}",
                                      "dtype": dtype, "head_dim": head_dim, "causal": causal, "config": config})
                specs.append({"id": f"forward {dtype} d{head_dim} {'causal' if causal else 'full'}", "dtype": dtype,
                              "head_dim": head_dim, "causal": causal, "config": "", "forward": True})
                if head_dim in EXTRA_HEAD_DIMS:  # ALiBi's and windows' backward (the default) and forward
                    base = f"{dtype} d{head_dim} {'causal' if causal else 'full'}"
                    for alibi, window in ((True, None), (False, [256, 0]), (True, [256, 0])):
                        words = " alibi" * alibi + " window" * bool(window)
                        specs.append({"id": f"{base} {gb.default_config(head_dim, causal)}{words}", "dtype": dtype,
                                      "head_dim": head_dim, "causal": causal,
                                      "config": str(gb.default_config(head_dim, causal)), "alibi": alibi,
                                      "window": window, "extra": True})
                        specs.append({"id": f"forward {base}{words}", "dtype": dtype, "head_dim": head_dim,
                                      "causal": causal, "config": "", "forward": True, "alibi": alibi,
                                      "window": window, "extra": True})
    # Variants whose shared memory does not fit at a head dim are left out there (compile list).
    fits = {(s["head_dim"], s["config"]) for s in specs if not s.get("forward")}
    cases = [c for c in correctness_cases(variants, gb.default_config) if (c["head_dim"], c["config"]) in fits]
    if args.quick:
        cases = [c for c in cases if tuple(c["shape"]) in QUICK_SHAPES]
    if args.alibi_window_only or args.no_alibi_window:
        specs = [spec for spec in specs if bool(spec.get("extra")) == args.alibi_window_only]
        cases = [case for case in cases if bool(case.get("alibi") or case.get("window")) == args.alibi_window_only]
    timed = variants + [v for v in TIMING_ONLY if v not in variants]

    def timing_cases(to_time: list[str]) -> list[dict]:
        if args.alibi_window_only:
            return [case for case in bench_cases([]) if case.get("alibi") or case.get("window")]
        timing = bench_cases(to_time + [v for v in TIMING_ONLY if v not in to_time])
        if args.no_alibi_window:
            timing = [case for case in timing if not (case.get("alibi") or case.get("window"))]
        for case in timing:
            if case.get("configs"):
                case["configs"] = [c for c in case["configs"] if (case["shape"][3], c) in fits]
        return timing

    return harness.check_main(Path(__file__), args, "Gluon backward check", record, specs, cases, timing_cases,
                              lambda correct, bench, hello, bad, hung: report(correct, bench, timed, hello, gb),
                              _describe, going_on=False)


if __name__ == "__main__":
    sys.exit(main())
