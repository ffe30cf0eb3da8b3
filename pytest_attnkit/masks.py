"""Which query rows see which keys, as the contract says (docs/contract.md): causal aligned
bottom-right, windows as FlashAttention's local attention. Shared by the oracle and by
implementations that must zero the rows that see no key themselves (torch_flex), so that an
implementation does not import the oracle it is judged by. torch is imported inside the
functions: this module is light."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def visibility_mask(seqlen_q: int, seqlen_k: int, *, causal: bool, window: tuple[int, int] | None,
                    device: "torch.device | str", key_offset: int | None = None) -> "torch.Tensor | None":
    """Boolean [Nq, Nk] mask, True where query i sees key j, or None when every pair is visible.

    With ``d = i + Nk - Nq - j``: causal needs ``d >= 0``; a window ``(left, right)`` needs
    ``-right <= d <= left`` (a side of -1 is unbounded), as FlashAttention's local attention.
    ``key_offset`` replaces ``Nk - Nq`` (the contract's bottom-right alignment) in ``d``: the
    diagnosis's wrong-on-purpose references use 0 (top-left, torch's ``is_causal``).
    """
    import torch

    if not causal and window is None:
        return None
    offset = seqlen_k - seqlen_q if key_offset is None else key_offset
    rows = torch.arange(seqlen_q, device=device)[:, None]
    cols = torch.arange(seqlen_k, device=device)[None, :]
    distance = rows + offset - cols
    visible = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    if causal:
        visible &= distance >= 0
    if window is not None:
        left, right = window
        if left >= 0:
            visible &= distance <= left
        if right >= 0:
            visible &= distance >= -right
    return visible


def rows_with_a_key(seqlen_q: int, seqlen_k: int, *, causal: bool, window: tuple[int, int] | None,
                    device: "torch.device | str") -> "torch.Tensor":
    """Boolean [Nq]: True for the query rows that see at least one key."""
    import torch

    visible = visibility_mask(seqlen_q, seqlen_k, causal=causal, window=window, device=device)
    if visible is None:
        return torch.ones(seqlen_q, dtype=torch.bool, device=device)
    return visible.any(dim=-1)
