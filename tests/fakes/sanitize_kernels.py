"""Varlen attention kernels for the sanitize suite's GPU test: the same Triton kernel, honest and
with a planted out-of-bounds read. ``OneRowPast`` loads one key row past the end of each sequence
and masks it out of the scores: every result is right, and only the last sequence's extra row lies
outside the packed tensors, where compute-sanitizer's memcheck must see it. Copied into a fake
distribution by the test (tests/test_sanitize.py); a slow kernel, one program per query row.
"""

import torch
import triton
import triton.language as tl

from pytest_attnkit import AttentionImpl


@triton.jit
def _varlen_rows(Q, K, V, O, CU_Q, CU_K, stride_q, stride_k, stride_v, stride_o, scale, H_Q, GROUP,
                 HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, EXTRA: tl.constexpr, CAUSAL: tl.constexpr):
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
    for start in range(0, n_k + EXTRA, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        readable = keys < n_k + EXTRA  # EXTRA = 1: one row past the sequence is read
        k = tl.load(K + (k_start + keys)[:, None] * stride_k + kv_head * HEAD_DIM + dims[None, :],
                    mask=readable[:, None], other=0.0).to(tl.float32)
        v = tl.load(V + (k_start + keys)[:, None] * stride_v + kv_head * HEAD_DIM + dims[None, :],
                    mask=readable[:, None], other=0.0).to(tl.float32)
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
    extra_rows = 0

    def not_supported_reasons(self, case, device, *, backward=False):
        reasons = super().not_supported_reasons(case, device, backward=backward)
        if case.kind != "varlen":
            reasons.append("this test kernel takes packed sequences only")
        return reasons

    def forward(self, q, k, v, *, causal=False, scale=None, cu_seqlens_q=None, cu_seqlens_k=None,
                max_seqlen_q=None, max_seqlen_k=None):
        out = torch.zeros_like(q)
        heads_q, head_dim = q.shape[1], q.shape[2]
        grid = (max_seqlen_q, cu_seqlens_q.shape[0] - 1, heads_q)
        _varlen_rows[grid](q, k, v, out, cu_seqlens_q, cu_seqlens_k, q.stride(0), k.stride(0), v.stride(0),
                           out.stride(0), scale or head_dim ** -0.5, heads_q, heads_q // k.shape[1],
                           HEAD_DIM=head_dim, BLOCK_N=32, EXTRA=self.extra_rows, CAUSAL=causal)
        return out


class OneRowPast(HonestVarlen):
    """Reads one key and value row past each sequence's end (masked out of the scores)."""

    extra_rows = 1
