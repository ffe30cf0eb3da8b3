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

Variants (the contract's, FlashAttention's names). Causal and a sliding window are one band: row
``i`` sees key ``j`` when ``-right <= i + Nk - Nq - j <= left`` (causal is ``right = 0``; an
unbounded side is a number larger than any length), so every kernel visits only the key blocks a
tile's band touches, unmasked where every row of the tile sees the whole block and masked at the
band's two edges and the ragged end (``_tile_ranges``). softcap (``cap * tanh(s / cap)``) and
ALiBi (``- slope * |i + Nk - Nq - j|``) change the scores in ``_scores``, which the forward and
both backward kernels share; softcap's derivative ``1 - tanh^2`` scales dS. A sink joins each
row's denominator once, after the keys (``_join_sink``; in the split decode, in the merge), and
its LSE then enters the backward like any other, so no kernel changes for its gradient (``launch``
sums it from the LSE and delta). The LSE the caller gets is this one times ln 2. V's head dim
(``HEAD_DIM_V``) may differ from Q's (MLA).

Layouts (``LAYOUT``): dense; varlen, where program ``b`` of the grid's batch axis is sequence
``b`` of packed tensors and reads its rows and length from ``cu_seqlens`` (``_sequence``; the grid
covers the longest sequence and the rest exit); paged, where keys and values are found page by
page through the block table (``_kv_rows``) and each sequence has its own cache length.

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



#: An unbounded side of a band: past any length, yet small enough that sums like
#: ``row + Nk - Nq + side`` stay in int32.
UNBOUNDED = 1 << 30


def band(causal: bool, window: tuple[int, int] | None) -> tuple[int, int]:
    """(left, right) of the band ``-right <= i + Nk - Nq - j <= left`` every kernel here and the
    Gluon forward take for a window ``(left, right)`` (a side of -1 unbounded, as the contract's;
    None: no window): an unbounded side, or one past :data:`UNBOUNDED` (2**31 - 1 would wrap the
    int32 sums), as :data:`UNBOUNDED`; causal folded into the right side (at most 0)."""
    left, right = window if window is not None else (-1, -1)
    left = UNBOUNDED if left < 0 else min(left, UNBOUNDED)
    right = UNBOUNDED if right < 0 else min(right, UNBOUNDED)
    return left, min(right, 0) if causal else right


#: Layouts of the tensors (a kernel constexpr): dense [B, H, N, D]; varlen, packed sequences found
#: through cu_seqlens; paged, a KV cache read through a block table.
DENSE, VARLEN, PAGED = 0, 1, 2


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
def _sequence(off_b, N_Q, N_K, CU_Q, CU_K, SEQLENS_K, LAYOUT: tl.constexpr):
    # (first query row, queries, first key row, keys) of sequence ``off_b``: its rows in the packed
    # tensors (varlen), its cache length (paged), or the tensors' own lengths (dense).
    if LAYOUT == 1:
        q_start = tl.load(CU_Q + off_b)
        n_q = tl.load(CU_Q + off_b + 1) - q_start
        k_start = tl.load(CU_K + off_b)
        n_k = tl.load(CU_K + off_b + 1) - k_start
    elif LAYOUT == 2:
        q_start = off_b * 0
        n_q = N_Q
        k_start = off_b * 0
        n_k = tl.load(SEQLENS_K + off_b)
    else:
        q_start = off_b * 0
        n_q = N_Q
        k_start = off_b * 0
        n_k = N_K
    return q_start, n_q, k_start, n_k


