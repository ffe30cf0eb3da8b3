"""Standard (naive) attention: a CUDA C kernel run through CuPy, the quadratic-memory baseline.

This is the "standard attention" of the design notes, kept deliberately naive so that a flash
kernel has something honest to be compared with: one thread block per query row computes that
row's scores ``scale * q_i . k_j`` and writes them to a float32 buffer in device memory, turns
the row into softmax probabilities in place, and then reads it back to form ``P @ V``. Memory
model: besides the inputs (never copied; non-contiguous views are read through their strides)
and the output (``q.shape`` in ``q.dtype``, contiguous), one call allocates exactly one
workspace, the full ``[batch, heads_q, seqlen_q, seqlen_k]`` float32 score buffer, i.e.
:func:`score_buffer_bytes` = ``4 * B * Hq * Nq * Nk`` bytes, which grows with the square of the
sequence length. Both the buffer and the output are allocated by torch on ``q.device`` (so
torch's allocator and its memory statistics see them), cross into CuPy through DLPack without
copies, and the kernel runs on torch's current CUDA stream (so torch CUDA events time it
honestly). The kernel source is ``cupy_naive.cu`` next to this file; it is compiled once per
process (and per device) by ``cupy.RawModule`` through NVRTC. Forward only: there is no backward
and the output carries no autograd graph.
"""

from __future__ import annotations

import math
import threading
from pathlib import Path
from typing import Any

from pytest_attnkit.contract import AttentionImpl, Case

__all__ = ["CupyNaive", "score_buffer_bytes", "MAX_HEAD_DIM", "THREADS_PER_BLOCK"]

#: Kernel source, shipped next to this module.
KERNEL_SOURCE = Path(__file__).with_name("cupy_naive.cu")

#: Threads per block (a multiple of 32, at most 1024: the kernel's reductions assume whole warps).
THREADS_PER_BLOCK = 128

#: Largest head_dim accepted. The kernel itself only needs (32 + head_dim rounded up to 4)
#: floats of dynamic shared memory, so up to 12256 would fit in the default 48 KiB; 256 is the
#: declared, tested range (head_dim > THREADS_PER_BLOCK is handled by strided loops).
MAX_HEAD_DIM = 256

#: CUDA grid limits: grid = (seqlen_q, heads_q, batch).
_MAX_GRID_X = 2**31 - 1
_MAX_GRID_YZ = 65535

_KERNEL_NAMES = {
    "float16": "naive_attention_f16",
    "bfloat16": "naive_attention_bf16",
    "float32": "naive_attention_f32",
}

_lock = threading.Lock()
_module: Any = None  # cupy.RawModule, created on first use
_kernels: dict[str, Any] = {}  # dtype name -> cupy.RawKernel (compiled lazily, per device)


def score_buffer_bytes(batch: int, heads_q: int, seqlen_q: int, seqlen_k: int) -> int:
    """Size in bytes of the float32 score buffer one forward call allocates: 4*B*Hq*Nq*Nk."""
    for name, value in (("batch", batch), ("heads_q", heads_q), ("seqlen_q", seqlen_q), ("seqlen_k", seqlen_k)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"score_buffer_bytes: {name} must be a non-negative int, got {value!r}")
    return 4 * batch * heads_q * seqlen_q * seqlen_k


def _get_kernel(dtype_name: str) -> Any:
    """The RawKernel for one dtype; the module is compiled once (CuPy caches it per device)."""
    global _module
    with _lock:
        kernel = _kernels.get(dtype_name)
        if kernel is None:
            import cupy

            if _module is None:
                try:
                    source = KERNEL_SOURCE.read_text(encoding="utf-8")
                except OSError as error:
                    raise RuntimeError(
                        f"cupy_naive: cannot read the kernel source {KERNEL_SOURCE} ({error}); "
                        "it must be installed next to cupy_naive.py"
                    ) from error
                _module = cupy.RawModule(code=source)
            kernel = _module.get_function(_KERNEL_NAMES[dtype_name])
            _kernels[dtype_name] = kernel
        return kernel


