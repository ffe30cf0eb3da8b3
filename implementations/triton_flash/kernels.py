"""The Triton kernels of FlashAttention, forward and backward.

The math. For one (batch, query head) pair with query rows ``q_i``, keys ``k_j`` and values
``v_j``, the output is ``o_i = sum_j softmax_j(s_ij) v_j`` with ``s_ij = scale * q_i . k_j``.
The forward walks the keys block by block and keeps, per row, a running maximum ``m`` and a
running sum ``l`` of ``exp(s - m)`` (the online softmax), rescaling the partial output whenever
``m`` grows. Everything is done in base 2: the logits are multiplied by
``qk_scale = scale * log2(e)`` once, so each exponential is a single ``exp2``
(``2**(x * log2(e)) == e**x``). Causal masks are aligned bottom-right:
query ``i`` sees key ``j`` iff ``j <= i + Nk - Nq``, so key blocks wholly above that diagonal
are never visited and only the blocks that straddle it (or the ragged tail) pay for a mask. Per
row the forward saves the log-sum-exp ``lse = m + log2(l)`` (base 2, of the scaled logits); the
backward recomputes ``p_ij = exp2(s_ij * log2(e) - lse_i)`` from it instead of storing the
attention matrix, which keeps the extra memory linear in the sequence length. With
``delta_i = sum_d dO_id O_id``, the gradients are ``dS = P * (dO V^T - delta)``,
``dQ = scale * dS K``, ``dK = scale * dS^T Q`` and ``dV = P^T dO``. A row that sees no key at all
(causal with ``Nq > Nk``) has ``l = 0``: it outputs zeros and saves ``lse = +inf``, which makes its
recomputed ``p`` exactly 0, so it contributes nothing to any gradient and no NaN appears.

Layout: tensors are ``[batch, heads, seqlen, head_dim]`` with arbitrary strides (all four are
passed to the kernels). ``k``/``v`` may have fewer heads than ``q`` (GQA/MQA): query head ``h``
reads kv head ``h // (Hq // Hkv)``; the dK/dV kernel sums over the query heads of a group itself.
Head dims that are not powers of two are padded to ``BLOCK_D`` and masked on loads and stores.

Decode (a few query rows per kv head against a long cache) takes ``attn_fwd_split``: the keys,
not the queries, are split across programs (Flash-Decoding), and ``attn_fwd_combine`` merges the
slices by their log-sum-exps.

FP8 (e4m3, forward only) takes ``attn_fwd_fp8``: the same online softmax with both products on
FP8 tensor cores. The values stand for ``x.float() * descale`` with one descale per (batch, kv
head), so ``q_descale * k_descale`` folds into the logits' scale and ``v_descale`` into the
final normalization. P is rounded to e4m3 for the PV product after a shift of its exponent by
+8 (``p * 256``, exact, folded into the ``exp2``): the unshifted P in [0, 1] would leave every
probability below 2**-6 in e4m3's subnormals and flush those below 2**-10 to zero; the shift
cancels in ``acc / l``. V arrives with its keys on the contiguous axis (``launch`` transposes
it): Hopper's FP8 wgmma reads both operands K-major, and for the PV product K runs over keys.

The kernels are private to this package: ``launch.py`` chooses their tiles and grids.
"""

from __future__ import annotations

from typing import Any, Callable

try:
    import triton
    import triton.language as tl
except ImportError as exc:  # the package must still import, so that the adapter can say why
    triton = None
    tl = None
    TRITON_IMPORT_ERROR: ImportError | None = exc
else:
    TRITON_IMPORT_ERROR = None


def _needs_triton(fn: Callable[..., Any]) -> Callable[..., Any]:
    def unavailable(*args: Any, **kwargs: Any) -> Any:
        raise ImportError(f"{fn.__name__} needs triton, which failed to import: {TRITON_IMPORT_ERROR}")

    return unavailable


# Without triton the kernels below become stubs that raise when called; their `tl.constexpr`
# annotations are plain strings (postponed evaluation), so defining them needs no triton.
_kernel = triton.jit if triton is not None else _needs_triton


