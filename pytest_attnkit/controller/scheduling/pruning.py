"""Pruning: the queued requests cancelled unrun. Runs in the pytest process, under the scheduler's lock.

- **Warm-ups only where they spare the timing something.** A warm-up runs a case so that its test,
  timed later with the GPU alone in the same worker, does not pay the case's first call there. Once
  an implementation's requests so far (its correctness cases come first) compiled nothing (a kernel
  built ahead of time, a library call, kernels all in the disk cache), and, on CUDA, its warm-ups
  showed no first-call setup either (below), its warm-ups are dropped unrun: they would only take
  GPU time (:class:`WarmUpPruning`). Setup is what a first call costs beyond the next call of the
  same case in the same process (:func:`setup_s`), which the compile clock does not see: torch's
  cuDNN attention builds a plan per shape in each process, and on a fresh H200 torch_sdpa's timed
  cases paid 12.6 s of first calls with the GPU alone once its warm-ups were dropped, 4.6-5.3 s in
  warm runs (results/2026-11-27-session13). A warm-up shows setup where its first call cost
  :data:`WARM_COMPILE_S` or more beyond the next and at least :data:`SETUP_CALLS` calls (then its
  two calls beside other work spare the GPU-alone phase more than they cost). A first call too long
  for a second one (:data:`pytest_attnkit.worker.calls.NEXT_CALL_MAX_S`) says nothing either way
  and is not counted: on an H100 torch_sdpa's first warm-ups in a process took 1.3-6.0 s (cuDNN's
  start and its backward plans), and counting them as "no setup" dropped its warm-ups after five
  (results/2026-11-27-session14). Nor does a warm-up that was its worker's first request in its
  direction (``process_first``): its first call also paid what a process pays once (a module
  loaded or compiled once per worker, CuPy's). Once any other warm-up showed setup, the
  implementation keeps its warm-ups in that direction for the rest of the run: a plan per shape
  does not show in every shape. On a fresh H200 (results/2026-12-02-session27, cold39) the plans of
  torch_sdpa's d128 forwards cost about 60 ms, under ten of their 8 ms calls; three such warm-ups
  dropped the 16 warm-ups behind them, whose first calls then paid 5.4 s in all with the GPU alone
  (seven of them, its d64, packed and decoding shapes, 0.3-1.9 s each). Without any, :data:`WARM_EVIDENCE`
  warm-ups that said and showed none drop the rest. Forwards and backwards are judged apart: on
  an H100 (h100-warm13) torch_sdpa's last forward warm-ups (paged decoding, no plan to build)
  dropped every backward warm-up behind them, whose cases then paid 60-530 ms each with the GPU
  alone.
- **A chain that stops.** A job submitted with ``follows`` runs only if ``follows`` says yes of
  the reply of the job before it (a memory sweep's next point: the point before measured); else it
  is cancelled, and so is the next (:func:`stopped`).

A cancelled future is "not run" to the suite that reads it: no reply is made up.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping

from pytest_attnkit.controller.scheduling.job import Job
from pytest_attnkit.messages import Reply

#: Warm-ups of an implementation whose requests compiled less than this, each, are not worth
#: their GPU time once this many requests have shown it.
WARM_COMPILE_S = 0.05
WARM_EVIDENCE = 3
#: A first call that costs this many calls of its case beyond the next one is setup worth a warm-up.
SETUP_CALLS = 10


def setup_s(reply: Reply) -> float | None:
    """What a warm-up's first call cost beyond its next call (the worker's ``first_call_s`` and
    ``next_call_s``), or None where the reply does not say (no second call: a long case, the CPU)."""
    first, later = reply.data.get("first_call_s"), reply.data.get("next_call_s")
    if first is None or later is None:
        return None
    return max(0.0, float(first) - float(later))


def spared_s(reply: Reply) -> float | None:
    """At most what a warm-up spared its case's timing: its setup, or where it made one call only,
    that call (a process's first cuDNN call, 1.3-6.0 s on an H100, is mostly setup); None where the
    reply says nothing (the CPU). The pool ranks warm workers by it."""
    setup = setup_s(reply)
    if setup is not None:
        return setup
    first = reply.data.get("first_call_s")
    return None if first is None else float(first)


def shows_setup(reply: Reply) -> bool | None:
    """Whether a warm-up's reply shows first-call setup worth a warm-up (the module docstring), or
    None where it cannot say (one call only, or the worker's first request in its direction)."""
    setup = setup_s(reply)
    if setup is None or reply.data.get("process_first"):
        return None
    return setup >= max(WARM_COMPILE_S, SETUP_CALLS * float(reply.data["next_call_s"]))


class WarmUpPruning:
    """Per implementation, (requests finished, the most one of them compiled, in seconds), and,
    per direction, how many of its warm-ups could tell and whether any showed setup.
    ``first_calls``: warm-ups report their first calls (CUDA), so that pruning waits for them; else
    compile seconds alone decide."""

    def __init__(self, *, first_calls: bool = False) -> None:
        self.first_calls = first_calls
        self._compiled: dict[str, tuple[int, float]] = {}
        self._told: dict[tuple[str, bool], int] = {}
        self._setup_shown: set[tuple[str, bool]] = set()

    def record(self, impl: str, compile_s: float, *, warm_up: Reply | None = None, backward: bool = False) -> None:
        """A finished request of ``impl``, which compiled ``compile_s``; ``warm_up``: its reply, where
        it was a warm-up (of a ``backward``: forwards and backwards build plans of their own, and
        their warm-ups are judged apart)."""
        count, most = self._compiled.get(impl, (0, 0.0))
        self._compiled[impl] = (count + 1, max(most, float(compile_s)))
        shown = shows_setup(warm_up) if warm_up is not None else None
        if shown is not None:
            self._told[(impl, backward)] = self._told.get((impl, backward), 0) + 1
            if shown:
                self._setup_shown.add((impl, backward))

    def compiles_nothing(self, impl: str) -> bool:
        """Whether ``impl``'s requests so far (:data:`WARM_EVIDENCE` or more) compiled nothing."""
        count, most = self._compiled.get(impl, (0, 0.0))
        return count >= WARM_EVIDENCE and most < WARM_COMPILE_S

    def pointless(self, job: Job) -> bool:
        """Whether a warm-up would spare its test nothing (see the module docstring)."""
        if not job.warm or not self.compiles_nothing(job.impl):
            return False
        if not self.first_calls:
            return True
        direction = (job.impl, job.request.backward)
        return self._told.get(direction, 0) >= WARM_EVIDENCE and direction not in self._setup_shown


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
                job.pointless = warm_ups.pointless(job)
                job.future.cancel()
            dropped_any = True
    return dropped_any
