"""Form (b): a class that declares what it supports, so pytest-attnkit skips the rest in words."""

from __future__ import annotations

import torch
from pytest_attnkit import AttentionImpl, Case

from attnkit_example_kernels.chunked import chunked_attention


class ChunkedForwardOnly(AttentionImpl):
    """The chunked kernel, inference only, with its limits stated as data."""

    devices = ("cpu", "cuda")
    dtypes = ("float16", "float32")  # bf16 not offered: the skip reason says so
    head_dims = range(16, 129)
    supports_causal = True
    supports_gqa = True
    supports_seqlen_mismatch = True
    supports_backward = False
    memory_class = "linear"  # forward only: one chunk x N block of scores at a time

    def unavailable_reason(self, device: str) -> str | None:
        if device == "cuda" and not torch.cuda.is_available():
            return "no CUDA device"
        return super().unavailable_reason(device)

    def not_supported_reasons(self, case: Case, device: str, *, backward: bool = False) -> list[str]:
        reasons = super().not_supported_reasons(case, device, backward=backward)
        if case.seqlen_q > 65536:
            reasons.append(f"seqlen_q={case.seqlen_q} (at most 65536: the chunk loop runs in Python)")
        return reasons

    def forward(self, q, k, v, *, causal=False, scale=None):
        with torch.no_grad():
            return chunked_attention(q, k, v, causal=causal, scale=scale)
