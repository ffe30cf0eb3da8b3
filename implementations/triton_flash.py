"""FlashAttention in Triton, forward and backward, for pytest-attnkit.

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

Decode (a few query rows per kv head against a long cache) takes ``_attn_fwd_split``: the keys,
not the queries, are split across programs (Flash-Decoding), and ``_attn_fwd_combine`` merges the
slices by their log-sum-exps. Tile shapes are fixed per kernel, head dim and causal flag
(``default_tiles``, measured on an H200); ``ATTNKIT_TRITON_FLASH_TUNE=1`` times the candidates
instead. Versions, numbers and what limits them: ``triton_flash_NOTES.md`` beside this file.
"""

from __future__ import annotations

import functools
import math
import os
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from pytest_attnkit.contract import AttentionImpl, Case

try:
    import triton
    import triton.language as tl
except ImportError as exc:  # the module must still import so that unavailable_reason can explain
    triton = None
    tl = None
    _TRITON_IMPORT_ERROR: ImportError | None = exc
else:
    _TRITON_IMPORT_ERROR = None


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def _needs_triton(fn: Callable[..., Any]) -> Callable[..., Any]:
    def unavailable(*args: Any, **kwargs: Any) -> Any:
        raise ImportError(f"{fn.__name__} needs triton, which failed to import: {_TRITON_IMPORT_ERROR}")

    return unavailable


# Without triton the kernels below become stubs that raise when called; their `tl.constexpr`
# annotations are plain strings (postponed evaluation), so defining them needs no triton.
_kernel = triton.jit if triton is not None else _needs_triton

_LOG2E = 1.4426950408889634