def _shared_mem_bytes(head_dim: int) -> int:
    """Dynamic shared memory per block: 32 floats of reduction scratch plus q_i as float, padded
    to a multiple of 4 floats (the compiler reads the dot product's tail with 16-byte loads)."""
    return (32 + (head_dim + 3) // 4 * 4) * 4


def _dtype_name(tensor: Any) -> str:
    return str(tensor.dtype).removeprefix("torch.")


def _validate(q: Any, k: Any, v: Any) -> None:
    import torch

    for name, tensor in (("q", q), ("k", k), ("v", v)):
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(f"cupy_naive: {name} must be a torch.Tensor, got {type(tensor).__name__}")
        if tensor.device.type != "cuda":
            raise ValueError(f"cupy_naive: {name} must be a CUDA tensor, got device {tensor.device}")
        if tensor.dim() != 4:
            raise ValueError(
                f"cupy_naive: {name} must be 4-D [batch, heads, seqlen, head_dim], got shape {tuple(tensor.shape)}"
            )
        if tensor.layout != torch.strided:
            raise ValueError(f"cupy_naive: {name} must be a strided (dense) tensor, got layout {tensor.layout}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"cupy_naive: q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"cupy_naive: q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if _dtype_name(q) not in _KERNEL_NAMES:
        raise ValueError(f"cupy_naive: dtype {q.dtype} is not supported (float16, bfloat16, float32)")
    if k.shape != v.shape:
        raise ValueError(f"cupy_naive: k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    batch, heads_q, seqlen_q, head_dim = q.shape
    batch_kv, heads_kv, _seqlen_k, head_dim_kv = k.shape
    if batch != batch_kv:
        raise ValueError(f"cupy_naive: q has batch {batch} but k/v have batch {batch_kv}")
    if head_dim != head_dim_kv:
        raise ValueError(f"cupy_naive: q has head_dim {head_dim} but k/v have head_dim {head_dim_kv}")
    if heads_kv < 1 or heads_q % heads_kv:
        raise ValueError(
            f"cupy_naive: heads_q={heads_q} must be a positive multiple of heads_kv={heads_kv} (GQA/MQA)"
        )
    if head_dim > MAX_HEAD_DIM:
        raise ValueError(f"cupy_naive: head_dim={head_dim} is not supported (1..{MAX_HEAD_DIM})")
    if seqlen_q > _MAX_GRID_X or heads_q > _MAX_GRID_YZ or batch > _MAX_GRID_YZ:
        raise ValueError(
            f"cupy_naive: grid (seqlen_q={seqlen_q}, heads_q={heads_q}, batch={batch}) exceeds CUDA's limits "
            f"({_MAX_GRID_X}, {_MAX_GRID_YZ}, {_MAX_GRID_YZ})"
        )


def _to_cupy(tensor: Any, cupy: Any) -> Any:
    """Zero-copy CuPy view of a torch CUDA tensor, through DLPack.

    16-bit tensors are first reinterpreted as int16 (``Tensor.view(torch.int16)``: same bytes,
    same strides, no copy), because CuPy cannot import bfloat16 through DLPack and the kernel
    takes both 16-bit types as raw ``unsigned short`` anyway. Must run inside a
    ``torch.cuda.device`` context for the tensor's device (torch refuses to export otherwise).
    """
    import torch

    exported = tensor.detach()  # torch refuses to export tensors that require grad
    if exported.element_size() == 2:
        exported = exported.view(torch.int16)
    array = cupy.from_dlpack(exported)
    # The kernel addresses memory through torch's own element strides (passed separately), so
    # only the pointer matters: equal pointers prove that nothing was copied.
    if array.data.ptr != tensor.data_ptr():
        raise RuntimeError(
            "cupy_naive: DLPack import did not give a zero-copy view "
            f"(cupy pointer {array.data.ptr:#x}, torch pointer {tensor.data_ptr():#x})"
        )
    return array


class CupyNaive(AttentionImpl):
    """Standard attention with a materialized [B, Hq, Nq, Nk] float32 score buffer (CUDA only).

    head_dim 1..256 (:data:`MAX_HEAD_DIM`; the kernel's shared memory is 32 + head_dim floats,
    rounded up to a multiple of 4, per block). Forward only: backward is not supported and the output has no autograd graph.
    """

    devices = ("cuda",)
    dtypes = ("float16", "bfloat16", "float32")
    head_dims = range(1, MAX_HEAD_DIM + 1)
    supports_causal = True
    supports_gqa = True
    supports_seqlen_mismatch = True
    supports_backward = False
    memory_class = "quadratic"
    # Three kernels, each element written by one thread, no atomics: the same inputs give the
    # same bits, and one sequence's never depend on the others'.
    deterministic = "forward"
    batch_invariant = True

    def unavailable_reason(self, device: str) -> str | None:
        if device != "cuda":
            return "CUDA only: a CUDA C kernel through cupy.RawKernel"
        try:
            import cupy
        except ModuleNotFoundError as error:
            if error.name == "cupy":
                return "cupy is not installed (pip install cupy-cuda12x)"
            return f"cupy failed to import ({type(error).__name__}: {error})"
        except Exception as error:  # a broken install, missing CUDA libraries, ...
            return f"cupy failed to import ({type(error).__name__}: {error})"
        try:
            count = cupy.cuda.runtime.getDeviceCount()
        except Exception as error:
            return f"cupy: no CUDA device ({error})"
        if count < 1:
            return "cupy: no CUDA device (getDeviceCount() returned 0)"
        try:
            import torch
        except Exception as error:
            return f"torch failed to import ({type(error).__name__}: {error})"
        if not torch.cuda.is_available():
            if torch.version.cuda is None:
                return f"torch {torch.__version__} is built without CUDA"
            return f"torch {torch.__version__} sees no CUDA device (torch.cuda.is_available() is False)"
        return None

    def not_supported_reasons(self, case: Case, device: str, *, backward: bool = False) -> list[str]:
        reasons = super().not_supported_reasons(case, device, backward=backward)
        if case.batch > _MAX_GRID_YZ:
            reasons.append(f"batch={case.batch} exceeds the grid limit {_MAX_GRID_YZ}")
        if case.heads_q > _MAX_GRID_YZ:
            reasons.append(f"heads_q={case.heads_q} exceeds the grid limit {_MAX_GRID_YZ}")
        return reasons

    def expected_extra_bytes(self, case: Case, *, backward: bool = False) -> int | None:
        """The memory model: one call's only workspace is the float32 score buffer."""
        return score_buffer_bytes(case.batch, case.heads_q, case.seqlen_q, case.seqlen_k)

    def forward(self, q: Any, k: Any, v: Any, *, causal: bool = False, scale: float | None = None) -> Any:
        """softmax(scale * q k^T [causal, bottom-right]) v, with the full score matrix in memory.

        Returns a new contiguous tensor of ``q.shape`` and ``q.dtype`` on ``q.device``. Inputs
        are never modified or copied. Forward only (no autograd).
        """
        import numpy
        import torch

        _validate(q, k, v)
        batch, heads_q, seqlen_q, head_dim = q.shape
        heads_kv, seqlen_k = k.shape[1], k.shape[2]
        scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
        dtype_name = _dtype_name(q)

        out = torch.empty((batch, heads_q, seqlen_q, head_dim), dtype=q.dtype, device=q.device)
        if out.numel() == 0:
            return out
        if seqlen_k == 0:  # no key at all: every row is fully masked, so zeros
            return out.zero_()

        import cupy

        kernel = _get_kernel(dtype_name)
        device_index = q.device.index if q.device.index is not None else torch.cuda.current_device()
        with torch.cuda.device(device_index):
            scores = torch.empty((batch, heads_q, seqlen_q, seqlen_k), dtype=torch.float32, device=q.device)
            torch_stream = torch.cuda.current_stream(device_index)
            with cupy.cuda.Device(device_index), cupy.cuda.ExternalStream(torch_stream.cuda_stream, device_index):
                q_c, k_c, v_c = _to_cupy(q, cupy), _to_cupy(k, cupy), _to_cupy(v, cupy)
                scores_c, out_c = _to_cupy(scores, cupy), _to_cupy(out, cupy)
                i64 = numpy.int64
                args = (
                    q_c, k_c, v_c, scores_c, out_c,
                    i64(heads_q), i64(heads_kv), i64(seqlen_q), i64(seqlen_k), i64(head_dim),
                    *(i64(s) for s in q.stride()),
                    *(i64(s) for s in k.stride()),
                    *(i64(s) for s in v.stride()),
                    numpy.float32(scale), i64(1 if causal else 0),
                )  # fmt: skip
                shared_mem = _shared_mem_bytes(head_dim)
                kernel((seqlen_q, heads_q, batch), (THREADS_PER_BLOCK,), args, shared_mem=shared_mem)
        # `scores` is released here; torch's caching allocator orders its reuse after the kernel
        # on this same stream.
        return out
