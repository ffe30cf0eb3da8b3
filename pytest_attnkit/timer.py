"""The timer: GPU-correct timing of one call, as kernel engineers trust it.

On CUDA every sample is one call bracketed by CUDA events on the current stream, with the L2
cache flushed before it (a 256 MiB buffer zeroed, as ``triton.testing.do_bench`` does), after a
warm-up that keeps compilation and autotuning out of the numbers. The number of samples adapts to
the call's length within a time budget, never fewer than ``min_samples``, so the gate has enough
repetitions for its statistics. On the CPU the samples come from ``time.perf_counter`` and are
CPU numbers.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

L2_FLUSH_BYTES = 256 * 2**20


@dataclass(frozen=True)
class Timing:
    samples_ms: list[float]
    warmup_ms: float  # the first (compiling) call plus the rest of the warm-up
    timer: str  # "cuda-events" or "perf-counter"
    #: On CUDA: the median host time of a call bracketed by device-wide synchronizations. Work that
    #: escapes the timed stream shows here and not in the events.
    host_wall_ms: float | None = None
    #: The first call alone: compilation and autotuning show here (on CUDA, synchronized).
    first_call_ms: float | None = None

    @property
    def median_ms(self) -> float:
        return statistics.median(self.samples_ms)

    @property
    def iqr_ms(self) -> float:
        if len(self.samples_ms) < 4:
            return 0.0
        quartiles = statistics.quantiles(self.samples_ms, n=4)
        return quartiles[2] - quartiles[0]

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "median_ms": self.median_ms, "iqr_ms": self.iqr_ms}


def _sample_count(estimate_ms: float, budget_ms: float, min_samples: int, max_samples: int) -> int:
    return max(min_samples, min(max_samples, int(budget_ms / max(estimate_ms, 1e-3))))


def time_call(fn: Callable[[], Any], device: str, *, budget_ms: float = 400.0, min_samples: int = 15,
              max_samples: int = 100, warmup: int = 3, long_call_ms: float = 100.0,
              long_min_samples: int = 10) -> Timing:
    """Time ``fn`` (which runs the implementation once) on ``device``; see the module docstring.

    Calls longer than ``long_call_ms`` (a materializing kernel at 16k tokens takes seconds) get
    one warm-up call instead of ``warmup``, ``long_min_samples`` samples instead of
    ``min_samples`` (still more than the gate's minimum) and two host-wall checks instead of five:
    repeating them adds minutes to a run and nothing to what it knows.
    """
    import torch

    def synchronize() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    started = time.perf_counter()
    fn()  # the first call: compilation, autotuning, allocations
    synchronize()
    first_call_ms = (time.perf_counter() - started) * 1e3
    last_ms = None  # the latest warm call's host time
    for _ in range(warmup - 1):
        call_started = time.perf_counter()
        fn()
        synchronize()
        last_ms = (time.perf_counter() - call_started) * 1e3
        if last_ms > long_call_ms:
            break
    warmup_ms = (time.perf_counter() - started) * 1e3
    long_call = last_ms is not None and last_ms > long_call_ms
    floor = long_min_samples if long_call else min_samples
    if device != "cuda":
        estimate = last_ms if long_call else _time_cpu(fn, 1)[0]
        return Timing(_time_cpu(fn, _sample_count(estimate, budget_ms, floor, max_samples)), warmup_ms, "perf-counter",
                      first_call_ms=first_call_ms)
    flush = l2_flush_buffer()
    estimate = last_ms if long_call else min(event_samples(fn, 3, flush))
    samples = event_samples(fn, _sample_count(estimate, budget_ms, floor, max_samples), flush)
    wall = _time_synchronized(fn, 2 if long_call else 5)
    return Timing(samples, warmup_ms, "cuda-events", host_wall_ms=statistics.median(wall), first_call_ms=first_call_ms)


def l2_flush_buffer() -> Any:
    """The buffer whose zeroing evicts the inputs from L2 before each timed call."""
    import torch

    return torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")


def event_samples(fn: Callable[[], Any], count: int, flush: Any) -> list[float]:
    """``count`` CUDA-event timings of ``fn`` in milliseconds, ``flush`` zeroed before each one."""
    import torch

    starts = [torch.cuda.Event(enable_timing=True) for _ in range(count)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(count)]
    for start, end in zip(starts, ends):
        flush.zero_()  # evict the inputs from L2 so every call reads them from memory
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) for start, end in zip(starts, ends)]


def _time_synchronized(fn: Callable[[], Any], count: int) -> list[float]:
    import torch

    samples = []
    for _ in range(count):
        torch.cuda.synchronize()
        started = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - started) * 1e3)
    return samples


def _time_cpu(fn: Callable[[], Any], count: int) -> list[float]:
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - started) * 1e3)
    return samples
