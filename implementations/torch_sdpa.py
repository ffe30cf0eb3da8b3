"""torch_sdpa: PyTorch's ``scaled_dot_product_attention``, the reference implementation.

Bottom-right causal masking comes from ``torch.nn.attention.bias.causal_lower_right`` (the
contract's alignment; torch's ``is_causal`` is top-left, which differs when Nq != Nk), and grouped
kv heads from ``enable_gqa``. Rows that see no key come out of torch as NaN on some backends, so
they are zeroed explicitly, as the contract asks. Which backend runs (FlashAttention-2, cuDNN,
memory-efficient, math) is torch's choice for the shape and device.

The variants SDPA can compute exactly go through its ``attn_mask``: a sliding window as a boolean
mask, ALiBi as an additive mask in the inputs' dtype (``-slope * |i + Nk - Nq - j|``), and V head
dims that differ from Q's (SDPA takes ``Ev != E``). With a window bounded on the left, the queries
go in chunks of ``CHUNK_ROWS``, each against the keys its band can reach, so the masks (and the
memory) grow with N times the window, not N x N. Softcap (SDPA has no hook between the scores and
the softmax), sinks and the LSE (SDPA returns neither) are refused.

Varlen and paged KV caches are done one sequence at a time (:func:`per_sequence`): each
sequence's rows, or its pages gathered through the block table, go through the dense path above
and the outputs are put back in the packed layout. That is a correct reference, differentiable,
and as slow as a Python loop over the batch: it is declared, and timed, as such.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

from pytest_attnkit.contract import AttentionImpl

if TYPE_CHECKING:
    import torch


def sdpa_attention(q: "torch.Tensor", k: "torch.Tensor", v: "torch.Tensor", *, causal: bool = False,
                   scale: float | None = None) -> "torch.Tensor":
    import torch
    import torch.nn.functional as F

    seqlen_q, seqlen_k = q.shape[-2], k.shape[-2]
    gqa = {"enable_gqa": True} if q.shape[1] != k.shape[1] else {}
    if not causal:
        return F.scaled_dot_product_attention(q, k, v, scale=scale, **gqa)
    if seqlen_q == seqlen_k:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, **gqa)
    from torch.nn.attention.bias import causal_lower_right

    with warnings.catch_warnings():
        # torch warns that rows seeing no key give NaN; they are zeroed below.
        warnings.simplefilter("ignore", UserWarning)
        mask = causal_lower_right(seqlen_q, seqlen_k)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, **gqa)
    blind_rows = seqlen_q - seqlen_k  # rows i < Nq - Nk see no key
    if blind_rows > 0:
        keep = (torch.arange(seqlen_q, device=q.device) >= blind_rows)[:, None]
        out = torch.where(keep, out, torch.zeros((), dtype=out.dtype, device=out.device))
    return out


#: Query rows per SDPA call under a window bounded on the left; and per block of ALiBi's bias
#: as it is written into the mask (:func:`_alibi_mask`).
CHUNK_ROWS = 1024


def _alibi_mask(slopes: "torch.Tensor", distance: "torch.Tensor", visible: "torch.Tensor",
                dtype: "torch.dtype") -> "torch.Tensor":
    """ALiBi's bias, ``-slope * |distance|``, with ``-inf`` where a key is not visible, in
    ``dtype``, built CHUNK_ROWS query rows at a time. Built in one piece it took float32 copies
    of every head's scores: at 16k tokens and 16 heads 34 GiB for an 8 GiB mask, and on an 80 GB
    H100 the speed case ran out of memory alone three times beside the idle workers; the room
    made for it stopped the warm workers whose speed tests came next
    (results/2026-11-27-session11). Now the peak is about 11 GiB there: the mask (8 GiB in bf16),
    one block's float32 bias (1 GiB), and the int64 distances and visibility (2.3 GiB) the caller
    keeps. SDPA still gets the whole mask in one call: calls per chunk of rows made the backward
    2.5x slower (45 to 112 ms on an H200, same place)."""
    import torch

    mask = torch.empty(slopes.shape[0], *distance.shape, dtype=dtype, device=distance.device)
    for start in range(0, distance.shape[0], CHUNK_ROWS):
        rows = slice(start, start + CHUNK_ROWS)
        bias = -slopes[:, None, None] * distance[rows].abs().to(slopes.dtype)
        mask[:, rows] = bias.masked_fill_(~visible[rows], float("-inf"))
    return mask


def _banded_sdpa(q: "torch.Tensor", k: "torch.Tensor", v: "torch.Tensor", *, causal: bool, scale: float | None,
                 window: tuple[int, int] | None, alibi_slopes: "torch.Tensor | None") -> "torch.Tensor":
    """SDPA with the contract's window and ALiBi as explicit masks, one chunk of queries at a time."""
    import torch
    import torch.nn.functional as F

    seqlen_q, seqlen_k = q.shape[-2], k.shape[-2]
    offset = seqlen_k - seqlen_q
    left, right = window if window is not None else (-1, -1)
    if causal:
        right = 0 if right < 0 else min(right, 0)
    gqa = {"enable_gqa": True} if q.shape[1] != k.shape[1] else {}
    step = CHUNK_ROWS if left >= 0 else max(seqlen_q, 1)
    outs = []
    for start in range(0, seqlen_q, step):
        stop = min(start + step, seqlen_q)
        first = 0 if left < 0 else min(seqlen_k, max(0, start + offset - left))
        end = seqlen_k if right < 0 else max(0, min(seqlen_k, stop - 1 + offset + right + 1))
        if end <= first:  # no row of this chunk sees a key
            outs.append(q.new_zeros(q.shape[0], q.shape[1], stop - start, v.shape[-1]))
            continue
        rows = torch.arange(start, stop, device=q.device)[:, None]
        cols = torch.arange(first, end, device=q.device)[None, :]
        distance = rows + offset - cols
        visible = torch.ones_like(distance, dtype=torch.bool)
        if left >= 0:
            visible &= distance <= left
        if right >= 0:
            visible &= distance >= -right
        sees_a_key = visible.any(dim=-1, keepdim=True)
        # A row that sees no key would come out NaN (with NaN gradients); it attends to every key
        # here and is zeroed below, so its output and gradients are exactly zero.
        visible |= ~sees_a_key
        mask: "torch.Tensor" = visible
        if alibi_slopes is not None:
            mask = _alibi_mask(alibi_slopes, distance, visible, q.dtype)
        out = F.scaled_dot_product_attention(q[:, :, start:stop], k[:, :, first:end], v[:, :, first:end],
                                             attn_mask=mask, scale=scale, **gqa)
        if not bool(sees_a_key.all()):
            out = torch.where(sees_a_key, out, torch.zeros((), dtype=out.dtype, device=out.device))
        outs.append(out)
    return torch.cat(outs, dim=2) if len(outs) > 1 else outs[0]


