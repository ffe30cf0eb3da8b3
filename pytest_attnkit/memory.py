"""Memory scaling: peak extra device memory per call, measured at the allocator, and its fit.

For one sequence length the worker builds the inputs, empties torch's caching allocator, resets
its peak statistics and runs one forward (or forward plus backward). The *extra* memory is the
allocator's peak above what was allocated before the call, less the tensors the call returns
(the output and, with backward, the gradients): the workspace the implementation needed. Triton's
scratch allocations and CuPy's are routed through torch's allocator so the meter sees them. A
background thread samples the driver's free memory during the call; growth that the driver saw
and torch's allocator did not is reported as unmetered, never silently measured as zero.

Over a sweep of lengths, ``fit_exponent`` fits ``log(extra) = a + b log(N)`` by least squares,
and ``classify`` turns ``b`` into a class: at most linear (``b <= 1.3``), quadratic
(``1.7 <= b <= 2.3``), or neither. The pure functions here are tested on the CPU with synthetic
measurements; :func:`measure_point` needs a CUDA device.
"""

from __future__ import annotations

import math
import threading
from dataclasses import asdict, dataclass
from typing import Any

from pytest_attnkit.contract import AttentionImpl, Case

LINEAR_MAX_SLOPE = 1.3
QUADRATIC_SLOPE = (1.7, 2.3)
#: Driver-seen growth beyond torch's reserved memory that counts as unmetered: above this many
#: bytes and this share of what torch saw (the CUDA context and cuBLAS workspaces move a little).
UNMETERED_MIN_BYTES = 64 * 2**20
UNMETERED_MIN_SHARE = 0.10


@dataclass(frozen=True)
class MemoryPoint:
    seqlen: int
    status: str  # "measured", "oom", "error"
    extra_bytes: int = 0
    peak_bytes: int = 0
    retained_bytes: int = 0
    unmetered_bytes: int = 0
    expected_bytes: int | None = None
    message: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "MemoryPoint":
        return cls(**values)


