"""An experimental forward for Hopper: tensor descriptors (TMA) and Triton's automatic warp
specialization (``tl.range(..., warp_specialize=True)``, which Triton 3.6 lowers on sm90 to a
producer warp group and two consumer warp groups of 64 rows each). Dense and causal only, bf16 or
FP8 e4m3 (V given keys-contiguous), no LSE: a probe of what the structure gains, timed by
``ws_probe.py``. The autoWS pass takes one loop per kernel, so the causal case runs one loop
whose every tile is masked."""
import triton
import triton.language as tl


@triton.jit
def _inner(acc, l_i, m_i, q, desc_k, desc_v, off_b, off_hkv, offs_m, lo, hi, N_K, diag, qk_scale,
           HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
           MASKED: tl.constexpr, FP8: tl.constexpr, WS: tl.constexpr):
    for start_n in tl.range(lo, hi, BLOCK_N, warp_specialize=WS):
        k = desc_k.load([off_b, off_hkv, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
        qk = tl.dot(q, tl.trans(k))
        if MASKED:
            offs_n = start_n + tl.arange(0, BLOCK_N)
            visible = (offs_n[None, :] < N_K) & (offs_n[None, :] <= offs_m[:, None] + diag)
            qk = tl.where(visible, qk, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        else:
            m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            m_shift = m_new
        alpha = tl.exp2(m_i - m_shift)
        if FP8:
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
            acc = tl.dot(p.to(tl.bfloat16), v, acc)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def ws_fwd(desc_q, desc_k, desc_v, O, Q_DESCALE, K_DESCALE, V_DESCALE, stride_ob, stride_oh, stride_om,
           H_Q, H_KV, GROUP, N_Q, N_K, qk_scale,
           HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
           CAUSAL: tl.constexpr, FP8: tl.constexpr, WS: tl.constexpr):
    n_m = tl.cdiv(N_Q, BLOCK_M)
    pid = tl.program_id(0)
    if CAUSAL:
        pid = n_m - 1 - pid
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
    diag = N_K - N_Q
    if CAUSAL:
        hi = tl.minimum(tl.maximum(tl.minimum(start_m + BLOCK_M, N_Q) + diag, 0), N_K)
        full = tl.minimum(tl.maximum(start_m + 1 + diag, 0), hi)
    else:
        hi = N_K
        full = N_K
    full = full // BLOCK_N * BLOCK_N
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    if not CAUSAL:
        acc, l_i, m_i = _inner(acc, l_i, m_i, q, desc_k, desc_v, off_b, off_hkv, offs_m, 0, full, N_K,
                           diag, qk_scale, HEAD_DIM, BLOCK_M, BLOCK_N, False, FP8, WS)
    else:
        full = 0
        acc, l_i, m_i = _inner(acc, l_i, m_i, q, desc_k, desc_v, off_b, off_hkv, offs_m, full, hi,
                               N_K, diag, qk_scale, HEAD_DIM, BLOCK_M, BLOCK_N, True, FP8, WS)
    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    out = acc * (v_descale / l_safe)[:, None]
    offs_d = tl.arange(0, HEAD_DIM)
    o_base = O + off_b.to(tl.int64) * stride_ob + off_h.to(tl.int64) * stride_oh
    tl.store(o_base + offs_m[:, None] * stride_om + offs_d[None, :], out.to(tl.bfloat16),
             mask=offs_m[:, None] < N_Q)
