"""Order: which ready request starts next. Runs in the pytest process, under the scheduler's lock.

- The test pytest waits for comes first: a request whose test waits for it, or a request that one
  waits for in turn (``after``), starts before every other (:func:`awaited`).
- Each implementation's requests start in the order they were submitted, skipping those that wait
  for another to end (:func:`first_ready`: a memory sweep's next point waits for the point before;
  its other sweeps and requests go ahead meanwhile) and, while the first waits for device memory,
  those that do not fit; but those that took many seconds the last time
  they ran start before the rest, longest first
  (:mod:`~pytest_attnkit.controller.scheduling.durations`), so they make no tail.
- A free slot goes to the implementation with the most work left per running request
  (:class:`WorkLeft`): the seconds its queued requests took the last time they ran, and for those
  not remembered, the mean time its requests took so far (the mean over all until it has one).
  So the run ends when the slowest implementation ends, not long after the others.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from pytest_attnkit.controller.scheduling.admission import Hold, MemoryBudget
from pytest_attnkit.controller.scheduling.durations import long_s
from pytest_attnkit.controller.scheduling.job import Job

Lent = TypeVar("Lent")


def awaited(pending: Mapping[str, deque[Job]]) -> Job | None:
    """The pending job that a waiting test needs first: the awaited job, or the job it waits for
    to end (``after``), where that one has not started either."""
    job = next((job for queue in pending.values() for job in queue if job.awaited), None)
    while job is not None and job.after is not None and not job.after.future.done():
        if job.after not in pending.get(job.after.impl, ()):
            return None  # what it waits for is running
        job = job.after
    return job


def first_ready(queue: deque[Job], busy: Callable[[Job], bool], long_first: bool = False,
                fits: Callable[[Job], bool] = lambda job: True) -> Job | None:
    """The first job of an implementation's queue that waits for no other (nor for its own
    worker, ``busy`` with the request before it) and ``fits`` (the room on the GPU now); with
    ``long_first``, the ready job that took longest the last time it ran (``Job.last_s``), if any
    took long (:func:`.durations.long_s`). A job that must run alone is not moved ahead: it would
    keep the rest of its queue waiting until the GPU is free (the earliest job's hold is what makes
    room)."""
    ready = (job for job in queue
             if (job.after is None or job.after.future.done()) and not busy(job) and fits(job))
    if not long_first:
        return next(ready, None)
    first, longest, longest_s = None, None, 0.0
    for job in ready:
        if first is None:
            first = job
        seconds = long_s(job.last_s)
        if seconds > longest_s and not job.alone:
            longest, longest_s = job, seconds
    return longest or first


class WorkLeft:
    """Per implementation, (requests finished, seconds they took): the work left in its queue.

    Counted as the queue's requests would take: the time each took the last time it ran
    (``Job.last_s``), else the implementation's mean so far. A count of requests times one mean
    is blind to what is in the queue: on an H200 warm run, torch_flex's 293 requests (434 s of
    work) and triton_flash's 292 (103 s) looked alike while every worker was started, torch_flex got
    5 to 8 of the 16 slots until the others ran out of work at 42 s, and ran on alone until 66 s
    (results/2026-11-27-session9). Requests that must run alone are left out: they run with nothing
    beside them, whoever holds the slots."""

    def __init__(self) -> None:
        self._done: dict[str, tuple[int, float]] = {}

    def record(self, impl: str, seconds: float) -> None:
        count, total = self._done.get(impl, (0, 0.0))
        self._done[impl] = (count + 1, total + seconds)

    def mean_s(self, impl: str) -> float:
        """The mean time of ``impl``'s requests so far (of every request, before it has one)."""
        count, seconds = self._done.get(impl, (0, 0.0))
        if count:
            return seconds / count
        total_count = sum(count for count, _ in self._done.values())
        return sum(seconds for _, seconds in self._done.values()) / total_count if total_count else 1.0

    def queued_s(self, impl: str, queue: "deque[Job] | Sequence[Job]") -> float:
        """The seconds ``impl``'s queued requests would take (see the class's docstring)."""
        remembered, unknown = 0.0, 0
        for job in queue:
            if job.alone:
                continue
            if job.last_s is None:
                unknown += 1
            else:
                remembered += job.last_s
        return remembered + (unknown * self.mean_s(impl) if unknown else 0.0)

    def of(self, impl: str, queue: "deque[Job] | Sequence[Job]", running: int) -> float:
        """Seconds of queued work per running request (plus the one it would start)."""
        return self.queued_s(impl, queue) / (running + 1)

    def ranked(self, ready: list[Job], pending: Mapping[str, deque[Job]], running: Mapping[str, int]) -> list[Job]:
        """``ready`` jobs, the implementation with the most work left per running request first."""
        work = {impl: self.of(impl, pending.get(impl, ()), running.get(impl, 0)) for impl in {job.impl for job in ready}}
        return sorted(ready, key=lambda job: (-work[job.impl], job.seq))


