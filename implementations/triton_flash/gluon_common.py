"""What the Gluon forward (:mod:`.gluon_forward`) and backward (:mod:`.gluon_backward`) share.

Triton's Gluon imports (the module must import without them, so that the two can say why no call
takes them: :data:`GLUON_IMPORT_ERROR`), the switch that turns both off (:func:`gluon_off`) and
the reading of each path's own switch (:func:`path_setting`), the device check (:func:`device_reason`), the checks on
q, k, v that both make in the same words (:func:`plain_variants`, :func:`dense_reason`,
:func:`strides_reason`), and the 4-d TMA descriptors both build (:func:`descriptor`). Each kernel
keeps its own checks where their words or limits differ (layouts, the scale, the grid).
"""

from __future__ import annotations

import os

import torch

try:
    import triton
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_init,
        warpgroup_mma_wait,
    )
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    if not hasattr(gl, "warp_specialize"):
        raise ImportError("this triton's Gluon has no warp_specialize")
except Exception as exc:  # the kernels' modules must import without Gluon, so that they can say why
    GLUON_IMPORT_ERROR: Exception | None = exc
    triton = gluon = gl = TensorDescriptor = None
    fence_async_shared = mbarrier = tma = warpgroup_mma = warpgroup_mma_init = warpgroup_mma_wait = None
    tma_load = tma_store = thread_barrier = PUBLIC_REINTERPRET = None
else:
    GLUON_IMPORT_ERROR = None
    # TMA's copies: triton 3.6 names them async_copy_global_to_shared and
    # async_copy_shared_to_global; later versions async_load and async_store, and the old names
    # raise "has been removed" (triton 3.9). The kernels call these names, which work on both.
    tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global
    # The barrier of a CTA's threads (in a warp-specialized partition, of its warps):
    # ``thread_barrier`` in triton 3.6, ``barrier`` in 3.9.
    thread_barrier = getattr(gl, "thread_barrier", None) or gl.barrier
    # A shared buffer's view as another shape: ``_reinterpret`` in triton 3.6, ``reinterpret`` from
    # a later version on (3.9 has only that). A kernel picks the method by this constexpr.
    PUBLIC_REINTERPRET = gl.constexpr(hasattr(gl.shared_memory_descriptor, "reinterpret"))

#: Set to 0 to turn both Gluon kernels off: the Triton kernels then take every call. Set to 1 to
#: take them under a triton they have not run on a GPU under (:data:`VERIFIED_TRITON`).
GLUON_SWITCH = "ATTNKIT_TRITON_FLASH_GLUON"
#: The triton versions (major.minor) under which the Gluon kernels ran right on a GPU, in the checks
#: and the harness (NOTES.md). Under another the Triton kernels take every call unless
#: :data:`GLUON_SWITCH` is 1: a new compiler can turn right source into a kernel that hangs (NOTES.md
#: v26-v27: an allocator reusing a barrier's word). Triton 3.9 compiles both kernels for sm_90a with
#: the names below (more spills in the backward: 3.7-4.0 KB at d128 against 0.8-1.5 KB, NOTES.md v28);
#: no GPU here has run them under it.
VERIFIED_TRITON = ("3.6",)
LOG2E = 1.4426950408889634
HEAD_DIMS = (64, 128)
DTYPES = (torch.float16, torch.bfloat16)
#: Hopper's shared memory per block (227 KiB).
SHARED_LIMIT = 232448


def aligned(t: torch.Tensor) -> bool:
    """Whether TMA can address ``t``: 16-byte aligned base and strides, the head dim contiguous."""
    size = t.element_size()
    return (t.stride(-1) == 1 and t.data_ptr() % 16 == 0
            and all((stride * size) % 16 == 0 for stride in t.stride()[:-1]))


def gluon_off() -> bool:
    """Whether :data:`GLUON_SWITCH` turns both Gluon kernels off."""
    return os.environ.get(GLUON_SWITCH, "1") == "0"


def path_setting(switch: str) -> str | None:
    """A Gluon path's environment ``switch`` as read: "1" (take the path for every call it
    covers), "0" (never; also when :data:`GLUON_SWITCH` turns both Gluon kernels off) or None
    (the path's measured rule decides; any other value too)."""
    if gluon_off():
        return "0"
    value = os.environ.get(switch)
    return value if value in ("0", "1") else None


def version_reason(version: str | None = None) -> str | None:
    """Why this triton (``version``: triton's own by default) does not take the Gluon kernels
    (None: it does): one they have not run on a GPU under, unless :data:`GLUON_SWITCH` is 1."""
    version = triton.__version__ if version is None else version
    if os.environ.get(GLUON_SWITCH) == "1" or ".".join(version.split(".")[:2]) in VERIFIED_TRITON:
        return None
    verified = " or ".join(VERIFIED_TRITON)
    return (f"triton {verified}, the version its kernels ran right on a GPU under (this is triton {version}; "
            f"{GLUON_SWITCH}=1 takes them anyway)")