@_kernel
def _kv_rows(start_n, offs_n, n_k, table, stride_kp, stride_kn, stride_vp, stride_vn,
             PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, PAGED: tl.constexpr):
    # Element offsets of key rows ``offs_n`` in K and V: row * stride, or through the block table
    # (page * page stride + slot * slot stride). A tile inside one page reads one table entry.
    if PAGED:
        if PAGE_SIZE % BLOCK_N == 0:
            page = tl.load(table + start_n // PAGE_SIZE).to(tl.int64)
        else:
            page = tl.load(table + offs_n // PAGE_SIZE, mask=offs_n < n_k, other=0).to(tl.int64)
        slot = offs_n % PAGE_SIZE
        return page * stride_kp + slot * stride_kn, page * stride_vp + slot * stride_vn
    else:
        return offs_n * stride_kn, offs_n * stride_vn


@_kernel
def _tanh(x, FAST: tl.constexpr):
    if FAST:  # CUDA, 16-bit inputs: the SFU's tanh (max relative error about 2**-11)
        return tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=r,r", [x], dtype=tl.float32,
                                         is_pure=True, pack=1)
    else:  # exact to float32 rounding: 1 - 2 / (e^2x + 1), +-1 past overflow
        return 1.0 - 2.0 / (tl.exp2(x * 2.8853900817779268) + 1.0)


@_kernel
def _scores(qk, i, j, n_k, diag, left, right, qk_scale, cap_scale, slope,
            SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, MASKED: tl.constexpr, BANDED: tl.constexpr,
            FAST_TANH: tl.constexpr):
    # The base-2 scores of the products ``qk`` of query rows ``i`` and key rows ``j`` (broadcast
    # against each other), and tanh of the capped ones (for softcap's derivative). In order: the
    # scale, softcap (``qk_scale`` is then ``cap * log2(e)`` and ``cap_scale`` ``scale / cap``),
    # ALiBi (``slope`` already times log2(e)), then, in masked tiles, keys past the end and keys
    # outside the band ``-right <= i + diag - j <= left`` become -inf.
    if SOFTCAP:
        t = _tanh(qk * cap_scale, FAST_TANH)
        s = t * qk_scale
    else:
        t = qk
        s = qk * qk_scale
    if ALIBI == 1:  # the distance in integers (True is 1)
        s = s - slope * tl.abs(i + diag - j).to(tl.float32)
    elif ALIBI == 2:
        # The same bias, bit for bit (positions are exact in float32 below 2**24): the rows and
        # columns convert once each instead of every score, since an integer-to-float conversion
        # runs at the exp's quarter rate. The forward's loop loses a sixth of its instructions,
        # the dK/dV loop a tenth (triton 3.6). The dQ kernel keeps the integer form: its loop,
        # whose rows are fixed, came out shorter with it (NOTES v8).
        s = s - slope * tl.abs((i + diag).to(tl.float32) - j.to(tl.float32))
    return _masked(s, i, j, n_k, diag, left, right, MASKED, BANDED), t


@_kernel
def _masked(s, i, j, n_k, diag, left, right, MASKED: tl.constexpr, BANDED: tl.constexpr):
    # In masked tiles, keys past the end and keys outside the band ``-right <= i + diag - j <=
    # left`` become -inf.
    if MASKED:
        visible = j < n_k
        if BANDED:
            distance = i + diag - j
            visible = visible & (distance <= left) & (distance >= -right)
        s = tl.where(visible, s, float("-inf"))
    return s


@_kernel
def _tile_ranges(lo, hi, all_lo, all_hi, BLOCK: tl.constexpr, LEADING: tl.constexpr):
    # Block ranges over [lo, hi) on a grid of BLOCK from 0: masked [start, a), unmasked [a, b),
    # masked [b, end). [all_lo, all_hi) is what every row of the tile sees, so its whole blocks
    # need no mask. Negative bounds are clamped first (integer division must not see them).
    # Without LEADING (no bound on that side: lo and all_lo are <= 0) the ranges start at the
    # constant 0, as the kernels did before windows: computed lower bounds cost the backward
    # kernels 25-50 registers per thread (Triton 3.6 and 3.9, sm90; NOTES.md).
    if LEADING:
        end = tl.maximum(hi, lo)
        start = tl.where(end > lo, lo // BLOCK * BLOCK, end)
        a = tl.minimum(tl.cdiv(tl.maximum(all_lo, start), BLOCK) * BLOCK, end)
        a = tl.maximum(a, start)
    else:
        end = tl.maximum(hi, 0)
        start = 0
        a = 0
    b = tl.maximum(tl.maximum(all_hi, a) // BLOCK * BLOCK, a)
    return start, a, b, end


@_kernel
def _attn_fwd_inner(acc, l_i, m_i, q, k_base, v_base, table,
                    stride_kp, stride_kn, stride_kd, stride_vp, stride_vn, stride_vd,
                    i, offs_d, offs_dv, lo, hi, n_k, diag, left, right, qk_scale, cap_scale, slope,
                    HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr, BLOCK_D: tl.constexpr,
                    BLOCK_DV: tl.constexpr, BLOCK_N: tl.constexpr, BANDED: tl.constexpr,
                    SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, PAGED: tl.constexpr,
                    PAGE_SIZE: tl.constexpr, MASKED: tl.constexpr, FAST_TANH: tl.constexpr,
                    DOT_PRECISION: tl.constexpr, RAW_MAX: tl.constexpr):
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k_rows, v_rows = _kv_rows(start_n, offs_n, n_k, table, stride_kp, stride_kn, stride_vp, stride_vn,
                                  PAGE_SIZE, BLOCK_N, PAGED)
        k = _load_tile(k_base + k_rows[:, None] + offs_d[None, :] * stride_kd,
                       offs_n, n_k, offs_d, HEAD_DIM, MASKED, HEAD_DIM != BLOCK_D)
        v = _load_tile(v_base + v_rows[:, None] + offs_dv[None, :] * stride_vd,
                       offs_n, n_k, offs_dv, HEAD_DIM_V, MASKED, HEAD_DIM_V != BLOCK_DV)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        if RAW_MAX:
            # Plain scores with qk_scale > 0: the row maximum of the raw products, scaled once
            # per row, and the scale joins exp2's argument (one FFMA a score). The scaled scores
            # are never formed: one FMUL a score fewer (NOTES.md, v7).
            s = _masked(qk, i, offs_n[None, :], n_k, diag, left, right, MASKED, BANDED)
            m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
        else:
            s, t = _scores(qk, i, offs_n[None, :], n_k, diag, left, right, qk_scale, cap_scale, slope,
                           SOFTCAP, ALIBI * 2, MASKED, BANDED, FAST_TANH)  # ALiBi's float form
            m_new = tl.maximum(m_i, tl.max(s, 1))
        if MASKED:
            # A row that has seen no key yet still has m = -inf; shifting it by 0 instead keeps
            # exp2(-inf - -inf) = NaN out of alpha and p (both become exactly 0).
            m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        else:
            m_shift = m_new
        alpha = tl.exp2(m_i - m_shift)
        if RAW_MAX:
            p = tl.exp2(s * qk_scale - m_shift[:, None])
        else:
            p = tl.exp2(s - m_shift[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@_kernel
def _attn_fwd_rows(q, k_base, v_base, table, stride_kp, stride_kn, stride_kd, stride_vp, stride_vn, stride_vd,
                   i, offs_d, offs_dv, lo, hi, all_lo, all_hi, n_k, diag, left, right,
                   qk_scale, cap_scale, slope,
                   ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
                   BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_N: tl.constexpr,
                   BANDED: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr,
                   PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr, FAST_TANH: tl.constexpr,
                   DOT_PRECISION: tl.constexpr, LEADING: tl.constexpr, RAW_MAX: tl.constexpr):
    # One tile of query rows against keys [lo, hi), of which [all_lo, all_hi) are seen by every
    # row (see _tile_ranges). Returns the normalized output, which rows saw a key (l > 0), and
    # m + log2(l) for those rows; the caller chooses what a row that saw no key saves. The
    # leading masked blocks exist only under a window's left bound (LEADING): without one the
    # loop is not generated at all, so plain and causal tiles compile as they did before windows.
    start, a, b, end = _tile_ranges(lo, hi, all_lo, all_hi, BLOCK_N, LEADING)
    m_i = tl.full([ROWS], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([ROWS], dtype=tl.float32)
    acc = tl.zeros([ROWS, BLOCK_DV], dtype=tl.float32)
    if LEADING:
        acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, k_base, v_base, table,
                                        stride_kp, stride_kn, stride_kd, stride_vp, stride_vn, stride_vd,
                                        i, offs_d, offs_dv, start, a, n_k, diag, left, right,
                                        qk_scale, cap_scale, slope, HEAD_DIM, HEAD_DIM_V, BLOCK_D, BLOCK_DV,
                                        BLOCK_N, BANDED, SOFTCAP, ALIBI, PAGED, PAGE_SIZE, True, FAST_TANH,
                                        DOT_PRECISION, RAW_MAX)
    acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, k_base, v_base, table,
                                    stride_kp, stride_kn, stride_kd, stride_vp, stride_vn, stride_vd,
                                    i, offs_d, offs_dv, a, b, n_k, diag, left, right,
                                    qk_scale, cap_scale, slope, HEAD_DIM, HEAD_DIM_V, BLOCK_D, BLOCK_DV,
                                    BLOCK_N, BANDED, SOFTCAP, ALIBI, PAGED, PAGE_SIZE, False, FAST_TANH,
                                    DOT_PRECISION, RAW_MAX)
    acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, k_base, v_base, table,
                                    stride_kp, stride_kn, stride_kd, stride_vp, stride_vn, stride_vd,
                                    i, offs_d, offs_dv, b, end, n_k, diag, left, right,
                                    qk_scale, cap_scale, slope, HEAD_DIM, HEAD_DIM_V, BLOCK_D, BLOCK_DV,
                                    BLOCK_N, BANDED, SOFTCAP, ALIBI, PAGED, PAGE_SIZE, True, FAST_TANH,
                                    DOT_PRECISION, RAW_MAX)
    seen = l_i > 0.0
    l_safe = tl.where(seen, l_i, 1.0)
    return acc / l_safe[:, None], seen, m_i + tl.log2(l_safe)


@_kernel
def _join_sink(out, seen, lse, sink):
    # A sink (base-2 logit ``sink`` per row) joins the denominator and adds no value: the output
    # shrinks by 2^(lse - new lse). A row that saw no key keeps zeros, and its LSE is the sink's.
    lse = tl.where(seen, lse, float("-inf"))
    top = tl.maximum(lse, sink)
    total = top + tl.log2(tl.exp2(lse - top) + tl.exp2(sink - top))
    return out * tl.exp2(lse - total)[:, None], total


@_kernel
def attn_fwd(Q, K, V, O, LSE, SLOPES, SINKS, CU_Q, CU_K, SEQLENS_K, TABLE,
             stride_qb, stride_qh, stride_qm, stride_qd,
             stride_kb, stride_kh, stride_kn, stride_kd,
             stride_vb, stride_vh, stride_vn, stride_vd,
             stride_ob, stride_oh, stride_om, stride_od,
             stride_lb, stride_lh, stride_sb, stride_tb,
             H_Q, N_Q, N_K, GROUP, qk_scale, cap_scale, left, right,
             HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr, BLOCK_D: tl.constexpr,
             BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             BANDED: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, HAS_SINKS: tl.constexpr,
             LAYOUT: tl.constexpr, PAGE_SIZE: tl.constexpr, FAST_TANH: tl.constexpr,
             DOT_PRECISION: tl.constexpr, LEADING: tl.constexpr, RAW_MAX: tl.constexpr):
    start_m = tl.program_id(0) * BLOCK_M
    off_bh = tl.program_id(1)
    # 64-bit head offsets: batch * stride can pass 2**31 elements on large inputs.
    off_b = (off_bh // H_Q).to(tl.int64)
    off_h = (off_bh % H_Q).to(tl.int64)
    q_start, n_q, k_start, n_k = _sequence(off_b, N_Q, N_K, CU_Q, CU_K, SEQLENS_K, LAYOUT)
    if LAYOUT == 1:
        if start_m >= n_q:  # varlen: the grid covers the longest sequence
            return
    off_hkv = off_h // GROUP
    q_base = Q + off_b * stride_qb + off_h * stride_qh
    o_base = O + off_b * stride_ob + off_h * stride_oh
    lse_base = LSE + off_b * stride_lb + off_h * stride_lh
    if LAYOUT == 2:  # paged: K and V rows are found through the block table
        k_base = K + off_hkv * stride_kh
        v_base = V + off_hkv * stride_vh
    else:
        k_base = K + off_b * stride_kb + off_hkv * stride_kh
        v_base = V + off_b * stride_vb + off_hkv * stride_vh
    if LAYOUT == 1:  # varlen: the sequence's first rows
        q_base += q_start.to(tl.int64) * stride_qm
        o_base += q_start.to(tl.int64) * stride_om
        lse_base += q_start.to(tl.int64)
        k_base += k_start.to(tl.int64) * stride_kn
        v_base += k_start.to(tl.int64) * stride_vn
    table = TABLE + off_b * stride_tb

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    q = _load_tile(q_base + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                   offs_m, n_q, offs_d, HEAD_DIM, True, HEAD_DIM != BLOCK_D)
    slope = 0.0
    if ALIBI:
        slope = tl.load(SLOPES + off_b * stride_sb + off_h) * 1.4426950408889634

    # Row i sees key j when -right <= i + diag - j <= left (bottom-right: diag = Nk - Nq; causal
    # is right = 0; an unbounded side is a huge number). Keys outside the block's band are never
    # visited; those every row sees are visited unmasked.
    diag = n_k - n_q
    last = tl.minimum(start_m + BLOCK_M, n_q) - 1
    lo = tl.maximum(start_m + diag - left, 0)
    hi = tl.minimum(last + diag + right + 1, n_k)
    all_lo = last + diag - left
    all_hi = tl.minimum(start_m + diag + right + 1, n_k)
    out, seen, lse = _attn_fwd_rows(q, k_base, v_base, table, stride_kb, stride_kn, stride_kd,
                                    stride_vb, stride_vn, stride_vd,
                                    offs_m[:, None], offs_d, offs_dv, lo, hi, all_lo, all_hi, n_k, diag,
                                    left, right, qk_scale, cap_scale, slope,
                                    BLOCK_M, HEAD_DIM, HEAD_DIM_V, BLOCK_D, BLOCK_DV, BLOCK_N, BANDED,
                                    SOFTCAP, ALIBI, LAYOUT == 2, PAGE_SIZE, FAST_TANH, DOT_PRECISION, LEADING,
                                    RAW_MAX)
    if HAS_SINKS:
        out, lse = _join_sink(out, seen, lse, tl.load(SINKS + off_h) * 1.4426950408889634)
    else:
        # l == 0 exactly when a row saw no key: it outputs 0 and saves lse = +inf, so that the
        # backward's recomputed p = exp2(s - lse) is 0 for it.
        lse = tl.where(seen, lse, float("inf"))

    _store_tile(o_base + offs_m[:, None] * stride_om + offs_dv[None, :] * stride_od,
                out.to(O.dtype.element_ty), offs_m, n_q, offs_dv, HEAD_DIM_V, HEAD_DIM_V != BLOCK_DV)
    tl.store(lse_base + offs_m, lse, mask=offs_m < n_q)


@_kernel
def attn_fwd_split(Q, K, V, O, LSE, O_PART, LSE_PART, SLOPES, SINKS, SEQLENS_K, TABLE,
                   stride_qb, stride_qh, stride_qm, stride_qd,
                   stride_kb, stride_kh, stride_kn, stride_kd,
                   stride_vb, stride_vh, stride_vn, stride_vd,
                   stride_ob, stride_oh, stride_om, stride_od,
                   stride_lb, stride_lh, stride_sb, stride_tb,
                   H_Q, H_KV, N_Q, N_K, GROUP, keys_per_split, qk_scale, cap_scale, left, right,
                   HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr, BLOCK_D: tl.constexpr,
                   BLOCK_DV: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
                   BANDED: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr,
                   HAS_SINKS: tl.constexpr, LAYOUT: tl.constexpr, PAGE_SIZE: tl.constexpr,
                   DIRECT: tl.constexpr, FAST_TANH: tl.constexpr, DOT_PRECISION: tl.constexpr,
                   RAW_MAX: tl.constexpr):
    # Decode (Flash-Decoding): few query rows against a long KV cache. One program takes one kv
    # head and one slice of the keys, for every query row that reads that kv head: row r of the
    # tile is query position r % N_Q of query head hkv * GROUP + r // N_Q, so a GQA group reads its
    # K and V once. With one slice (DIRECT) it writes the output; otherwise each slice writes its
    # normalized partial output and log-sum-exp, and attn_fwd_combine merges the slices (and the
    # sinks). LAYOUT is dense or paged (each sequence its own cache length).
    split = tl.program_id(0)
    num_splits = tl.num_programs(0)
    off_bhkv = tl.program_id(1)
    off_b = (off_bhkv // H_KV).to(tl.int64)
    off_hkv = (off_bhkv % H_KV).to(tl.int64)
    if LAYOUT == 2:
        n_k = tl.load(SEQLENS_K + off_b)
        k_base = K + off_hkv * stride_kh
        v_base = V + off_hkv * stride_vh
    else:
        n_k = N_K
        k_base = K + off_b * stride_kb + off_hkv * stride_kh
        v_base = V + off_b * stride_vb + off_hkv * stride_vh
    table = TABLE + off_b * stride_tb
    rows = tl.arange(0, BLOCK_R)
    row_ok = rows < GROUP * N_Q
    head = off_hkv * GROUP + rows // N_Q
    pos = rows % N_Q
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    q = tl.load(Q + off_b * stride_qb + head[:, None] * stride_qh + pos[:, None] * stride_qm
                + offs_d[None, :] * stride_qd, mask=row_ok[:, None] & (offs_d < HEAD_DIM)[None, :], other=0.0)
    slope = 0.0
    if ALIBI:
        slope = (tl.load(SLOPES + off_b * stride_sb + head, mask=row_ok, other=0.0) * 1.4426950408889634)[:, None]

    # This slice's keys, cut to the band of the rows (positions 0 .. N_Q - 1, as in attn_fwd).
    # Slices start on the block grid, so the masked blocks never reach into a neighbour; a slice's
    # start is a leading bound like a window's, so the leading loop is always generated here.
    diag = n_k - N_Q
    slice_lo = split * keys_per_split
    slice_hi = tl.minimum(slice_lo + keys_per_split, n_k)
    lo = tl.maximum(tl.maximum(diag - left, 0), slice_lo)
    hi = tl.minimum(N_Q - 1 + diag + right + 1, slice_hi)
    all_lo = N_Q - 1 + diag - left
    all_hi = tl.minimum(diag + right + 1, hi)
    out, seen, lse = _attn_fwd_rows(q, k_base, v_base, table, stride_kb, stride_kn, stride_kd,
                                    stride_vb, stride_vn, stride_vd,
                                    pos[:, None], offs_d, offs_dv, lo, hi, all_lo, all_hi, n_k, diag,
                                    left, right, qk_scale, cap_scale, slope,
                                    BLOCK_R, HEAD_DIM, HEAD_DIM_V, BLOCK_D, BLOCK_DV, BLOCK_N, BANDED,
                                    SOFTCAP, ALIBI, LAYOUT == 2, PAGE_SIZE, FAST_TANH, DOT_PRECISION, True,
                                    RAW_MAX)
    if DIRECT:
        if HAS_SINKS:
            sink = tl.load(SINKS + head, mask=row_ok, other=0.0) * 1.4426950408889634
            out, lse = _join_sink(out, seen, lse, sink)
        else:
            lse = tl.where(seen, lse, float("inf"))
        tl.store(O + off_b * stride_ob + head[:, None] * stride_oh + pos[:, None] * stride_om
                 + offs_dv[None, :] * stride_od, out.to(O.dtype.element_ty),
                 mask=row_ok[:, None] & (offs_dv < HEAD_DIM_V)[None, :])
        tl.store(LSE + off_b * stride_lb + head * stride_lh + pos, lse, mask=row_ok)
    else:
        # A slice that saw no key for a row weighs nothing in the merge: lse = -inf there.
        part = ((off_b * H_Q + head) * N_Q + pos) * num_splits + split
        tl.store(O_PART + part[:, None] * BLOCK_DV + offs_dv[None, :], out, mask=row_ok[:, None])
        tl.store(LSE_PART + part, tl.where(seen, lse, float("-inf")), mask=row_ok)


@_kernel
def attn_fwd_combine(O_PART, LSE_PART, O, LSE, SINKS,
                     stride_ob, stride_oh, stride_om, stride_od,
                     stride_lb, stride_lh,
                     H_Q, N_Q, num_splits,
                     HEAD_DIM_V: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_S: tl.constexpr,
                     HAS_SINKS: tl.constexpr):
    # Merges the slices of one query row: o = sum_s w_s o_s / sum_s w_s with w_s = 2^(lse_s - max);
    # a sink adds its weight to the denominator only.
    row = tl.program_id(0).to(tl.int64)
    off_bh = row // N_Q
    pos = row % N_Q
    off_b = off_bh // H_Q
    off_h = off_bh % H_Q
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_DV)
    lse_s = tl.load(LSE_PART + row * num_splits + offs_s, mask=offs_s < num_splits, other=float("-inf"))
    m = tl.max(lse_s, 0)
    if HAS_SINKS:
        sink = tl.load(SINKS + off_h) * 1.4426950408889634
        m = tl.maximum(m, sink)
    m_safe = tl.where(m == float("-inf"), 0.0, m)  # no slice saw a key: every weight is 0
    w = tl.exp2(lse_s - m_safe)
    total = tl.sum(w, 0)
    if HAS_SINKS:
        total += tl.exp2(sink - m_safe)
    o_s = tl.load(O_PART + (row * num_splits + offs_s)[:, None] * BLOCK_DV + offs_d[None, :],
                  mask=(offs_s < num_splits)[:, None], other=0.0)
    out = tl.sum(o_s * w[:, None], 0) / tl.where(total > 0.0, total, 1.0)
    tl.store(O + off_b * stride_ob + off_h * stride_oh + pos * stride_om + offs_d * stride_od,
             out.to(O.dtype.element_ty), mask=offs_d < HEAD_DIM_V)
    tl.store(LSE + off_b * stride_lb + off_h * stride_lh + pos,
             tl.where(total > 0.0, m_safe + tl.log2(total), float("inf")))



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
        # qk_scale > 0 (attn_fwd_fp8): the row maximum of the raw products, scaled once per
        # row, as _attn_fwd_inner's RAW_MAX.
        qk = tl.dot(q, tl.trans(k))
        if MASKED:
            visible = offs_n[None, :] < N_K
            if CAUSAL:
                visible = visible & (offs_n[None, :] <= offs_m[:, None] + diag)
            qk = tl.where(visible, qk, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)  # as in _attn_fwd_inner
        else:
            m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            m_shift = m_new
        alpha = tl.exp2(m_i - m_shift)
        # p * 256 (<= 256 < 448): its small entries stay normal in e4m3; cancels in acc / l.
        p = tl.exp2(qk * qk_scale - (m_shift - 8.0)[:, None])
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
    # One scale for the logits: softmax scale * log2(e) * q's and k's descales. The loop takes
    # the row maximum before scaling, which needs a scale > 0: a negative one turns into q's sign
    # (exact in e4m3), and zero into a tiny scale (every score ~0: the uniform average it means).
    # A NaN descale stays NaN here, but the row maximum's tl.maximum drops NaNs, so the output
    # does not always show it (not checked: no finite-descale guarantee is made).
    qk_scale = qk_scale * tl.load(Q_DESCALE + descale) * tl.load(K_DESCALE + descale)
    sign_bit = tl.where(qk_scale < 0, 128, 0).to(tl.uint8)
    qk_scale = tl.where(qk_scale == 0, 1e-30, tl.abs(qk_scale))
    v_descale = tl.load(V_DESCALE + descale)
    q_base = Q + off_b * stride_qb + off_h * stride_qh
    k_base = K + off_b * stride_kb + off_hkv * stride_kh
    v_base = V + off_b * stride_vb + off_hkv * stride_vh
    o_base = O + off_b * stride_ob + off_h * stride_oh

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(q_base + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                mask=offs_m[:, None] < N_Q, other=0.0)
    q = (q.to(tl.uint8, bitcast=True) ^ sign_bit).to(Q.dtype.element_ty, bitcast=True)

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
                        HEAD_DIM_V: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr):
    # delta = rowsum(dO * O), stored [B, H, N] contiguous (a packed layout is one long sequence).
    start_m = tl.program_id(0) * BLOCK_M
    off_bh = tl.program_id(1)
    off_b = (off_bh // H_Q).to(tl.int64)
    off_h = (off_bh % H_Q).to(tl.int64)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_DV)
    o = _load_tile(O + off_b * stride_ob + off_h * stride_oh
                   + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od,
                   offs_m, N_Q, offs_d, HEAD_DIM_V, True, HEAD_DIM_V != BLOCK_DV)
    do = _load_tile(DO + off_b * stride_dob + off_h * stride_doh
                    + offs_m[:, None] * stride_dom + offs_d[None, :] * stride_dod,
                    offs_m, N_Q, offs_d, HEAD_DIM_V, True, HEAD_DIM_V != BLOCK_DV)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(DELTA + off_bh.to(tl.int64) * N_Q + offs_m, delta, mask=offs_m < N_Q)


@_kernel
def dq_unblock(W, DQ, N_Q, N4, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    # The Gluon backward's -dqb workspace, float32 [B * H, D / 8, N4, 8] (each row's 8-column
    # blocks apart), to dQ in DQ's dtype, [B * H, N, D] contiguous: the conversion that follows
    # the kernel, reading 32 contiguous bytes a block (gluon_backward.dq_result).
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    off_bh = tl.program_id(1).to(tl.int64)
    offs_d = tl.arange(0, HEAD_DIM)
    src = (W + off_bh * HEAD_DIM * N4 + (offs_d // 8)[None, :] * (N4 * 8) + offs_m[:, None] * 8
           + (offs_d % 8)[None, :])
    rows = (offs_m < N_Q)[:, None]
    dq = tl.load(src, mask=rows)
    tl.store(DQ + off_bh * N_Q * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :],
             dq.to(DQ.dtype.element_ty), mask=rows)


@_kernel
def _padded_start(CU_Q, off_b, ROWS: tl.constexpr):
    # Where sequence b's rows start in the padded copies: a multiple of ROWS, and far enough past
    # sequence b - 1's start for its rows rounded up to ROWS (with f(x) = x // ROWS * ROWS, both
    # f(cu[b + 1]) and f(cu[b]) are multiples of ROWS and their difference is >= len - ROWS + 1,
    # so it is >= round_up(len) - ROWS). Read from cu_seqlens alone, with no prefix sum; the
    # copies need total + ROWS * batch rows.
    return tl.load(CU_Q + off_b) // ROWS * ROWS + ROWS * off_b


@_kernel
def attn_bwd_pad_rows(LSE, DELTA, LSE_P, DELTA_P, CU_Q, stride_h, stride_ph, H_Q, BLOCK_M: tl.constexpr):
    # A packed LSE and delta [H, total] copied to [H, padded]: sequence b's rows start at
    # _padded_start (a multiple of BLOCK_M, launch.PACKED_ROWS), and its rows past its end, up to
    # a multiple of BLOCK_M, hold lse = +inf (so p = 0) and delta = 0. The dK/dV kernel then loads
    # them whole and aligned, with no masks (NOTES v8).
    start_m = tl.program_id(0) * BLOCK_M
    off_bh = tl.program_id(1)
    off_b = off_bh // H_Q
    off_h = (off_bh % H_Q).to(tl.int64)
    q_start, n_q, _, _ = _sequence(off_b, 0, 0, CU_Q, CU_Q, CU_Q, 1)
    if start_m >= n_q:
        return
    offs_m = start_m + tl.arange(0, BLOCK_M)
    inside = offs_m < n_q
    lse = tl.load(LSE + off_h * stride_h + q_start + offs_m, mask=inside, other=float("inf"))
    delta = tl.load(DELTA + off_h * stride_h + q_start + offs_m, mask=inside, other=0.0)
    rows = off_h * stride_ph + _padded_start(CU_Q, off_b, BLOCK_M) + offs_m
    tl.store(LSE_P + rows, lse)
    tl.store(DELTA_P + rows, delta)


@_kernel
def _attn_bwd_dkdv_inner(dk, dv, k, v, q_base, do_base, lse_base, delta_base,
                         stride_qm, stride_qd, stride_dom, stride_dod,
                         offs_n, offs_d, offs_dv, lo, hi, n_q, n_k, diag, left, right,
                         qk_scale, cap_scale, slope,
                         HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr, BLOCK_D: tl.constexpr,
                         BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr, BANDED: tl.constexpr,
                         SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, MASKED: tl.constexpr,
                         FAST_TANH: tl.constexpr, DOT_PRECISION: tl.constexpr, EVEN_Q: tl.constexpr,
                         PADDED: tl.constexpr):
    # Works on the transposed score tile (keys x queries) so every product has this program's
    # key block as its M dimension and accumulates straight into dk and dv. EVEN_Q: the loads
    # need no row mask, as every query block is whole, or (PADDED) as rows past the sequence's end
    # read its last row again and get lse = +inf from the padded copy, hence p = 0.
    for start_m in range(lo, hi, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        rows = offs_m
        if PADDED:
            rows = tl.minimum(offs_m, n_q - 1)
        q = _load_tile(q_base + rows[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                       offs_m, n_q, offs_d, HEAD_DIM, not EVEN_Q, HEAD_DIM != BLOCK_D)
        do = _load_tile(do_base + rows[:, None] * stride_dom + offs_dv[None, :] * stride_dod,
                        offs_m, n_q, offs_dv, HEAD_DIM_V, not EVEN_Q, HEAD_DIM_V != BLOCK_DV)
        if EVEN_Q:
            lse = tl.load(lse_base + offs_m)
            delta = tl.load(delta_base + offs_m)
        else:  # padding rows past n_q get lse = +inf, hence p = 0: no other mask needed for them
            lse = tl.load(lse_base + offs_m, mask=offs_m < n_q, other=float("inf"))
            delta = tl.load(delta_base + offs_m, mask=offs_m < n_q, other=0.0)
        qk_t = tl.dot(k, tl.trans(q), input_precision=DOT_PRECISION)
        # Masked before exp2: a hidden entry's score can be large (harmless once zeroed, but the
        # interpreter warns about the overflow).
        s_t, t_t = _scores(qk_t, offs_m[None, :], offs_n[:, None], n_k, diag, left, right,
                           qk_scale, cap_scale, slope, SOFTCAP, ALIBI * 2, MASKED, BANDED, FAST_TANH)
        p_t = tl.exp2(s_t - lse[None, :])
        dv = tl.dot(p_t.to(do.dtype), do, dv, input_precision=DOT_PRECISION)
        dp_t = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)
        ds_t = p_t * (dp_t - delta[None, :])
        if SOFTCAP:  # d(cap * tanh(x / cap)) / dx = 1 - tanh^2
            ds_t = ds_t * (1.0 - t_t * t_t)
        dk = tl.dot(ds_t.to(q.dtype), q, dk, input_precision=DOT_PRECISION)
    return dk, dv


@_kernel
def attn_bwd_dkdv(Q, K, V, DO, LSE, DELTA, DK, DV, SLOPES, CU_Q, CU_K,
                  stride_qb, stride_qh, stride_qm, stride_qd,
                  stride_kb, stride_kh, stride_kn, stride_kd,
                  stride_vb, stride_vh, stride_vn, stride_vd,
                  stride_dob, stride_doh, stride_dom, stride_dod,
                  stride_dkb, stride_dkh, stride_dkn, stride_dkd,
                  stride_dvb, stride_dvh, stride_dvn, stride_dvd,
                  stride_lb, stride_lh, stride_sb,
                  H_Q, H_KV, N_Q, N_K, GROUP, scale, qk_scale, cap_scale, left, right,
                  HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr, BLOCK_D: tl.constexpr,
                  BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BANDED: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr,
                  LAYOUT: tl.constexpr, FAST_TANH: tl.constexpr, DOT_PRECISION: tl.constexpr,
                  LEADING: tl.constexpr, TRAILING: tl.constexpr, EVEN_Q: tl.constexpr,
                  ROW_ALIGN: tl.constexpr, PADDED: tl.constexpr):
    # PADDED (packed sequences): LSE and DELTA are attn_bwd_pad_rows' copies, rows from
    # _padded_start; otherwise they are [B, H, N] (a packed layout's [H, total], masked per row).
    start_n = tl.program_id(0) * BLOCK_N
    off_bhkv = tl.program_id(1)
    off_b = (off_bhkv // H_KV).to(tl.int64)
    off_hkv = (off_bhkv % H_KV).to(tl.int64)
    q_start, n_q, k_start, n_k = _sequence(off_b, N_Q, N_K, CU_Q, CU_K, CU_K, LAYOUT)
    if LAYOUT == 1:
        if start_n >= n_k:  # varlen: the grid covers the longest sequence
            return
    k_base = K + off_b * stride_kb + off_hkv * stride_kh
    v_base = V + off_b * stride_vb + off_hkv * stride_vh
    dk_base = DK + off_b * stride_dkb + off_hkv * stride_dkh
    dv_base = DV + off_b * stride_dvb + off_hkv * stride_dvh
    if LAYOUT == 1:  # varlen: the sequence's first key row
        k_base += k_start.to(tl.int64) * stride_kn
        v_base += k_start.to(tl.int64) * stride_vn
        dk_base += k_start.to(tl.int64) * stride_dkn
        dv_base += k_start.to(tl.int64) * stride_dvn

    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    k = _load_tile(k_base + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd,
                   offs_n, n_k, offs_d, HEAD_DIM, True, HEAD_DIM != BLOCK_D)
    v = _load_tile(v_base + offs_n[:, None] * stride_vn + offs_dv[None, :] * stride_vd,
                   offs_n, n_k, offs_dv, HEAD_DIM_V, True, HEAD_DIM_V != BLOCK_DV)

    # The queries that see a key of this block: -right <= i + diag - j <= left for some j in it.
    # Those that see every key of a whole block need no mask (padding queries have lse = +inf).
    diag = n_k - n_q
    last_key = tl.minimum(start_n + BLOCK_N, n_k) - 1
    q_end = tl.cdiv(n_q, BLOCK_M) * BLOCK_M
    if TRAILING:  # a window's left bound: masked blocks on both sides of the band
        lo = tl.maximum(start_n - diag - right, 0)
        hi = tl.minimum(last_key - diag + left + 1, n_q)
        all_lo = last_key - diag - right
        all_hi = tl.minimum(start_n - diag + left + 1, q_end)
        if start_n + BLOCK_N > n_k:  # a ragged last key block masks its padding keys everywhere
            all_hi = 0
        start, a, b, end = _tile_ranges(lo, hi, all_lo, all_hi, BLOCK_M, True)
    else:
        # No left bound: every query from the first that sees the block's last key on sees all of
        # it, so one masked range (the diagonal, or every query of a ragged block) and one
        # unmasked. Written as before windows: the general form's computed bounds cost this
        # kernel registers, and with them occupancy (NOTES.md).
        if LEADING:
            start = tl.maximum(start_n - diag - right, 0) // BLOCK_M * BLOCK_M
            a = tl.cdiv(tl.maximum(last_key - diag - right, 0), BLOCK_M) * BLOCK_M
            a = tl.minimum(tl.maximum(a, start), q_end)
        else:
            start = 0
            a = 0
        if start_n + BLOCK_N > n_k:
            a = q_end
        b = n_q
        end = n_q

    row_start = q_start
    if PADDED:  # a multiple of ROW_ALIGN, which the compiler sees: aligned loads
        row_start = _padded_start(CU_Q, off_b, ROW_ALIGN)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)
    # Summing the group's query heads here writes dk/dv once, with no [B, Hq, Nk, D] scratch.
    for g in range(0, GROUP):
        off_h = off_hkv * GROUP + g
        q_base = Q + off_b * stride_qb + off_h * stride_qh
        do_base = DO + off_b * stride_dob + off_h * stride_doh
        lse_base = LSE + off_b * stride_lb + off_h * stride_lh
        delta_base = DELTA + off_b * stride_lb + off_h * stride_lh
        if LAYOUT == 1:  # varlen: the sequence's first query row, and its LSE/delta rows
            q_base += q_start.to(tl.int64) * stride_qm
            do_base += q_start.to(tl.int64) * stride_dom
            lse_base += row_start.to(tl.int64)
            delta_base += row_start.to(tl.int64)
        slope = 0.0
        if ALIBI:
            slope = tl.load(SLOPES + off_b * stride_sb + off_h) * 1.4426950408889634
        # Queries before the diagonal or the window's right edge see part of the block (and every
        # query sees only part of a ragged last block).
        dk, dv = _attn_bwd_dkdv_inner(dk, dv, k, v, q_base, do_base, lse_base, delta_base,
                                      stride_qm, stride_qd, stride_dom, stride_dod,
                                      offs_n, offs_d, offs_dv, start, a, n_q, n_k, diag, left, right,
                                      qk_scale, cap_scale, slope, HEAD_DIM, HEAD_DIM_V, BLOCK_D, BLOCK_DV,
                                      BLOCK_M, BANDED, SOFTCAP, ALIBI, True, FAST_TANH, DOT_PRECISION, EVEN_Q,
                                      PADDED)
        dk, dv = _attn_bwd_dkdv_inner(dk, dv, k, v, q_base, do_base, lse_base, delta_base,
                                      stride_qm, stride_qd, stride_dom, stride_dod,
                                      offs_n, offs_d, offs_dv, a, b, n_q, n_k, diag, left, right,
                                      qk_scale, cap_scale, slope, HEAD_DIM, HEAD_DIM_V, BLOCK_D, BLOCK_DV,
                                      BLOCK_M, BANDED, SOFTCAP, ALIBI, False, FAST_TANH, DOT_PRECISION, EVEN_Q,
                                      PADDED)
        if TRAILING:
            dk, dv = _attn_bwd_dkdv_inner(dk, dv, k, v, q_base, do_base, lse_base, delta_base,
                                          stride_qm, stride_qd, stride_dom, stride_dod,
                                          offs_n, offs_d, offs_dv, b, end, n_q, n_k, diag, left, right,
                                          qk_scale, cap_scale, slope, HEAD_DIM, HEAD_DIM_V, BLOCK_D, BLOCK_DV,
                                          BLOCK_M, BANDED, SOFTCAP, ALIBI, True, FAST_TANH, DOT_PRECISION, EVEN_Q,
                                          PADDED)

    dk = dk * scale
    _store_tile(dk_base + offs_n[:, None] * stride_dkn + offs_d[None, :] * stride_dkd,
                dk.to(DK.dtype.element_ty), offs_n, n_k, offs_d, HEAD_DIM, HEAD_DIM != BLOCK_D)
    _store_tile(dv_base + offs_n[:, None] * stride_dvn + offs_dv[None, :] * stride_dvd,
                dv.to(DV.dtype.element_ty), offs_n, n_k, offs_dv, HEAD_DIM_V, HEAD_DIM_V != BLOCK_DV)


@_kernel
def _attn_bwd_dq_inner(dq, q, do, lse, delta, k_base, v_base,
                       stride_kn, stride_kd, stride_vn, stride_vd,
                       i, offs_d, offs_dv, lo, hi, n_k, diag, left, right, qk_scale, cap_scale, slope,
                       HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr, BLOCK_D: tl.constexpr,
                       BLOCK_DV: tl.constexpr, BLOCK_N: tl.constexpr, BANDED: tl.constexpr,
                       SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, MASKED: tl.constexpr,
                       FAST_TANH: tl.constexpr, DOT_PRECISION: tl.constexpr):
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k = _load_tile(k_base + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd,
                       offs_n, n_k, offs_d, HEAD_DIM, MASKED, HEAD_DIM != BLOCK_D)
        v = _load_tile(v_base + offs_n[:, None] * stride_vn + offs_dv[None, :] * stride_vd,
                       offs_n, n_k, offs_dv, HEAD_DIM_V, MASKED, HEAD_DIM_V != BLOCK_DV)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        # Hidden and padding keys (loaded as zeros) may have a large score: masked before exp2.
        s, t = _scores(qk, i, offs_n[None, :], n_k, diag, left, right, qk_scale, cap_scale, slope,
                       SOFTCAP, ALIBI, MASKED, BANDED, FAST_TANH)
        p = tl.exp2(s - lse[:, None])
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
        ds = p * (dp - delta[:, None])
        if SOFTCAP:
            ds = ds * (1.0 - t * t)
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=DOT_PRECISION)
    return dq


@_kernel
def attn_bwd_dq(Q, K, V, DO, LSE, DELTA, DQ, SLOPES, CU_Q, CU_K,
                stride_qb, stride_qh, stride_qm, stride_qd,
                stride_kb, stride_kh, stride_kn, stride_kd,
                stride_vb, stride_vh, stride_vn, stride_vd,
                stride_dob, stride_doh, stride_dom, stride_dod,
                stride_dqb, stride_dqh, stride_dqm, stride_dqd,
                stride_lb, stride_lh, stride_sb,
                H_Q, N_Q, N_K, GROUP, scale, qk_scale, cap_scale, left, right,
                HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr, BLOCK_D: tl.constexpr,
                BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BANDED: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr,
                LAYOUT: tl.constexpr, FAST_TANH: tl.constexpr, DOT_PRECISION: tl.constexpr,
                LEADING: tl.constexpr):
    start_m = tl.program_id(0) * BLOCK_M
    off_bh = tl.program_id(1)
    off_b = (off_bh // H_Q).to(tl.int64)
    off_h = (off_bh % H_Q).to(tl.int64)
    q_start, n_q, k_start, n_k = _sequence(off_b, N_Q, N_K, CU_Q, CU_K, CU_K, LAYOUT)
    if LAYOUT == 1:
        if start_m >= n_q:
            return
    off_hkv = off_h // GROUP
    k_base = K + off_b * stride_kb + off_hkv * stride_kh
    v_base = V + off_b * stride_vb + off_hkv * stride_vh
    q_base = Q + off_b * stride_qb + off_h * stride_qh
    do_base = DO + off_b * stride_dob + off_h * stride_doh
    dq_base = DQ + off_b * stride_dqb + off_h * stride_dqh
    row = off_b * stride_lb + off_h * stride_lh
    if LAYOUT == 1:  # varlen: the sequence's first rows
        k_base += k_start.to(tl.int64) * stride_kn
        v_base += k_start.to(tl.int64) * stride_vn
        q_base += q_start.to(tl.int64) * stride_qm
        do_base += q_start.to(tl.int64) * stride_dom
        dq_base += q_start.to(tl.int64) * stride_dqm
        row += q_start.to(tl.int64)

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    q = _load_tile(q_base + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                   offs_m, n_q, offs_d, HEAD_DIM, True, HEAD_DIM != BLOCK_D)
    do = _load_tile(do_base + offs_m[:, None] * stride_dom + offs_dv[None, :] * stride_dod,
                    offs_m, n_q, offs_dv, HEAD_DIM_V, True, HEAD_DIM_V != BLOCK_DV)
    lse = tl.load(LSE + row + offs_m, mask=offs_m < n_q, other=float("inf"))
    delta = tl.load(DELTA + row + offs_m, mask=offs_m < n_q, other=0.0)
    slope = 0.0
    if ALIBI:
        slope = tl.load(SLOPES + off_b * stride_sb + off_h) * 1.4426950408889634

    diag = n_k - n_q  # the forward's key ranges
    last = tl.minimum(start_m + BLOCK_M, n_q) - 1
    lo = tl.maximum(start_m + diag - left, 0)
    hi = tl.minimum(last + diag + right + 1, n_k)
    all_lo = last + diag - left
    all_hi = tl.minimum(start_m + diag + right + 1, n_k)
    start, a, b, end = _tile_ranges(lo, hi, all_lo, all_hi, BLOCK_N, LEADING)

    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    if LEADING:  # a window's left bound: the band's first blocks are partly visible
        dq = _attn_bwd_dq_inner(dq, q, do, lse, delta, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
                                offs_m[:, None], offs_d, offs_dv, start, a, n_k, diag, left, right,
                                qk_scale, cap_scale, slope, HEAD_DIM, HEAD_DIM_V, BLOCK_D, BLOCK_DV, BLOCK_N,
                                BANDED, SOFTCAP, ALIBI, True, FAST_TANH, DOT_PRECISION)
    dq = _attn_bwd_dq_inner(dq, q, do, lse, delta, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
                            offs_m[:, None], offs_d, offs_dv, a, b, n_k, diag, left, right,
                            qk_scale, cap_scale, slope, HEAD_DIM, HEAD_DIM_V, BLOCK_D, BLOCK_DV, BLOCK_N,
                            BANDED, SOFTCAP, ALIBI, False, FAST_TANH, DOT_PRECISION)
    dq = _attn_bwd_dq_inner(dq, q, do, lse, delta, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
                            offs_m[:, None], offs_d, offs_dv, b, end, n_k, diag, left, right,
                            qk_scale, cap_scale, slope, HEAD_DIM, HEAD_DIM_V, BLOCK_D, BLOCK_DV, BLOCK_N,
                            BANDED, SOFTCAP, ALIBI, True, FAST_TANH, DOT_PRECISION)
    dq = dq * scale
    _store_tile(dq_base + offs_m[:, None] * stride_dqm + offs_d[None, :] * stride_dqd,
                dq.to(DQ.dtype.element_ty), offs_m, n_q, offs_d, HEAD_DIM, HEAD_DIM != BLOCK_D)
