"""The memory meter, as the worker runs it: peak extra device memory of one call.

For one sequence length the worker builds the inputs and runs one forward (or forward plus
backward) unmeasured, a warm-up whose compilation, autotuning and first-call workspaces (a
compiled kernel's first call read 48 MiB at 1k tokens, then 258 KiB at 2k) are no part of what
the kernel needs per call; then it frees that call's results, empties torch's caching allocator,
resets its peak statistics and measures a second call. The *extra* memory is the
allocator's peak above what was allocated before the call, less the tensors the call returns
(the output and, with backward, the gradients): the workspace the implementation needed. Triton's
scratch allocations and CuPy's are routed through torch's allocator so the meter sees them. A
background thread samples what the driver has given this process during the call; growth that
the driver saw and torch's allocator did not is reported as unmetered, never silently measured
as zero.

The driver's figure is this process's own where NVML reports it per process
(:func:`process_meter`): then other processes on the GPU (the scheduler's other workers) cannot
move it, and sweeps may run beside other work. Where it does not (NVML missing, or a container
whose process ids NVML does not know), the device's free memory stands in, which every process
moves: the environment probe says which (``memory_meter``), and the pytest side then gives
memory sweeps the GPU alone.

The fit over a sweep of lengths and the verdict are the pytest process's
(:mod:`pytest_attnkit.controller.memory`). :func:`measure_point` needs a CUDA device.
"""

from __future__ import annotations

import os
import threading
from dataclasses import replace
from typing import Any

from pytest_attnkit.contract import AttentionImpl, Case
from pytest_attnkit.records import MemoryPoint, PointStatus
from pytest_attnkit.worker.calls import call_implementation

#: Driver-seen growth beyond torch's reserved memory that counts as unmetered: above this many
#: bytes and this share of what torch saw (the CUDA context and cuBLAS workspaces move a little).
UNMETERED_MIN_BYTES = 64 * 2**20
UNMETERED_MIN_SHARE = 0.10


class ProcessMeter:
    """This process's device memory as the driver accounts it, through NVML."""

    def __init__(self, nvml: Any, handle: Any) -> None:
        self._nvml, self._handle, self._pid = nvml, handle, os.getpid()

    def used(self) -> int | None:
        try:
            processes = self._nvml.nvmlDeviceGetComputeRunningProcesses(self._handle)
        except Exception:
            return None
        return next((int(process.usedGpuMemory or 0) for process in processes if process.pid == self._pid), None)


_meter: "ProcessMeter | None | bool" = False  # False: not looked for yet


def process_meter() -> ProcessMeter | None:
    """The per-process meter of the current CUDA device, or None where NVML cannot tell this
    process's memory (call after this process has made its CUDA context)."""
    global _meter
    if _meter is False:
        _meter = None
        from pytest_attnkit.worker import nvml

        found = nvml.device()
        if found is not None:
            meter = ProcessMeter(*found)
            if meter.used() is not None:  # None: a process NVML cannot see
                _meter = meter
    return _meter or None


class _DriverSampler:
    """Samples, in a thread, the memory the driver has given out, to see allocations torch's
    allocator cannot: this process's own where NVML tells it, else the device's free memory
    (``used`` grows as free memory shrinks, so the two read alike)."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.meter = process_meter()
        self.max_used = self._used()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _used(self) -> int:
        if self.meter is not None:
            used = self.meter.used()
            if used is not None:
                return used
        free, total = self.torch.cuda.mem_get_info()
        return total - free

    def _run(self) -> None:
        while not self._stop.is_set():
            self.max_used = max(self.max_used, self._used())
            self._stop.wait(0.0005)

    def __enter__(self) -> "_DriverSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.max_used = max(self.max_used, self._used())


def route_allocations_through_torch() -> None:
    """Make Triton's scratch memory and CuPy's allocations come from torch's caching allocator."""
    import sys

    import torch

    try:
        import triton

        if hasattr(triton, "set_allocator"):
            triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    except ImportError:
        pass
    if "cupy" in sys.modules:
        import cupy

        def torch_backed(size: int) -> Any:
            block = torch.empty(max(size, 1), dtype=torch.uint8, device="cuda")
            memory = cupy.cuda.UnownedMemory(block.data_ptr(), size, block)
            return cupy.cuda.MemoryPointer(memory, 0)

        cupy.cuda.set_allocator(torch_backed)


def release_device_memory(*, collect: bool = True) -> None:
    """Free what a measurement left behind (an out-of-memory traceback holds its frames' tensors
    until it is dropped, which is why this runs after :func:`measure_point` returns). ``collect``
    runs Python's cycle collector first, for tensors held only by reference cycles: it scans every
    object of the process, a tenth of a second or more in one that compiled with torch.compile, so
    a caller that knows nothing is left (:func:`device_bytes_held` back where it was) skips it."""
    import gc
    import sys

    import torch

    if collect:
        gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    if "cupy" in sys.modules:  # CuPy's own pools, where an implementation allocated through them
        import cupy

        cupy.get_default_memory_pool().free_all_blocks()
        cupy.get_default_pinned_memory_pool().free_all_blocks()


