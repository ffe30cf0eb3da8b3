"""The environment probe, as a worker runs it: versions, and the device the run will use."""

from __future__ import annotations

import importlib.metadata
import platform
from typing import Any


def _distribution_version(*names: str) -> str | None:
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def describe_environment(device: str) -> dict[str, Any]:
    """Versions and the device ("cpu", "cuda" or "auto": the GPU when there is one), as the header
    and the baselines record them."""
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": _distribution_version("torch"),
        "triton": _distribution_version("triton"),
        "cupy": _distribution_version("cupy-cuda13x", "cupy-cuda12x", "cupy-cuda11x", "cupy"),
        "numpy": _distribution_version("numpy"),
        "cuda_available": False,
        "device": device,
        "device_name": platform.processor() or platform.machine(),
    }
    try:
        import torch
    except ImportError as error:
        info["torch_error"] = str(error)
        return info
    info["torch"] = str(torch.__version__)
    if torch.cuda.is_available():
        info["cuda_available"] = True
        info["cuda_runtime"] = torch.version.cuda
        info["cuda_device_count"] = torch.cuda.device_count()
        if device in ("cuda", "auto"):
            properties = torch.cuda.get_device_properties(torch.cuda.current_device())
            info["device_name"] = properties.name
            info["compute_capability"] = f"{properties.major}.{properties.minor}"
            info["device_memory_bytes"] = properties.total_memory
            info["multiprocessors"] = properties.multi_processor_count
            info["memory_meter"] = _memory_meter(torch)
    return info


def _memory_meter(torch: Any) -> str:
    """"process" where NVML reports this process's own device memory (memory sweeps may then run
    beside other work), else "device" (:mod:`pytest_attnkit.worker.memory`)."""
    from pytest_attnkit.worker.memory import process_meter

    torch.zeros(1, device="cuda")  # the CUDA context NVML is to find
    return "process" if process_meter() is not None else "device"
