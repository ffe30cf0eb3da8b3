"""An experimental dK/dV kernel for Hopper with TMA loads and Triton's automatic warp
specialization (see ``ws_kernel.py``), timed by ``ws_probe.py --backward``.

The work of ``attn_bwd_dkdv`` for dense MHA inputs (causal: top-left, Nq = Nk) whose length is
a multiple of the tiles. Each program owns ``BLOCK_N`` keys, which the pass splits between the two
consumer warp groups, and loops over every query block:
S^T = K Q^T, P^T = exp2(S^T - lse), dV += P^T dO, dP^T = V dO^T, dS^T = P^T (dP^T - delta),
dK += dS^T Q.
The LSE ([B, H, N] float32, as delta) is base 2, and ``qk_scale`` is the softmax scale times
log2(e), as the shipped kernels take them; dK leaves scaled by ``scale``. ``ALIBI`` adds
``-slope * |i - j|`` (``SLOPES`` float32 [H]), as FlashAttention's ALiBi.
"""

import triton
import triton.language as tl


@triton.jit
def ws_bwd_dkdv(desc_q, desc_k, desc_v, desc_do, desc_lse, desc_delta, DK, DV, SLOPES,
                stride_kb, stride_kh, stride_kn, H, N, scale, qk_scale,
                HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                CAUSAL: tl.constexpr, ALIBI: tl.constexpr, WS: tl.constexpr):
    start_n = tl.program_id(0) * BLOCK_N
    off_bh = tl.program_id(1)
    off_b = off_bh // H
    off_h = off_bh % H
    k = desc_k.load([off_b, off_h, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
    v = desc_v.load([off_b, off_h, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    lo = 0
    if CAUSAL:  # queries from this key block's diagonal on; one loop, every tile masked
        lo = start_n // BLOCK_M * BLOCK_M
    offs_n = start_n + tl.arange(0, BLOCK_N)
    if ALIBI:  # the bias -slope * |i - j| in base 2, the distance in float32 as the shipped dK/dV
        slope = tl.load(SLOPES + off_h) * 1.4426950408889634
        keys = offs_n.to(tl.float32)
    for start_m in tl.range(lo, N, BLOCK_M, warp_specialize=WS):
        q = desc_q.load([off_b, off_h, start_m, 0]).reshape(BLOCK_M, HEAD_DIM)
        do = desc_do.load([off_b, off_h, start_m, 0]).reshape(BLOCK_M, HEAD_DIM)
        lse = desc_lse.load([off_b, off_h, start_m]).reshape(BLOCK_M)
        delta = desc_delta.load([off_b, off_h, start_m]).reshape(BLOCK_M)
        qk_t = tl.dot(k, tl.trans(q))
        s_t = qk_t * qk_scale
        if ALIBI:
            queries = (start_m + tl.arange(0, BLOCK_M)).to(tl.float32)
            s_t = s_t - slope * tl.abs(queries[None, :] - keys[:, None])
        p_t = tl.exp2(s_t - lse[None, :])
        if CAUSAL:
            offs_m = start_m + tl.arange(0, BLOCK_M)
            p_t = tl.where(offs_m[None, :] >= offs_n[:, None], p_t, 0.0)
        dv = tl.dot(p_t.to(do.dtype), do, dv)
        dp_t = tl.dot(v, tl.trans(do))
        ds_t = p_t * (dp_t - delta[None, :])
        dk = tl.dot(ds_t.to(q.dtype), q, dk)
    offs_d = tl.arange(0, HEAD_DIM)
    base = off_b.to(tl.int64) * stride_kb + off_h.to(tl.int64) * stride_kh
    at = base + offs_n[:, None] * stride_kn + offs_d[None, :]
    tl.store(DK + at, (dk * scale).to(DK.dtype.element_ty))
    tl.store(DV + at, dv.to(DV.dtype.element_ty))
