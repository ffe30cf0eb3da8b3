"""One GPU run for triton_flash's Gluon forward (issue 42, step 1): is it right, does it hang, how fast.

Usage, on the Hopper machine, from the repository root (about 3 minutes on an H200):

    python3 tools/flash_bench/gluon_check.py --out DIR [--variants n128s2,n128s3,...] [--case-timeout 60]
        [--timing-dtypes bfloat16,float16]

Needs torch with CUDA and triton 3.6 (Gluon); the project need not be installed (the checkout's
folders are imported). Four phases, each in child processes, so that a hung or crashed kernel
cannot take the run with it:

1. compile: every kernel the run needs (dtype x head dim x causal x configuration), in parallel
   processes that only compile (one kernel per such combination: lengths are not specialized).
2. correctness: every combination of bf16/fp16, d64/d128, causal or not, over lengths 1k, 4k,
   16k, odd ones (113, 1000, 4097), Nq != Nk both ways (rows that see no key under causal), GQA
   and MQA, batch > 1; each configuration of ``--variants`` on four of them. Inputs are
   random normal; the outputs are poisoned with NaN first. The rule is the harness's
   (``pytest_attnkit.worker.tolerance``): the max error against a float64 oracle at most 2x the
   plain same-precision implementation's plus twice the dtype's rounding, for the output and
   for the natural LSE (kernel's base-2 LSE times ln 2) on rows that see a key; rows that see
   none must be exactly 0 with LSE +inf. The kernel also runs twice more and must give the same
   bits (a race in a warp-specialized kernel tends to show as run-to-run differences). Then the
   attention variants the kernel takes (:data:`ATTENTION_VARIANTS`: sliding windows, ALiBi,
   softcap, sinks and all four at once) on five shapes each, d64, d128 and MLA's d192 (no harness
   case has MLA with a variant: this check is how those get run), against the float64 oracle with
   the same variants (``--no-attention-variants`` leaves them out).
3. timing: the issue's cases (bf16, and fp16 too with ``--timing-dtypes bfloat16,float16``;
   b1-h16-q16384 d128, b4-h16-q4096 d128, b4-h32-q4096 d64, b8-h16-q1024 d128; each causal and not) with ``triton.testing.do_bench`` (median, L2 flushed),
   for the Gluon forward, SDPA with the cuDNN backend, SDPA with the FLASH backend and the
   existing triton_flash forward (``launch.flash_fwd``, what Gluon would replace), and the bf16
   matmul ceiling; then each ``--variants`` configuration of the Gluon forward on the same
   cases, each first checked against cuDNN's output. Every dtype of ``--timing-dtypes`` times
   the same cases in that dtype, cuDNN and the others in it too; cases not in bf16 are named
   with the dtype (``b8-h16-q1024 d128 fp16``).
4. report: the tables, printed and written to DIR.

Each case has a deadline (``--case-timeout``, seconds): a warp-specialized kernel that is wrong
usually hangs instead of failing. On the first case past it, the child is killed and the case is
named as hung. A default configuration's hang stops the run there; a ``--variants``
configuration's drops that configuration (its other cases and its timing) and the rest go on in a
fresh child, as they do after a crash (e.g. an illegal address, recorded). A variant that fails
a case is not timed either; a timing case that hangs is left out. FLOPs are 4 * B * Hq * D *
(pairs of a query and a key it sees), the harness's count (``pytest_attnkit.counts``); causal counts the visible pairs.

Written to DIR: ``check.json`` (every result, the environment, the command), ``check.md`` (the
tables), ``compile.log``, and each child's stderr (``*.stderr``). The exit status is 0 when
everything ran and passed, 1 on a failed case, 2 on a hang, 3 on a compile failure.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

import gluon_harness as harness  # noqa: E402

DTYPES = ("bfloat16", "float16")
HEAD_DIMS = (64, 128, 192)
#: V's head dim where it is not Q's: MLA's 128 beside 192 (gluon_forward.HEAD_DIM_PAIRS).
V_DIMS = {192: 128}


def value_dim(head_dim: int) -> int:
    """V's head dim in this check's cases with Q's ``head_dim``."""
    return V_DIMS.get(head_dim, head_dim)


def default_for(default_config, head_dim: int, causal: bool):
    """``default_config`` (gluon_forward's) for Q's ``head_dim``, with V's where it differs (MLA)."""
    if value_dim(head_dim) != head_dim:
        return default_config(head_dim, causal, None, value_dim(head_dim))
    return default_config(head_dim, causal)
