"""The timer: GPU-correct timing of one call, as kernel engineers trust it.

On CUDA every sample is one call bracketed by CUDA events on the current stream, with the L2
cache flushed before it (a 256 MiB buffer zeroed, as ``triton.testing.do_bench`` does), after a
warm-up that keeps compilation and autotuning out of the numbers. The number of samples adapts to
the call's length within a time budget, never fewer than ``min_samples``, so the gate has enough
repetitions for its statistics. On the CPU the samples come from ``time.perf_counter`` and are
CPU numbers.

Before the flush the stream is held busy (a GPU spin, ``torch.cuda._sleep``) for longer than the
host takes to issue the call, as NVBench's blocking kernel does; the call then starts right after
the flush, as it would without the hold, but with all of it already queued. Without it a
short call's events also time the host: the start event fires as soon as the flush ends, and the
GPU then waits for Python and the launch path to deliver the kernels (a 0.03 ms decode call read
two to five times that; docs/speed.md: the timer). The host's part is measured on its own
(``Timing.launch_ms``) and reported beside the GPU time, not mixed into it.

The hold also reads the SM clock: it spins a known number of cycles, so events around it give
each sample's clock in MHz (``Timing.clocks_mhz``; a short lead spin first, so that the first
event waits on the GPU rather than firing while the host launches). A long load can bring an H200
against its power cap and its clock down 6-11% within one case (results/2026-11-23-h200-clock),
more than the margin between two good kernels; the summary names such cases. The samples are left
as measured.

A call that needs something made fresh before each run (a backward needs its own autograd graph,
since a compiled backward may free the graph it runs) passes ``prepare``: it runs before every
call of ``fn``, warm-up and samples alike, outside the timed region (on CUDA before the hold,
and waited for), so only ``fn`` is timed.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from typing import Any, Callable, ContextManager

from pytest_attnkit.records import Timing

L2_FLUSH_BYTES = 256 * 2**20
#: The hold before each timed call: HOLD_FACTOR times the host's time to issue one call, plus
#: HOLD_SLACK_MS for the flush, the events and the hold's own launch, at most HOLD_LIMIT_MS (a call
#: whose host part is longer than that is host-bound, and its events say so).
HOLD_FACTOR = 2.0
HOLD_SLACK_MS = 0.05
HOLD_LIMIT_MS = 20.0
#: The shortest hold read as the SM clock (``Timing.clocks_mhz``): the events' resolution, about
#: half a microsecond, is then under 1% of it.
CLOCK_HOLD_MS = 0.1
#: The spin queued ahead of a clock reading's first event, so that the event waits on the GPU and
#: fires as the measured spin starts, not when the host gets to launch it.
CLOCK_LEAD_MS = 0.05


def _sample_count(estimate_ms: float, budget_ms: float, min_samples: int, max_samples: int) -> int:
    return max(min_samples, min(max_samples, int(budget_ms / max(estimate_ms, 1e-3))))


def time_call(fn: Callable[[], Any], device: str, *, budget_ms: float = 400.0, min_samples: int = 15,
              max_samples: int = 100, warmup: int = 3, long_call_ms: float = 100.0,
              long_min_samples: int = 6, hold_stream: bool = True,
              prepare: Callable[[], Any] | None = None) -> Timing:
    """Time ``fn`` (which runs the implementation once) on ``device``; see the module docstring.

    Calls longer than ``long_call_ms`` (a materializing kernel at 16k tokens takes seconds) get
    one warm-up call instead of ``warmup``, ``long_min_samples`` samples instead of
    ``min_samples`` (the gate's minimum: its exact test decides on six a side) and one host-wall
    check instead of five: such calls repeat closely, and the full count made the naive kernel's
    long cases most of a speed run. ``hold_stream=False`` leaves out the hold (see the module
    docstring), to show what it changes. ``prepare``, when given, runs before every call of ``fn``
    and is never timed (see the module docstring); the first-call and warm-up figures are ``fn``'s.
    """
    warmed = warm_up(fn, device, warmup=warmup, long_call_ms=long_call_ms, hold_stream=hold_stream, prepare=prepare)
    count = warmed.sample_count(budget_ms, min_samples=min_samples, max_samples=max_samples,
                                long_min_samples=long_min_samples)
    return warmed.timing(warmed.samples(count))


class WarmedCall:
    """A call after its warm-up, ready to be sampled as often as asked: :func:`time_call` samples it
    once; an A/B run (``--attnkit-against``) samples it in small blocks, alternating with the other
    version's worker, with the same flush, hold and inputs each time."""

    def __init__(self, fn: Callable[[], Any], device: str, prepare: Callable[[], Any] | None, *,
                 warmup_ms: float, first_call_ms: float, long_call: bool, last_ms: float | None) -> None:
        self.fn, self.device, self.prepare = fn, device, prepare
        self.warmup_ms, self.first_call_ms, self.long_call, self.last_ms = warmup_ms, first_call_ms, long_call, last_ms
        self.launch_ms: float | None = None
        #: The host's time to issue the warm-up's last call (before waiting for it).
        self.last_launch_ms: float | None = None
        self.wall_ms: float | None = None
        self.wait_ms: float | None = None
        self.hold = 0.0
        self.flush: Any = None
        self._clocks: list[float] = []  # the latest samples' SM clocks, when the hold could read them
        #: The warm-up ended after a first call over its ``stop_over_ms`` (:func:`warm_up`): not
        #: to be sampled.
        self.stopped = False
        self._estimate_ms: float | None = None

    def _setup_cuda(self, hold_stream: bool) -> None:
        if self.long_call and self.last_launch_ms is not None and self.last_ms is not None:
            # The warm-up's last call was issued and waited for as _time_synchronized does: a
            # call of a second or more is not run once more only to read the same two figures.
            launch, wall = [self.last_launch_ms], [self.last_ms]
        else:
            launch, wall = _time_synchronized(self.fn, 1 if self.long_call else 5, self.prepare)
        self.launch_ms = statistics.median(launch)
        self.wall_ms = statistics.median(wall)
        self.wait_ms = statistics.median(w - l for w, l in zip(wall, launch))
        self.hold = hold_ms(self.launch_ms) if hold_stream else 0.0
        self.flush = l2_flush_buffer()

    def estimate_ms(self) -> float:
        """One call's time, for sizing the sample count (the warm-up's figure for a long call)."""
        if self._estimate_ms is None:
            if self.long_call and self.last_ms is not None:
                self._estimate_ms = self.last_ms
            elif self.device != "cuda":
                self._estimate_ms = _time_cpu(self.fn, 1, self.prepare)[0]
            else:
                self._estimate_ms = min(event_samples(self.fn, 3, self.flush, self.hold, self.prepare))
        return self._estimate_ms

    def sample_count(self, budget_ms: float, *, min_samples: int = 15, max_samples: int = 100,
                     long_min_samples: int = 6) -> int:
        floor = long_min_samples if self.long_call else min_samples
        return _sample_count(self.estimate_ms(), budget_ms, floor, max_samples)

    def samples(self, count: int) -> list[float]:
        if self.device != "cuda":
            return _time_cpu(self.fn, count, self.prepare)
        self._clocks = []
        return event_samples(self.fn, count, self.flush, self.hold, self.prepare, clocks=self._clocks)

    def timing(self, samples: list[float]) -> Timing:
        """The Timing of ``samples``, the latest :meth:`samples` (their clocks come with them)."""
        if self.device != "cuda":
            return Timing(tuple(samples), self.warmup_ms, "perf-counter", first_call_ms=self.first_call_ms)
        clocks = [round(c, 1) for c in self._clocks if c == c] if len(self._clocks) == len(samples) else []
        return Timing(tuple(samples), self.warmup_ms, "cuda-events", host_wall_ms=self.wall_ms,
                      first_call_ms=self.first_call_ms, launch_ms=self.launch_ms, hold_ms=self.hold,
                      wait_ms=self.wait_ms, clocks_mhz=tuple(clocks))


def warm_up(fn: Callable[[], Any], device: str, *, warmup: int = 3, long_call_ms: float = 100.0,
            hold_stream: bool = True, prepare: Callable[[], Any] | None = None,
            watch: Callable[[], ContextManager[Any]] | None = None,
            stop_over_ms: float | None = None) -> WarmedCall:
    """The first call and the warm-up of ``fn`` (see :func:`time_call`); on CUDA also the host's
    launch time, the hold and the flush buffer that every later sample uses. ``watch``, when given,
    makes the context each warm call after the first runs in (``prepare`` outside it): the speed
    suite's look for calls that synchronize the host, which then needs no call of its own (a naive
    kernel's 4k case spent 0.6 s on that one call). A first call longer than ``stop_over_ms`` ends
    the warm-up there, nothing set up for samples (``stopped``): the caller knows the call is over
    its limit (the speed suite, where the implementation's first calls show no setup)."""
    import torch

    def synchronize() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    started = time.perf_counter()
    if prepare is not None:
        prepare()
        synchronize()
    call_started = time.perf_counter()
    fn()  # the first call: compilation, autotuning, allocations
    synchronize()
    first_call_ms = (time.perf_counter() - call_started) * 1e3
    if stop_over_ms is not None and first_call_ms > stop_over_ms:
        warmed = WarmedCall(fn, device, prepare, warmup_ms=(time.perf_counter() - started) * 1e3,
                            first_call_ms=first_call_ms, long_call=True, last_ms=first_call_ms)
        warmed.stopped = True
        return warmed
    last_ms = last_launch_ms = None  # the latest warm call's host time, to issue it and until it ended
    for _ in range(warmup - 1):
        if prepare is not None:
            prepare()
            synchronize()
        with watch() if watch is not None else contextlib.nullcontext():
            call_started = time.perf_counter()
            fn()
            last_launch_ms = (time.perf_counter() - call_started) * 1e3
            synchronize()
            last_ms = (time.perf_counter() - call_started) * 1e3
        if last_ms > long_call_ms:
            break
    warmup_ms = (time.perf_counter() - started) * 1e3
    long_call = last_ms is not None and last_ms > long_call_ms
    warmed = WarmedCall(fn, device, prepare, warmup_ms=warmup_ms, first_call_ms=first_call_ms, long_call=long_call,
                        last_ms=last_ms)
    warmed.last_launch_ms = last_launch_ms
    if device == "cuda":
        warmed._setup_cuda(hold_stream)
    return warmed


def hold_ms(launch_ms: float) -> float:
    """How long to hold the stream before a call whose host part takes ``launch_ms``."""
    if not launch_ms >= 0:
        raise ValueError(f"a launch time must be a non-negative number of milliseconds, not {launch_ms!r}")
    return min(HOLD_LIMIT_MS, HOLD_FACTOR * launch_ms + HOLD_SLACK_MS)


def l2_flush_buffer() -> Any:
    """The buffer whose zeroing evicts the inputs from L2 before each timed call."""
    import torch

    return torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")


def event_samples(fn: Callable[[], Any], count: int, flush: Any, hold: float = 0.0,
                  prepare: Callable[[], Any] | None = None, clocks: list[float] | None = None) -> list[float]:
    """``count`` CUDA-event timings of ``fn`` in milliseconds, ``flush`` zeroed before each one and
    the stream then held busy for ``hold`` milliseconds (see the module docstring). ``prepare``,
    when given, runs before each hold and is waited for, so its work is done before the sample's
    hold, flush and call are issued. ``clocks``, when given and the hold is at least
    ``CLOCK_HOLD_MS``, receives each sample's SM clock in MHz (:func:`clock_mhz`); the hold then
    starts with a lead of ``CLOCK_LEAD_MS`` more."""
    import torch

    cycles = round(hold * spin_cycles_per_ms()) if hold > 0 else 0
    read_clock = clocks is not None and hold >= CLOCK_HOLD_MS
    lead = round(CLOCK_LEAD_MS * spin_cycles_per_ms()) if read_clock else 0
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(count)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(count)]
    holds = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
             for _ in range(count if read_clock else 0)]
    for i, (start, end) in enumerate(zip(starts, ends)):
        if prepare is not None:
            prepare()
            torch.cuda.synchronize()
        if cycles:
            if read_clock:
                torch.cuda._sleep(lead)
                holds[i][0].record()
            torch.cuda._sleep(cycles)  # the GPU spins while the host issues the flush and the call behind it
            if read_clock:
                holds[i][1].record()
        flush.zero_()  # evict the inputs from L2 so every call reads them from memory
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    if read_clock:
        clocks.extend(clock_mhz(cycles, held.elapsed_time(released)) for held, released in holds)
    return [start.elapsed_time(end) for start, end in zip(starts, ends)]