def device_bytes_held() -> int:
    """Device memory held by live tensors and arrays now: torch's allocated bytes, and CuPy's
    pool's used bytes where CuPy is loaded."""
    import sys

    import torch

    held = torch.cuda.memory_allocated()
    if "cupy" in sys.modules:
        import cupy

        held += cupy.get_default_memory_pool().used_bytes()
    return held


def measure_point(impl: AttentionImpl, case: Case, *, backward: bool, seed: int,
                  call_limit_ms: float | None = None) -> MemoryPoint:
    """Peak extra memory of one call (CUDA only). Out-of-memory is a result, not a crash.

    The peak counts from what is allocated just before the measured call, so nothing allocated
    before may be freed during it: garbage in reference cycles (a previous request's tensors) is
    collected just before the call, and the cycle collector is off during it. Before this, a
    point of torch_sdpa's varlen backward sweep read 2.1 MiB in parallel runs, where its
    neighbours and the serial run read 14.4 KB per token; since, every run reads the latter
    (results/2026-11-25-h200-main-job; the mechanism was not traced further). With
    ``call_limit_ms``, a point whose measured call took longer says so in ``stop``: the sweep
    ends after it (``pytest_attnkit.cases.MEMORY_CALL_LIMIT_MS``)."""
    import gc
    import time

    import torch

    from pytest_attnkit.worker.inputs import make_inputs

    route_allocations_through_torch()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    collecting = gc.isenabled()
    try:
        inputs = make_inputs(case, "cuda", seed)
        q, k, v = (t.detach().requires_grad_(backward) for t in (inputs.q, inputs.k, inputs.v))
        dout = inputs.dout if backward else None
        variant_inputs = replace(inputs, q=None, k=None, v=None, dout=None)  # a variant's ALiBi slopes or sinks
        del inputs
        # The warm-up: unmeasured, and held to the contract; an OOM in it is the point's result.
        _run(impl, case, q, k, v, dout, variant_inputs, checked=True)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        gc.collect()
        gc.disable()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        reserved_before = torch.cuda.memory_reserved()
        with _DriverSampler(torch) as sampler:
            used_before = sampler.max_used
            started = time.perf_counter()
            returned = _run(impl, case, q, k, v, dout, variant_inputs)
            torch.cuda.synchronize()
            call_ms = (time.perf_counter() - started) * 1e3
        peak = torch.cuda.max_memory_allocated() - before
        retained = sum(t.numel() * t.element_size() for t in returned)
        reserved_growth = torch.cuda.max_memory_reserved() - reserved_before
        driver_growth = sampler.max_used - used_before
        unmetered = max(0, driver_growth - reserved_growth)
        if unmetered < max(UNMETERED_MIN_BYTES, UNMETERED_MIN_SHARE * max(reserved_growth, 1)):
            unmetered = 0
        expected = impl.expected_extra_bytes(case, backward=backward)
        stop = ""
        if call_limit_ms is not None and call_ms > call_limit_ms:
            stop = (f"one call took {call_ms:.0f} ms, longer than this profile repeats ({call_limit_ms:.0f} ms); "
                    "--attnkit-profile=full goes on")
        return MemoryPoint(case.sweep_length, PointStatus.MEASURED, extra_bytes=max(0, peak - retained),
                           peak_bytes=peak, retained_bytes=retained, unmetered_bytes=unmetered,
                           expected_bytes=expected, call_ms=round(call_ms, 1), stop=stop)
    except torch.cuda.OutOfMemoryError as error:
        # The whole message: the handler reads its figures, then keeps its first two sentences.
        return MemoryPoint(case.sweep_length, PointStatus.OOM, message=str(error).strip())
    except Exception as error:  # CuPy's OutOfMemoryError is not torch's
        if "out of memory" in str(error).lower() or type(error).__name__ == "OutOfMemoryError":
            return MemoryPoint(case.sweep_length, PointStatus.OOM,
                               message=f"{type(error).__name__}: {str(error).splitlines()[0]}")
        raise
    finally:
        if collecting:
            gc.enable()


def _run(impl: AttentionImpl, case: Case, q: Any, k: Any, v: Any, dout: Any, inputs: Any, *,
         checked: bool = False) -> list[Any]:
    """One call: the output, and with ``dout`` the gradients of q, k and v (from a graph of its own).
    ``checked`` holds it to the contract, its inputs compared by checksum: a copy would take
    memory beside the case that this suite measures (pytest_attnkit/worker/calls.py)."""
    import torch

    from pytest_attnkit.worker.calls import InputWatch, check_gradients, check_returned, given_inputs

    watch = InputWatch(given_inputs(q, k, v, inputs), copy=False) if checked else None
    with torch.set_grad_enabled(dout is not None):
        out = call_implementation(impl, case, q, k, v, inputs)
        if watch is not None:
            check_returned(case, out, q, backward=dout is not None)
        returned = [out]
        if dout is not None:
            grads = torch.autograd.grad(out, (q, k, v), dout, allow_unused=watch is not None)
            if watch is not None:
                check_gradients({"dq": q, "dk": k, "dv": v}, grads)
            returned += list(grads)
    if watch is not None:
        watch.check()
    return returned