DEFAULT_VARIANTS = "n128s2,n128s3-eager,n128s2-nopp-eager,n128s2-eager-r224,n64s2-eager"


#: (batch, heads_q, heads_kv, n_q, n_k): every one runs for every dtype, head dim and causal flag.
CORRECTNESS_SHAPES = (
    (1, 2, 2, 1024, 1024),
    (1, 2, 1, 4096, 4096),       # GQA 2:1
    (1, 1, 1, 16384, 16384),
    (2, 4, 2, 113, 113),         # batch > 1, a partial tile
    (1, 2, 2, 1000, 1000),
    (1, 2, 2, 4097, 4097),       # one row past a whole tile
    (1, 2, 2, 1000, 4097),       # Nq < Nk
    (1, 2, 2, 4097, 1000),       # Nq > Nk: under causal, rows that see no key
    (1, 4, 1, 300, 129),         # MQA, Nq > Nk
    (1, 2, 2, 1, 1000),          # one query row
    (1, 2, 2, 64, 1),            # one key
)
#: The shapes each --variants configuration is checked on (bf16, both head dims, both causal flags).
#: The last two have more row blocks than an H100 or H200 has SMs (512 and 1056 with 128 rows), so
#: that a persistent configuration (``-p``) takes several items a CTA, causal ones of unequal
#: lengths and (Nq > Nk) some with no key tile.
VARIANT_SHAPES = ((1, 2, 2, 1000, 1000), (1, 2, 1, 4097, 4097), (1, 2, 2, 4097, 1000), (2, 4, 2, 113, 113),
                  (4, 16, 8, 1000, 1000), (2, 16, 4, 4097, 1000))
#: The attention variants checked (name, causal, window, ALiBi, softcap, sinks): each on
#: :data:`ATTENTION_VARIANT_SHAPES` at every head dim, in one dtype a head dim (bf16 at d64 and
#: d192, fp16 at d128), with the kernel's default configuration for it.
ATTENTION_VARIANTS = (
    ("w128:0", True, (128, 0), False, 0.0, False),       # a causal sliding window
    ("w256:64", False, (256, 64), False, 0.0, False),    # two-sided, not causal
    ("alibi", False, None, True, 0.0, False),
    ("causal-alibi", True, None, True, 0.0, False),
    ("cap30-x8", False, None, False, 30.0, False),
    ("causal-cap15-x8", True, None, False, 15.0, False),
    ("causal-sinks", True, None, False, 0.0, True),
    ("causal-w256:0-cap15-alibi-sinks-x8", True, (256, 0), True, 15.0, True),   # all at once
)
#: Softcap's cases scale q by this (``-x8``): scores of unit spread are nearly unchanged by a cap of
#: 15 or 30 (tanh(x / 30) * 30 is x within 1% up to |x| = 5), so a kernel that dropped the cap
#: would pass them; at 8x the scores reach the cap.
SOFTCAP_LOGIT_SCALE = 8.0
#: Shapes of the variant cases: GQA, Nq != Nk both ways (rows that see no key under causal or a
#: window), a partial tile with batch > 1.
ATTENTION_VARIANT_SHAPES = ((1, 2, 2, 1000, 1000), (1, 2, 1, 4097, 4097), (1, 2, 2, 4097, 1000),
                            (1, 2, 2, 1000, 4097), (2, 4, 2, 113, 113))
VARIANT_DTYPES = {64: "bfloat16", 128: "float16", 192: "bfloat16"}
#: The issue's speed cases, bf16, each causal and not.
BENCH_SHAPES = (
    (1, 16, 16384, 128),
    (4, 16, 4096, 128),
    (4, 32, 4096, 64),
    (8, 16, 1024, 128),
    (4, 16, 4096, 192),          # MLA: V's head dim 128 (the harness's MLA speed case)
)
IMPLS = ("gluon", "sdpa_cudnn", "sdpa_flash", "triton_flash")


# ---------------------------------------------------------------------------------------------
# Child side (touches CUDA)
# ---------------------------------------------------------------------------------------------


def _modules():
    from gluon_compile import ensure_package, load_gluon_forward

    gf = load_gluon_forward()
    ensure_package()
    from pytest_attnkit.implementations.triton_flash import launch as tf_launch

    return gf, tf_launch