@_kernel
def _load_tile(ptrs, rows, n_rows, cols, N_COLS: tl.constexpr, CHECK_ROWS: tl.constexpr,
               CHECK_COLS: tl.constexpr):
    # Masks are compile-time optional: tiles that lie wholly inside the tensor load unmasked.
    if CHECK_ROWS and CHECK_COLS:
        tile = tl.load(ptrs, mask=(rows[:, None] < n_rows) & (cols[None, :] < N_COLS), other=0.0)
    elif CHECK_ROWS:
        tile = tl.load(ptrs, mask=rows[:, None] < n_rows, other=0.0)
    elif CHECK_COLS:
        tile = tl.load(ptrs, mask=cols[None, :] < N_COLS, other=0.0)
    else:
        tile = tl.load(ptrs)
    return tile


@_kernel
def _store_tile(ptrs, value, rows, n_rows, cols, N_COLS: tl.constexpr, CHECK_COLS: tl.constexpr):
    if CHECK_COLS:
        tl.store(ptrs, value, mask=(rows[:, None] < n_rows) & (cols[None, :] < N_COLS))
    else:
        tl.store(ptrs, value, mask=rows[:, None] < n_rows)


@_kernel
def _attn_fwd_inner(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
                    offs_m, offs_d, lo, hi, N_K, diag, qk_scale,
                    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                    CAUSAL: tl.constexpr, MASKED: tl.constexpr, DOT_PRECISION: tl.constexpr):
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k = _load_tile(k_base + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd,
                       offs_n, N_K, offs_d, HEAD_DIM, MASKED, HEAD_DIM != BLOCK_D)
        v = _load_tile(v_base + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                       offs_n, N_K, offs_d, HEAD_DIM, MASKED, HEAD_DIM != BLOCK_D)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        if MASKED:
            visible = offs_n[None, :] < N_K
            if CAUSAL:
                visible = visible & (offs_n[None, :] <= offs_m[:, None] + diag)
            qk = tl.where(visible, qk, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            # A row that has seen no key yet still has m = -inf; shifting it by 0 instead keeps
            # exp2(-inf - -inf) = NaN out of alpha and p (both become exactly 0).
            m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        else:
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            m_shift = m_new
        alpha = tl.exp2(m_i - m_shift)
        p = tl.exp2(qk - m_shift[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@_kernel
def _attn_fwd_rows(q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
                   offs_m, offs_d, lo, full, hi, N_K, diag, qk_scale,
                   ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                   BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr):
    # One tile of query rows against keys [lo, hi): [lo, full) unmasked, [full, hi) masked.
    # Returns the normalized output, which rows saw a key (l > 0), and m + log2(l) for those rows;
    # the caller chooses what a row that saw no key saves.
    m_i = tl.full([ROWS], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([ROWS], dtype=tl.float32)
    acc = tl.zeros([ROWS, BLOCK_D], dtype=tl.float32)
    acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, k_base, v_base,
                                    stride_kn, stride_kd, stride_vn, stride_vd,
                                    offs_m, offs_d, lo, full, N_K, diag, qk_scale,
                                    HEAD_DIM, BLOCK_D, BLOCK_N, CAUSAL, False, DOT_PRECISION)
    acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, k_base, v_base,
                                    stride_kn, stride_kd, stride_vn, stride_vd,
                                    offs_m, offs_d, full, hi, N_K, diag, qk_scale,
                                    HEAD_DIM, BLOCK_D, BLOCK_N, CAUSAL, True, DOT_PRECISION)
    seen = l_i > 0.0
    l_safe = tl.where(seen, l_i, 1.0)
    return acc / l_safe[:, None], seen, m_i + tl.log2(l_safe)


@_kernel
def attn_fwd(Q, K, V, O, LSE,
              stride_qb, stride_qh, stride_qm, stride_qd,
              stride_kb, stride_kh, stride_kn, stride_kd,
              stride_vb, stride_vh, stride_vn, stride_vd,
              stride_ob, stride_oh, stride_om, stride_od,
              H_Q, N_Q, N_K, GROUP, qk_scale,
              HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr):
    start_m = tl.program_id(0) * BLOCK_M
    off_bh = tl.program_id(1)
    # 64-bit head offsets: batch * stride can pass 2**31 elements on large inputs.
    off_b = (off_bh // H_Q).to(tl.int64)
    off_h = (off_bh % H_Q).to(tl.int64)
    off_hkv = off_h // GROUP
    q_base = Q + off_b * stride_qb + off_h * stride_qh
    k_base = K + off_b * stride_kb + off_hkv * stride_kh
    v_base = V + off_b * stride_vb + off_hkv * stride_vh
    o_base = O + off_b * stride_ob + off_h * stride_oh

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q = _load_tile(q_base + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                   offs_m, N_Q, offs_d, HEAD_DIM, True, HEAD_DIM != BLOCK_D)

    diag = N_K - N_Q  # bottom-right alignment: row i sees keys j <= i + diag
    if CAUSAL:
        # Keys past the last valid row's diagonal are invisible to the whole block: never visit.
        hi = tl.minimum(tl.maximum(tl.minimum(start_m + BLOCK_M, N_Q) + diag, 0), N_K)
        # Keys up to the first row's diagonal are visible to every row: no mask needed there.
        full = tl.minimum(tl.maximum(start_m + 1 + diag, 0), hi)
    else:
        hi = N_K
        full = N_K
    full = full // BLOCK_N * BLOCK_N  # the ragged last key block goes to the masked loop

    out, seen, lse = _attn_fwd_rows(q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
                                    offs_m, offs_d, 0, full, hi, N_K, diag, qk_scale,
                                    BLOCK_M, HEAD_DIM, BLOCK_D, BLOCK_N, CAUSAL, DOT_PRECISION)
    # l == 0 exactly when a row saw no key: it outputs 0 and saves lse = +inf, so that the
    # backward's recomputed p = exp2(s - lse) is 0 for it.
    lse = tl.where(seen, lse, float("inf"))

    _store_tile(o_base + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od,
                out.to(O.dtype.element_ty), offs_m, N_Q, offs_d, HEAD_DIM, HEAD_DIM != BLOCK_D)
    tl.store(LSE + off_bh.to(tl.int64) * N_Q + offs_m, lse, mask=offs_m < N_Q)


@_kernel
def attn_fwd_split(Q, K, V, O, LSE, O_PART, LSE_PART,
                    stride_qb, stride_qh, stride_qm, stride_qd,
                    stride_kb, stride_kh, stride_kn, stride_kd,
                    stride_vb, stride_vh, stride_vn, stride_vd,
                    stride_ob, stride_oh, stride_om, stride_od,
                    H_Q, H_KV, N_Q, N_K, GROUP, keys_per_split, qk_scale,
                    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                    BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
                    CAUSAL: tl.constexpr, DIRECT: tl.constexpr, DOT_PRECISION: tl.constexpr):
    # Decode (Flash-Decoding): few query rows against a long KV cache. One program takes one kv
    # head and one slice of the keys, for every query row that reads that kv head: row r of the
    # tile is query position r % N_Q of query head hkv * GROUP + r // N_Q, so a GQA group reads its
    # K and V once. With one slice (DIRECT) it writes the output; otherwise each slice writes its
    # normalized partial output and log-sum-exp, and attn_fwd_combine merges the slices.
    split = tl.program_id(0)
    num_splits = tl.num_programs(0)
    off_bhkv = tl.program_id(1)
    off_b = (off_bhkv // H_KV).to(tl.int64)
    off_hkv = (off_bhkv % H_KV).to(tl.int64)
    rows = tl.arange(0, BLOCK_R)
    row_ok = rows < GROUP * N_Q
    head = off_hkv * GROUP + rows // N_Q
    pos = rows % N_Q
    offs_d = tl.arange(0, BLOCK_D)
    col_ok = offs_d < HEAD_DIM
    q = tl.load(Q + off_b * stride_qb + head[:, None] * stride_qh + pos[:, None] * stride_qm
                + offs_d[None, :] * stride_qd, mask=row_ok[:, None] & col_ok[None, :], other=0.0)
    k_base = K + off_b * stride_kb + off_hkv * stride_kh
    v_base = V + off_b * stride_vb + off_hkv * stride_vh

    diag = N_K - N_Q
    lo = split * keys_per_split
    hi = tl.minimum(lo + keys_per_split, N_K)
    if CAUSAL:
        hi = tl.maximum(tl.minimum(hi, N_Q + diag), lo)  # the last row sees keys j < N_Q + diag
        full_end = tl.minimum(tl.maximum(diag + 1, lo), hi)  # keys every row sees
    else:
        full_end = hi
    full = lo + (full_end - lo) // BLOCK_N * BLOCK_N

    out, seen, lse = _attn_fwd_rows(q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
                                    pos, offs_d, lo, full, hi, N_K, diag, qk_scale,
                                    BLOCK_R, HEAD_DIM, BLOCK_D, BLOCK_N, CAUSAL, DOT_PRECISION)
    row_id = (off_b * H_Q + head) * N_Q + pos
    if DIRECT:
        tl.store(O + off_b * stride_ob + head[:, None] * stride_oh + pos[:, None] * stride_om
                 + offs_d[None, :] * stride_od, out.to(O.dtype.element_ty),
                 mask=row_ok[:, None] & col_ok[None, :])
        tl.store(LSE + row_id, tl.where(seen, lse, float("inf")), mask=row_ok)
    else:
        # A slice that saw no key for a row weighs nothing in the merge: lse = -inf there.
        part = row_id * num_splits + split
        tl.store(O_PART + part[:, None] * BLOCK_D + offs_d[None, :], out, mask=row_ok[:, None])
        tl.store(LSE_PART + part, tl.where(seen, lse, float("-inf")), mask=row_ok)


@_kernel
def attn_fwd_combine(O_PART, LSE_PART, O, LSE,
                      stride_ob, stride_oh, stride_om, stride_od,
                      H_Q, N_Q, num_splits,
                      HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr):
    # Merges the slices of one query row: o = sum_s w_s o_s / sum_s w_s with w_s = 2^(lse_s - max).
    row = tl.program_id(0).to(tl.int64)
    off_bh = row // N_Q
    pos = row % N_Q
    off_b = off_bh // H_Q
    off_h = off_bh % H_Q
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    lse_s = tl.load(LSE_PART + row * num_splits + offs_s, mask=offs_s < num_splits, other=float("-inf"))
    m = tl.max(lse_s, 0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)  # no slice saw a key: every weight is 0
    w = tl.exp2(lse_s - m_safe)
    total = tl.sum(w, 0)
    o_s = tl.load(O_PART + (row * num_splits + offs_s)[:, None] * BLOCK_D + offs_d[None, :],
                  mask=(offs_s < num_splits)[:, None], other=0.0)
    out = tl.sum(o_s * w[:, None], 0) / tl.where(total > 0.0, total, 1.0)
    tl.store(O + off_b * stride_ob + off_h * stride_oh + pos * stride_om + offs_d * stride_od,
             out.to(O.dtype.element_ty), mask=offs_d < HEAD_DIM)
    tl.store(LSE + row, tl.where(total > 0.0, m_safe + tl.log2(total), float("inf")))


@_kernel
def transpose_keys(V, VT, stride_vb, stride_vh, stride_vn, stride_vd,
                    stride_tb, stride_th, stride_tn, stride_td,
                    H_KV, N_K, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr):
    # VT[b, h, n, :] = V[b, h, n, :] for one block of keys, where VT is a [B, H, N, D] view whose
    # key axis is the contiguous one (stride_tn == 1): loaded along D, stored along the keys.
    start_n = tl.program_id(0) * BLOCK_N
    off_bh = tl.program_id(1)
    off_b = (off_bh // H_KV).to(tl.int64)
    off_h = (off_bh % H_KV).to(tl.int64)
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    tile = tl.load(V + off_b * stride_vb + off_h * stride_vh
                   + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                   mask=offs_n[:, None] < N_K, other=0.0)
    tl.store(VT + off_b * stride_tb + off_h * stride_th
             + offs_d[:, None] * stride_td + offs_n[None, :] * stride_tn,
             tl.trans(tile), mask=offs_n[None, :] < N_K)


@_kernel
def _round_to_e4m3(x):
    # x (float32, 0 <= x < 448) rounded to the nearest e4m3 value, nearest-even, kept in float32:
    # only for Triton's CPU interpreter, whose float32 -> fp8 cast loses the carry when a mantissa
    # rounds up (0.4975 becomes 0.25, not 0.5) and truncates subnormals. The cast of a value that
    # is already exact is right there; the GPU's cvt.rn.satfinite needs none of this.
    bits = x.to(tl.int32, bitcast=True)
    bits = (bits + 0x7FFFF + ((bits >> 20) & 1)) & -0x100000  # keep 3 mantissa bits, carry up
    normal = bits.to(tl.float32, bitcast=True)
    subnormal = (x + 16384.0) - 16384.0  # below 2**-6: multiples of 2**-9 (16384 = 2**-9 * 2**23)
    return tl.where(x < 0.015625, subnormal, normal)


@_kernel
def _round_to_bf16(x):
    # x (float32, finite) rounded to the nearest bfloat16, nearest-even, kept in float32: the
    # interpreter's float32 -> bfloat16 cast truncates. Interpreter only, as _round_to_e4m3.
    bits = x.to(tl.int32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -0x10000
    return bits.to(tl.float32, bitcast=True)


@_kernel
def _attn_fwd_fp8_inner(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
                        offs_m, offs_d, lo, hi, N_K, diag, qk_scale,
                        BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, MASKED: tl.constexpr,
                        EXACT_CAST: tl.constexpr):
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k_ptrs = k_base + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd
        # V^T's tile [D, BLOCK_N], keys along the contiguous axis: tl.trans of it is the PV
        # product's B operand [BLOCK_N, D] K-major, as Hopper's FP8 wgmma needs.
        v_ptrs = v_base + offs_d[:, None] * stride_vd + offs_n[None, :] * stride_vn
        if MASKED:
            k = tl.load(k_ptrs, mask=offs_n[:, None] < N_K, other=0.0)
            v_t = tl.load(v_ptrs, mask=offs_n[None, :] < N_K, other=0.0)
        else:
            k = tl.load(k_ptrs)
            v_t = tl.load(v_ptrs)
        qk = tl.dot(q, tl.trans(k)) * qk_scale
        if MASKED:
            visible = offs_n[None, :] < N_K
            if CAUSAL:
                visible = visible & (offs_n[None, :] <= offs_m[:, None] + diag)
            qk = tl.where(visible, qk, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)  # as in _attn_fwd_inner
        else:
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            m_shift = m_new
        alpha = tl.exp2(m_i - m_shift)
        # p * 256 (<= 256 < 448): its small entries stay normal in e4m3; cancels in acc / l.
        p = tl.exp2(qk - (m_shift - 8.0)[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        if EXACT_CAST:
            p = _round_to_e4m3(p)
        acc = tl.dot(p.to(v_t.dtype), tl.trans(v_t), acc)
        m_i = m_new
    return acc, l_i, m_i


@_kernel
def attn_fwd_fp8(Q, K, V, O, Q_DESCALE, K_DESCALE, V_DESCALE,
                  stride_qb, stride_qh, stride_qm, stride_qd,
                  stride_kb, stride_kh, stride_kn, stride_kd,
                  stride_vb, stride_vh, stride_vn, stride_vd,
                  stride_ob, stride_oh, stride_om, stride_od,
                  H_Q, H_KV, N_Q, N_K, GROUP, qk_scale,
                  HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  CAUSAL: tl.constexpr, EXACT_CAST: tl.constexpr):
    # The forward on FP8 inputs (see the module docstring). The tile ranges are attn_fwd's; head
    # dims are powers of two (no column masks), descales float32 [B, H_KV] contiguous, and the
    # output bf16. No LSE: FP8 has no backward here.
    start_m = tl.program_id(0) * BLOCK_M
    off_bh = tl.program_id(1)
    off_b = (off_bh // H_Q).to(tl.int64)
    off_h = (off_bh % H_Q).to(tl.int64)
    off_hkv = off_h // GROUP
    descale = off_b * H_KV + off_hkv
    # One scale for the logits: softmax scale * log2(e) * q's and k's descales.
    qk_scale = qk_scale * tl.load(Q_DESCALE + descale) * tl.load(K_DESCALE + descale)
    v_descale = tl.load(V_DESCALE + descale)
    q_base = Q + off_b * stride_qb + off_h * stride_qh
    k_base = K + off_b * stride_kb + off_hkv * stride_kh
    v_base = V + off_b * stride_vb + off_hkv * stride_vh
    o_base = O + off_b * stride_ob + off_h * stride_oh

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(q_base + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                mask=offs_m[:, None] < N_Q, other=0.0)

    diag = N_K - N_Q
    if CAUSAL:  # the key ranges of attn_fwd
        hi = tl.minimum(tl.maximum(tl.minimum(start_m + BLOCK_M, N_Q) + diag, 0), N_K)
        full = tl.minimum(tl.maximum(start_m + 1 + diag, 0), hi)
    else:
        hi = N_K
        full = N_K
    full = full // BLOCK_N * BLOCK_N

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    acc, l_i, m_i = _attn_fwd_fp8_inner(acc, l_i, m_i, q, k_base, v_base,
                                        stride_kn, stride_kd, stride_vn, stride_vd,
                                        offs_m, offs_d, 0, full, N_K, diag, qk_scale,
                                        BLOCK_N, CAUSAL, False, EXACT_CAST)
    acc, l_i, m_i = _attn_fwd_fp8_inner(acc, l_i, m_i, q, k_base, v_base,
                                        stride_kn, stride_kd, stride_vn, stride_vd,
                                        offs_m, offs_d, full, hi, N_K, diag, qk_scale,
                                        BLOCK_N, CAUSAL, True, EXACT_CAST)
    # A row that saw no key has l = 0 and acc = 0: it writes zeros.
    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    out = acc * (v_descale / l_safe)[:, None]
    if EXACT_CAST:
        out = _round_to_bf16(out)
    tl.store(o_base + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od,
             out.to(O.dtype.element_ty), mask=offs_m[:, None] < N_Q)


@_kernel
def attn_bwd_preprocess(O, DO, DELTA,
                         stride_ob, stride_oh, stride_om, stride_od,
                         stride_dob, stride_doh, stride_dom, stride_dod,
                         H_Q, N_Q,
                         HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr):
    start_m = tl.program_id(0) * BLOCK_M
    off_bh = tl.program_id(1)
    off_b = (off_bh // H_Q).to(tl.int64)
    off_h = (off_bh % H_Q).to(tl.int64)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    o = _load_tile(O + off_b * stride_ob + off_h * stride_oh
                   + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od,
                   offs_m, N_Q, offs_d, HEAD_DIM, True, HEAD_DIM != BLOCK_D)
    do = _load_tile(DO + off_b * stride_dob + off_h * stride_doh
                    + offs_m[:, None] * stride_dom + offs_d[None, :] * stride_dod,
                    offs_m, N_Q, offs_d, HEAD_DIM, True, HEAD_DIM != BLOCK_D)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(DELTA + off_bh.to(tl.int64) * N_Q + offs_m, delta, mask=offs_m < N_Q)


@_kernel
def _attn_bwd_dkdv_inner(dk, dv, k, v, q_base, do_base, lse_base, delta_base,
                         stride_qm, stride_qd, stride_dom, stride_dod,
                         offs_n, offs_d, lo, hi, N_Q, N_K, diag, qk_scale,
                         HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                         CAUSAL: tl.constexpr, MASKED: tl.constexpr, DOT_PRECISION: tl.constexpr):
    # Works on the transposed score tile (keys x queries) so every product has this program's
    # key block as its M dimension and accumulates straight into dk and dv.
    for start_m in range(lo, hi, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q = _load_tile(q_base + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                       offs_m, N_Q, offs_d, HEAD_DIM, True, HEAD_DIM != BLOCK_D)
        do = _load_tile(do_base + offs_m[:, None] * stride_dom + offs_d[None, :] * stride_dod,
                        offs_m, N_Q, offs_d, HEAD_DIM, True, HEAD_DIM != BLOCK_D)
        # Padding rows past N_Q get lse = +inf, hence p = 0: no mask needed for them.
        lse = tl.load(lse_base + offs_m, mask=offs_m < N_Q, other=float("inf"))
        delta = tl.load(delta_base + offs_m, mask=offs_m < N_Q, other=0.0)
        qk_t = tl.dot(k, tl.trans(q), input_precision=DOT_PRECISION)
        s_t = qk_t * qk_scale - lse[None, :]
        if MASKED:
            # Mask the exponent, not p: a hidden entry's s can be large, and exp2 of it would
            # overflow (harmless once zeroed, but the interpreter warns about it).
            visible = offs_n[:, None] < N_K
            if CAUSAL:
                visible = visible & (offs_n[:, None] <= offs_m[None, :] + diag)
            s_t = tl.where(visible, s_t, float("-inf"))
        p_t = tl.exp2(s_t)
        dv = tl.dot(p_t.to(do.dtype), do, dv, input_precision=DOT_PRECISION)
        dp_t = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)
        ds_t = p_t * (dp_t - delta[None, :])
        dk = tl.dot(ds_t.to(q.dtype), q, dk, input_precision=DOT_PRECISION)
    return dk, dv


@_kernel
def attn_bwd_dkdv(Q, K, V, DO, LSE, DELTA, DK, DV,
                   stride_qb, stride_qh, stride_qm, stride_qd,
                   stride_kb, stride_kh, stride_kn, stride_kd,
                   stride_vb, stride_vh, stride_vn, stride_vd,
                   stride_dob, stride_doh, stride_dom, stride_dod,
                   stride_dkb, stride_dkh, stride_dkn, stride_dkd,
                   stride_dvb, stride_dvh, stride_dvn, stride_dvd,
                   H_Q, H_KV, N_Q, N_K, GROUP, scale, qk_scale,
                   HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr):
    start_n = tl.program_id(0) * BLOCK_N
    off_bhkv = tl.program_id(1)
    off_b = (off_bhkv // H_KV).to(tl.int64)
    off_hkv = (off_bhkv % H_KV).to(tl.int64)

    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    k = _load_tile(K + off_b * stride_kb + off_hkv * stride_kh
                   + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd,
                   offs_n, N_K, offs_d, HEAD_DIM, True, HEAD_DIM != BLOCK_D)
    v = _load_tile(V + off_b * stride_vb + off_hkv * stride_vh
                   + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                   offs_n, N_K, offs_d, HEAD_DIM, True, HEAD_DIM != BLOCK_D)

    diag = N_K - N_Q
    q_end = tl.cdiv(N_Q, BLOCK_M) * BLOCK_M
    if CAUSAL:
        # The first query that sees this block's first key; earlier query blocks see none of it.
        lo = tl.maximum(start_n - diag, 0) // BLOCK_M * BLOCK_M
        # From the first query that sees the block's last (valid) key on, no mask is needed.
        last_key = tl.minimum(start_n + BLOCK_N, N_K) - 1
        full = tl.cdiv(tl.maximum(last_key - diag, 0), BLOCK_M) * BLOCK_M
        full = tl.minimum(tl.maximum(full, lo), q_end)
    else:
        lo = 0
        full = 0
    # A ragged last key block masks its padding keys against every query block.
    if start_n + BLOCK_N > N_K:
        full = q_end

    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    # Summing the group's query heads here writes dk/dv once, with no [B, Hq, Nk, D] scratch.
    for g in range(0, GROUP):
        off_h = off_hkv * GROUP + g
        off_bh = off_b * H_Q + off_h
        q_base = Q + off_b * stride_qb + off_h * stride_qh
        do_base = DO + off_b * stride_dob + off_h * stride_doh
        lse_base = LSE + off_bh * N_Q
        delta_base = DELTA + off_bh * N_Q
        dk, dv = _attn_bwd_dkdv_inner(dk, dv, k, v, q_base, do_base, lse_base, delta_base,
                                      stride_qm, stride_qd, stride_dom, stride_dod,
                                      offs_n, offs_d, lo, full, N_Q, N_K, diag, qk_scale,
                                      HEAD_DIM, BLOCK_D, BLOCK_M, CAUSAL, True, DOT_PRECISION)
        dk, dv = _attn_bwd_dkdv_inner(dk, dv, k, v, q_base, do_base, lse_base, delta_base,
                                      stride_qm, stride_qd, stride_dom, stride_dod,
                                      offs_n, offs_d, full, N_Q, N_Q, N_K, diag, qk_scale,
                                      HEAD_DIM, BLOCK_D, BLOCK_M, CAUSAL, False, DOT_PRECISION)

    dk = dk * scale
    _store_tile(DK + off_b * stride_dkb + off_hkv * stride_dkh
                + offs_n[:, None] * stride_dkn + offs_d[None, :] * stride_dkd,
                dk.to(DK.dtype.element_ty), offs_n, N_K, offs_d, HEAD_DIM, HEAD_DIM != BLOCK_D)
    _store_tile(DV + off_b * stride_dvb + off_hkv * stride_dvh
                + offs_n[:, None] * stride_dvn + offs_d[None, :] * stride_dvd,
                dv.to(DV.dtype.element_ty), offs_n, N_K, offs_d, HEAD_DIM, HEAD_DIM != BLOCK_D)


@_kernel
def _attn_bwd_dq_inner(dq, q, do, lse, delta, k_base, v_base,
                       stride_kn, stride_kd, stride_vn, stride_vd,
                       offs_m, offs_d, lo, hi, N_K, diag, qk_scale,
                       HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                       CAUSAL: tl.constexpr, MASKED: tl.constexpr, DOT_PRECISION: tl.constexpr):
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k = _load_tile(k_base + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd,
                       offs_n, N_K, offs_d, HEAD_DIM, MASKED, HEAD_DIM != BLOCK_D)
        v = _load_tile(v_base + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                       offs_n, N_K, offs_d, HEAD_DIM, MASKED, HEAD_DIM != BLOCK_D)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        s = qk * qk_scale - lse[:, None]
        if MASKED:
            # Hidden and padding keys (loaded as zeros) may have a large s: mask before exp2.
            visible = offs_n[None, :] < N_K
            if CAUSAL:
                visible = visible & (offs_n[None, :] <= offs_m[:, None] + diag)
            s = tl.where(visible, s, float("-inf"))
        p = tl.exp2(s)
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=DOT_PRECISION)
    return dq


@_kernel
def attn_bwd_dq(Q, K, V, DO, LSE, DELTA, DQ,
                 stride_qb, stride_qh, stride_qm, stride_qd,
                 stride_kb, stride_kh, stride_kn, stride_kd,
                 stride_vb, stride_vh, stride_vn, stride_vd,
                 stride_dob, stride_doh, stride_dom, stride_dod,
                 stride_dqb, stride_dqh, stride_dqm, stride_dqd,
                 H_Q, N_Q, N_K, GROUP, scale, qk_scale,
                 HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr):
    start_m = tl.program_id(0) * BLOCK_M
    off_bh = tl.program_id(1)
    off_b = (off_bh // H_Q).to(tl.int64)
    off_h = (off_bh % H_Q).to(tl.int64)
    off_hkv = off_h // GROUP
    k_base = K + off_b * stride_kb + off_hkv * stride_kh
    v_base = V + off_b * stride_vb + off_hkv * stride_vh

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q = _load_tile(Q + off_b * stride_qb + off_h * stride_qh
                   + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                   offs_m, N_Q, offs_d, HEAD_DIM, True, HEAD_DIM != BLOCK_D)
    do = _load_tile(DO + off_b * stride_dob + off_h * stride_doh
                    + offs_m[:, None] * stride_dom + offs_d[None, :] * stride_dod,
                    offs_m, N_Q, offs_d, HEAD_DIM, True, HEAD_DIM != BLOCK_D)
    row = off_bh.to(tl.int64) * N_Q + offs_m
    lse = tl.load(LSE + row, mask=offs_m < N_Q, other=float("inf"))
    delta = tl.load(DELTA + row, mask=offs_m < N_Q, other=0.0)

    diag = N_K - N_Q
    if CAUSAL:  # the same key ranges as the forward
        hi = tl.minimum(tl.maximum(tl.minimum(start_m + BLOCK_M, N_Q) + diag, 0), N_K)
        full = tl.minimum(tl.maximum(start_m + 1 + diag, 0), hi)
    else:
        hi = N_K
        full = N_K
    full = full // BLOCK_N * BLOCK_N

    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    dq = _attn_bwd_dq_inner(dq, q, do, lse, delta, k_base, v_base,
                            stride_kn, stride_kd, stride_vn, stride_vd,
                            offs_m, offs_d, 0, full, N_K, diag, qk_scale,
                            HEAD_DIM, BLOCK_D, BLOCK_N, CAUSAL, False, DOT_PRECISION)
    dq = _attn_bwd_dq_inner(dq, q, do, lse, delta, k_base, v_base,
                            stride_kn, stride_kd, stride_vn, stride_vd,
                            offs_m, offs_d, full, hi, N_K, diag, qk_scale,
                            HEAD_DIM, BLOCK_D, BLOCK_N, CAUSAL, True, DOT_PRECISION)
    dq = dq * scale
    _store_tile(DQ + off_b * stride_dqb + off_h * stride_dqh
                + offs_m[:, None] * stride_dqm + offs_d[None, :] * stride_dqd,
                dq.to(DQ.dtype.element_ty), offs_m, N_Q, offs_d, HEAD_DIM, HEAD_DIM != BLOCK_D)