def device_reason(device: torch.device) -> str | None:
    """Why no call on ``device`` takes this kernel, whatever its shape (None: some can)."""
    if GLUON_IMPORT_ERROR is not None:
        return f"Gluon (triton.experimental.gluon, triton >= 3.6) is not available: {GLUON_IMPORT_ERROR}"
    if os.environ.get("TRITON_INTERPRET") == "1" or device.type != "cuda":
        return "a CUDA device (not Triton's interpreter)"
    if (reason := version_reason()) is not None:
        return reason
    capability = torch.cuda.get_device_capability(device)
    if capability[0] != 9:
        return f"Hopper (sm_90) only: wgmma and this kernel's TMA use are sm_90a (this GPU is sm{capability[0]}{capability[1]})"
    return None


def plain_variants(causal: bool, variants: object | None, alibi: bool = False, window: bool = False,
                   softcap: bool = False, sinks: bool = False) -> bool:
    """Whether ``variants`` (None, or :class:`.launch.Variants`) asks for no more than plain or
    causal attention, and the variants a flag allows: ``alibi``, ``window`` (a sliding window),
    ``softcap``, ``sinks``."""
    if variants is None or getattr(variants, "key", None) is None:
        return True
    # Variants.key(): (causal, window, softcap, ALiBi, sinks).
    key_causal, key_window, key_softcap, key_alibi, key_sinks = variants.key()
    return (key_causal == bool(causal) and (softcap or not key_softcap) and (sinks or not key_sinks)
            and (alibi or not key_alibi) and (window or key_window is None))


def dense_reason(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dtypes: tuple[torch.dtype, ...] = DTYPES,
                 dtype_words: str = "float16 or bfloat16",
                 head_dims: tuple[tuple[int, int], ...] | None = None) -> str | None:
    """Why q, k, v are not the dense inputs both kernels take (None: they are): tensors
    ``[B, H, N, D]`` on one Hopper GPU (:func:`device_reason`), of one dtype among ``dtypes``
    (float16/bfloat16; the FP8 forward's e4m3, said as ``dtype_words``), head dim 64 or 128 (V's
    the same; ``head_dims``: the (Q's and K's, V's) pairs a kernel takes instead), Hq a multiple
    of Hkv, nothing empty."""
    tensors = (q, k, v)
    if not all(isinstance(t, torch.Tensor) for t in tensors):
        return "q, k, v must be tensors"
    if any(t.dim() != 4 for t in tensors):
        return "dense [batch, heads, seqlen, head_dim] tensors only"
    if (reason := device_reason(q.device)) is not None:
        return reason
    if any(t.device != q.device for t in tensors):
        return "q, k, v on one device"
    if q.dtype not in dtypes or k.dtype != q.dtype or v.dtype != q.dtype:
        return f"{dtype_words} q, k, v of one dtype, got {q.dtype}, {k.dtype}, {v.dtype}"
    batch, heads_q, n_q, head_dim = q.shape
    pairs = tuple((d, d) for d in HEAD_DIMS) if head_dims is None else head_dims
    if k.shape[-1] != head_dim or (head_dim, v.shape[-1]) not in pairs:
        said = ", ".join(f"{d}" if d == dv else f"{d} with V's {dv}" for d, dv in pairs)
        return (f"head dims {said} (V's equal to Q's unless said), got q {head_dim}, k {k.shape[-1]}, "
                f"v {v.shape[-1]}")
    if k.shape[:3] != v.shape[:3] or k.shape[0] != batch or k.shape[1] == 0 or heads_q % k.shape[1]:
        return f"k, v shapes {tuple(k.shape)}, {tuple(v.shape)} do not fit q {tuple(q.shape)}"
    if batch * heads_q * n_q == 0 or k.shape[2] == 0:
        return "empty inputs take the existing path"
    return None


def strides_reason(*tensors: torch.Tensor) -> str | None:
    """Why TMA cannot address one of ``tensors`` (None: it can address them all)."""
    if not all(aligned(t) for t in tensors):
        return "strides TMA can address: head dim contiguous, other strides and the base 16-byte aligned"
    return None


def descriptor(t: torch.Tensor, rows: int, swizzle: int = 128, cols: int | None = None) -> "TensorDescriptor":
    """A TMA descriptor of blocks ``[1, 1, rows, cols]`` (``cols`` None: D) on ``[B, H, N, D]``:
    4-d, so that each (batch, head) is bounded: loads past its last row read zeros, stores there
    are dropped. The backward's fp32 dQ takes ``swizzle`` 0 with whole rows, or 128 with 32
    columns (a swizzled box spans at most 128 bytes)."""
    layout = gl.NVMMASharedLayout(swizzle_byte_width=swizzle, element_bitwidth=8 * t.element_size(), rank=4)
    return TensorDescriptor.from_tensor(t, [1, 1, rows, t.shape[-1] if cols is None else cols], layout)