def fit_exponent(seqlens: list[int], extra_bytes: list[int]) -> float | None:
    """Least-squares slope of log(extra bytes) against log(N), over points with extra > 0.

    None when fewer than three points needed extra memory at all (constant, not a power law).
    """
    points = [(math.log(n), math.log(b)) for n, b in zip(seqlens, extra_bytes) if b > 0]
    if len(points) < 3:
        return None
    mean_x = sum(x for x, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    if spread == 0:
        return None
    return sum((x - mean_x) * (y - mean_y) for x, y in points) / spread


def classify(slope: float | None) -> str:
    """'linear' (at most linear, including no extra memory), 'quadratic', or 'neither'."""
    if slope is None or slope <= LINEAR_MAX_SLOPE:
        return "linear"
    if QUADRATIC_SLOPE[0] <= slope <= QUADRATIC_SLOPE[1]:
        return "quadratic"
    return "neither"


def memory_problems(declared: str | None, points: list[MemoryPoint]) -> list[str]:
    """Every way the sweep contradicts the implementation's claims; empty when it holds.

    The fitted class must match the declared one; no allocation may escape the meter; and where
    the implementation gives an analytic model, each measurement is within 10% of it.
    """
    measured = [point for point in points if point.status == "measured"]
    problems = []
    if len(measured) < 3:
        problems.append(f"only {len(measured)} lengths could be measured; at least 3 are needed to fit an exponent")
    else:
        slope = fit_exponent([p.seqlen for p in measured], [p.extra_bytes for p in measured])
        if declared is not None and classify(slope) != declared:
            problems.append(f"declares {declared} memory but its extra memory grows as N^{slope:.2f} ({classify(slope)})")
    for point in measured:
        if point.unmetered_bytes:
            problems.append(f"at N={point.seqlen} it allocated {point.unmetered_bytes} bytes that torch's allocator "
                            "did not see (a path the meter cannot measure)")
        if point.expected_bytes:
            ratio = point.extra_bytes / point.expected_bytes
            if abs(ratio - 1) > 0.10:
                problems.append(f"at N={point.seqlen} it used {point.extra_bytes} bytes, {ratio:.2f}x its own model "
                                f"({point.expected_bytes} bytes; 10% allowed)")
    return problems


def format_bytes(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(count) < 1024 or unit == "TiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    raise AssertionError("unreachable")


def format_table(name: str, direction: str, points: list[MemoryPoint], slope: float | None) -> list[str]:
    """A table a person reads: N, peak extra bytes, bytes per token, and the fitted exponent."""
    lines = [f"{name} ({direction}): fitted exponent {'none (no extra memory)' if slope is None else f'{slope:.2f}'}"
             f" -> {classify(slope)}",
             f"  {'N':>7}  {'extra (peak)':>14}  {'bytes/token':>12}  {'model':>12}  note"]
    for point in points:
        if point.status != "measured":
            lines.append(f"  {point.seqlen:>7}  {'-':>14}  {'-':>12}  {'-':>12}  {point.status}: {point.message}")
            continue
        model = format_bytes(point.expected_bytes) if point.expected_bytes is not None else "-"
        note = f"unmetered {format_bytes(point.unmetered_bytes)}" if point.unmetered_bytes else ""
        lines.append(f"  {point.seqlen:>7}  {format_bytes(point.extra_bytes):>14}  "
                     f"{point.extra_bytes / point.seqlen:>12.1f}  {model:>12}  {note}")
    return lines


class _DriverSampler:
    """Samples the driver's free memory in a thread, to see allocations torch's allocator cannot."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.min_free = torch.cuda.mem_get_info()[0]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.min_free = min(self.min_free, self.torch.cuda.mem_get_info()[0])
            self._stop.wait(0.0005)

    def __enter__(self) -> "_DriverSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.min_free = min(self.min_free, self.torch.cuda.mem_get_info()[0])


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


def release_device_memory() -> None:
    """Free what a measurement left behind (an out-of-memory traceback holds its frames' tensors
    until it is dropped, which is why this runs after :func:`measure_point` returns)."""
    import gc

    import torch

    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def measure_point(impl: AttentionImpl, case: Case, *, backward: bool, seed: int) -> MemoryPoint:
    """Peak extra memory of one call (CUDA only). Out-of-memory is a result, not a crash."""
    import torch

    from pytest_attnkit.inputs import make_inputs

    route_allocations_through_torch()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    try:
        inputs = make_inputs(case, "cuda", seed)
        q, k, v = (t.detach().requires_grad_(backward) for t in (inputs.q, inputs.k, inputs.v))
        dout = inputs.dout if backward else None
        del inputs
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        reserved_before = torch.cuda.memory_reserved()
        with _DriverSampler(torch) as sampler:
            free_before = torch.cuda.mem_get_info()[0]
            with torch.set_grad_enabled(backward):
                out = impl(q, k, v, causal=case.causal, scale=None)
                returned = [out]
                if backward:
                    returned += list(torch.autograd.grad(out, (q, k, v), dout))
            torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
        retained = sum(t.numel() * t.element_size() for t in returned)
        reserved_growth = torch.cuda.max_memory_reserved() - reserved_before
        driver_growth = free_before - sampler.min_free
        unmetered = max(0, driver_growth - reserved_growth)
        if unmetered < max(UNMETERED_MIN_BYTES, UNMETERED_MIN_SHARE * max(reserved_growth, 1)):
            unmetered = 0
        expected = impl.expected_extra_bytes(case, backward=backward)
        return MemoryPoint(case.seqlen_q, "measured", extra_bytes=max(0, peak - retained), peak_bytes=peak,
                           retained_bytes=retained, unmetered_bytes=unmetered, expected_bytes=expected)
    except torch.cuda.OutOfMemoryError as error:
        # torch's message goes on about allocator settings; the first two sentences say it all.
        return MemoryPoint(case.seqlen_q, "oom", message=". ".join(str(error).split(". ")[:2]).strip())
    except Exception as error:  # CuPy's OutOfMemoryError is not torch's
        if "out of memory" in str(error).lower() or type(error).__name__ == "OutOfMemoryError":
            return MemoryPoint(case.seqlen_q, "oom", message=f"{type(error).__name__}: {str(error).splitlines()[0]}")
        raise