# ---------------------------------------------------------------------------------------------
# Kernels
# ---------------------------------------------------------------------------------------------


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
def _attn_fwd(Q, K, V, O, LSE,
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
def _attn_fwd_split(Q, K, V, O, LSE, O_PART, LSE_PART,
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
    # normalized partial output and log-sum-exp, and _attn_fwd_combine merges the slices.
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
def _attn_fwd_combine(O_PART, LSE_PART, O, LSE,
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
def _attn_bwd_preprocess(O, DO, DELTA,
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
def _attn_bwd_dkdv(Q, K, V, DO, LSE, DELTA, DK, DV,
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
def _attn_bwd_dq(Q, K, V, DO, LSE, DELTA, DQ,
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


# ---------------------------------------------------------------------------------------------
# Launcher
# ---------------------------------------------------------------------------------------------

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_MIN_HEAD_DIM, _MAX_HEAD_DIM = 16, 256
#: Decode path: at most this many query rows per kv head (GROUP x Nq) go through the split kernel.
_DECODE_MAX_ROWS = 64
_DECODE_MAX_SEQLEN_Q = 16
#: Below this many keys a split decode loses on the GPU test machine: its two launches cost more
#: host time than the split saves (b4 h32/8 k4096 measured 0.077 ms through the plain forward and
#: 0.10-0.15 ms split; tools/flash_bench/overhead.py). A short cache still takes the decode
#: kernel when one slice per kv head already fills the GPU (one launch, no merge).
_DECODE_SPLIT_MIN_KEYS = 8192


@dataclass(frozen=True)
class Tiles:
    """One launch configuration. For the decode kernel ``block_m`` is unused (the tile's rows are
    the query rows of a kv head) and ``waves`` sets how many programs per SM the key split aims
    for."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    waves: int = 0

    def __str__(self) -> str:
        if self.block_m == 0:  # decode
            return f"n{self.block_n} w{self.num_warps} s{self.num_stages} waves{self.waves}"
        return f"{self.block_m}x{self.block_n} w{self.num_warps} s{self.num_stages}"


#: Kernels with tile choices: the forward, the decode forward and the two backward kernels.
KERNELS = ("fwd", "decode", "dkdv", "dq")


@functools.lru_cache(maxsize=None)
def tile_candidates(kernel: str, block_d: int, dtype: torch.dtype) -> tuple[Tiles, ...]:
    """The few tile shapes worth timing for ``kernel`` at padded head dim ``block_d``, best guess first.

    On the GPU the lists are short on purpose: each entry costs a compilation on first use. They
    keep the pipelined tiles inside Hopper's 228 KB of shared memory per SM up to D = 256. fp32
    is not a speed target: it gets the first guess with halved tiles (each element is twice as
    big), untuned. Under the interpreter each program costs a fixed overhead per operation, so few
    large tiles are fastest (128 x 128 ran a 1000 x 64 fp16 forward+backward about 3x faster than
    64 x 64); its decode split aims at a handful of programs so that CI exercises the merge.
    """
    if kernel not in KERNELS:
        raise ValueError(f"unknown kernel {kernel!r} (known: {', '.join(KERNELS)})")
    if _interpreting():
        return (Tiles(0, 128, 4, 1, waves=1) if kernel == "decode" else Tiles(128, 128, 4, 1),)
    small, medium = block_d <= 64, block_d <= 128
    # Pruned with tools/flash_bench on an H200 (implementations/triton_flash_NOTES.md): each list
    # keeps the winners of the measured shapes. Timed only with ATTNKIT_TRITON_FLASH_TUNE=1;
    # otherwise default_tiles picks among them, and fp32 gets the first.
    table = {
        "fwd": ([Tiles(64, 64, 4, 3), Tiles(128, 64, 4, 3), Tiles(128, 128, 4, 3)] if small else
                [Tiles(64, 64, 4, 3), Tiles(128, 128, 8, 3), Tiles(128, 64, 8, 3)] if medium else
                [Tiles(64, 32, 4, 2), Tiles(64, 64, 4, 2), Tiles(128, 32, 8, 2)]),
        "decode": ([Tiles(0, 64, 4, 4, waves=4), Tiles(0, 64, 4, 3, waves=8), Tiles(0, 128, 4, 3, waves=4)] if medium else
                   [Tiles(0, 32, 4, 3, waves=4), Tiles(0, 64, 4, 2, waves=4), Tiles(0, 32, 4, 2, waves=8)]),
        "dkdv": ([Tiles(32, 64, 4, 3), Tiles(32, 128, 4, 3), Tiles(64, 64, 4, 3)] if small else
                 [Tiles(32, 64, 4, 3), Tiles(64, 128, 8, 3), Tiles(32, 128, 8, 2)] if medium else
                 [Tiles(32, 32, 4, 2), Tiles(32, 64, 4, 2), Tiles(64, 32, 4, 2)]),
        "dq": ([Tiles(64, 64, 4, 3), Tiles(128, 64, 8, 3)] if small else
               [Tiles(128, 64, 8, 3), Tiles(128, 32, 4, 3), Tiles(64, 32, 4, 3)] if medium else
               [Tiles(32, 32, 4, 2), Tiles(64, 32, 4, 2), Tiles(32, 64, 4, 2)]),
    }
    candidates = table[kernel]
    if dtype == torch.float32:
        first = candidates[0]
        return (Tiles(first.block_m and max(16, first.block_m // 2), max(16, first.block_n // 2), first.num_warps,
                      first.num_stages, first.waves),)
    return tuple(candidates)


def default_tiles(kernel: str, block_d: int, dtype: torch.dtype, causal: bool, n_k: int) -> Tiles:
    """The tiles a kernel gets without runtime tuning: the winners of the H200 sweep
    (implementations/triton_flash_NOTES.md), fixed so that every run of a suite times the same code.
    (Tuning in each process picked between near-equal candidates by a few noisy timings and moved
    a case by up to 11% from one run to the next: noise the regression gate would have to carry.)"""
    candidates = tile_candidates(kernel, block_d, dtype)
    if len(candidates) == 1 or block_d > 128:
        return candidates[0]
    small = block_d <= 64
    by_kernel = {
        "fwd": Tiles(64, 64, 4, 3) if small or n_k < 4096 else Tiles(128, 128, 8, 3),
        "decode": candidates[0],
        "dkdv": (Tiles(32, 128, 4, 3) if causal else Tiles(32, 64, 4, 3)) if small else
                (Tiles(32, 64, 4, 3) if causal else Tiles(64, 128, 8, 3)),
        "dq": (Tiles(64, 64, 4, 3) if causal else Tiles(128, 64, 8, 3)) if small else Tiles(128, 64, 8, 3),
    }
    return by_kernel[kernel]


def _tuning() -> bool:
    """ATTNKIT_TRITON_FLASH_TUNE=1 times the candidates on first use (a GPU the defaults were not
    measured on); otherwise the defaults run untimed."""
    return os.environ.get("ATTNKIT_TRITON_FLASH_TUNE") == "1"


def _choose(kernel: str, key: tuple, block_d: int, dtype: torch.dtype, causal: bool, n_k: int,
            run: Callable[[Tiles], Any], work: float, memory_bound: bool = False) -> Tiles:
    if _tuning():
        return TUNER.pick((kernel, *key), tile_candidates(kernel, block_d, dtype), run, work=work,
                          memory_bound=memory_bound)
    return default_tiles(kernel, block_d, dtype, causal, n_k)


def _out_of_resources() -> type[BaseException]:
    errors = getattr(triton.runtime, "errors", None)
    return getattr(errors, "OutOfResources", None) or getattr(triton.runtime, "OutOfResources")


class Tuner:
    """Chooses a kernel's tiles the first time a kind of problem is seen, by timing the candidates.

    The key is the kernel, dtype, head dim, causal flag and the problem's size class; the choice is
    kept for the life of the process (Triton keeps the compiled kernels on disk across
    processes). Small problems (under ``min_work``, counted in FLOPs, or bytes for decode) take the
    first candidate untimed: there the choice matters little and compiling the others would cost
    more than it saves. Each tuning is recorded (candidates' times, choice, seconds spent,
    compilation included) so that the suite can report what tuning costs.
    """

    def __init__(self, *, min_flops: float = 2.0**36, min_bytes: float = 2.0**25, reps: int = 5) -> None:
        self.min_flops, self.min_bytes, self.reps = min_flops, min_bytes, reps
        self.choices: dict[tuple, Tiles] = {}
        self.records: list[dict[str, Any]] = []

    def pick(self, key: tuple, candidates: tuple[Tiles, ...], run: Callable[[Tiles], Any], *, work: float,
             memory_bound: bool = False) -> Tiles:
        if len(candidates) == 1 or _interpreting() or work < (self.min_bytes if memory_bound else self.min_flops):
            return candidates[0]
        chosen = self.choices.get(key)
        if chosen is not None:
            return chosen
        started = time.perf_counter()
        timings: dict[Tiles, float] = {}
        for tiles in candidates:
            try:
                timings[tiles] = self._time(lambda: run(tiles))
            except _out_of_resources() as error:  # this shape does not fit this GPU's shared memory
                timings[tiles] = math.inf
                last_error = error
        chosen = min(timings, key=timings.__getitem__)
        if math.isinf(timings[chosen]):
            raise last_error
        self.choices[key] = chosen
        self.records.append({"key": [str(part) for part in key], "chosen": str(chosen),
                             "seconds": time.perf_counter() - started,
                             "ms": {str(tiles): ms for tiles, ms in timings.items()}})
        return chosen

    def _time(self, call: Callable[[], Any]) -> float:
        from pytest_attnkit.timer import event_samples, l2_flush_buffer

        call()  # compiles, and catches a configuration that does not fit before timing it
        samples = event_samples(call, self.reps, l2_flush_buffer())
        return sorted(samples)[len(samples) // 2]

    def seconds(self) -> float:
        return sum(record["seconds"] for record in self.records)


TUNER = Tuner()


def _size_class(n: int) -> int:
    return triton.next_power_of_2(max(n, 1))


def _check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-d [batch, heads, seqlen, head_dim], got shape {tuple(t.shape)}")
    if q.dtype not in _DTYPES:
        raise ValueError(f"dtype {q.dtype} is not supported (float16, bfloat16, float32)")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.device != q.device or v.device != q.device:
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if q.device.type == "cpu" and not _interpreting():
        raise ValueError("CPU tensors need Triton's interpreter: set TRITON_INTERPRET=1 before importing triton")
    if q.device.type not in ("cpu", "cuda"):
        raise ValueError(f"device {q.device} is not supported (cuda, or cpu under the interpreter)")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have one shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    batch, heads_q, _, head_dim = q.shape
    if k.shape[0] != batch or k.shape[3] != head_dim:
        raise ValueError(f"k/v shape {tuple(k.shape)} does not match q's batch and head_dim {tuple(q.shape)}")
    heads_kv = k.shape[1]
    if heads_kv == 0 or heads_q % heads_kv:
        raise ValueError(f"q heads ({heads_q}) must be a multiple of k/v heads ({heads_kv})")
    if not _MIN_HEAD_DIM <= head_dim <= _MAX_HEAD_DIM:
        raise ValueError(f"head_dim={head_dim} is outside {_MIN_HEAD_DIM}..{_MAX_HEAD_DIM}")


def _block_d(head_dim: int) -> int:
    return max(16, triton.next_power_of_2(head_dim))


def _dot_precision(dtype: torch.dtype) -> str:
    # "ieee" keeps fp32 products true fp32 (not tf32); for 16-bit inputs the option is ignored.
    return "ieee" if dtype == torch.float32 else "tf32"


@functools.lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 4  # the interpreter: a few slices, so that the merge runs in CI too
    return torch.cuda.get_device_properties(device).multi_processor_count


def uses_decode_kernel(n_q: int, group: int, n_k: int, batch_heads_kv: int, sm_count: int, waves: int) -> bool:
    """Few query rows per kv head (decode, speculative decode) against a long cache, or a short
    cache whose kv heads alone fill the GPU: split the keys instead of the queries. Under the
    interpreter every decode shape takes it, so that CI runs the split and the merge."""
    if n_q > _DECODE_MAX_SEQLEN_Q or n_q * group > _DECODE_MAX_ROWS:
        return False
    return _interpreting() or n_k >= _DECODE_SPLIT_MIN_KEYS or batch_heads_kv >= waves * sm_count


@functools.lru_cache(maxsize=1024)
def decode_splits(batch_heads_kv: int, n_k: int, block_n: int, waves: int, sm_count: int) -> tuple[int, int]:
    """(number of key slices, keys per slice): enough programs for ``waves`` per SM, each slice a
    whole number of key blocks."""
    blocks = max(1, triton.cdiv(n_k, block_n))
    wanted = max(1, triton.cdiv(waves * sm_count, max(batch_heads_kv, 1)))
    per_split = triton.cdiv(blocks, min(wanted, blocks)) * block_n
    return triton.cdiv(max(n_k, 1), per_split), per_split


def _launch_fwd(q, k, v, o, lse, causal: bool, scale: float, t: Tiles) -> None:
    batch, heads_q, n_q, head_dim = q.shape
    heads_kv, n_k = k.shape[1], k.shape[2]
    _attn_fwd[(triton.cdiv(n_q, t.block_m), batch * heads_q)](
        q, k, v, o, lse,
        *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        heads_q, n_q, n_k, heads_q // heads_kv, scale * _LOG2E,
        HEAD_DIM=head_dim, BLOCK_D=_block_d(head_dim), BLOCK_M=t.block_m, BLOCK_N=t.block_n,
        CAUSAL=causal, DOT_PRECISION=_dot_precision(q.dtype),
        num_warps=t.num_warps, num_stages=t.num_stages,
    )


def _launch_decode(q, k, v, o, lse, causal: bool, scale: float, t: Tiles) -> None:
    batch, heads_q, n_q, head_dim = q.shape
    heads_kv, n_k = k.shape[1], k.shape[2]
    group = heads_q // heads_kv
    block_d = _block_d(head_dim)
    splits, per_split = decode_splits(batch * heads_kv, n_k, t.block_n, t.waves, _sm_count(q.device))
    direct = splits == 1
    if direct:
        o_part = lse_part = lse  # unused placeholders: the kernel writes o and lse itself
    else:  # one allocation for both scratch arrays: each call's host time counts in decode
        parts = batch * heads_q * n_q * splits
        scratch = torch.empty(parts * (block_d + 1), dtype=torch.float32, device=q.device)
        o_part, lse_part = scratch[:parts * block_d], scratch[parts * block_d:]
    _attn_fwd_split[(splits, batch * heads_kv)](
        q, k, v, o, lse, o_part, lse_part,
        *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        heads_q, heads_kv, n_q, n_k, group, per_split, scale * _LOG2E,
        HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_R=max(16, triton.next_power_of_2(group * n_q)),
        BLOCK_N=t.block_n, CAUSAL=causal, DIRECT=direct, DOT_PRECISION=_dot_precision(q.dtype),
        num_warps=t.num_warps, num_stages=t.num_stages,
    )
    if not direct:
        _attn_fwd_combine[(batch * heads_q * n_q,)](
            o_part, lse_part, o, lse, *o.stride(), heads_q, n_q, splits,
            HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_S=max(2, triton.next_power_of_2(splits)),
            num_warps=4,
        )


#: (shapes, dtype, causal, device) -> (launcher, tiles): the forward's choice, made once per shape
#: so that a repeated call (decode, where host time shows) pays only a dictionary lookup.
_PLANS: dict[tuple, tuple[Callable[..., None], Tiles]] = {}


def _plan_fwd(q, k, v, o, lse, causal: bool, scale: float) -> tuple[Callable[..., None], Tiles]:
    batch, heads_q, n_q, head_dim = q.shape
    heads_kv, n_k = k.shape[1], k.shape[2]
    group = heads_q // heads_kv
    block_d = _block_d(head_dim)
    waves = tile_candidates("decode", block_d, q.dtype)[0].waves
    decode = uses_decode_kernel(n_q, group, n_k, batch * heads_kv, _sm_count(q.device), waves)
    kernel, launch = ("decode", _launch_decode) if decode else ("fwd", _launch_fwd)
    key = (q.dtype, head_dim, causal, _size_class(n_q), _size_class(n_k),
           _size_class(batch * heads_kv) if decode else group > 1)
    if decode:  # memory bound: the work that matters is the KV cache's bytes
        work = 2.0 * batch * heads_kv * n_k * head_dim * q.element_size()
    else:
        work = 4.0 * batch * heads_q * n_q * n_k * head_dim
    tiles = _choose(kernel, key, block_d, q.dtype, causal, n_k,
                    lambda t: launch(q, k, v, o, lse, causal, scale, t), work, memory_bound=decode)
    return launch, tiles


def _flash_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float,
               tiles: Tiles | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    batch, heads_q, n_q, head_dim = q.shape
    heads_kv, n_k = k.shape[1], k.shape[2]
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((batch, heads_q, n_q), dtype=torch.float32, device=q.device)
    if o.numel() == 0:
        return o, lse
    if n_k == 0:  # nothing to attend to: zeros, and lse = +inf as for any row that sees no key
        return o.zero_(), lse.fill_(float("inf"))
    if tiles is not None:  # forced (tools/flash_bench): the tiles say which kernel
        launch = _launch_decode if tiles.block_m == 0 else _launch_fwd
    else:
        plan_key = (q.shape, k.shape, q.dtype, causal, q.device)
        plan = _PLANS.get(plan_key)
        if plan is None:
            if len(_PLANS) >= 4096:  # a long-lived process that sees endless shapes: start over
                _PLANS.clear()
            plan = _plan_fwd(q, k, v, o, lse, causal, scale)
            _PLANS[plan_key] = plan
        launch, tiles = plan
    launch(q, k, v, o, lse, causal, scale, tiles)
    return o, lse


def _launch_dkdv(q, k, v, do, lse, delta, dk, dv, causal: bool, scale: float, t: Tiles) -> None:
    batch, heads_q, n_q, head_dim = q.shape
    heads_kv, n_k = k.shape[1], k.shape[2]
    _attn_bwd_dkdv[(triton.cdiv(n_k, t.block_n), batch * heads_kv)](
        q, k, v, do, lse, delta, dk, dv,
        *q.stride(), *k.stride(), *v.stride(), *do.stride(), *dk.stride(), *dv.stride(),
        heads_q, heads_kv, n_q, n_k, heads_q // heads_kv, scale, scale * _LOG2E,
        HEAD_DIM=head_dim, BLOCK_D=_block_d(head_dim), BLOCK_M=t.block_m, BLOCK_N=t.block_n,
        CAUSAL=causal, DOT_PRECISION=_dot_precision(q.dtype),
        num_warps=t.num_warps, num_stages=t.num_stages,
    )


def _launch_dq(q, k, v, do, lse, delta, dq, causal: bool, scale: float, t: Tiles) -> None:
    batch, heads_q, n_q, head_dim = q.shape
    heads_kv, n_k = k.shape[1], k.shape[2]
    _attn_bwd_dq[(triton.cdiv(n_q, t.block_m), batch * heads_q)](
        q, k, v, do, lse, delta, dq,
        *q.stride(), *k.stride(), *v.stride(), *do.stride(), *dq.stride(),
        heads_q, n_q, n_k, heads_q // heads_kv, scale, scale * _LOG2E,
        HEAD_DIM=head_dim, BLOCK_D=_block_d(head_dim), BLOCK_M=t.block_m, BLOCK_N=t.block_n,
        CAUSAL=causal, DOT_PRECISION=_dot_precision(q.dtype),
        num_warps=t.num_warps, num_stages=t.num_stages,
    )


def _flash_bwd(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               o: torch.Tensor, lse: torch.Tensor, causal: bool, scale: float,
               tiles: dict[str, Tiles] | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    batch, heads_q, n_q, head_dim = q.shape
    heads_kv, n_k = k.shape[1], k.shape[2]
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    if n_q == 0 or n_k == 0 or batch * heads_q == 0:
        # No query or no key: nothing attends, so every gradient is zero.
        return dq.zero_(), dk.zero_(), dv.zero_()
    block_d = _block_d(head_dim)
    tiles = tiles or {}

    delta = torch.empty_like(lse)
    _attn_bwd_preprocess[(triton.cdiv(n_q, 64), batch * heads_q)](
        o, do, delta, *o.stride(), *do.stride(), heads_q, n_q,
        HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_M=64, num_warps=4,
    )
    key = (q.dtype, head_dim, causal, _size_class(n_q), _size_class(n_k), heads_q > heads_kv)
    work = 4.0 * batch * heads_q * n_q * n_k * head_dim  # the forward's FLOPs: only compared with a floor
    t = tiles.get("dkdv") or _choose(
        "dkdv", key, block_d, q.dtype, causal, n_k,
        lambda t: _launch_dkdv(q, k, v, do, lse, delta, dk, dv, causal, scale, t), work)
    _launch_dkdv(q, k, v, do, lse, delta, dk, dv, causal, scale, t)
    t = tiles.get("dq") or _choose(
        "dq", key, block_d, q.dtype, causal, n_k,
        lambda t: _launch_dq(q, k, v, do, lse, delta, dq, causal, scale, t), work)
    _launch_dq(q, k, v, do, lse, delta, dq, causal, scale, t)
    return dq, dk, dv


# ---------------------------------------------------------------------------------------------
# Autograd wrapper and public entry point
# ---------------------------------------------------------------------------------------------


class _FlashAttnFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                scale: float) -> torch.Tensor:
        o, lse = _flash_fwd(q, k, v, causal, scale)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal = causal
        ctx.scale = scale
        return o

    @staticmethod
    def backward(ctx: Any, do: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = _flash_bwd(do, q, k, v, o, lse, ctx.causal, ctx.scale)
        needs = ctx.needs_input_grad
        return (dq if needs[0] else None, dk if needs[1] else None, dv if needs[2] else None,
                None, None)


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                    scale: float | None = None) -> torch.Tensor:
    """Attention of ``q`` [B, Hq, Nq, D] over ``k``, ``v`` [B, Hkv, Nk, D]; differentiable.

    ``scale`` defaults to ``1/sqrt(D)``; ``causal`` masks bottom-right (query ``i`` sees key
    ``j <= i + Nk - Nq``), and rows that see no key come out as zeros.
    """
    if triton is None:
        raise ImportError(f"flash_attention needs triton (pip install triton): {_TRITON_IMPORT_ERROR}")
    _check_inputs(q, k, v)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if not math.isfinite(scale):
        raise ValueError(f"scale must be finite, got {scale!r}")
    if not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)):
        return _flash_fwd(q, k, v, bool(causal), scale)[0]  # inference: no autograd node to build
    return _FlashAttnFunction.apply(q, k, v, bool(causal), scale)


# ---------------------------------------------------------------------------------------------
# pytest-attnkit implementation
# ---------------------------------------------------------------------------------------------


class TritonFlash(AttentionImpl):
    """Triton FlashAttention (forward and backward) on CUDA, or on the CPU via Triton's interpreter."""

    devices = ("cuda", "cpu")
    dtypes = ("float16", "bfloat16", "float32")
    head_dims = range(_MIN_HEAD_DIM, _MAX_HEAD_DIM + 1)
    supports_causal = True
    supports_gqa = True
    supports_seqlen_mismatch = True
    supports_backward = True
    memory_class = "linear"

    def unavailable_reason(self, device: str) -> str | None:
        reason = super().unavailable_reason(device)
        if reason is not None:
            return reason
        if _TRITON_IMPORT_ERROR is not None:
            if isinstance(_TRITON_IMPORT_ERROR, ModuleNotFoundError) and _TRITON_IMPORT_ERROR.name == "triton":
                return "triton is not installed (pip install triton)"
            return f"triton failed to import: {_TRITON_IMPORT_ERROR}"
        if device == "cpu" and not _interpreting():
            return ("the CPU needs Triton's interpreter (TRITON_INTERPRET=1, set before triton is "
                    "imported), which attnkit's workers set; it is not set in this process")
        if device == "cuda" and not torch.cuda.is_available():
            return "no CUDA device"
        return None

    def not_supported_reasons(self, case: Case, device: str, *, backward: bool = False) -> list[str]:
        reasons = super().not_supported_reasons(case, device, backward=backward)
        if backward and case.dtype == "float32" and case.head_dim > 128:
            # Found by the correctness suite: dq/dk reached 3.2-3.5x the plain fp32 error at
            # head_dim 256 on some seeds (the rule allows 3x), where the same recomputation done
            # in torch stays near 1x. Not claimed until the kernel's fp32 path is fixed.
            reasons.append("float32 backward at head_dim > 128 is not claimed: its gradient error "
                           "exceeds the 3x rule on some inputs")
        if device == "cpu" and case.dtype == "bfloat16":
            reasons.append("bfloat16 under Triton's CPU interpreter gives wrong results (a Triton "
                           "interpreter limitation); bf16 is tested on the GPU")
        return reasons

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                scale: float | None = None) -> torch.Tensor:
        return flash_attention(q, k, v, causal=causal, scale=scale)
