"""Varlen attention kernels for the sanitize suite's GPU test: the same Triton kernel, honest and
with planted out-of-bounds reads, each with right numbers on the suite's case (the extra rows are
masked out of the scores, and a probability of zero weighs the extra values; OneRowPast's row past
v may land on the NaN the harness leaves in freed memory, and fail a correctness case). Only the last sequence's
extra rows lie outside the packed tensors. Copied into a fake distribution by the test
(tests/suites/test_sanitize.py); a slow kernel, one program per query row.

- ``OneRowPast``: one key and value row past each sequence (a few hundred bytes past k and v). Its
  value reaches the result times a probability of zero: the guarded inputs see it (NaN times zero
  is NaN), and they run first.
- ``TilePastK``: a whole tile of keys (32 rows) past each sequence, values read as they should be.
  A key past the end only feeds a score that is masked: the guards cannot see it, memcheck must.
- ``TilePastOwnK``: the same read past a copy of k the kernel allocates itself through torch.
- ``RowPastOwnK``: one row past that copy: the known limit, which nothing here sees.
"""

import torch
import triton
import triton.language as tl

from pytest_attnkit import AttentionImpl


@triton.jit
def _varlen_rows(Q, K, V, O, CU_Q, CU_K, stride_q, stride_k, stride_v, stride_o, scale, H_Q, GROUP,
                 HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, EXTRA_K: tl.constexpr, EXTRA_V: tl.constexpr,
                 EXTRA: tl.constexpr, CAUSAL: tl.constexpr):
    row = tl.program_id(0)
    seq = tl.program_id(1)
    head = tl.program_id(2)
    q_start = tl.load(CU_Q + seq)
    n_q = tl.load(CU_Q + seq + 1) - q_start
    k_start = tl.load(CU_K + seq)
    n_k = tl.load(CU_K + seq + 1) - k_start
    if row >= n_q:
        return
    kv_head = head // GROUP
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + (q_start + row) * stride_q + head * HEAD_DIM + dims).to(tl.float32)
    m = -float("inf")
    l = 0.0
    acc = tl.zeros([HEAD_DIM], dtype=tl.float32)
    last = row + n_k - n_q  # bottom-right causal: the last key this row sees
    for start in range(0, n_k + EXTRA, BLOCK_N):  # EXTRA = the larger of the two
        keys = start + tl.arange(0, BLOCK_N)
        # EXTRA_K, EXTRA_V = 1: one row past the sequence is read; = BLOCK_N: a whole tile
        k = tl.load(K + (k_start + keys)[:, None] * stride_k + kv_head * HEAD_DIM + dims[None, :],
                    mask=(keys < n_k + EXTRA_K)[:, None], other=0.0).to(tl.float32)
        v = tl.load(V + (k_start + keys)[:, None] * stride_v + kv_head * HEAD_DIM + dims[None, :],
                    mask=(keys < n_k + EXTRA_V)[:, None], other=0.0).to(tl.float32)
        visible = keys < n_k  # ... and masked out of the result
        if CAUSAL:
            visible = visible & (keys <= last)
        s = tl.where(visible, tl.sum(k * q[None, :], axis=1) * scale, -float("inf"))
        m_new = tl.maximum(m, tl.max(s, axis=0))
        safe = tl.where(m_new == -float("inf"), 0.0, m_new)
        p = tl.exp(s - safe)
        correction = tl.exp(m - safe)
        l = l * correction + tl.sum(p, axis=0)
        acc = acc * correction + tl.sum(p[:, None] * v, axis=0)
        m = m_new
    out = tl.where(l > 0, acc / l, 0.0)
    tl.store(O + (q_start + row) * stride_o + head * HEAD_DIM + dims, out.to(O.dtype.element_ty))


class HonestVarlen(AttentionImpl):
    devices = ("cuda",)
    dtypes = ("float16", "bfloat16", "float32")
    head_dims = (32, 64, 128)
    supports_backward = False
    supports_varlen = True
    extra_k = 0
    extra_v = 0
    own_k = False  # read k from a copy the kernel allocates itself

    def not_supported_reasons(self, case, device, *, backward=False):
        reasons = super().not_supported_reasons(case, device, backward=backward)
        if case.kind != "varlen":
            reasons.append("this test kernel takes packed sequences only")
        return reasons

    def forward(self, q, k, v, *, causal=False, scale=None, cu_seqlens_q=None, cu_seqlens_k=None,
                max_seqlen_q=None, max_seqlen_k=None):
        out = torch.zeros_like(q)
        if self.own_k:
            k = torch.empty(k.shape, dtype=k.dtype, device=k.device).copy_(k)  # an allocation of its own
        heads_q, head_dim = q.shape[1], q.shape[2]
        grid = (max_seqlen_q, cu_seqlens_q.shape[0] - 1, heads_q)
        _varlen_rows[grid](q, k, v, out, cu_seqlens_q, cu_seqlens_k, q.stride(0), k.stride(0), v.stride(0),
                           out.stride(0), scale or head_dim ** -0.5, heads_q, heads_q // k.shape[1],
                           HEAD_DIM=head_dim, BLOCK_N=32, EXTRA_K=self.extra_k, EXTRA_V=self.extra_v,
                           EXTRA=max(self.extra_k, self.extra_v), CAUSAL=causal)
        return out


class OneRowPast(HonestVarlen):
    """Reads one key and value row past each sequence's end (masked out of the scores)."""

    extra_k = extra_v = 1


class TilePastK(HonestVarlen):
    """Reads a whole tile of keys (32 rows) past each sequence's end, only into masked scores."""

    extra_k = 32


class TilePastOwnK(HonestVarlen):
    """Reads a whole tile past the end of a copy of k it allocates itself."""

    extra_k = 32
    own_k = True


class RowPastOwnK(HonestVarlen):
    """Reads one row past the end of a copy of k it allocates itself."""

    extra_k = 1
    own_k = True
