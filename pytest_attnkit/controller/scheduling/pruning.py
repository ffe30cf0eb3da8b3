"""Pruning: the queued requests cancelled unrun. Runs in the pytest process, under the scheduler's lock.

- **Warm-ups only where they compile.** Once an implementation's requests so far (its correctness
  cases come first) compiled nothing (a kernel built ahead of time, a library call, kernels all in
  the disk cache), its warm-ups are dropped unrun: they would only take GPU time
  (:class:`WarmUpPruning`).
- **A chain that stops.** A job submitted with ``follows`` runs only if ``follows`` says yes of
  the reply of the job before it (a memory sweep's next point: the point before measured); else it
  is cancelled, and so is the next (:func:`stopped`).

A cancelled future is "not run" to the suite that reads it: no reply is made up.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping

from pytest_attnkit.controller.scheduling.job import Job

#: Warm-ups of an implementation whose requests compiled less than this, each, are not worth
#: their GPU time once this many requests have shown it.
WARM_COMPILE_S = 0.05
WARM_EVIDENCE = 3


class WarmUpPruning:
    """Per implementation, (requests finished, the most one of them compiled, in seconds)."""

    def __init__(self) -> None:
        self._compiled: dict[str, tuple[int, float]] = {}

    def record(self, impl: str, compile_s: float) -> None:
        count, most = self._compiled.get(impl, (0, 0.0))
        self._compiled[impl] = (count + 1, max(most, float(compile_s)))

    def pointless(self, job: Job) -> bool:
        """Whether a warm-up would compile nothing (see the module docstring)."""
        if not job.warm:
            return False
        count, most = self._compiled.get(job.impl, (0, 0.0))
        return count >= WARM_EVIDENCE and most < WARM_COMPILE_S


def stopped(job: Job) -> bool:
    """Whether a job that runs only if its ``follows`` says yes of ``after``'s reply is told no
    (or ``after`` was itself cancelled)."""
    if job.follows is None or job.after is None or not job.after.future.done():
        return False
    return job.after.future.cancelled() or not job.follows(job.after.future.result())


def drop_unrun(pending: Mapping[str, deque[Job]], warm_ups: WarmUpPruning) -> bool:
    """Cancel, unrun, the queued warm-ups that would compile nothing and the jobs whose
    ``follows`` says no (a stopped sweep's points: each cancelled point stops the next); whether
    any was."""
    dropped_any = False
    for queue in pending.values():
        while dropped := [job for job in queue if warm_ups.pointless(job) or stopped(job)]:
            for job in dropped:
                queue.remove(job)
                job.future.cancel()
            dropped_any = True
    return dropped_any
