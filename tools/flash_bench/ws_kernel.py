"""An experimental forward for Hopper: tensor descriptors (TMA) and Triton's automatic warp
specialization (``tl.range(..., warp_specialize=True)``), timed by ``ws_probe.py``.

Triton 3.6 lowers such a loop on sm90 (its NVGPU warp-specialization pass) to a producer warp
group that issues the TMA loads and two consumer warp groups of ``BLOCK_M / 2`` rows each, with
registers moved from the producer to the consumers (setmaxnreg: 232 each, 40 for the producer).
That is FlashAttention-3's structure, which this package's own kernels cannot express (NOTES.md,
v9). The pass takes one loop per kernel, so a causal or ragged case runs a single loop whose every
tile is masked (``MASKED``), not an unmasked loop and a masked one.

Dense [B, H, N, D] inputs only (any strides with the head dim contiguous; GQA through ``GROUP``),
bf16/fp16 or FP8 e4m3 (then V comes keys-contiguous, [B, H, D, N], and descales [B, Hkv]), no
variant and no LSE. Rows and keys past the end come in as zeros from TMA.
"""

import triton
import triton.language as tl


@triton.jit
def _ws_inner(acc, l_i, m_i, q, desc_k, desc_v, off_b, off_hkv, offs_m, hi, N_K, diag, qk_scale,
              HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, MASKED: tl.constexpr,
              FP8: tl.constexpr, WS: tl.constexpr):
    for start_n in tl.range(0, hi, BLOCK_N, warp_specialize=WS):
        k = desc_k.load([off_b, off_hkv, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
        qk = tl.dot(q, tl.trans(k))
        # qk_scale > 0: the row maximum of the raw products, scaled once per row.
        if MASKED:
            offs_n = start_n + tl.arange(0, BLOCK_N)
            if CAUSAL:  # j <= i + diag < N_Q + diag = N_K for every row stored: no bound to check
                visible = offs_n[None, :] <= offs_m[:, None] + diag
            else:
                visible = offs_n[None, :] < N_K
            qk = tl.where(visible, qk, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen no key yet
        else:
            m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            m_shift = m_new
        alpha = tl.exp2(m_i - m_shift)
        if FP8:  # p * 256: small entries stay normal in e4m3; cancels in acc / l
            p = tl.exp2(qk * qk_scale - (m_shift - 8.0)[:, None])
        else:
            p = tl.exp2(qk * qk_scale - m_shift[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        if FP8:
            v_t = desc_v.load([off_b, off_hkv, 0, start_n]).reshape(HEAD_DIM, BLOCK_N)
            acc = tl.dot(p.to(tl.float8e4nv), tl.trans(v_t), acc)
        else:
            v = desc_v.load([off_b, off_hkv, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
            acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def ws_fwd(desc_q, desc_k, desc_v, O, Q_DESCALE, K_DESCALE, V_DESCALE, stride_ob, stride_oh, stride_om,
           H_Q, H_KV, GROUP, N_Q, N_K, qk_scale,
           HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
           CAUSAL: tl.constexpr, MASKED: tl.constexpr, FP8: tl.constexpr, WS: tl.constexpr):
    # MASKED must be set when CAUSAL is or N_K is not a multiple of BLOCK_N (the host's choice).
    pid = tl.program_id(0)
    if CAUSAL:  # the longest rows first
        pid = tl.cdiv(N_Q, BLOCK_M) - 1 - pid
    start_m = pid * BLOCK_M
    off_bh = tl.program_id(1)
    off_b = off_bh // H_Q
    off_h = off_bh % H_Q
    off_hkv = off_h // GROUP
    v_descale = 1.0
    if FP8:
        d = off_b * H_KV + off_hkv
        qk_scale = qk_scale * tl.load(Q_DESCALE + d) * tl.load(K_DESCALE + d)
        v_descale = tl.load(V_DESCALE + d)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    q = desc_q.load([off_b, off_h, start_m, 0]).reshape(BLOCK_M, HEAD_DIM)
    diag = N_K - N_Q  # bottom-right causal: row i sees keys j <= i + diag
    hi = N_K
    if CAUSAL:
        hi = tl.minimum(tl.maximum(tl.minimum(start_m + BLOCK_M, N_Q) + diag, 0), N_K)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    acc, l_i, m_i = _ws_inner(acc, l_i, m_i, q, desc_k, desc_v, off_b, off_hkv, offs_m, hi, N_K, diag,
                              qk_scale, HEAD_DIM, BLOCK_N, CAUSAL, MASKED, FP8, WS)
    l_safe = tl.where(l_i > 0.0, l_i, 1.0)  # a row that saw no key writes zeros
    out = acc * (v_descale / l_safe)[:, None]
    offs_d = tl.arange(0, HEAD_DIM)
    o_base = O + off_b.to(tl.int64) * stride_ob + off_h.to(tl.int64) * stride_oh
    tl.store(o_base + offs_m[:, None] * stride_om + offs_d[None, :], out.to(O.dtype.element_ty),
             mask=offs_m[:, None] < N_Q)
