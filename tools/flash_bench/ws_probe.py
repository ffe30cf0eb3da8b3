"""Time the warp-specialized probes (``ws_kernel.py``, ``ws_bwd_kernel.py``) against
triton_flash and cuDNN, or check them on the CPU.

For each case (the speed suite's shapes: 16k tokens, H x D = 2048) it times, with versions.py's
timer (CUDA events, L2 flushed, the GPU spun ahead of the start event):
- forward: ``cudnn`` (torch's scaled_dot_product_attention on its cuDNN backend, bf16 cases),
  ``triton_flash`` (the shipped forward, ``launch.flash_fwd`` / ``flash_fwd_fp8``, default tiles;
  FP8 gets V keys-contiguous, as the probe does) and ``ws BMxBN/S``, the probe at each tile, with
  its largest |difference| from triton_flash's output over that output's largest |value| (WRONG
  past 0.02, 0.05 for FP8: the interpreter check cannot see the warp-specialized lowering);
- ``--backward``: the shipped backward whole (``triton_flash bwd``) and its dK/dV kernel alone
  (from the profiler), ``cudnn bwd``, and the dK/dV probe at each tile (events, and from the
  profiler as the shipped kernel; ratios only between profiled times), with its relative
  difference from the shipped dK and dV.
A probe tile that fails to compile or launch is reported, not fatal. A tile that hangs is not:
so first ``ws_min.py attn2`` runs in its own process, and if Triton's warp specialization does not
finish there within a minute (triton 3.6 on an H200: it hangs; results/2026-11-23-h200-ws-runtime)
nothing is timed and the exit status is 3. ``--force`` skips that check.

``--check`` runs both probes in Triton's interpreter (set ``TRITON_INTERPRET=1``) on small fp16
cases against float64 attention (not FP8: the interpreter's e4m3 casts are not exact) and exits
1 if an error passes its bound.

Usage (GPU): python3 tools/flash_bench/ws_probe.py --out FILE.json [--backward] [--reps 30] [--cases a,b]
       (CPU): TRITON_INTERPRET=1 python3 tools/flash_bench/ws_probe.py --check
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.tools.tensor_descriptor import TensorDescriptor

from pytest_attnkit.implementations.triton_flash import launch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from versions import kernel_times, timed  # noqa: E402
from ws_bwd_kernel import ws_bwd_dkdv  # noqa: E402
from ws_kernel import ws_fwd  # noqa: E402

LOG2E = 1.4426950408889634
# name: (dtype, head_dim, seqlen, causal, probe tiles (block_m, block_n, num_stages))
BF16_D128 = [(128, 128, 2), (128, 64, 2), (128, 64, 3), (256, 64, 2)]
BF16_D64 = [(128, 128, 2), (128, 128, 3), (128, 256, 2), (256, 64, 2)]
FP8_D128 = [(128, 128, 2), (128, 128, 3), (128, 256, 2)]
FP8_D64 = [(128, 128, 2), (128, 256, 2), (128, 128, 3), (256, 128, 2)]
CASES = {}
for _n in (4096, 16384):
    for _causal in (False, True):
        _tag = f"{_n // 1024}k{'-causal' if _causal else ''}"
        CASES[f"bf16-d128-{_tag}"] = ("bf16", 128, _n, _causal, BF16_D128)
        CASES[f"bf16-d64-{_tag}"] = ("bf16", 64, _n, _causal, BF16_D64)
        CASES[f"fp8-d128-{_tag}"] = ("fp8", 128, _n, _causal, FP8_D128)
        CASES[f"fp8-d64-{_tag}"] = ("fp8", 64, _n, _causal, FP8_D64)
CASES["bf16-d128-1k"] = ("bf16", 128, 1024, False, BF16_D128)
# The backward's cases: bf16, dK/dV probe tiles (block_m, block_n, num_stages); block_n is split
# between the two consumer warp groups.
BWD_D128 = [(64, 128, 2), (64, 128, 3), (32, 128, 2)]
BWD_D64 = [(64, 128, 2), (128, 128, 2), (64, 128, 3)]
BWD_CASES = {f"bwd-d{d}-{n // 1024}k{'-causal' if causal else ''}":
             (d, n, causal, False, BWD_D128 if d == 128 else BWD_D64)
             for d in (128, 64) for n in (4096, 16384) for causal in (False, True)}
BWD_CASES["bwd-d128-16k-alibi"] = (128, 16384, False, True, BWD_D128)  # issue 21's case against torch_flex


def descriptor(t: torch.Tensor, block: list[int]) -> TensorDescriptor:
    return TensorDescriptor(t, list(t.shape), list(t.stride()), block)


def probe(q, k, v_or_vt, o, descales, causal: bool, scale: float, tiles: tuple[int, int, int], fp8: bool):
    block_m, block_n, stages = tiles
    batch, heads, n_q, d = q.shape
    heads_kv, n_k = k.shape[1], k.shape[2]
    dq = descriptor(q, [1, 1, block_m, d])
    dk = descriptor(k, [1, 1, block_n, d])
    if fp8:  # v_or_vt: [B, H, D, N] viewed keys-contiguous
        vt = v_or_vt.transpose(2, 3)
        dv = descriptor(vt, [1, 1, d, block_n])
    else:
        dv = descriptor(v_or_vt, [1, 1, block_n, d])
    grid = (math.ceil(n_q / block_m), batch * heads)
    ws_fwd[grid](dq, dk, dv, o, *descales, o.stride(0), o.stride(1), o.stride(2),
                 heads, heads_kv, heads // heads_kv, n_q, n_k, scale * LOG2E,
                 HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=causal,
                 MASKED=causal or n_k % block_n != 0, FP8=fp8, WS=True,
                 num_warps=4, num_stages=stages)
    return o


def probe_dkdv(q, k, v, do, lse, delta, dk, dv, causal: bool, scale: float, tiles: tuple[int, int, int],
               slopes=None):
    """The dK/dV probe on [B, H, N, D] q, k, v, dO and the base-2 LSE and delta [B, H, N]; ALiBi
    with ``slopes`` (float32 [H])."""
    block_m, block_n, stages = tiles
    batch, heads, n, d = q.shape
    if n % block_n or n % block_m:
        raise ValueError(f"the dK/dV probe needs lengths that are multiples of its tiles, got {n} and {tiles}")
    ws_bwd_dkdv[(n // block_n, batch * heads)](
        descriptor(q, [1, 1, block_m, d]), descriptor(k, [1, 1, block_n, d]), descriptor(v, [1, 1, block_n, d]),
        descriptor(do, [1, 1, block_m, d]), descriptor(lse, [1, 1, block_m]), descriptor(delta, [1, 1, block_m]),
        dk, dv, dk if slopes is None else slopes, dk.stride(0), dk.stride(1), dk.stride(2), heads, n, scale,
        scale * LOG2E, HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=causal, ALIBI=slopes is not None,
        WS=True, num_warps=4, num_stages=stages)
    return dk, dv


def run_backward(name: str, spec: tuple, reps: int) -> dict:
    d, n, causal, alibi, tiles = spec
    batch, heads = 16384 // n, 2048 // d
    gen = torch.Generator(device="cuda").manual_seed(0)
    shape = (batch, heads, n, d)
    q, k, v, do = (torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(4))
    slopes = torch.rand(heads, device="cuda", generator=gen) * 0.3 if alibi else None  # as versions.py
    variants = launch.Variants(causal=causal, alibi_slopes=slopes)
    scale = d ** -0.5
    flops = 8.0 * batch * heads * n * n * d / (2 if causal else 1)  # dK/dV's 4 products of 2 N^2 D
    row: dict = {"case": name, "shape": list(shape), "causal": causal, "tflop": flops / 1e12, "ms": {}, "diff": {}}
    o, lse = launch.flash_fwd(q, k, v, causal, scale, variants=variants)
    delta = (o.float() * do.float()).sum(-1).contiguous()

    def shipped():
        return launch.flash_bwd(do, q, k, v, o, lse, causal, scale, variants=variants)

    _, ref_dk, ref_dv, _ = shipped()
    row["ms"]["triton_flash bwd"] = timed(shipped, reps)
    kernels = kernel_times(shipped)
    row["ms"]["triton_flash dkdv"] = next((ms for key, ms in kernels.items() if "dkdv" in key), None)
    row["kernels_ms"] = kernels
    if not alibi:  # cuDNN has no ALiBi here; the speed suite compares that case with torch_flex
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            out = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=causal, scale=scale)
        row["ms"]["cudnn bwd"] = timed(lambda: torch.autograd.grad(out, leaves, do, retain_graph=True), reps)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    for t in tiles:
        label = f"ws dkdv {t[0]}x{t[1]}/{t[2]}"
        try:
            dk.fill_(float("nan")), dv.fill_(float("nan"))
            probe_dkdv(q, k, v, do, lse, delta, dk, dv, causal, scale, t, slopes)
            torch.cuda.synchronize()
            row["diff"][label] = max(float((dk.float() - ref_dk.float()).abs().max() / ref_dk.float().abs().max()),
                                     float((dv.float() - ref_dv.float()).abs().max() / ref_dv.float().abs().max()))
            call = lambda: probe_dkdv(q, k, v, do, lse, delta, dk, dv, causal, scale, t, slopes)  # noqa: E731
            row["ms"][label] = timed(call, reps)
            # and as the shipped dK/dV was timed: the profiler's kernel time (no L2 flush, 3 calls)
            row["ms"][f"{label} profiled"] = kernel_times(call, match="ws_").get("ws_bwd_dkdv")
        except Exception as error:  # noqa: BLE001 - a tile that does not compile is a finding
            row["ms"][label] = None
            row["diff"][label] = f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"
    return row


def check() -> int:
    """Both probes in the interpreter against float64 attention; 1 if an error passes its bound."""
    torch.manual_seed(0)
    worst = 0.0
    # (batch, heads_q, heads_kv, n_q, n_k, head_dim, causal, block_m, block_n): GQA, causal (bottom-right
    # with n_q < n_k too), ragged rows and keys
    for b, hq, hkv, nq, nk, d, causal, bm, bn in [(1, 2, 1, 256, 256, 64, False, 128, 64),
                                                  (2, 2, 2, 256, 256, 64, True, 128, 64),
                                                  (1, 4, 2, 192, 192, 32, True, 128, 32),
                                                  (1, 2, 2, 200, 200, 64, False, 128, 64),
                                                  (1, 2, 1, 100, 260, 64, True, 64, 64)]:
        q = torch.randn(b, hq, nq, d, dtype=torch.float16)
        k, v = (torch.randn(b, hkv, nk, d, dtype=torch.float16) for _ in range(2))
        o = torch.full((b, hq, nq, d), float("nan"), dtype=torch.float32)
        probe(q, k, v, o, (o, o, o), causal, d ** -0.5, (bm, bn, 2), fp8=False)  # descales unused
        ref, _, _ = attention64(q, k, v, causal)
        error = float((o.double() - ref).abs().max())
        worst = max(worst, error if math.isfinite(error) else math.inf)
        print(f"forward b{b} h{hq}:{hkv} q{nq} k{nk} d{d}{' causal' if causal else ''}: max error {error:.1e}")
    # (batch, heads, n, head_dim, causal, alibi, block_m, block_n)
    for b, h, n, d, causal, alibi, bm, bn in [(1, 2, 256, 64, False, False, 64, 128),
                                              (2, 1, 256, 32, True, False, 64, 128),
                                              (1, 2, 384, 64, True, False, 128, 128),
                                              (1, 2, 256, 64, False, True, 64, 128)]:
        q, k, v, do = (torch.randn(b, h, n, d, dtype=torch.float16) for _ in range(4))
        slopes = torch.rand(h) * 0.3 if alibi else None
        out, lse, grads = attention64(q, k, v, causal, do, slopes)
        delta = (out * do.double()).sum(-1).float().contiguous()
        dk, dv = (torch.empty(b, h, n, d, dtype=torch.float32) for _ in range(2))
        probe_dkdv(q, k, v, do, (lse / math.log(2)).float().contiguous(), delta, dk, dv, causal, d ** -0.5,
                   (bm, bn, 2), slopes)
        error = max(float((dk.double() - grads[1]).abs().max()), float((dv.double() - grads[2]).abs().max()))
        worst = max(worst, error if math.isfinite(error) else math.inf)  # max() would pass over a NaN
        flags = (" causal" if causal else "") + (" alibi" if alibi else "")
        print(f"dK/dV b{b} h{h} n{n} d{d}{flags}: max error {error:.1e}")
    # fp16 P and dS against float64: a few 1e-4 on these sizes; a wrong mask or scale is 1e-1 and up
    bound = 2e-3
    print(f"worst {worst:.1e} against a bound of {bound:.0e}: {'ok' if worst <= bound else 'FAILED'}")
    return 0 if worst <= bound else 1


def attention64(q, k, v, causal: bool, do=None, slopes=None):
    """(output, natural LSE, (dq, dk, dv) or None) in float64; causal bottom-right (row i sees
    keys j <= i + Nk - Nq, every row at least one here), ALiBi's -slope * |i - j| with ``slopes``
    [H] (Nq = Nk)."""
    group = q.shape[1] // k.shape[1]
    qd, kd, vd = (t.double().requires_grad_() for t in (q, k, v))
    scores = qd @ kd.repeat_interleave(group, 1).transpose(-1, -2) * q.shape[-1] ** -0.5
    if slopes is not None:
        rows = torch.arange(q.shape[2], dtype=torch.float64)
        scores = scores - slopes.double()[:, None, None] * (rows[:, None] - rows[None, :]).abs()
    if causal:
        n_q, n_k = scores.shape[-2:]
        scores = scores.masked_fill(torch.ones(n_q, n_k, dtype=torch.bool).triu(n_k - n_q + 1), float("-inf"))
    out = torch.softmax(scores, -1) @ vd.repeat_interleave(group, 1)
    grads = torch.autograd.grad(out, (qd, kd, vd), do.double()) if do is not None else None
    return out.detach(), torch.logsumexp(scores, -1).detach(), grads


def run_case(name: str, spec: tuple, reps: int) -> dict:
    kind, d, n, causal, tiles = spec
    batch, heads = 16384 // n, 2048 // d
    gen = torch.Generator(device="cuda").manual_seed(0)
    shape = (batch, heads, n, d)
    q, k, v = (torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
    scale = d ** -0.5
    flops = 4.0 * batch * heads * n * n * d / (2 if causal else 1)
    row: dict = {"case": name, "shape": list(shape), "causal": causal, "tflop": flops / 1e12, "ms": {}, "diff": {}}
    o = torch.empty(shape, device="cuda", dtype=torch.bfloat16)
    if kind == "bf16":
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]), torch.no_grad():
            row["ms"]["cudnn"] = timed(lambda: torch.nn.functional.scaled_dot_product_attention(
                q, k, v, is_causal=causal, scale=scale), reps)
        ref = launch.flash_fwd(q, k, v, causal, scale, variants=launch.Variants(causal=causal))[0]
        row["ms"]["triton_flash"] = timed(lambda: launch.flash_fwd(
            q, k, v, causal, scale, variants=launch.Variants(causal=causal)), reps)
        descales = (o, o, o)  # unused by the bf16 probe
        v_in = v
    else:
        f8 = torch.float8_e4m3fn
        amax = [x.abs().amax(dim=(2, 3)).float() / 448.0 for x in (q, k, v)]
        q8, k8, v8 = ((x / s[:, :, None, None]).to(f8) for x, s in zip((q, k, v), amax))
        descales = tuple(s.contiguous() for s in amax)
        v_in = launch.keys_contiguous(v8)  # both get V keys-contiguous: no transposition timed
        ref = launch.flash_fwd_fp8(q8, k8, v_in, descales, causal, scale)
        row["ms"]["triton_flash"] = timed(lambda: launch.flash_fwd_fp8(q8, k8, v_in, descales, causal, scale), reps)
        q, k = q8, k8
    for t in tiles:
        label = f"ws {t[0]}x{t[1]}/{t[2]}"
        try:
            o.fill_(float("nan"))  # a row the tile leaves unwritten shows, not the last tile's result
            out = probe(q, k, v_in, o, descales, causal, scale, t, kind == "fp8")
            torch.cuda.synchronize()
            row["diff"][label] = float((out.float() - ref.float()).abs().max() / ref.float().abs().max())
            row["ms"][label] = timed(lambda: probe(q, k, v_in, o, descales, causal, scale, t, kind == "fp8"), reps)
        except Exception as error:  # noqa: BLE001 - a tile that does not compile is a finding
            row["ms"][label] = None
            row["diff"][label] = f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"
    return row


def warp_specialization_problem(limit_s: float = 60.0) -> str | None:
    """Why this GPU cannot run a warp-specialized kernel (ws_min.py's ``attn2``, in a process of
    its own, so that a hang dies with it), or None if it can."""
    command = [sys.executable, "-u", str(Path(__file__).resolve().parent / "ws_min.py"), "attn2"]
    shown = "ws_min.py attn2"
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=limit_s)
    except subprocess.TimeoutExpired:
        return f"`{shown}` did not finish in {limit_s:.0f} s (a warp-specialized kernel hangs)"
    if done.returncode != 0 or " done" not in done.stdout:
        last = (done.stderr.strip().splitlines() or done.stdout.strip().splitlines() or ["no output"])[-1]
        return f"`{shown}` failed (exit {done.returncode}): {last[:60]}"
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out")
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--cases", default="")
    parser.add_argument("--backward", action="store_true", help="time the dK/dV probe (BWD_CASES)")
    parser.add_argument("--check", action="store_true", help="interpreter check (TRITON_INTERPRET=1), no GPU")
    parser.add_argument("--force", action="store_true", help="time even if ws_min.py attn2 does not finish")
    args = parser.parse_args()
    if args.check:
        return check()
    if not args.out:
        parser.error("--out is required to time")
    if not args.force:
        problem = warp_specialization_problem()
        if problem:
            print(f"ws_probe: not timing: {problem}", file=sys.stderr)
            return 3
    table = BWD_CASES if args.backward else CASES
    names = [c for c in args.cases.split(",") if c] or list(table)
    unknown = [name for name in names if name not in table]
    if unknown:
        parser.error(f"unknown cases {', '.join(unknown)} (known: {', '.join(table)})")
    rows = []
    for name in names:
        row = (run_backward if args.backward else run_case)(name, table[name], args.reps)
        rows.append(row)
        base = row["ms"]["triton_flash dkdv" if args.backward else "triton_flash"]
        cells = []
        for label, ms in row["ms"].items():
            if ms is None:
                cells.append(f"{label}: failed ({row['diff'][label]})")
                continue
            diff = row["diff"].get(label)
            extra = ""
            if isinstance(diff, float):  # largest |difference| over the shipped output's largest |value|
                bound = 0.05 if "fp8" in name else 0.02
                extra = f" diff {diff:.1e}" + ("" if diff <= bound else f" WRONG (over {bound})")
            if args.backward and "dkdv" not in label:  # whole backwards: time only
                cells.append(f"{label}: {ms:.3f} ms")
                continue
            # the backward's ratios compare like with like: profiled kernel times
            same_method = not args.backward or label.endswith("profiled") or label == "triton_flash dkdv"
            ratio = f" ({base / ms:.2f}x)" if base and same_method else ""
            cells.append(f"{label}: {ms:.3f} ms {row['tflop'] / ms * 1e3:.0f} TF/s{ratio}{extra}")
        print(f"{name}\n  " + "\n  ".join(cells), flush=True)
        Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                              "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
