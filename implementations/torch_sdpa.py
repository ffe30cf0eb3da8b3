"""torch_sdpa: PyTorch's ``scaled_dot_product_attention``, the reference implementation.

Bottom-right causal masking comes from ``torch.nn.attention.bias.causal_lower_right`` (the
contract's alignment; torch's ``is_causal`` is top-left, which differs when Nq != Nk), and grouped
kv heads from ``enable_gqa``. Rows that see no key come out of torch as NaN on some backends, so
they are zeroed explicitly, as the contract asks. Which backend runs (FlashAttention-2, cuDNN,
memory-efficient, math) is torch's choice for the shape and device.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

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


class TorchSDPA(AttentionImpl):
    devices = ("cpu", "cuda")
    dtypes = ("float16", "bfloat16", "float32")
    supports_causal = True
    supports_gqa = True
    supports_seqlen_mismatch = True
    supports_backward = True
    memory_class = "linear"

    def unavailable_reason(self, device: str) -> str | None:
        try:
            import torch
        except ImportError as error:
            return f"torch is not installed ({error})"
        if device == "cuda" and not torch.cuda.is_available():
            return "no CUDA device"
        return super().unavailable_reason(device)

    def forward(self, q, k, v, *, causal=False, scale=None):
        return sdpa_attention(q, k, v, causal=causal, scale=scale)
