"""The oracle: attention computed in float64, and the plain same-precision implementation.

The correctness rule (see :mod:`pytest_attnkit.worker.tolerance`) needs two references. The *oracle*
is plain attention on inputs upcast to float64. The *plain* reference is the same math in the
inputs' own precision, written the obvious way (as FlashAttention's tests do with
``attention_ref(upcast=False)``): its error against the oracle measures how much rounding an
honest implementation in that precision makes, so the allowed error scales with it.

Masking follows the contract: bottom-right causal alignment, and a query row that sees no key
produces zeros (and zero gradients), never NaN.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def causal_mask(seqlen_q: int, seqlen_k: int, device: "torch.device") -> "torch.Tensor":
    """Boolean [Nq, Nk] mask, True where query i may see key j: ``j <= i + Nk - Nq``."""
    import torch

    rows = torch.arange(seqlen_q, device=device)[:, None]
    cols = torch.arange(seqlen_k, device=device)[None, :]
    return cols <= rows + (seqlen_k - seqlen_q)


def attention_math(
    q: "torch.Tensor",
    k: "torch.Tensor",
    v: "torch.Tensor",
    *,
    causal: bool,
    scale: float | None = None,
) -> "torch.Tensor":
    """Plain attention in the inputs' dtype, differentiable. Tensors are [B, H, N, D]."""
    import torch

    heads_q, heads_kv = q.shape[1], k.shape[1]
    if heads_q != heads_kv:
        group = heads_q // heads_kv
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    scores = torch.matmul(q * scale, k.transpose(-2, -1))
    if causal:
        visible = causal_mask(q.shape[-2], k.shape[-2], q.device)
        row_sees_a_key = visible.any(dim=-1, keepdim=True)
        # Rows that see no key get finite scores before the softmax and zero probabilities
        # after it, so neither the output nor the backward pass ever touches a NaN.
        scores = scores.masked_fill(~visible, float("-inf")).masked_fill(~row_sees_a_key, 0.0)
        probs = torch.softmax(scores, dim=-1) * row_sees_a_key
    else:
        probs = torch.softmax(scores, dim=-1)
    return torch.matmul(probs.to(v.dtype), v)


def oracle_attention(
    q: "torch.Tensor", k: "torch.Tensor", v: "torch.Tensor", *, causal: bool, scale: float | None = None
) -> "torch.Tensor":
    """Attention on float64 copies of the inputs; the result is float64."""
    return attention_math(q.double(), k.double(), v.double(), causal=causal, scale=scale)


def forward_and_grads(
    q: "torch.Tensor",
    k: "torch.Tensor",
    v: "torch.Tensor",
    dout: "torch.Tensor | None",
    *,
    causal: bool,
    float64: bool,
) -> dict[str, "torch.Tensor"]:
    """Run the reference (float64 oracle or plain same-precision) and, with ``dout``, its backward.

    Returns detached tensors keyed ``out``, and ``dq``, ``dk``, ``dv`` when ``dout`` is given.
    """
    import torch

    cast = (lambda t: t.detach().double()) if float64 else (lambda t: t.detach())
    leaves = [cast(t).requires_grad_(dout is not None) for t in (q, k, v)]
    with torch.enable_grad():
        out = attention_math(*leaves, causal=causal)
        results = {"out": out.detach()}
        if dout is not None:
            grads = torch.autograd.grad(out, leaves, cast(dout))
            results.update(dq=grads[0], dk=grads[1], dv=grads[2])
    return results
