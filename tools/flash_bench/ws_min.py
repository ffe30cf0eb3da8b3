"""Does Triton's automatic warp specialization run on this GPU? The smallest kernels that say so.

``mm``: a bf16 matmul whose K loop carries ``tl.range(..., warp_specialize=True)`` and loads its
tiles through tensor descriptors (TMA). ``attn2``: FlashAttention's forward loop, the same way, two
stages (``attn3``: three; ``attnptrq``: Q through pointers). A name with ``nows`` runs the same
kernel with warp specialization off, as the control. Each prints when it compiled, launched and
finished, and its largest error against torch.

On an H200 with triton 3.6.0 (results/2026-11-23-h200-ws-runtime): ``mm`` compiles to 12 warps and
faults (illegal memory access); ``attn2`` compiles to 12 warps and never finishes; ``mm-nows`` and
``attn2-nows`` finish with the right answer. Compiled for sm90 on a machine without a GPU (not
recorded under results/): ``attnptrq`` fails in the warp-specialization pass, and ``attn3`` asks
for 246 KB of shared memory, over an SM's 227 KB. The exit status is 1 when the answer is wrong. Run each in its own process under ``timeout``: a hung kernel holds
the GPU until its process dies. ``--compile-only`` compiles for sm90 on a machine without a GPU.

Usage: timeout 30 python3 -u tools/flash_bench/ws_min.py VARIANT [--compile-only]
"""
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor


@triton.jit
def mm(desc_a, desc_b, C, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, N: tl.constexpr, WS: tl.constexpr):
    pm, pn = tl.program_id(0), tl.program_id(1)
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k in tl.range(0, K, BK, warp_specialize=WS):
        a = desc_a.load([pm * BM, k])
        b = desc_b.load([pn * BN, k])
        acc = tl.dot(a, tl.trans(b), acc)
    offs_m = pm * BM + tl.arange(0, BM)
    offs_n = pn * BN + tl.arange(0, BN)
    tl.store(C + offs_m[:, None] * N + offs_n[None, :], acc)


@triton.jit
def attn(desc_q, Q, desc_k, desc_v, O, N, qk_scale, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
         PTRQ: tl.constexpr, WS: tl.constexpr):
    pm, bh = tl.program_id(0), tl.program_id(1)
    offs_m = pm * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, D)
    row0 = bh * N
    if PTRQ:
        q = tl.load(Q + (row0 + offs_m)[:, None] * D + offs_d[None, :])
    else:
        q = desc_q.load([row0 + pm * BM, 0])
    m_i = tl.full([BM], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BM], dtype=tl.float32)
    acc = tl.zeros([BM, D], dtype=tl.float32)
    for start in tl.range(0, N, BN, warp_specialize=WS):
        k = desc_k.load([row0 + start, 0])
        qk = tl.dot(q, tl.trans(k))
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(qk * qk_scale - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        v = desc_v.load([row0 + start, 0])
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
    tl.store(O + (row0 + offs_m)[:, None] * D + offs_d[None, :], (acc / l_i[:, None]).to(O.dtype.element_ty))


def main():
    variant, compile_only = sys.argv[1], "--compile-only" in sys.argv
    dev = "cpu" if compile_only else "cuda"
    if compile_only:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from sm90_compile import _TargetOnly
        from triton.runtime import driver
        driver.set_active(_TargetOnly(90))
    t0 = time.time()
    say = lambda *a: print(f"[{time.time() - t0:5.1f}s] {variant}", *a, flush=True)  # noqa: E731
    if variant.startswith("mm"):
        M = N = K = 4096
        BM, BN, BK, stages = 128, 128, 64, (3 if variant == "mm3" else 2)
        a = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
        b = torch.randn(N, K, device=dev, dtype=torch.bfloat16)
        c = torch.empty(M, N, device=dev, dtype=torch.float32)
        args = (TensorDescriptor.from_tensor(a, [BM, BK]), TensorDescriptor.from_tensor(b, [BN, BK]), c, K)
        kw = dict(BM=BM, BN=BN, BK=BK, N=N, WS="nows" not in variant, num_warps=4, num_stages=stages)
        grid = (M // BM, N // BN)
        k = mm.warmup(*args, **kw, grid=grid)
        say("compiled, warps", k.metadata.num_warps, "smem", k.metadata.shared)
        if compile_only:
            return 0
        mm[grid](*args, **kw); say("launched"); torch.cuda.synchronize()
        err = float((c - a.float() @ b.float().T).abs().max())
        say("done, max err", err)
        return 0 if err <= 0.05 else 1  # fp32 sums of K = 4096 bf16 products: about 2e-3
    B, N, D, BM, BN = 64, 4096, 128, 128, 128
    stages = 3 if variant == "attn3" else 2
    q, k_, v = (torch.randn(B * N, D, device=dev, dtype=torch.bfloat16) for _ in range(3))
    o = torch.empty_like(q)
    args = (TensorDescriptor.from_tensor(q, [BM, D]), q, TensorDescriptor.from_tensor(k_, [BN, D]),
            TensorDescriptor.from_tensor(v, [BN, D]), o, N, D ** -0.5 * 1.4426950408889634)
    kw = dict(D=D, BM=BM, BN=BN, PTRQ=variant == "attnptrq", WS="nows" not in variant, num_warps=4, num_stages=stages)
    grid = (N // BM, B)
    kern = attn.warmup(*args, **kw, grid=grid)
    say("compiled, warps", kern.metadata.num_warps, "smem", kern.metadata.shared)
    if compile_only:
        return 0
    attn[grid](*args, **kw); say("launched"); torch.cuda.synchronize()
    ref = torch.nn.functional.scaled_dot_product_attention(*(x.view(B, 1, N, D) for x in (q, k_, v))).view(B * N, D)
    err = float((o.float() - ref.float()).abs().max())
    say("done, max err", err)
    return 0 if err <= 0.02 else 1  # bf16 output: about 5e-4


sys.exit(main())
