"""Time the warp-specialized forward probe (``ws_kernel.py``) against triton_flash and cuDNN.

For each case (the speed suite's forward shapes: 16k tokens, H x D = 2048) it times, with
versions.py's timer (CUDA events, L2 flushed, the GPU spun ahead of the start event):
- ``cudnn``: torch's scaled_dot_product_attention on its cuDNN backend (bf16 cases);
- ``triton_flash``: the shipped forward (``launch.flash_fwd`` / ``flash_fwd_fp8``), default tiles;
- ``ws BMxBN/S``: the probe at each tile, with its largest |difference| from triton_flash's output.
A probe tile that fails to compile or launch is reported, not fatal.

Usage (GPU): python3 tools/flash_bench/ws_probe.py --out FILE.json [--reps 30] [--cases a,b]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.tools.tensor_descriptor import TensorDescriptor

from pytest_attnkit.implementations.triton_flash import launch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from versions import timed  # noqa: E402
from ws_kernel import ws_fwd  # noqa: E402

LOG2E = 1.4426950408889634
# name: (dtype, head_dim, seqlen, causal, probe tiles (block_m, block_n, num_stages))
BF16_D128 = [(128, 128, 2), (128, 64, 2), (128, 64, 3), (128, 128, 3)]
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
    grid = ((n_q + block_m - 1) // block_m, batch * heads)
    ws_fwd[grid](dq, dk, dv, o, *descales, o.stride(0), o.stride(1), o.stride(2),
                 heads, heads_kv, heads // heads_kv, n_q, n_k, scale * LOG2E,
                 HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=causal, FP8=fp8, WS=True,
                 num_warps=4, num_stages=stages)
    return o


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
        ref = launch.flash_fwd_fp8(q8, k8, v8, descales, causal, scale)
        row["ms"]["triton_flash"] = timed(lambda: launch.flash_fwd_fp8(q8, k8, v8, descales, causal, scale), reps)
        v_in = launch.keys_contiguous(v8)
        q, k = q8, k8
    for t in tiles:
        label = f"ws {t[0]}x{t[1]}/{t[2]}"
        try:
            out = probe(q, k, v_in, o, descales, causal, scale, t, kind == "fp8")
            torch.cuda.synchronize()
            row["diff"][label] = float((out.float() - ref.float()).abs().max())
            row["ms"][label] = timed(lambda: probe(q, k, v_in, o, descales, causal, scale, t, kind == "fp8"), reps)
        except Exception as error:  # noqa: BLE001 - a tile that does not compile is a finding
            row["ms"][label] = None
            row["diff"][label] = f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--cases", default="")
    args = parser.parse_args()
    names = [c for c in args.cases.split(",") if c] or list(CASES)
    rows = []
    for name in names:
        row = run_case(name, CASES[name], args.reps)
        rows.append(row)
        base = row["ms"]["triton_flash"]
        cells = []
        for label, ms in row["ms"].items():
            if ms is None:
                cells.append(f"{label}: failed ({row['diff'][label]})")
                continue
            diff = row["diff"].get(label)
            extra = f" d={diff:.1e}" if isinstance(diff, float) else ""
            cells.append(f"{label}: {ms:.3f} ms {row['tflop'] / ms * 1e3:.0f} TF/s ({base / ms:.2f}x){extra}")
        print(f"{name}\n  " + "\n  ".join(cells), flush=True)
        Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                              "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
