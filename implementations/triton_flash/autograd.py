"""The entry points, in FlashAttention's names: ``flash_attention`` (dense), ``flash_attention_varlen``
(packed sequences) and ``flash_attention_with_kvcache`` (a paged KV cache, forward only), each
differentiable through one ``torch.autograd.Function``; FP8 inputs take the forward-only FP8 kernel."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import torch

from .kernels import TRITON_IMPORT_ERROR, triton
from .launch import (
    FP8_DTYPES,
    Paged,
    Variants,
    Varlen,
    check_inputs,
    check_inputs_fp8,
    flash_bwd,
    flash_fwd,
    flash_fwd_fp8,
)

_LN2 = math.log(2.0)


class _FlashAttnFunction(torch.autograd.Function):
    """q, k, v and the sinks (None, or logits that may require grad) in; the output and the
    natural LSE out, both differentiable. ``variants`` carries everything else (its sinks unused)."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor | None,
                scale: float, variants: Variants, layout: Varlen | None) -> tuple[torch.Tensor, torch.Tensor]:
        variants = replace(variants, sinks=_kernel_scalars(sinks))
        o, lse = flash_fwd(q, k, v, variants.causal, scale, variants=variants, layout=layout)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.scale, ctx.variants, ctx.layout = scale, variants, layout
        ctx.sinks_dtype = None if sinks is None else sinks.dtype
        ctx.set_materialize_grads(False)
        return o, lse * _LN2  # the caller's LSE is the natural one

    @staticmethod
    def backward(ctx: Any, do: torch.Tensor | None, dlse: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        q, k, v, o, lse = ctx.saved_tensors
        if do is None:  # only the LSE was used
            do = torch.zeros_like(o)
        dq, dk, dv, dsinks = flash_bwd(do, q, k, v, o, lse, ctx.variants.causal, ctx.scale, variants=ctx.variants,
                                       layout=ctx.layout, dlse=dlse)
        needs = ctx.needs_input_grad
        if dsinks is not None:
            dsinks = dsinks.to(ctx.sinks_dtype)
        return (dq if needs[0] else None, dk if needs[1] else None, dv if needs[2] else None,
                dsinks if needs[3] else None, None, None, None)


def _variants(causal: bool, window_size: Any, softcap: float, alibi_slopes: torch.Tensor | None,
              sinks: torch.Tensor | None) -> Variants:
    window = None
    if window_size is not None:
        window = tuple(window_size) if isinstance(window_size, (tuple, list)) else window_size
        if window == (-1, -1):  # FlashAttention's "no window"
            window = None
    return Variants(causal=bool(causal), window=window, softcap=softcap, alibi_slopes=alibi_slopes, sinks=sinks)


def _kernel_scalars(t: torch.Tensor | None) -> torch.Tensor | None:
    # ALiBi slopes and sinks as the kernels read them: float32, contiguous.
    return None if t is None else t.to(torch.float32).contiguous()


def _softmax_scale(q: torch.Tensor, scale: float | None) -> float:
    """``scale``, or ``1/sqrt(D)`` when None; refused unless finite."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if not math.isfinite(scale):
        raise ValueError(f"scale must be finite, got {scale!r}")
    return scale


def _run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None, variants: Variants,
         layout: Varlen | Paged | None, return_lse: bool) -> Any:
    scale = _softmax_scale(q, scale)
    sinks = variants.sinks
    variants = replace(variants, softcap=float(variants.softcap), alibi_slopes=_kernel_scalars(variants.alibi_slopes))
    tensors = (q, k, v) if sinks is None else (q, k, v, sinks)
    if not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors)):
        # inference: no autograd node to build (decode's host time shows)
        o, lse = flash_fwd(q, k, v, variants.causal, scale, variants=replace(variants, sinks=_kernel_scalars(sinks)),
                           layout=layout)
        return (o, lse * _LN2) if return_lse else o
    if isinstance(layout, Paged):
        raise ValueError("flash_attention_with_kvcache has no backward (forward only, as FlashAttention's)")
    o, lse = _FlashAttnFunction.apply(q, k, v, sinks, scale, variants, layout)
    return (o, lse) if return_lse else o


def _needs_triton() -> None:
    if triton is None:
        raise ImportError(f"triton_flash needs triton (pip install triton): {TRITON_IMPORT_ERROR}")


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                    scale: float | None = None, window_size: tuple[int, int] | None = None,
                    softcap: float = 0.0, alibi_slopes: torch.Tensor | None = None,
                    sinks: torch.Tensor | None = None, return_lse: bool = False,
                    q_descale: torch.Tensor | None = None, k_descale: torch.Tensor | None = None,
                    v_descale: torch.Tensor | None = None) -> Any:
    """Attention of ``q`` [B, Hq, Nq, D] over ``k`` [B, Hkv, Nk, D], ``v`` [B, Hkv, Nk, Dv];
    differentiable (q, k, v, sinks, and through the LSE).

    ``scale`` defaults to ``1/sqrt(D)``; ``causal`` masks bottom-right (query ``i`` sees key
    ``j <= i + Nk - Nq``), and rows that see no key come out as zeros. The variants are
    pytest-attnkit's contract (FlashAttention's names): ``window_size=(left, right)`` (-1
    unbounded), ``softcap``, ``alibi_slopes`` ([Hq] or [B, Hq]), ``sinks`` ([Hq] logits in every
    row's denominator), ``return_lse`` (then ``(out, lse)``, lse float32 [B, Hq, Nq], natural log).

    FP8 (``float8_e4m3fn`` q, k, v; FlashAttention-3's call): the values are ``x.float() *
    descale`` with float32 descales ``[B, Hkv]`` (q's per kv head; None stands for 1), the output
    is bfloat16, and there is no backward and no variant (head dims 64 and 128; CUDA sm89+, or the
    CPU interpreter).
    """
    _needs_triton()
    variants = _variants(causal, window_size, softcap, alibi_slopes, sinks)
    fp8 = isinstance(q, torch.Tensor) and q.dtype in FP8_DTYPES
    if fp8:
        if variants.key() != Variants(causal=variants.causal).key() or return_lse:
            raise ValueError("the FP8 forward takes no variant (window_size, softcap, alibi_slopes, sinks, "
                             "return_lse)")
        descales = (q_descale, k_descale, v_descale)
        check_inputs_fp8(q, k, v, descales)
        scale = _softmax_scale(q, scale)
        if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
            raise ValueError("the FP8 forward has no backward (as FlashAttention-3's FP8)")
        return flash_fwd_fp8(q, k, v, descales, variants.causal, scale)
    if not (q_descale is None and k_descale is None and v_descale is None):
        given = getattr(q, "dtype", type(q).__name__)
        raise ValueError(f"descales go with FP8 inputs (float8_e4m3fn), not {given}")
    check_inputs(q, k, v, variants)
    return _run(q, k, v, scale, variants, None, return_lse)


def flash_attention_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                           cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, *,
                           causal: bool = False, scale: float | None = None,
                           window_size: tuple[int, int] | None = None, softcap: float = 0.0,
                           alibi_slopes: torch.Tensor | None = None, sinks: torch.Tensor | None = None,
                           return_lse: bool = False) -> Any:
    """Packed sequences (``flash_attn_varlen_func``): q [total_q, Hq, D], k [total_k, Hkv, D],
    v [total_k, Hkv, Dv]; sequence ``b`` owns rows ``cu_seqlens[b]:cu_seqlens[b + 1]`` (int32, from
    0) and sees only itself, with causal, window and ALiBi positions within it (bottom-right).
    ``max_seqlen_*`` must be at least the longest sequence's length (the grid covers it). Returns
    the output [total_q, Hq, Dv] (rows past ``cu_seqlens_q[-1]`` are zeros), and with
    ``return_lse`` the LSE [Hq, total_q]. Differentiable, as :func:`flash_attention`."""
    _needs_triton()
    variants = _variants(causal, window_size, softcap, alibi_slopes, sinks)
    layout = Varlen(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    check_inputs(q, k, v, variants, layout)
    return _run(q, k, v, scale, variants, layout, return_lse)


def flash_attention_with_kvcache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                 block_table: torch.Tensor, cache_seqlens: torch.Tensor, *, causal: bool = False,
                                 scale: float | None = None, window_size: tuple[int, int] | None = None,
                                 softcap: float = 0.0, alibi_slopes: torch.Tensor | None = None,
                                 sinks: torch.Tensor | None = None, return_lse: bool = False) -> Any:
    """Attention over a paged KV cache (``flash_attn_with_kvcache``), forward only: q [B, Nq, Hq, D];
    caches [pages, page_size, Hkv, D or Dv]; sequence ``b``'s token ``t`` is in page
    ``block_table[b, t // page_size]`` (int32 [B, max_pages]) at slot ``t % page_size``, and it
    has ``cache_seqlens[b]`` tokens (int32 [B]). Causal aligns the queries to the cache's end.
    Returns the output [B, Nq, Hq, Dv], and with ``return_lse`` the LSE [B, Hq, Nq]. Few query
    rows per kv head take the split decode (the keys spread over the GPU), as dense decode does."""
    _needs_triton()
    variants = _variants(causal, window_size, softcap, alibi_slopes, sinks)
    layout = Paged(block_table, cache_seqlens)
    check_inputs(q, k_cache, v_cache, variants, layout)
    return _run(q, k_cache, v_cache, scale, variants, layout, return_lse)