def per_sequence(attend: Any, q: "torch.Tensor", k: "torch.Tensor", v: "torch.Tensor", *,
                 cu_seqlens_q: "torch.Tensor | None" = None, cu_seqlens_k: "torch.Tensor | None" = None,
                 block_table: "torch.Tensor | None" = None, cache_seqlens: "torch.Tensor | None" = None,
                 ) -> "torch.Tensor":
    """Packed attention (varlen: cu_seqlens; paged KV: block_table and cache_seqlens) as a loop
    of ``attend(q, k, v)`` over the sequences, each ``[1, H, N, D]``; the output in the packed
    layout (the contract's). A sequence without keys gives zeros; unused varlen rows too."""
    import torch

    heads_q, value_dim = q.shape[-2], v.shape[-1]
    outs = []
    if block_table is not None and cache_seqlens is not None:
        page_size = k.shape[1]
        for b, length in enumerate(cache_seqlens.tolist()):
            pages = block_table[b, :-(-length // page_size)].long()
            keys = k.index_select(0, pages).flatten(0, 1)[:length]
            values = v.index_select(0, pages).flatten(0, 1)[:length]
            outs.append(_one_sequence(attend, q[b], keys, values, value_dim))
        return torch.stack(outs)
    assert cu_seqlens_q is not None and cu_seqlens_k is not None
    bounds_q, bounds_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for b in range(len(bounds_q) - 1):
        rows = q[bounds_q[b]:bounds_q[b + 1]]
        if rows.shape[0]:
            outs.append(_one_sequence(attend, rows, k[bounds_k[b]:bounds_k[b + 1]], v[bounds_k[b]:bounds_k[b + 1]],
                                      value_dim))
    outs.append(q.new_zeros(q.shape[0] - bounds_q[-1], heads_q, value_dim, dtype=v.dtype))  # unused rows
    return torch.cat(outs)


def _one_sequence(attend: Any, q: "torch.Tensor", k: "torch.Tensor", v: "torch.Tensor", value_dim: int) -> "torch.Tensor":
    """``attend`` on one sequence's ``[N, H, D]`` rows, back in that layout."""
    if k.shape[0] == 0:
        return q.new_zeros(q.shape[0], q.shape[1], value_dim, dtype=v.dtype)
    out = attend(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None])
    return out[0].transpose(0, 1)


class TorchSDPA(AttentionImpl):
    devices = ("cpu", "cuda")
    dtypes = ("float16", "bfloat16", "float32")
    supports_causal = True
    supports_gqa = True
    supports_seqlen_mismatch = True
    supports_backward = True
    memory_class = "linear"
    supports_window = True
    supports_alibi = True
    head_dims_v = range(1, 1025)
    supports_varlen = True  # a loop over the sequences: a reference, not fast
    supports_paged_kv = True  # the same loop, gathering each sequence's pages
    supports_paged_kv_backward = True

    def unavailable_reason(self, device: str) -> str | None:
        try:
            import torch
        except ImportError as error:
            return f"torch is not installed ({error})"
        if device == "cuda" and not torch.cuda.is_available():
            return "no CUDA device"
        return super().unavailable_reason(device)

    def forward(self, q, k, v, *, causal=False, scale=None, window_size=None, alibi_slopes=None,
                cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None, block_table=None,
                cache_seqlens=None):
        window = None if window_size is None or tuple(window_size) == (-1, -1) else tuple(window_size)

        def attend(q, k, v):
            if window is None and alibi_slopes is None:
                return sdpa_attention(q, k, v, causal=causal, scale=scale)
            return _banded_sdpa(q, k, v, causal=causal, scale=scale, window=window, alibi_slopes=alibi_slopes)

        if cu_seqlens_q is None and block_table is None:
            return attend(q, k, v)
        return per_sequence(attend, q, k, v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                            block_table=block_table, cache_seqlens=cache_seqlens)
