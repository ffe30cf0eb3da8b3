"""torch_flex: PyTorch's FlexAttention, compiled by ``torch.compile`` into one fused kernel.

FlexAttention (``torch.nn.attention.flex_attention``) takes the mask as a Python function
(``mask_mod``) and has Inductor generate a fused attention kernel from it: a Triton template on
CUDA, a C++ template on the CPU. It is here as the compiler-generated baseline beside torch_sdpa
(hand-written kernels) and triton_flash (a hand-written Triton kernel): it shows what a kernel
written by torch.compile from a mask function gets, in speed and memory, on the same cases.

The contract's bottom-right causal mask is the ``mask_mod`` ``kv_idx <= q_idx + Nk - Nq``, turned
into a block mask by ``create_block_mask`` once per (Nq, Nk, device) and kept in a small LRU cache;
key blocks wholly above the diagonal are then never visited. Without causal masking no block
mask is passed. Grouped kv heads go through ``enable_gqa``. A row that sees no key (causal with
Nq > Nk) comes out of FlexAttention as zeros, with zero gradients: the kernels turn its empty
softmax sum into 1 and its ``-inf`` log-sum-exp into 0 (seen on the CPU with torch 2.13; the
CUDA templates say so in their source), so nothing is zeroed here.

``torch.compile(flex_attention, dynamic=False)`` is made once per process, so each new shape,
dtype or grad mode compiles once (tens of seconds on the CPU for the first) and then hits the
cache. On the CPU FlexAttention runs forward only: torch refuses any input that requires grad.
On CUDA its Triton kernels need head_dim >= 16; the CPU takes any head dim.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Callable

from pytest_attnkit.contract import AttentionImpl, Case

if TYPE_CHECKING:
    import torch

#: Block masks kept, least recently used dropped first; one is a few small int tensors.
BLOCK_MASK_CACHE_SIZE = 64
#: Compiled entries allowed per code object. Every shape compiles its own entry (dynamic=False)
#: and dynamo's default limit (8) would quietly send later shapes to eager FlexAttention, which
#: is unfused, quadratic-memory math.
RECOMPILE_LIMIT = 1 << 16

_lock = threading.Lock()
_compiled_flex: Callable[..., Any] | None = None
_block_masks: "OrderedDict[tuple[int, int, str, bool], Any]" = OrderedDict()


def _raise_dynamo_limit(config: Any, names: tuple[str, ...], value: int) -> None:
    for name in names:  # older torch calls these cache_size_limit and accumulated_cache_size_limit
        if hasattr(config, name):
            setattr(config, name, max(getattr(config, name), value))
            return


def compiled_flex_attention() -> Callable[..., Any]:
    """``torch.compile(flex_attention, dynamic=False)``, made on first use, once per process."""
    global _compiled_flex
    with _lock:
        if _compiled_flex is None:
            import torch
            import torch._dynamo.config
            from torch.nn.attention.flex_attention import flex_attention

            try:
                import torch._functorch.config

                # Donated buffers free saved tensors during backward, which breaks the speed
                # suite's repeated backward calls on one retained graph.
                torch._functorch.config.donated_buffer = False
            except (ImportError, AttributeError):  # a torch without donated buffers
                pass
            _raise_dynamo_limit(torch._dynamo.config, ("recompile_limit", "cache_size_limit"), RECOMPILE_LIMIT)
            _raise_dynamo_limit(torch._dynamo.config,
                                ("accumulated_recompile_limit", "accumulated_cache_size_limit"), RECOMPILE_LIMIT)
            _compiled_flex = torch.compile(flex_attention, dynamic=False)
        return _compiled_flex


def _bottom_right_causal(offset: int) -> Callable[..., Any]:
    def mask_mod(batch: Any, head: Any, q_idx: Any, kv_idx: Any) -> Any:
        return kv_idx <= q_idx + offset

    return mask_mod


def causal_block_mask(seqlen_q: int, seqlen_k: int, device: "torch.device") -> Any:
    """The bottom-right causal ``BlockMask`` for these lengths on ``device``, cached (LRU)."""
    key = (seqlen_q, seqlen_k, str(device), True)
    with _lock:
        if key in _block_masks:
            _block_masks.move_to_end(key)
            return _block_masks[key]
    from torch.nn.attention.flex_attention import create_block_mask

    block_mask = create_block_mask(_bottom_right_causal(seqlen_k - seqlen_q), None, None, seqlen_q, seqlen_k,
                                   device=device)
    with _lock:
        _block_masks[key] = block_mask
        _block_masks.move_to_end(key)
        while len(_block_masks) > BLOCK_MASK_CACHE_SIZE:
            _block_masks.popitem(last=False)
    return block_mask


def flex_attention_contract(q: "torch.Tensor", k: "torch.Tensor", v: "torch.Tensor", *, causal: bool = False,
                            scale: float | None = None) -> "torch.Tensor":
    import torch

    if q.device.type == "cpu" and not torch.is_grad_enabled():
        # FlexAttention refuses CPU inputs that require grad even under no_grad.
        q, k, v = q.detach(), k.detach(), v.detach()
    block_mask = causal_block_mask(q.shape[-2], k.shape[-2], q.device) if causal else None
    return compiled_flex_attention()(q, k, v, block_mask=block_mask, scale=scale,
                                     enable_gqa=q.shape[1] != k.shape[1])


class TorchFlex(AttentionImpl):
    devices = ("cpu", "cuda")
    dtypes = ("float16", "bfloat16", "float32")
    head_dims = None  # any on the CPU; CUDA's refinement is in not_supported_reasons
    supports_causal = True
    supports_gqa = True
    supports_seqlen_mismatch = True
    supports_backward = True  # CUDA only; see not_supported_reasons
    memory_class = "linear"

    def unavailable_reason(self, device: str) -> str | None:
        try:
            import torch
        except ImportError as error:
            return f"torch is not installed ({error})"
        try:
            import torch.nn.attention.flex_attention  # noqa: F401
        except ImportError as error:
            return f"torch {torch.__version__} has no FlexAttention (needs torch >= 2.5: {error})"
        if device == "cuda":
            if not torch.cuda.is_available():
                return "no CUDA device"
            try:
                from torch.utils._triton import has_triton
            except ImportError:
                has_triton = None
            if has_triton is not None and not has_triton():
                return "torch.compile needs triton to build FlexAttention's CUDA kernels, and it is not installed"
        return super().unavailable_reason(device)

    def not_supported_reasons(self, case: Case, device: str, *, backward: bool = False) -> list[str]:
        reasons = super().not_supported_reasons(case, device, backward=backward)
        if device == "cpu" and backward:
            reasons.append("FlexAttention has no backward on the CPU (torch refuses inputs that require grad)")
        if device == "cuda" and case.head_dim < 16:
            reasons.append(f"head_dim={case.head_dim} (FlexAttention's CUDA kernels need head_dim >= 16)")
        return reasons

    def forward(self, q, k, v, *, causal=False, scale=None):
        return flex_attention_contract(q, k, v, causal=causal, scale=scale)