def clock_mhz(cycles: int, spun_ms: float) -> float:
    """The SM clock in MHz while a spin of ``cycles`` (``torch.cuda._sleep`` counts SM clock cycles)
    took ``spun_ms``; NaN for a reading of no time."""
    return cycles / spun_ms / 1e3 if spun_ms > 0 else float("nan")


_spin_rate: dict[int, float] = {}


def spin_cycles_per_ms() -> float:
    """GPU clock cycles ``torch.cuda._sleep`` spins per millisecond on this device, measured once."""
    import torch

    device = torch.cuda.current_device()
    if device not in _spin_rate:
        cycles = 1_000_000
        torch.cuda._sleep(cycles)  # loads the spin kernel
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(3):
            torch.cuda._sleep(cycles // 10)  # a lead, so that the start event waits on the GPU
            start.record()
            torch.cuda._sleep(cycles)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        _spin_rate[device] = cycles / statistics.median(times)
    return _spin_rate[device]


def _time_synchronized(fn: Callable[[], Any], count: int,
                       prepare: Callable[[], Any] | None = None) -> tuple[list[float], list[float]]:
    """Host milliseconds per call, from an idle GPU: to issue the call, and until the whole device
    finished it."""
    import torch

    launch, wall = [], []
    for _ in range(count):
        if prepare is not None:
            prepare()
        torch.cuda.synchronize()
        started = time.perf_counter()
        fn()
        launch.append((time.perf_counter() - started) * 1e3)
        torch.cuda.synchronize()
        wall.append((time.perf_counter() - started) * 1e3)
    return launch, wall


def _time_cpu(fn: Callable[[], Any], count: int, prepare: Callable[[], Any] | None = None) -> list[float]:
    samples = []
    for _ in range(count):
        if prepare is not None:
            prepare()
        started = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - started) * 1e3)
    return samples