def _inputs(shape, dtype_name: str, head_dim: int, seed: int, device: str = "cuda"):
    import torch

    batch, heads_q, heads_kv, n_q, n_k = shape
    dtype = getattr(torch, dtype_name)
    generator = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(batch, heads_q, n_q, head_dim, device=device, dtype=dtype, generator=generator)
    k = torch.randn(batch, heads_kv, n_k, head_dim, device=device, dtype=dtype, generator=generator)
    v = torch.randn(batch, heads_kv, n_k, value_dim(head_dim), device=device, dtype=dtype, generator=generator)
    return q, k, v


def _reference(q, k, v, causal: bool, scale: float, block_rows: int | None = None, variant: dict | None = None):
    """(oracle out, oracle natural LSE, plain out, plain LSE, rows that see a key), by blocks of
    query rows so that 16k x 16k never materializes: rows [r0, r1) see keys [0, r1 + Nk - Nq)
    under causal, and the block's diagonal is put where the whole one's is (``key_offset``: row
    ``r0 + i`` against key ``j``), which the masks and ALiBi's bias read. ``variant``: the
    window, ALiBi slopes, softcap and sinks (:func:`_variant_inputs`), None for none."""
    import torch

    from pytest_attnkit.masks import rows_with_a_key
    from pytest_attnkit.oracle import attention_math

    variant = variant or {}
    window = variant.get("window")
    batch, heads_q, n_q, head_dim = q.shape
    n_k = k.shape[2]
    outs = {"oracle": [], "plain": []}
    lses = {"oracle": [], "plain": []}
    rows = block_rows or max(64, min(n_q, (1 << 25) // max(1, batch * heads_q * n_k)))
    for r0 in range(0, n_q, rows):
        r1 = min(n_q, r0 + rows)
        keys = r1 + n_k - n_q if causal else n_k
        if keys <= 0 and variant.get("sinks") is None:
            for name, dtype in (("oracle", torch.float64), ("plain", q.dtype)):
                outs[name].append(torch.zeros(batch, heads_q, r1 - r0, v.shape[-1], device=q.device, dtype=dtype))
                lses[name].append(torch.zeros(batch, heads_q, r1 - r0, device=q.device, dtype=dtype))
            continue
        keys = max(keys, 1)  # with sinks a row that sees no key still has the sink's LSE
        qb, kb, vb = q[:, :, r0:r1], k[:, :, :keys], v[:, :, :keys]
        options = dict(causal=causal, scale=scale, window=window, softcap=variant.get("softcap", 0.0),
                       key_offset=r0 + n_k - n_q, return_lse=True)
        slopes, sinks = variant.get("alibi_slopes"), variant.get("sinks")
        for name, cast in (("oracle", torch.float64), ("plain", q.dtype)):
            # The oracle takes every input in float64; the plain reference keeps ALiBi's slopes
            # and the sinks float32, as the harness's does (oracle.forward_and_grads).
            wide = (lambda t: None if t is None else t.double()) if cast == torch.float64 else (lambda t: t)
            out, lse = attention_math(qb.to(cast), kb.to(cast), vb.to(cast), **options,
                                      alibi_slopes=wide(slopes), sinks=wide(sinks))
            outs[name].append(out)
            lses[name].append(lse)
    seen = rows_with_a_key(n_q, n_k, causal=causal, window=window, device=q.device)
    return (torch.cat(outs["oracle"], 2), torch.cat(lses["oracle"], 2), torch.cat(outs["plain"], 2),
            torch.cat(lses["plain"], 2), seen)


def _check_case(case: dict, gf, device: str = "cuda") -> dict:
    """One correctness case (``device`` other than cuda: only for testing this check against a
    stand-in for ``gf`` on the CPU)."""
    import torch

    from pytest_attnkit.worker.tolerance import FORWARD_FACTOR, compare

    shape, causal, head_dim = tuple(case["shape"]), case["causal"], case["head_dim"]
    q, k, v = _inputs(shape, case["dtype"], head_dim, case["seed"], device)
    scale = head_dim ** -0.5
    reason = gf.unsupported_reason(q, k, v, causal, scale)
    if reason is not None:
        return {"passed": False, "error": f"supports() refused: {reason}"}
    config = gf.Config.parse(case["config"]) if case.get("config") else None  # None: its default
    variant = _variant_inputs(case.get("variant"), q.shape[1], case["seed"], device)
    if variant.get("softcap"):
        q = (q.float() * SOFTCAP_LOGIT_SCALE).to(q.dtype)

    def run():
        o = torch.full((*q.shape[:3], v.shape[-1]), float("nan"), device=q.device, dtype=q.dtype)
        lse = torch.full(q.shape[:3], float("nan"), device=q.device, dtype=torch.float32)
        return gf.flash_fwd(q, k, v, causal, scale, config, out=(o, lse), **variant)

    start = time.perf_counter()
    out, lse2 = run()
    if q.is_cuda:
        torch.cuda.synchronize()
    first_call_s = time.perf_counter() - start
    repeats_equal = True
    for _ in range(2):
        again, again_lse = run()
        repeats_equal &= bool(torch.equal(again, out) and torch.equal(again_lse.nan_to_num(1.0), lse2.nan_to_num(1.0)))
    oracle, oracle_lse, plain, plain_lse, seen = _reference(q, k, v, causal, scale, variant=variant)
    dtype = q.dtype
    out_cmp = compare("out", out, oracle, plain, dtype=dtype, factor=FORWARD_FACTOR)
    lse_nat = lse2.double() * math.log(2.0)
    # With sinks every row has the sink in its denominator: a row that sees no key has the sink's
    # LSE (compared with the oracle's) and zeros; without, zeros and +inf.
    with_lse = torch.ones_like(seen) if variant.get("sinks") is not None else seen
    lse_cmp = compare("lse", lse_nat[:, :, with_lse], oracle_lse[:, :, with_lse], plain_lse[:, :, with_lse],
                      dtype=dtype, factor=FORWARD_FACTOR)
    unseen_ok = bool((out[:, :, ~seen] == 0).all()
                     and (variant.get("sinks") is not None
                          or (torch.isinf(lse2[:, :, ~seen]).all() and (lse2[:, :, ~seen] > 0).all())))
    return {
        "passed": out_cmp.passed and lse_cmp.passed and unseen_ok and repeats_equal,
        "out": {"max_error": out_cmp.max_error, "allowed": out_cmp.allowed, "plain_error": out_cmp.plain_error,
                "nonfinite": out_cmp.nonfinite, "worst_index": list(out_cmp.worst_index),
                "rel_l1": out_cmp.rel_l1},
        "lse": {"max_error": lse_cmp.max_error, "allowed": lse_cmp.allowed, "nonfinite": lse_cmp.nonfinite},
        "rows_without_key": int((~seen).sum().item()), "rows_without_key_ok": unseen_ok,
        "repeats_bitwise_equal": repeats_equal, "first_call_s": round(first_call_s, 3),
    }


def _variant_inputs(variant: dict | None, heads_q: int, seed: int, device: str = "cuda") -> dict:
    """A case's ``variant`` (window, alibi, softcap, sinks, as :data:`ATTENTION_VARIANTS` says) as
    :func:`gluon_forward.flash_fwd`'s keywords: ALiBi's slopes the usual geometric ones over the
    heads (float32 [Hq]), the sinks' logits random in [-1, 3) (float32 [Hq]); {} for none."""
    import torch

    if not variant:
        return {}
    keywords: dict = {}
    if variant.get("window") is not None:
        keywords["window"] = tuple(variant["window"])
    if variant.get("alibi"):
        keywords["alibi_slopes"] = torch.tensor([2.0 ** (-8.0 * (h + 1) / heads_q) for h in range(heads_q)],
                                                device=device, dtype=torch.float32)
    if variant.get("softcap"):
        keywords["softcap"] = float(variant["softcap"])
    if variant.get("sinks"):
        generator = torch.Generator(device=device).manual_seed(seed + 7)
        keywords["sinks"] = torch.rand(heads_q, device=device, generator=generator) * 4.0 - 1.0
    return keywords


def _flops(batch: int, heads: int, n: int, head_dim: int, causal: bool) -> float:
    """2 x (Q's head dim + V's) a visible pair: QK^T's and PV's multiply-adds."""
    pairs = n * (n + 1) // 2 if causal else n * n
    return 2.0 * batch * heads * (head_dim + value_dim(head_dim)) * pairs


def _bench_case(case: dict, gf, tf_launch) -> dict:
    import torch
    import triton
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    batch, heads, n, head_dim = case["shape"]
    causal = case["causal"]
    q, k, v = _inputs((batch, heads, heads, n, n), case.get("dtype", "bfloat16"), head_dim, 1234)
    scale = head_dim ** -0.5
    flops = _flops(batch, heads, n, head_dim, causal)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        expected = sdpa(q, k, v, is_causal=causal, scale=scale)
    result = {"flops": flops, "ms": {}, "tflops": {}, "max_diff_vs_cudnn": {}}

    def timed(name, fn, backend=None):
        try:
            if backend is None:
                ms = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
            else:
                with sdpa_kernel(backend):
                    ms = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
        except Exception as exc:  # one backend refusing must not lose the others
            result.setdefault("errors", {})[name] = f"{type(exc).__name__}: {str(exc)[:300]}"
            return
        result["ms"][name] = ms
        result["tflops"][name] = flops / ms / 1e9

    configs = case.get("configs") or [None]
    for text in configs:
        config = None if text is None else gf.Config.parse(text)
        name = "gluon" if text is None else f"gluon {text}"
        got, _ = gf.flash_fwd(q, k, v, causal, scale, config)
        torch.cuda.synchronize()
        result["max_diff_vs_cudnn"][name] = float((got.float() - expected.float()).abs().max().item())
        timed(name, lambda: gf.flash_fwd(q, k, v, causal, scale, config))
    if case.get("baselines", True):
        timed("sdpa_cudnn", lambda: sdpa(q, k, v, is_causal=causal, scale=scale), SDPBackend.CUDNN_ATTENTION)
        timed("sdpa_flash", lambda: sdpa(q, k, v, is_causal=causal, scale=scale), SDPBackend.FLASH_ATTENTION)
        got, _ = tf_launch.flash_fwd(q, k, v, causal, scale)
        torch.cuda.synchronize()
        result["max_diff_vs_cudnn"]["triton_flash"] = float((got.float() - expected.float()).abs().max().item())
        timed("triton_flash", lambda: tf_launch.flash_fwd(q, k, v, causal, scale))
    return result


def _matmul_ceiling() -> dict:
    import torch
    import triton

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = triton.testing.do_bench(lambda: a @ b, warmup=25, rep=100, return_mode="median")
    return {"ms": ms, "tflops": 2 * 8192 ** 3 / ms / 1e9}


def child(mode: str, cases_path: str) -> int:
    cases = json.loads(Path(cases_path).read_text())
    if mode == "selftest":  # the parent's deadlines and crash handling, without a GPU
        return harness.selftest_child(cases)
    import torch

    gf, tf_launch = _modules()
    if mode == "compile":
        def compile_one(case: dict) -> None:
            q, k, v = _inputs((1, 2, 2, 256, 256), case["dtype"], case["head_dim"], 0)
            variant = case.get("variant") or {}
            gf.warmup(q, k, v, case["causal"], 0.1, gf.Config.parse(case["config"]) if case.get("config") else None,
                      alibi=bool(variant.get("alibi")),
                      window=tuple(variant["window"]) if variant.get("window") else None,
                      softcap=float(variant.get("softcap", 0.0)), sinks=bool(variant.get("sinks")))

        return harness.compile_each(cases, compile_one)
    harness.hello()

    def run_one(case: dict) -> dict:
        if mode == "correct":
            return _check_case(case, gf)
        if case.get("kind") == "ceiling":
            return _matmul_ceiling()
        return _bench_case(case, gf, tf_launch)

    return harness.run_each(cases, run_one)


# ---------------------------------------------------------------------------------------------
# Parent side (no CUDA here)
# ---------------------------------------------------------------------------------------------


def _describe(mode: str, event: dict) -> str:
    if mode == "correct":
        if "out" not in event:
            return f"  {event['id']}: FAIL {event.get('error', '')}"
        verdict = "ok  " if event["passed"] else "FAIL"
        extra = "" if event["repeats_bitwise_equal"] else " (repeats differ)"
        if event["rows_without_key"]:
            extra += f", {event['rows_without_key']} rows see no key ({'ok' if event['rows_without_key_ok'] else 'WRONG'})"
        return (f"  {verdict} {event['id']}: out {event['out']['max_error']:.2e} <= {event['out']['allowed']:.2e}"
                f", lse {event['lse']['max_error']:.2e} <= {event['lse']['allowed']:.2e}{extra}")
    if event.get("error") and "tflops" not in event:
        return f"  {event['id']}: ERROR {event['error'][:300]}"
    if "tflops" in event and isinstance(event["tflops"], dict):
        figures = ", ".join(f"{name} {value:.0f}" for name, value in event["tflops"].items())
        return f"  {event['id']}: TFLOP/s {figures}" + (f"; errors {event['errors']}" if event.get("errors") else "")
    return f"  {event['id']}: {event.get('tflops', 0):.0f} TFLOP/s"


def fits(gf, config: str, head_dim: int) -> bool:
    """Whether a configuration can run at a head dim (shared memory, the register split): one that
    cannot (n128s3 at d128, three consumers at d128) is left out of that head dim's cases."""
    parsed = gf.Config.parse(config)
    reason = getattr(gf, "register_reason", lambda c: None)(parsed)
    if value_dim(head_dim) != head_dim:
        if parsed.persistent or parsed.consumers != 2:
            return False  # MLA's O goes over Q's buffer in the one-item grid with two consumers
        return gf.shared_bytes(parsed, head_dim, head_dim_v=value_dim(head_dim)) <= gf.SHARED_LIMIT and reason is None
    return gf.shared_bytes(parsed, head_dim) <= gf.SHARED_LIMIT and reason is None


def attention_variant_cases() -> list[dict]:
    """The cases of :data:`ATTENTION_VARIANTS` (each at every head dim on each of
    :data:`ATTENTION_VARIANT_SHAPES`), each with its kernel's default configuration."""
    cases = []
    for name, causal, window, alibi, softcap, sinks in ATTENTION_VARIANTS:
        variant = {"window": list(window) if window else None, "alibi": alibi, "softcap": softcap, "sinks": sinks}
        for head_dim in HEAD_DIMS:
            dtype = VARIANT_DTYPES[head_dim]
            for seed, shape in enumerate(ATTENTION_VARIANT_SHAPES):
                b, hq, hk, nq, nk = shape
                cases.append({"id": f"{SHORT[dtype]} d{head_dim} {name} b{b} h{hq}/{hk} q{nq} k{nk} [default]",
                              "dtype": dtype, "head_dim": head_dim, "causal": causal, "config": None,
                              "variant": variant, "shape": list(shape), "seed": 200 + seed})
    return cases


def attention_variant_specs() -> list[dict]:
    """What the variant cases compile: one kernel a (dtype, head dim, variant), its default tiles."""
    seen, specs = set(), []
    for case in attention_variant_cases():
        name = case["id"].split(" b", 1)[0]
        if name not in seen:
            seen.add(name)
            specs.append({"id": f"{name} (default)", "dtype": case["dtype"], "head_dim": case["head_dim"],
                          "causal": case["causal"], "config": None, "variant": case["variant"]})
    return specs


def correctness_cases(variants: list[str], default_config, gf=None) -> list[dict]:
    cases = []
    for dtype in DTYPES:
        for head_dim in HEAD_DIMS:
            for causal in (False, True):
                config = str(default_for(default_config, head_dim, causal))
                for seed, shape in enumerate(CORRECTNESS_SHAPES):
                    cases.append(_correctness_case(dtype, head_dim, causal, config, shape, seed))
    for variant in variants:
        for head_dim in HEAD_DIMS:
            if gf is not None and not fits(gf, variant, head_dim):
                continue
            for causal in (False, True):
                for seed, shape in enumerate(VARIANT_SHAPES):
                    cases.append(_correctness_case("bfloat16", head_dim, causal, variant, shape, 100 + seed))
    return cases


def _correctness_case(dtype, head_dim, causal, config, shape, seed) -> dict:
    b, hq, hk, nq, nk = shape
    name = f"{ {'bfloat16': 'bf16', 'float16': 'fp16'}[dtype]} d{head_dim} {'causal' if causal else 'full'} b{b} h{hq}/{hk} q{nq} k{nk} [{config}]"
    return {"id": name, "dtype": dtype, "head_dim": head_dim, "causal": causal, "config": config,
            "shape": list(shape), "seed": seed}


#: A dtype's short name in case names and tables.
SHORT = {"bfloat16": "bf16", "float16": "fp16"}


def bench_label(batch: int, heads: int, n: int, head_dim: int, causal: bool, dtype: str = "bfloat16") -> str:
    """A timing case's name: the harness's (``b4-h32-q4096 d64 causal``), and `` fp16`` after it
    for a dtype other than bf16 (bf16's names stay those of earlier runs' check.json)."""
    label = harness.case_label(batch, heads, n, head_dim, causal)
    return label if dtype == "bfloat16" else f"{label} {SHORT[dtype]}"


def bench_cases(variants: list[str], gf=None, dtypes: tuple[str, ...] = ("bfloat16",)) -> list[dict]:
    cases = [{"id": "matmul bf16 8192^3", "kind": "ceiling"}]
    for dtype in dtypes:
        for batch, heads, n, head_dim in BENCH_SHAPES:
            for causal in (False, True):
                label = bench_label(batch, heads, n, head_dim, causal, dtype)
                cases.append({"id": label, "shape": [batch, heads, n, head_dim], "causal": causal, "dtype": dtype})
    for dtype in dtypes if variants else ():
        for batch, heads, n, head_dim in BENCH_SHAPES:
            configs = [v for v in variants if gf is None or fits(gf, v, head_dim)]
            for causal in (False, True) if configs else ():
                label = f"{bench_label(batch, heads, n, head_dim, causal, dtype)} variants"
                cases.append({"id": label, "shape": [batch, heads, n, head_dim], "causal": causal,
                              "configs": configs, "baselines": False, "dtype": dtype})
    return cases


def variants_table(bench: dict, variants: list[str], dtypes: tuple[str, ...]) -> list[str]:
    """The configurations' table: TFLOP/s of the default and of each variant, each dtype's cases,
    with cuDNN's TFLOP/s (same dtype, same run) and the best Gluon one's ratio to it."""
    lines = ["| case | dtype | cuDNN | default | " + " | ".join(variants) + " | best / cuDNN | max diff |",
             "|---|---|---|---|" + "---|" * len(variants) + "---|---|"]
    for dtype in dtypes:
        for batch, heads, n, head_dim in BENCH_SHAPES:
            for causal in (False, True):
                label = bench_label(batch, heads, n, head_dim, causal, dtype)
                base = bench.get(label, {}).get("tflops", {})
                t = bench.get(f"{label} variants", {}).get("tflops", {})
                mine = [base.get("gluon")] + [t.get(f"gluon {v}") for v in variants]
                cells = [f"{x:.0f}" if x is not None else "-" for x in [base.get("sdpa_cudnn")] + mine]
                got = [x for x in mine if x is not None]
                best = f"{max(got) / base['sdpa_cudnn']:.2f}" if got and base.get("sdpa_cudnn") else "-"
                # The largest |out - cuDNN's out| of the Gluon runs of this row (a wrong one stands out).
                diffs = [d for key in (label, f"{label} variants")
                         for name, d in bench.get(key, {}).get("max_diff_vs_cudnn", {}).items()
                         if name.startswith("gluon")]
                worst = f"{max(diffs):.1e}" if diffs else "-"
                lines.append(f"| {harness.case_label(batch, heads, n, head_dim, causal)} | {SHORT[dtype]} | "
                             + " | ".join(cells) + f" | {best} | {worst} |")
    return lines


def report(results: dict, bench: dict, variants: list[str], hello: dict,
           dtypes: tuple[str, ...] = ("bfloat16",)) -> str:
    lines = []
    correct = results.get("correct", {})
    passed = sum(1 for r in correct.values() if r.get("passed"))
    lines.append(f"## Correctness: {passed} of {len(correct)} cases passed")
    failed = [(case_id, r) for case_id, r in correct.items() if not r.get("passed")]
    for case_id, r in failed:
        detail = r.get("error") or (f"out {r['out']['max_error']:.2e} (allowed {r['out']['allowed']:.2e}), "
                                    f"lse {r['lse']['max_error']:.2e} (allowed {r['lse']['allowed']:.2e}), "
                                    f"repeats equal {r['repeats_bitwise_equal']}, "
                                    f"no-key rows ok {r['rows_without_key_ok']}")
        lines.append(f"- FAIL {case_id}: {detail}")
    if correct and not failed:
        worst = max(correct.values(), key=lambda r: r["out"]["max_error"] / r["out"]["allowed"])
        lines.append(f"- worst headroom (out error / allowed): "
                     f"{worst['out']['max_error'] / worst['out']['allowed']:.2f} ({worst['id']})")
    lines.append("")
    if not bench:
        lines.append("## Speed: not timed (--skip-timing, or the timing phase gave nothing)")
        return "\n".join(lines)
    ceiling = bench.get("matmul bf16 8192^3", {})
    lines.append(f"## Speed ({', '.join(SHORT[d] for d in dtypes)}; TFLOP/s, do_bench median; "
                 f"{hello.get('device', '?')}; bf16 matmul ceiling {ceiling.get('tflops', float('nan')):.0f})")
    lines.append("")
    lines.append("| case | dtype | gluon | sdpa cuDNN | sdpa FLASH | triton_flash | gluon / cuDNN "
                 "| triton_flash / cuDNN |")
    lines.append("|---|---|---|---|---|---|---|---|")
    for dtype in dtypes:
        for batch, heads, n, head_dim in BENCH_SHAPES:
            for causal in (False, True):
                label = bench_label(batch, heads, n, head_dim, causal, dtype)
                t = bench.get(label, {}).get("tflops", {})
                cells = [f"{t[name]:.0f}" if name in t else "-" for name in IMPLS]
                ratios = [f"{t[name] / t['sdpa_cudnn']:.2f}" if name in t and "sdpa_cudnn" in t else "-"
                          for name in ("gluon", "triton_flash")]
                lines.append(f"| {harness.case_label(batch, heads, n, head_dim, causal)} | {SHORT[dtype]} | "
                             + " | ".join(cells + ratios) + " |")
    if variants:
        from implementations.triton_flash.gluon_forward import default_config

        lines.append("")
        lines.append("Gluon configurations (TFLOP/s; the default is gluon_forward.default_config's, "
                     f"{harness.defaults_words(default_config)}; max |out - cuDNN| of each in check.json):")
        lines.append("")
        lines += variants_table(bench, variants, dtypes)
    return "\n".join(lines)


def main() -> int:
    parser = harness.check_parser(__doc__, "Gluon", DEFAULT_VARIANTS)
    parser.add_argument("--timing-dtypes", default="bfloat16", metavar="DTYPES",
                        help="comma-separated dtypes the timing phase runs the issue's cases in, each against "
                             "cuDNN in the same dtype (default: bfloat16; issue 42's goal: bfloat16,float16)")
    parser.add_argument("--no-attention-variants", action="store_true",
                        help="leave out the cases of windows, ALiBi, softcap and sinks (ATTENTION_VARIANTS)")
    parser.add_argument("--child", nargs=2, metavar=("MODE", "CASES"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(*args.child)
    if not args.out:
        parser.error("--out DIR is required")

    from gluon_compile import load_gluon_forward

    gf = load_gluon_forward()  # no CUDA in this process: the Config parser and the defaults only
    variants = [v for v in args.variants.split(",") if v.strip()]
    timing_dtypes = tuple(d.strip() for d in args.timing_dtypes.split(",") if d.strip())
    if not timing_dtypes or any(d not in DTYPES for d in timing_dtypes):
        parser.error(f"--timing-dtypes: a comma-separated list of {', '.join(DTYPES)}")
    for text in variants:
        gf.Config.parse(text)  # a typo fails here, not in a child
    record = harness.check_record(variants, timing_dtypes=list(timing_dtypes))

    specs, seen_specs = [], set()
    for dtype in DTYPES:
        for head_dim in HEAD_DIMS:
            for causal in (False, True):
                # Variants run in bf16's correctness cases and in every timed dtype.
                timed_here = dtype == "bfloat16" or dtype in timing_dtypes
                default = str(default_for(gf.default_config, head_dim, causal))
                for config in [default] + (variants if timed_here else []):
                    key = (dtype, head_dim, causal, config)
                    if key not in seen_specs and fits(gf, config, head_dim):
                        seen_specs.add(key)
                        specs.append({"id": f"{dtype} d{head_dim} {'causal' if causal else 'full'} {config}",
                                      "dtype": dtype, "head_dim": head_dim, "causal": causal, "config": config})

    def report_all(correct: dict, bench: dict, hello: dict, bad: list[str], hung_list: list[str]) -> str:
        text = report({"correct": correct}, bench, variants, hello, timing_dtypes)
        if bad or hung_list:
            text += (f"\n\nNot timed (a case failed or hung): {', '.join(bad) or 'none'}; hung: "
                     f"{', '.join(hung_list) or 'none'}")
        return text

    cases = correctness_cases(variants, gf.default_config, gf)
    if not args.no_attention_variants:
        specs += attention_variant_specs()
        cases += attention_variant_cases()
    return harness.check_main(Path(__file__), args, "Gluon forward check", record, specs, cases,
                              lambda timed: bench_cases(timed, gf, timing_dtypes), report_all, _describe,
                              going_on=True)


if __name__ == "__main__":
    sys.exit(main())
