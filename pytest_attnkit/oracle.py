"""The oracle: attention computed in float64, and the plain same-precision implementation.

The correctness rule (see :mod:`pytest_attnkit.worker.tolerance`) needs two references. The *oracle*
is plain attention on inputs upcast to float64. The *plain* reference is the same math in the
inputs' own precision, written the obvious way (as FlashAttention's tests do with
``attention_ref(upcast=False)``): its error against the oracle measures how much rounding an
honest implementation in that precision makes, so the allowed error scales with it.

Masking follows the contract: bottom-right causal alignment, and a query row that sees no key
produces zeros (and zero gradients), never NaN. The variants follow FlashAttention's reference
(``attention_ref`` in its tests) in the order it applies them: scale, soft cap, ALiBi bias, the
causal and window masks, then the softmax, with the sinks' logits joining its denominator.

Varlen and paged-KV cases (:class:`Packing`) split by sequence: each sequence's rows (through
``cu_seqlens``, or its pages through the block table) go through the same dense math on their own,
so the oracle of a packed batch is the dense oracle of each sequence, reassembled in the packed
layout and differentiable with respect to the packed tensors.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from pytest_attnkit.masks import rows_with_a_key, visibility_mask

if TYPE_CHECKING:
    import torch

    from pytest_attnkit.contract import Case

__all__ = ["Packing", "alibi_bias", "attention_math", "forward_and_grads", "lse_rows_with_a_key",
           "packed_attention_math", "rows_with_a_key", "visibility_mask"]


@dataclass(frozen=True)
class Packing:
    """Where each sequence's tokens are: varlen's cumulative lengths, or a paged cache's pages."""

    kind: str  # "varlen" or "paged"
    cu_seqlens_q: tuple[int, ...] = ()
    cu_seqlens_k: tuple[int, ...] = ()
    block_table: tuple[tuple[int, ...], ...] = ()
    cache_seqlens: tuple[int, ...] = ()
    page_size: int = 0

    @property
    def batch(self) -> int:
        return len(self.cache_seqlens) if self.kind == "paged" else len(self.cu_seqlens_q) - 1


def alibi_bias(slopes: "torch.Tensor", seqlen_q: int, seqlen_k: int,
               key_offset: int | None = None) -> "torch.Tensor":
    """[Hq, Nq, Nk] bias ``-slope[h] * |i + Nk - Nq - j|`` in the slopes' dtype (``key_offset``
    in place of ``Nk - Nq``, as :func:`visibility_mask`)."""
    import torch

    offset = seqlen_k - seqlen_q if key_offset is None else key_offset
    rows = torch.arange(seqlen_q, device=slopes.device)[:, None]
    cols = torch.arange(seqlen_k, device=slopes.device)[None, :]
    distance = (rows + offset - cols).abs().to(slopes.dtype)
    return -slopes[:, None, None] * distance


def attention_math(
    q: "torch.Tensor",
    k: "torch.Tensor",
    v: "torch.Tensor",
    *,
    causal: bool,
    scale: float | None = None,
    window: tuple[int, int] | None = None,
    softcap: float = 0.0,
    alibi_slopes: "torch.Tensor | None" = None,
    sinks: "torch.Tensor | None" = None,
    return_lse: bool = False,
    probs_dtype: "torch.dtype | None" = None,
    key_offset: int | None = None,
) -> "torch.Tensor | tuple[torch.Tensor, torch.Tensor]":
    """Plain attention in the inputs' dtype, differentiable. Tensors are [B, H, N, D]; V's head
    dim may differ. With ``return_lse``, also the natural-log LSE of each row's softmax
    denominator (sinks included), in the scores' dtype; where a row sees no key and has no sink
    its LSE is 0 here (the contract leaves it open). ``probs_dtype`` rounds P to that dtype before
    the PV product, as FA3's FP8 reference does (``intermediate_dtype``). ``key_offset`` moves the
    masks' and ALiBi's diagonal (:func:`visibility_mask`; None is the contract's)."""
    import torch

    heads_q, heads_kv = q.shape[1], k.shape[1]
    seqlen_q, seqlen_k = q.shape[-2], k.shape[-2]
    if heads_q != heads_kv:
        group = heads_q // heads_kv
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    scores = torch.matmul(q * scale, k.transpose(-2, -1))
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    if alibi_slopes is not None:
        scores = scores + alibi_bias(alibi_slopes, seqlen_q, seqlen_k, key_offset).to(scores.dtype)
    visible = visibility_mask(seqlen_q, seqlen_k, causal=causal, window=window, device=q.device,
                              key_offset=key_offset)
    if sinks is not None:
        # The sink column keeps every row's softmax finite, so masked keys stay -inf; FA4's
        # reference concatenates the sink logit and drops its column after the softmax.
        if visible is not None:
            scores = scores.masked_fill(~visible, float("-inf"))
        sink_column = sinks.to(scores.dtype)[None, :, None, None].expand(*scores.shape[:-1], 1)
        with_sink = torch.cat([scores, sink_column], dim=-1)
        lse = torch.logsumexp(with_sink, dim=-1)
        probs = torch.softmax(with_sink, dim=-1)[..., :-1]
    elif visible is not None:
        row_sees_a_key = visible.any(dim=-1, keepdim=True)
        # Rows that see no key get finite scores before the softmax and zero probabilities
        # after it, so neither the output nor the backward pass ever touches a NaN.
        scores = scores.masked_fill(~visible, float("-inf")).masked_fill(~row_sees_a_key, 0.0)
        probs = torch.softmax(scores, dim=-1) * row_sees_a_key
        lse = torch.logsumexp(scores, dim=-1) * row_sees_a_key[..., 0]
    else:
        probs = torch.softmax(scores, dim=-1)
        lse = torch.logsumexp(scores, dim=-1) if return_lse else None
    if probs_dtype is not None:
        probs = probs.to(probs_dtype)
    out = torch.matmul(probs.to(v.dtype), v)
    return (out, lse) if return_lse else out


