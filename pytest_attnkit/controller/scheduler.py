"""The scheduler: workers answer the tests' requests ahead of them, several at a time on one GPU.

pytest runs one test after another, and a correctness case spends most of its first call
compiling on one CPU core while the GPU idles. So once pytest has collected and selected the
tests (``-k``, node ids, ``--lf`` and ``-m`` have had their say), the session submits every
correctness test's request here, and a ``warm`` request for every memory and speed test (its
kernels compiled while other work fills the GPU). Up to ``jobs`` requests run at once, each in a
worker process of its implementation; each test then waits for its own reply, in pytest's order,
and reports as before. Nothing here decides a verdict: a reply means what it meant when the
test asked for it itself.

The rules:

- **Workers.** Each implementation keeps the worker that described it (its primary) and gets more
  as its requests need them, at most ``jobs`` beyond the primaries in all (one more for the
  request a test waits for): to start one for an implementation that has work, an idle one of
  another is closed. The pool owns them (:meth:`pytest_attnkit.controller.pool.WorkerPool.lease`):
  the scheduler says which request starts when, the pool which worker it runs in.
- **Order** (:mod:`~pytest_attnkit.controller.scheduling.order`). Each implementation's requests start in the order they were submitted (memory
  sweeps first, then pytest's order, warm-ups last: :meth:`pytest_attnkit.controller.suite.Suite.order`),
  skipping those that wait for another to end (a memory sweep's next point waits for
  the point before; its other sweeps and requests go ahead meanwhile). Requests that took
  :data:`~pytest_attnkit.controller.scheduling.durations.LONG_S` or more the last time they ran
  (:mod:`~pytest_attnkit.controller.scheduling.durations`, kept in the compile-cache folder) start
  before the rest, longest first. A free slot goes to the implementation with the most work left per running request:
  its queued requests times the mean time its requests took so far (the mean over all until it
  has one). So the run ends when the slowest implementation ends, not long after the others:
  a compiled kernel that takes seconds per case gets most of the slots, one that takes
  milliseconds few.
- **GPU memory** (:mod:`~pytest_attnkit.controller.scheduling.admission`,
  :mod:`~pytest_attnkit.controller.scheduling.oom_retry`). Each request carries an estimate of the device memory it needs; requests run
  together only while their estimates fit ``budget_bytes``, and one that fits alone runs alone.
  Smaller requests may start ahead of one that waits for room, for at most ``MAX_HOLD_S``; then
  nothing new starts until it has its room (a warm-up never holds the others). A request that runs
  out of device memory while another ran beside it is run again alone, in the worker it ran in
  (which holds what it compiled); one that runs out alone is run again after idle
  workers are stopped until what it lacked is free (:meth:`~pytest_attnkit.controller.pool.WorkerPool.evict`; up to
  ``ROOM_ROUNDS`` times, each by the latest failure's figures), then after every other worker is
  stopped (idle workers hand back what torch and CuPy cached, not their CUDA
  contexts, the kernels they loaded, nor what an implementation keeps), and only the last reply
  counts: an out-of-memory caused by a neighbour is never the kernel's failure, and one with the
  GPU to itself is a case that does not fit, which its test skips with the numbers
  (:mod:`pytest_attnkit.worker.out_of_memory`).
- **Warm-ups only where they spare the timing something**
  (:mod:`~pytest_attnkit.controller.scheduling.pruning`). Once an implementation's requests so far
  (its correctness cases come first) compiled nothing (a kernel built ahead of time, a library
  call, kernels all in the disk cache) and, on CUDA, its warm-ups' first calls cost no more than a
  few calls (three said so and none said otherwise: no plan built per shape, as cuDNN's is), its
  warm-ups are dropped unrun
  (cancelled): they would only take GPU time; those kept run in its primary worker, which times
  its cases (what they spare is that process's). To make room for another implementation's worker,
  an idle one that holds no warm-up is closed first, then, for an implementation whose requests
  compile, the one whose warm-ups spared least each (compiled, or first calls' setup): its speed
  tests are timed in it.
- **The GPU alone.** :meth:`exclusive` is for what must have the GPU to itself (speed timing, and
  memory sweeps where the meter sees every process's allocations): it waits until everything
  submitted has finished, and starts nothing else until it ends. The pool takes it for every
  request sent on the caller's thread (:meth:`pytest_attnkit.controller.pool.WorkerPool.request_alone`,
  through :meth:`~pytest_attnkit.controller.pool.WorkerPool.share`). Extra workers that hold no warm-up are
  closed as it begins (:meth:`~pytest_attnkit.controller.pool.WorkerPool.trim`): nothing is left for them, and each holds
  device memory while it lives. The others stay: a speed test is timed in the worker that warmed
  its case up (``Job.worker``), which has its kernels compiled and loaded.
- **A worker of its own.** A request submitted DEDICATED (:class:`~pytest_attnkit.messages.Isolation`:
  the torch.compile check, which resets torch's compile caches) runs in a worker of its own per
  (implementation, tag), started for the first such request and closed once the last one queued
  has run; no other request runs in it, so what a warm-up compiled in a shared worker stays
  there. It is not counted among the ``jobs`` extra workers, and runs its requests one at a time.
  A request submitted with a ``launch`` (the sanitize suite's run under compute-sanitizer) runs
  in a worker the pool starts under that launcher for it alone, up to ``launch.at_once`` of them
  at once, and closes before its reply is handed on (the tool writes its summary as it exits).
- **Failures stay put.** A worker that crashes or misses its deadline fails the one request it
  was running; the next request on it starts a fresh process.
- **The test pytest waits for comes first.** A request whose test waits for it (:meth:`wait`), or
  a request that one waits for in turn (``after``), starts before every other; if every slot is
  taken, in one more: a test never waits behind requests of later tests, so with ``-x`` a test
  that fails at once stops the run at once, however long the requests ahead of it take (a hang
  runs until its deadline).
- **Stopping.** :meth:`close` (the run ends: normally, after ``-x``, on Ctrl-C or SIGTERM) drops
  the requests not yet started and kills the workers of the running ones; no worker is left. The
  session closes the scheduler as soon as pytest is stopping (after the test that ``-x`` stops
  at), not only when the run ends.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterator, Protocol

from pytest_attnkit.controller.ledger import Ledger
from pytest_attnkit.controller.pool import Lease
from pytest_attnkit.controller.process import Launch, Worker
from pytest_attnkit.controller.scheduling import oom_retry, order, pruning
from pytest_attnkit.controller.scheduling.admission import MemoryBudget
from pytest_attnkit.controller.scheduling.durations import Durations
from pytest_attnkit.controller.scheduling.job import Job
from pytest_attnkit.controller.scheduling.order import WorkLeft
from pytest_attnkit.controller.scheduling.pruning import WarmUpPruning
from pytest_attnkit.controller.scheduling.submission import Submissions
from pytest_attnkit.messages import Reply, Request, Status

__all__ = ["Job", "Scheduler"]


class Workers(Protocol):
    """What the scheduler asks of the pool (:class:`pytest_attnkit.controller.pool.WorkerPool`)."""

    def info(self, name: str) -> Any: ...

    def broken_reply(self, name: str) -> Reply: ...

    def lease(self, impl: str, *, room: int = 0, dedicated: "tuple[str, str] | None" = None,
              same_as: Worker | None = None, queued: Callable[[str], bool] = ...,
              launch: Launch | None = None) -> Lease | None: ...

    def busy(self, dedicated: "tuple[str, str] | None", launch: Launch | None) -> bool: ...

    def primary(self, name: str) -> Worker: ...

    def finish(self, lease: Lease) -> None: ...

    def begin(self, lease: Lease) -> None: ...

    def give_back(self, lease: Lease, *, warmed: bool, last: bool = True,
                  compile_s: float = 0.0, spared_s: float | None = None) -> Worker | None: ...

    def retire(self, impl: str, worker: Worker) -> None: ...

    def trim(self) -> None: ...

    def evict(self, keep: Worker, failed: Reply | None, *, every: bool = False) -> tuple[int, bool]: ...

    def stop_lending(self) -> list[tuple[str, Worker]]: ...

    def retire_all(self, workers: list[tuple[str, Worker]]) -> None: ...

    def ask(self, worker: Worker, name: str, request: Request) -> Reply: ...


class Scheduler(Submissions):
    """The queue of requests submitted ahead of the tests, the dispatcher thread that starts them
    and the threads they run on (``jobs`` of them, and one more for the request a test waits for)."""

    def __init__(self, pool: Workers, *, jobs: int, budget_bytes: int | None, ledger: Ledger,
                 durations: Durations | None = None, first_calls: bool = False) -> None:
        super().__init__(pool)
        #: How long each request took last time (the long ones start first), and this run's.
        self.durations = durations if durations is not None else Durations(None)
        self.jobs = max(1, jobs)
        self.budget, self.budget_bytes = MemoryBudget(budget_bytes), budget_bytes
        self.ledger = ledger
        self._cond = threading.Condition()
        self._pending: dict[str, deque[Job]] = {}
        self._running: dict[Job, Lease] = {}
        self._paused = False
        self._closed = False  # close() has run
        self._work_left = WorkLeft()
        self._pruning = WarmUpPruning(first_calls=first_calls)  # first_calls: warm-ups time theirs (CUDA)
        # One thread more than jobs: the job a test waits for may run beside jobs others.
        self._executor = ThreadPoolExecutor(max_workers=self.jobs + 1, thread_name_prefix="attnkit-job")
        self._dispatcher = threading.Thread(target=self._dispatch_loop, name="attnkit-scheduler", daemon=True)

    # -- the pytest thread's side --------------------------------------------------------------
    def _queue(self, job: Job) -> None:
        """Queue a submitted job for the dispatcher (see :class:`Submissions`)."""
        job.request = dataclasses.replace(job.request, release_memory=True)  # others run beside it
        job.alone = self.budget.over(job)
        job.last_s = self.durations.of(job)
        with self._cond:
            if self._closed:
                job.future.cancel()
                return
            self._pending.setdefault(job.impl, deque()).append(job)
            if self._dispatcher.ident is None:  # not started yet
                self._dispatcher.start()
            self._cond.notify_all()

    def wait(self, job: Job) -> Reply:
        """The job's reply, once it has one (the pytest thread waits here; Ctrl-C interrupts).
        A job cancelled unrun raises ``CancelledError``."""
        started = time.monotonic()
        with self._cond:
            if not job.future.done():
                job.awaited = True
                self._cond.notify_all()
        try:
            return job.future.result()
        finally:
            self.ledger.waited(time.monotonic() - started)

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """The GPU alone: everything submitted finishes first, nothing starts until the end. The
        pool closes the extra workers that hold no warm-up first (:meth:`WorkerPool.trim`)."""
        started = time.monotonic()
        with self._cond:
            while (any(self._pending.values()) or self._running) and not self._closed:
                self._cond.wait()
            self._paused = True
        self.pool.trim()
        self.ledger.waited(time.monotonic() - started)
        try:
            yield
        finally:
            with self._cond:
                self._paused = False
                self._cond.notify_all()

    def close(self) -> None:
        """Drop what has not started, kill the workers of what runs, and stop every thread (once:
        a second call does nothing)."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            dropped, self._pending = [job for queue in self._pending.values() for job in queue], {}
            self._cond.notify_all()
        for job in dropped:
            job.future.cancel()
        spare = self.pool.stop_lending()  # kills the workers of what runs
        if self._dispatcher.ident is not None:
            self._dispatcher.join()
        self._executor.shutdown(wait=True)
        self.pool.retire_all(spare)
        problem = self.durations.save()  # for the next run's order
        if problem:
            print(f"attnkit: {problem}", file=sys.stderr)

    # -- the dispatcher thread -----------------------------------------------------------------
    def _dispatch_loop(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (choice := self._next()) is None:
                    self._cond.wait()
                if self._closed:
                    return
                job, lease = choice
                oom_retry.beside(job, self._running)
                self._running[job] = lease
                self.budget.started(job)
                self._pending[job.impl].remove(job)
            self.ledger.began()
            self._executor.submit(self._run, job, lease)

    def _next(self) -> "tuple[Job, Lease] | None":
        """The job to start now and the worker the pool lends it (:func:`order.choose`), once the
        queued jobs not worth running are dropped (:func:`pruning.drop_unrun`); or None."""
        if self._paused:
            return None
        if pruning.drop_unrun(self._pending, self._pruning):
            self._cond.notify_all()  # exclusive() may be waiting for the queue to empty
        return order.choose(self._pending, list(self._running), jobs=self.jobs, budget=self.budget,
                            work_left=self._work_left, busy=lambda job: self.pool.busy(job.dedicated, job.launch),
                            lease=self._lease, long_first=bool(self.durations.remembered))

    def _lease(self, job: Job, room: int = 0) -> Lease | None:
        """A worker for ``job`` from the pool (see :meth:`WorkerPool.lease`): a sweep's next point
        the one that ran the point before, a request that ran out of memory the one it ran in (it
        holds what the request compiled: on an H100 a torch_flex warm-up run again elsewhere
        compiled for 12 s, alone, results/2026-11-27-session9), while the pool keeps it; a warm-up of
        an implementation that compiles nothing its primary, one at a time."""
        same_as = job.after.worker if job.same_worker and job.after is not None else None
        if job.first_oom is not None and job.worker is not None:
            same_as = job.worker
        elif job.warm and same_as is None and self._pruning.compiles_nothing(job.impl):
            # What such a warm-up spares is its process's own (a cuDNN plan per shape), which only
            # the worker that times the case keeps: the primary, never closed to make room, times
            # a case whose warm-up's worker is gone. On a fresh H100 and H200, torch_sdpa's warm-ups
            # ran in extra workers, all closed for torch_flex's compiling tail, and none of its 37
            # timed cases met its warm-up (h100-cold14, h200-cold16).
            same_as = self.pool.primary(job.impl)
        return self.pool.lease(job.impl, room=room, dedicated=job.dedicated, same_as=same_as,
                               queued=lambda impl: bool(self._pending.get(impl)), launch=job.launch)

    # -- a job's thread ------------------------------------------------------------------------
    def _run(self, job: Job, lease: Lease) -> None:
        job.worker = worker = lease.worker
        self.pool.begin(lease)
        oom_retry.make_room(job, worker, self.pool, self.ledger)
        started = time.monotonic()
        try:
            reply = self.pool.ask(worker, job.impl, job.request)
        except BaseException as error:  # a bug of the harness must not leave the test waiting forever
            reply = Reply(Status.CRASHED, f"the scheduler failed to run the request: {error!r}")
        self.pool.finish(lease)  # a worker under a launcher ends before its reply is handed on
        ended = time.monotonic()
        self.ledger.record(job.ledger_row, job.impl, reply.spent, started, ended, queued_s=started - job.submitted)
        retry = oom_retry.retries(job, reply)
        with self._cond:
            self._running.pop(job, None)
            self.budget.ended(job)
            self._work_left.record(job.impl, ended - started)
            self.durations.record(job, ended - started)
            warm_up = reply if job.warm and reply.status is Status.OK else None
            self._pruning.record(job.impl, reply.spent.compile_s, warm_up=warm_up, backward=job.request.backward)
            if retry and not self._closed:
                self.ledger.ran_out(job.ledger_row, job.impl, job.request, reply, beside=job.shared)
                if oom_retry.run_again(job, reply) is oom_retry.Again.ALONE:
                    self.ledger.ran_out_of_memory(job.impl)
                self._pending[job.impl].appendleft(job)
            # A worker of its own whose last queued request this was is closed.
            last = job.dedicated is None or not any(other.dedicated == job.dedicated
                                                    for other in self._pending.get(job.impl, ()))
            done_with = self.pool.give_back(lease, warmed=job.warm, last=last, compile_s=reply.spent.compile_s,
                                            spared_s=pruning.spared_s(reply) if warm_up is not None else None)
            self._cond.notify_all()
        if self._closed and not job.future.done():
            job.future.cancel()
        elif not retry:
            job.future.set_result(reply)
        if done_with is not None:
            self.pool.retire(job.impl, done_with)
