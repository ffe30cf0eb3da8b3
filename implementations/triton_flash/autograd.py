"""The differentiable entry point: ``flash_attention`` and its ``torch.autograd.Function``."""

from __future__ import annotations

import math
from typing import Any

import torch

from .kernels import TRITON_IMPORT_ERROR, triton
from .launch import check_inputs, flash_bwd, flash_fwd


class _FlashAttnFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                scale: float) -> torch.Tensor:
        o, lse = flash_fwd(q, k, v, causal, scale)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal = causal
        ctx.scale = scale
        return o

    @staticmethod
    def backward(ctx: Any, do: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = flash_bwd(do, q, k, v, o, lse, ctx.causal, ctx.scale)
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
        raise ImportError(f"flash_attention needs triton (pip install triton): {TRITON_IMPORT_ERROR}")
    check_inputs(q, k, v)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if not math.isfinite(scale):
        raise ValueError(f"scale must be finite, got {scale!r}")
    if not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)):
        return flash_fwd(q, k, v, bool(causal), scale)[0]  # inference: no autograd node to build
    return _FlashAttnFunction.apply(q, k, v, bool(causal), scale)
