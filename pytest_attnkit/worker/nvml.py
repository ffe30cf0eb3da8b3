"""NVML, the driver's view of the GPU, as the worker reads it (runs in the worker processes).

torch's allocator sees only its own allocations; NVML sees every process's. Three readers use it:
the memory suite's per-process meter (:func:`pytest_attnkit.worker.memory.process_meter`), the
figures of an out-of-memory reply (who else held the GPU: :mod:`pytest_attnkit.worker.out_of_memory`),
and the speed suite's list of other processes that computed beside a timing
(:func:`pytest_attnkit.worker.speed.gpu_processes`). Each goes through :func:`device` here, so
the device lookup (by the CUDA device's UUID, which NVML and CUDA number alike whatever
``CUDA_VISIBLE_DEVICES`` says) is written once. Everything returns None where NVML cannot answer:
no pynvml, a driver or torch without these calls, or no CUDA device.
"""

from __future__ import annotations

import functools
from typing import Any


@functools.lru_cache(maxsize=1)
def device() -> tuple[Any, Any] | None:
    """(pynvml, the NVML handle of this process's current CUDA device), or None without NVML.
    Call after the process has made its CUDA context."""
    try:
        import pynvml
        import torch

        pynvml.nvmlInit()
        uuid = str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)
        return pynvml, pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
    except Exception:  # no NVML, or a torch or driver without these calls
        return None


def compute_processes() -> dict[int, int] | None:
    """Process id -> device bytes of every compute process on this process's GPU (as NVML numbers
    them: in a container, possibly not this namespace's ids); None where NVML cannot list them."""
    found = device()
    if found is None:
        return None
    nvml, handle = found
    try:
        return {int(process.pid): int(process.usedGpuMemory or 0)
                for process in nvml.nvmlDeviceGetComputeRunningProcesses(handle)}
    except Exception:
        return None