def packed_attention_math(q: "torch.Tensor", k: "torch.Tensor", v: "torch.Tensor", packing: Packing, *,
                          sinks: "torch.Tensor | None" = None, return_lse: bool = False,
                          **options: Any) -> "torch.Tensor | tuple[torch.Tensor, torch.Tensor]":
    """:func:`attention_math` sequence by sequence, in the packed layout (see the contract).

    varlen: q, k, v ``[rows, H, D]``; the output ``[rows, Hq, Dv]`` and the LSE ``[Hq, rows]``, zero
    on unused rows. paged: q ``[B, Nq, Hq, D]``, k and v ``[pages, page_size, Hkv, D]``; the output
    ``[B, Nq, Hq, Dv]`` and the LSE ``[B, Hq, Nq]``. A sequence with no key gives zeros (the LSE:
    the sink's logit, or 0 where the contract leaves it open)."""
    import torch

    heads_q, value_dim = q.shape[-2], v.shape[-1]
    outs, lses = [], []
    for b in range(packing.batch):
        if packing.kind == "varlen":
            q_rows = q[packing.cu_seqlens_q[b]:packing.cu_seqlens_q[b + 1]]
            k_rows = k[packing.cu_seqlens_k[b]:packing.cu_seqlens_k[b + 1]]
            v_rows = v[packing.cu_seqlens_k[b]:packing.cu_seqlens_k[b + 1]]
        else:
            length = packing.cache_seqlens[b]
            pages = torch.tensor(packing.block_table[b][:-(-length // packing.page_size)], device=k.device,
                                 dtype=torch.long)
            q_rows = q[b]
            k_rows = k[pages].reshape(-1, *k.shape[2:])[:length]
            v_rows = v[pages].reshape(-1, *v.shape[2:])[:length]
        queries, keys = q_rows.shape[0], k_rows.shape[0]
        if queries == 0:
            continue
        if keys == 0:
            out = q_rows.new_zeros(queries, heads_q, value_dim, dtype=v.dtype)
            lse = (sinks.to(q.dtype)[:, None].expand(heads_q, queries) if sinks is not None
                   else q_rows.new_zeros(heads_q, queries))
        else:
            result = attention_math(q_rows.transpose(0, 1)[None], k_rows.transpose(0, 1)[None],
                                    v_rows.transpose(0, 1)[None], sinks=sinks, return_lse=True, **options)
            out, lse = result[0][0].transpose(0, 1), result[1][0]
        outs.append(out)
        lses.append(lse)
    if packing.kind == "paged":
        out, lse = torch.stack(outs), torch.stack(lses)
    else:
        unused = q.shape[0] - packing.cu_seqlens_q[-1]
        out = torch.cat(outs + [q.new_zeros(unused, heads_q, value_dim, dtype=v.dtype)])
        lse = torch.cat(lses + [q.new_zeros(heads_q, unused)], dim=1)
    return (out, lse) if return_lse else out


def lse_rows_with_a_key(case: "Case", device: "torch.device | str") -> "torch.Tensor":
    """Boolean, broadcastable to the case's LSE: True where the row sees at least one key (unused
    varlen rows: False)."""
    import torch

    def rows(queries: int, keys: int) -> "torch.Tensor":
        if keys == 0:
            return torch.zeros(queries, dtype=torch.bool, device=device)
        return rows_with_a_key(queries, keys, causal=case.causal, window=case.window, device=device)

    if case.kind == "dense":
        return rows(case.seqlen_q, case.seqlen_k)
    if case.kind == "paged":
        return torch.stack([rows(queries, keys) for queries, keys in case.sequences])[:, None, :]
    return torch.cat([rows(queries, keys) for queries, keys in case.sequences]
                     + [torch.zeros(case.unused_tokens, dtype=torch.bool, device=device)])


def forward_and_grads(
    q: "torch.Tensor",
    k: "torch.Tensor",
    v: "torch.Tensor",
    dout: "torch.Tensor | None",
    *,
    causal: bool,
    float64: bool,
    window: tuple[int, int] | None = None,
    softcap: float = 0.0,
    alibi_slopes: "torch.Tensor | None" = None,
    sinks: "torch.Tensor | None" = None,
    return_lse: bool = False,
    dlse: "torch.Tensor | None" = None,
    dtype: "torch.dtype | None" = None,
    probs_dtype: "torch.dtype | None" = None,
    packing: Packing | None = None,
    wrap: "Callable[[Callable[..., Any]], Callable[..., Any]] | None" = None,
) -> dict[str, "torch.Tensor"]:
    """Run the reference (float64 oracle or plain same-precision) and, with ``dout``, its backward.

    Returns detached tensors keyed ``out`` (and ``lse`` with ``return_lse``), and with ``dout``
    the gradients ``dq``, ``dk``, ``dv`` (and ``dsinks`` with sinks). The LSE's upstream gradient
    is ``dlse``. ALiBi slopes and sinks stay float32 in the plain reference, as the contract
    hands them; the oracle takes every input in float64. ``dtype`` casts q, k, v (and the
    upstream gradient) for the plain reference, ``probs_dtype`` rounds P (FA3's FP8 reference:
    bf16 on the dequantized inputs, P in e4m3). With ``packing`` the tensors are in its packed
    layout (:func:`packed_attention_math`), and so are the gradients.

    ``wrap`` takes the attention function (:func:`attention_math`, or :func:`packed_attention_math`
    with ``packing`` bound) and returns the one to differentiate in its place, called the same way:
    the diagnosis (:mod:`pytest_attnkit.worker.diagnosis`) builds its wrong-on-purpose references
    so, from this math with altered arguments. A leaf the wrapped function does not use gets a
    zero gradient.
    """
    import torch

    backward = dout is not None
    if float64:
        cast = lambda t: t.detach().double()  # noqa: E731
    elif dtype is not None:
        cast = lambda t: t.detach().to(dtype)  # noqa: E731
    else:
        cast = lambda t: t.detach()  # noqa: E731
    keep = (lambda t: t.detach().double()) if float64 else (lambda t: t.detach())  # noqa: E731
    leaves = [cast(t).requires_grad_(backward) for t in (q, k, v)]
    names = ["dq", "dk", "dv"]
    sink_leaf = None
    if sinks is not None:
        sink_leaf = keep(sinks).requires_grad_(backward)
        leaves.append(sink_leaf)
        names.append("dsinks")
    slopes = None if alibi_slopes is None else keep(alibi_slopes)
    with torch.enable_grad():
        options = dict(causal=causal, window=window, softcap=softcap, alibi_slopes=slopes, sinks=sink_leaf,
                       return_lse=return_lse, probs_dtype=probs_dtype)
        math_function: Callable[..., Any] = (attention_math if packing is None
                                             else functools.partial(packed_attention_math, packing=packing))
        if wrap is not None:
            math_function = wrap(math_function)
        result = math_function(*leaves[:3], **options)
        out, lse = result if return_lse else (result, None)
        results = {"out": out.detach()}
        if lse is not None:
            results["lse"] = lse.detach()
        if backward:
            outputs, upstream = [out], [cast(dout)]
            if lse is not None and dlse is not None:
                outputs.append(lse)
                upstream.append(cast(dlse).to(lse.dtype))
            grads = torch.autograd.grad(outputs, leaves, upstream, allow_unused=True)
            results.update((name, torch.zeros_like(leaf) if grad is None else grad)
                           for name, grad, leaf in zip(names, grads, leaves))
    return results
