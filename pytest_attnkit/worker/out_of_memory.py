"""What a request that ran out of device memory replies: a status of its own, with the numbers.

An out-of-memory error says nothing about whether the kernel is right: it says that the case did
not fit on this GPU at that moment, perhaps because other processes (the scheduler's other
workers) held memory. So the worker does not report it as the implementation raising: it replies
``Status.OUT_OF_MEMORY`` with what the pytest side needs to decide (run it again alone, or skip the
case with the numbers, :meth:`pytest_attnkit.controller.outcome.Outcomes.from_reply`): how much the
failed allocation asked for, what the device had free and in all once this request's own memory
was handed back, and what this process and the others on the GPU held.

Which errors count: torch's ``OutOfMemoryError``, CuPy's ``OutOfMemoryError``, and an error whose
message is the CUDA driver's or runtime's out-of-memory (``CUDA_ERROR_OUT_OF_MEMORY``,
``cudaErrorMemoryAllocation``, "CUDA out of memory"), as libraries that wrap it in their own
exception (Triton's launcher, a ``RuntimeError`` from an extension) pass it on. Triton's
``OutOfResources`` for shared memory is a kernel that cannot launch on this GPU at any size,
not device memory: it stays the implementation's error.
"""

from __future__ import annotations

import re
import sys
import traceback
from typing import Any

from pytest_attnkit.messages import Reply, Status
from pytest_attnkit.worker.nvml import compute_processes

_DRIVER_OUT_OF_MEMORY = re.compile(r"CUDA out of memory|CUDA_ERROR_OUT_OF_MEMORY|cudaErrorMemoryAllocation"
                                   r"|cudaMalloc.*out of memory", re.IGNORECASE)
#: torch's "Tried to allocate 16.00 GiB", CuPy's "Out of memory allocating 34,359,738,368 bytes".
_TORCH_REQUEST = re.compile(r"Tried to allocate ([\d.]+) (B|KiB|MiB|GiB|TiB)")
_CUPY_REQUEST = re.compile(r"allocating ([\d,]+) bytes")
#: torch's "... of which 10.34 GiB is free" and "this process has 68.84 GiB memory in use".
_TORCH_FREE = re.compile(r"of which ([\d.]+) (B|KiB|MiB|GiB|TiB) is free")
_TORCH_IN_USE = re.compile(r"this process has ([\d.]+) (B|KiB|MiB|GiB|TiB) memory in use")
_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` (or an error it was raised from) is a device out-of-memory."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if type(current).__name__ == "OutOfMemoryError":  # torch's and CuPy's share the name
            return True
        if "OutOfResources" not in type(current).__name__ and _DRIVER_OUT_OF_MEMORY.search(str(current)):
            return True
        current = current.__cause__ or current.__context__
    return False


def _size(pattern: re.Pattern[str], message: str) -> int | None:
    found = pattern.search(message)
    return int(float(found[1]) * _UNITS[found[2]]) if found else None


def requested_bytes(message: str) -> int | None:
    """The size of the allocation that failed, where the message names it."""
    found = _CUPY_REQUEST.search(message)
    return int(found[1].replace(",", "")) if found else _size(_TORCH_REQUEST, message)


def at_failure(message: str) -> dict[str, int]:
    """What torch's message says of the moment the allocation failed: the device's free bytes and
    this process's."""
    figures = {"free_at_failure_bytes": _size(_TORCH_FREE, message),
               "process_at_failure_bytes": _size(_TORCH_IN_USE, message)}
    return {key: value for key, value in figures.items() if value is not None}


def first_sentences(message: str) -> str:
    """An out-of-memory's message cut to what says it all: torch's goes on about allocator
    settings after its first two sentences."""
    return ". ".join(message.split(". ")[:2]).strip()


def message_figures(message: str) -> dict[str, int]:
    """What an out-of-memory's message says: the allocation it asked for, and where torch's
    message says them, the device's free bytes and this process's at the failure."""
    asked = requested_bytes(message)
    return {**({"requested_bytes": asked} if asked is not None else {}), **at_failure(message)}


def device_memory() -> dict[str, Any]:
    """The device's free and total bytes now, and what this process and the others hold (the
    others' where NVML lists the processes on the GPU). Call after this process let go of what
    it can: an out-of-memory's traceback keeps its frames' tensors alive until it is cleared."""
    if "torch" not in sys.modules:
        return {}
    import torch

    from pytest_attnkit.worker.memory import release_device_memory

    figures: dict[str, Any] = {}
    try:
        release_device_memory()
        free, total = torch.cuda.mem_get_info()
        figures.update(free_bytes=int(free), total_bytes=int(total))
    except Exception:  # a context an error left unusable: the numbers stay unknown
        return figures
    processes = compute_processes()
    if processes is not None:
        import os

        figures["process_bytes"] = processes.get(os.getpid(), 0)
        others = {pid: used for pid, used in processes.items() if pid != os.getpid()}
        figures.update(other_processes=len(others), other_bytes=sum(others.values()),
                       processes={str(pid): used for pid, used in others.items()})
    return figures


def out_of_memory_reply(error: BaseException, data: dict[str, Any] | None = None) -> Reply | None:
    """The reply for ``error`` if it is an out-of-memory (see the module docstring), else None.
    Clears the traceback's frames first, so that what they held is handed back before the device
    is measured. ``data``: what the request measured before it failed (kept in the reply)."""
    if not is_out_of_memory(error):
        return None
    text = "".join(traceback.format_exception_only(type(error), error)).strip()
    first = next((line for line in text.splitlines() if line.strip()), type(error).__name__)
    if error.__traceback__ is not None:
        traceback.clear_frames(error.__traceback__)
    figures = {**message_figures(text), **device_memory()}
    return Reply(Status.OUT_OF_MEMORY, first_sentences(first), {**(data or {}), "out_of_memory": figures})