def choose(pending: Mapping[str, deque[Job]], running: Sequence[Job], *, jobs: int, budget: MemoryBudget,
           work_left: WorkLeft, busy: Callable[[Job], bool],
           lease: Callable[[Job, int], "Lent | None"], long_first: bool = False) -> "tuple[Job, Lent] | None":
    """The job to start now and the worker ``lease(job, room)`` lends it, or None: the awaited
    job first (:func:`awaited`; in one slot more than ``jobs``), then, while a slot is free, the
    earliest ready job where admission holds for it (:meth:`MemoryBudget.hold`), else each
    implementation's first ready job that fits the budget, the most work left per running request
    first (:class:`WorkLeft`); ``long_first``: see :func:`first_ready`.

    Only a job some test will wait for holds the others: a warm-up (nobody waits for its reply
    before the GPU-alone phase, which waits for it) starts once it fits (one that must run alone,
    the moment the GPU is free, before any other), at the latest once the other queued requests
    have run. On an H100 (results/2026-11-27-session9, ``h100-cold``) a torch_flex
    warm-up that ran out of memory beside others went back to the head of its queue to run alone;
    torch_flex was the last implementation with work, and its 15 other warm-ups (2-6 s each)
    waited behind it: 1-3 requests ran from 175 to 206 s while it waited for a 24 s request to end
    and then compiled for 12 s alone."""
    first = awaited(pending)
    if first is not None and budget.fits(first, running) and len(running) <= jobs:
        lent = lease(first, 1)
        if lent is not None:
            return first, lent
    if len(running) >= jobs:
        return None
    # Each queue's first ready job that is not a warm-up may hold the others.
    holding = [job for queue in pending.values()
               if (job := first_ready(queue, busy, long_first, lambda job: not job.warm)) is not None]
    earliest = min(holding, key=lambda job: job.seq) if holding else None
    hold = budget.hold(earliest, running) if earliest is not None else Hold.NONE
    if hold is Hold.BLOCK:
        return None  # it has waited long enough: nothing else starts until it has room
    if hold is Hold.FIRST:
        assert earliest is not None
        lent = lease(earliest, 0)  # its room has come: it goes first
        return (earliest, lent) if lent is not None else None
    # While a queue's first job waits for room, the ones behind it that fit go ahead; one that
    # must run alone, once the GPU is free for it, before them.
    fitting = [job for queue in pending.values()
               if (job := first_ready(queue, busy, long_first, lambda job: budget.fits(job, running))) is not None]
    if not fitting:
        return None
    per_impl = {impl: sum(job.impl == impl for job in running) for impl in pending}
    for job in sorted(work_left.ranked(fitting, pending, per_impl), key=lambda job: not job.alone):
        lent = lease(job, 0)
        if lent is not None:
            return job, lent
    return None
