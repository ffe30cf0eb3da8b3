"""The entry point: ``flash_attention`` (differentiable through its ``torch.autograd.Function``;
FP8 inputs take the forward-only FP8 kernel)."""

from __future__ import annotations

import math
from typing import Any

import torch

from .kernels import TRITON_IMPORT_ERROR, triton
from .launch import FP8_DTYPES, check_inputs, check_inputs_fp8, flash_bwd, flash_fwd, flash_fwd_fp8


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
                    scale: float | None = None, q_descale: torch.Tensor | None = None,
                    k_descale: torch.Tensor | None = None,
                    v_descale: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of ``q`` [B, Hq, Nq, D] over ``k``, ``v`` [B, Hkv, Nk, D]; differentiable.

    ``scale`` defaults to ``1/sqrt(D)``; ``causal`` masks bottom-right (query ``i`` sees key
    ``j <= i + Nk - Nq``), and rows that see no key come out as zeros.

    FP8 (``float8_e4m3fn`` q, k, v; FlashAttention-3's call): the values are ``x.float() *
    descale`` with float32 descales ``[B, Hkv]`` (q's per kv head; None stands for 1), the output
    is bfloat16, and there is no backward (head dims 64 and 128; CUDA sm89+, or the CPU
    interpreter).
    """
    if triton is None:
        raise ImportError(f"flash_attention needs triton (pip install triton): {TRITON_IMPORT_ERROR}")
    fp8 = isinstance(q, torch.Tensor) and q.dtype in FP8_DTYPES
    if fp8:
        descales = (q_descale, k_descale, v_descale)
        check_inputs_fp8(q, k, v, descales)
    else:
        if not (q_descale is None and k_descale is None and v_descale is None):
            given = getattr(q, "dtype", type(q).__name__)
            raise ValueError(f"descales go with FP8 inputs (float8_e4m3fn), not {given}")
        check_inputs(q, k, v)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if not math.isfinite(scale):
        raise ValueError(f"scale must be finite, got {scale!r}")
    if fp8:
        if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
            raise ValueError("the FP8 forward has no backward (as FlashAttention-3's FP8)")
        return flash_fwd_fp8(q, k, v, descales, bool(causal), scale)
    if not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)):
        return flash_fwd(q, k, v, bool(causal), scale)[0]  # inference: no autograd node to build
    return _FlashAttnFunction.apply(q, k, v, bool(causal), scale)
