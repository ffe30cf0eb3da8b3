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
  the point before; its other sweeps and requests go ahead meanwhile). A free slot goes to the implementation with the most work left per running request:
  its queued requests times the mean time its requests took so far (the mean over all until it
  has one). So the run ends when the slowest implementation ends, not long after the others:
  a compiled kernel that takes seconds per case gets most of the slots, one that takes
  milliseconds few.
- **GPU memory** (:mod:`~pytest_attnkit.controller.scheduling.admission`,
  :mod:`~pytest_attnkit.controller.scheduling.oom_retry`). Each request carries an estimate of the device memory it needs; requests run
  together only while their estimates fit ``budget_bytes``, and one that fits alone runs alone.
  Smaller requests may start ahead of one that waits for room, for at most ``MAX_HOLD_S``; then
  nothing new starts until it has its room. A request that runs out of device memory while
  another ran beside it is run again alone; one that runs out alone is run again after idle
  workers are stopped until what it lacked is free (:meth:`~pytest_attnkit.controller.pool.WorkerPool.evict`; up to
  ``ROOM_ROUNDS`` times, each by the latest failure's figures), then after every other worker is
  stopped (idle workers hand back what torch and CuPy cached, not their CUDA
  contexts, the kernels they loaded, nor what an implementation keeps), and only the last reply
  counts: an out-of-memory caused by a neighbour is never the kernel's failure, and one with the
  GPU to itself is a case that does not fit, which its test skips with the numbers
  (:mod:`pytest_attnkit.worker.out_of_memory`).
- **Warm-ups only where they compile** (:mod:`~pytest_attnkit.controller.scheduling.pruning`). Once an implementation's requests so far (its
  correctness cases come first) compiled nothing (a kernel built ahead of time, a library call,
  kernels all in the disk cache), its warm-ups are dropped unrun (cancelled): they would only take
  GPU time. To make room for another implementation's worker, an idle one that holds no warm-up
  is closed first.
- **The GPU alone.** :meth:`exclusive` is for what must have the GPU to itself (speed timing, and
  memory sweeps where the meter sees every process's allocations): it waits until everything
  submitted has finished, and starts nothing else until it ends. The pool takes it for every
  request it sends itself (:meth:`pytest_attnkit.controller.pool.WorkerPool.request`, through
  :meth:`~pytest_attnkit.controller.pool.WorkerPool.share`). Extra workers that hold no warm-up are
  closed as it begins (:meth:`~pytest_attnkit.controller.pool.WorkerPool.trim`): nothing is left for them, and each holds
  device memory while it lives. The others stay: a speed test is timed in the worker that warmed
  its case up (``Job.worker``), which has its kernels compiled and loaded.
- **A worker of its own.** A request submitted DEDICATED (:class:`~pytest_attnkit.messages.Isolation`:
  the torch.compile check, which resets torch's compile caches) runs in a worker of its own per
  (implementation, tag), started for the first such request and closed once the last one queued
  has run; no other request runs in it, so what a warm-up compiled in a shared worker stays
  there. It is not counted among the ``jobs`` extra workers, and runs its requests one at a time.
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
import itertools
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterator, Protocol

from pytest_attnkit.controller.ledger import Ledger
from pytest_attnkit.controller.pool import Lease
from pytest_attnkit.controller.process import Worker
from pytest_attnkit.controller.scheduling import oom_retry, order, pruning
from pytest_attnkit.controller.scheduling.admission import Hold, MemoryBudget
from pytest_attnkit.controller.scheduling.job import Job
from pytest_attnkit.controller.scheduling.order import WorkLeft
from pytest_attnkit.controller.scheduling.pruning import WarmUpPruning
from pytest_attnkit.messages import Isolation, Reply, Request, Status

__all__ = ["Job", "Scheduler"]


class Workers(Protocol):
    """What the scheduler asks of the pool (:class:`pytest_attnkit.controller.pool.WorkerPool`)."""

    def info(self, name: str) -> Any: ...

    def broken_reply(self, name: str) -> Reply: ...

    def lease(self, impl: str, *, room: int = 0, dedicated: "tuple[str, str] | None" = None,
              same_as: Worker | None = None, queued: Callable[[str], bool] = ...) -> Lease | None: ...

    def dedicated_busy(self, key: tuple[str, str]) -> bool: ...

    def begin(self, lease: Lease) -> None: ...

    def give_back(self, lease: Lease, *, warmed: bool, last: bool = True) -> Worker | None: ...

    def retire(self, impl: str, worker: Worker) -> None: ...

    def trim(self) -> None: ...

    def evict(self, keep: Worker, failed: Reply | None, *, every: bool = False) -> tuple[int, bool]: ...

    def stop_lending(self) -> list[tuple[str, Worker]]: ...

    def retire_all(self, workers: list[tuple[str, Worker]]) -> None: ...

    def ask(self, worker: Worker, name: str, request: Request) -> Reply: ...


class Scheduler:
    """The queue of requests submitted ahead of the tests, the dispatcher thread that starts them
    and the threads they run on (``jobs`` of them, and one more for the request a test waits for)."""

    def __init__(self, pool: Workers, *, jobs: int, budget_bytes: int | None, ledger: Ledger) -> None:
        self.pool = pool
        self.jobs = max(1, jobs)
        self.budget = MemoryBudget(budget_bytes)
        self.ledger = ledger
        self._cond = threading.Condition()
        self._seq = itertools.count()
        self._pending: dict[str, deque[Job]] = {}
        self._running: dict[Job, Lease] = {}
        self._paused = False
        self._closed = False
        self._shut = False  # close() has run
        self._work_left = WorkLeft()
        self._pruning = WarmUpPruning()
        # One thread more than jobs: the job a test waits for may run beside jobs others.
        self._executor = ThreadPoolExecutor(max_workers=self.jobs + 1, thread_name_prefix="attnkit-job")
        self._dispatcher = threading.Thread(target=self._dispatch_loop, name="attnkit-scheduler", daemon=True)
        self._dispatcher_started = False

    @property
    def budget_bytes(self) -> int | None:
        return self.budget.budget_bytes

    # -- the pytest thread's side --------------------------------------------------------------
    def submit(self, impl: str, suite: str, request: Request, *, gpu_bytes: int = 0, warm: bool = False,
               after: Job | None = None, follows: Callable[[Reply], bool] | None = None, same_worker: bool = False,
               isolation: Isolation = Isolation.SHARED, tag: str | None = None) -> Job:
        """Queue ``request`` for ``impl``; its reply comes through :meth:`wait`. ``after``: start
        only once that job has ended; with ``follows``, only if it says yes of that job's reply
        (else the future is cancelled); with ``same_worker``, in the worker that ran it.
        ``isolation`` DEDICATED: in a worker of its own per (``impl``, ``tag``)."""
        job = Job(impl, suite, dataclasses.replace(request, release_memory=True), int(gpu_bytes), next(self._seq), warm=warm,
                  after=after, follows=follows, same_worker=same_worker, isolation=isolation, tag=tag)
        info = self.pool.info(impl)
        if info.load_error:  # no worker to ask: the reply is the load error
            job.future.set_result(self.pool.broken_reply(impl))
            return job
        if self.budget.over(job):
            job.alone = True
        with self._cond:
            if self._closed:
                job.future.cancel()
                return job
            self._pending.setdefault(impl, deque()).append(job)
            if not self._dispatcher_started:
                self._dispatcher_started = True
                self._dispatcher.start()
            self._cond.notify_all()
        return job

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
            if self._shut:
                return
            self._shut = True
            self._closed = True
            dropped = [job for queue in self._pending.values() for job in queue]
            for queue in self._pending.values():
                queue.clear()
            self._cond.notify_all()
        for job in dropped:
            job.future.cancel()
        spare = self.pool.stop_lending()  # kills the workers of what runs
        if self._dispatcher_started:
            self._dispatcher.join()
        self._executor.shutdown(wait=True)
        self.pool.retire_all(spare)

    # -- the dispatcher thread -----------------------------------------------------------------
    def _dispatch_loop(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (choice := self._next()) is None:
                    self._cond.wait()
                if self._closed:
                    return
                job, lease = choice
                for other in self._running:
                    other.shared = True
                job.shared = job.shared or bool(self._running)
                self._running[job] = lease
                self.budget.started(job)
                self._pending[job.impl].remove(job)
            self.ledger.began()
            self._executor.submit(self._run, job, lease)

    def _drop_pointless(self) -> None:
        """Cancel, unrun, the warm-ups that would compile nothing and the jobs whose ``follows``
        says no (a stopped sweep's points: each cancelled point stops the next). A cancelled
        future is "not run" to the suite that reads it."""
        for queue in self._pending.values():
            while dropped := [job for job in queue if self._pruning.pointless(job) or pruning.stopped(job)]:
                for job in dropped:
                    queue.remove(job)
                    job.future.cancel()
                self._cond.notify_all()  # exclusive() may be waiting for the queue to empty

    def _busy(self, job: Job) -> bool:
        """Whether ``job``'s worker of its own is busy with the request before it."""
        return job.dedicated is not None and self.pool.dedicated_busy(job.dedicated)

    def _next(self) -> "tuple[Job, Lease] | None":
        """The job to start now and the worker the pool lends it; or None."""
        if self._paused:
            return None
        self._drop_pointless()
        running = list(self._running)
        awaited = order.awaited(self._pending)
        if awaited is not None and self.budget.fits(awaited, running) and len(self._running) <= self.jobs:
            lease = self._lease(awaited, room=1)  # one slot more than jobs, for it alone
            if lease is not None:
                return awaited, lease
        if len(self._running) >= self.jobs:
            return None
        heads = [job for queue in self._pending.values() if (job := order.first_ready(queue, self._busy)) is not None]
        if not heads:
            return None
        earliest = min(heads, key=lambda job: job.seq)
        hold = self.budget.hold(earliest, running)
        if hold is Hold.BLOCK:
            return None  # it has waited long enough: nothing else starts until it has room
        if hold is Hold.FIRST:
            lease = self._lease(earliest)  # its room has come: it goes first
            return (earliest, lease) if lease is not None else None
        per_impl = {impl: sum(job.impl == impl for job in self._running) for impl in self._pending}
        ready = [job for job in heads if self.budget.fits(job, running)]
        for job in self._work_left.ranked(ready, self._pending, per_impl):
            lease = self._lease(job)
            if lease is not None:
                return job, lease
        return None

    def _lease(self, job: Job, room: int = 0) -> Lease | None:
        """A worker for ``job`` from the pool (see :meth:`WorkerPool.lease`)."""
        same_as = job.after.worker if job.same_worker and job.after is not None else None
        return self.pool.lease(job.impl, room=room, dedicated=job.dedicated, same_as=same_as,
                               queued=lambda impl: bool(self._pending.get(impl)))

    # -- a job's thread ------------------------------------------------------------------------
    def _run(self, job: Job, lease: Lease) -> None:
        worker = lease.worker
        self.pool.begin(lease)
        room = oom_retry.room_round(job)
        if room is not None:
            failed, every = room
            stopped, everyone = self.pool.evict(worker, failed, every=every)
            self.ledger.cleared_gpu(job.impl, stopped)
            oom_retry.room_made(job, everyone)
        started = time.monotonic()
        job.worker = worker
        reply = Reply(Status.CRASHED, "the request was not sent")
        try:
            reply = self.pool.ask(worker, job.impl, job.request)
        except BaseException as error:  # a bug of the harness must not leave the test waiting forever
            reply = Reply(Status.CRASHED, f"the scheduler failed to run the request: {error!r}")
        ended = time.monotonic()
        self.ledger.record(job.ledger_row, job.impl, reply.spent, started, ended, queued_s=started - job.submitted)
        retry = oom_retry.retries(job, reply)
        with self._cond:
            self._running.pop(job, None)
            self.budget.ended(job)
            self._work_left.record(job.impl, ended - started)
            self._pruning.record(job.impl, reply.spent.compile_s)
            if retry and not self._closed:
                if oom_retry.run_again(job, reply) is oom_retry.Again.ALONE:
                    self.ledger.ran_out_of_memory(job.impl)
                self._pending[job.impl].appendleft(job)
            # A worker of its own whose last queued request this was is closed.
            last = job.dedicated is None or not any(other.dedicated == job.dedicated
                                                    for other in self._pending.get(job.impl, ()))
            done_with = self.pool.give_back(lease, warmed=job.warm, last=last)
            self._cond.notify_all()
        if self._closed and not job.future.done():
            job.future.cancel()
        elif not retry:
            job.future.set_result(reply)
        if done_with is not None:
            self.pool.retire(job.impl, done_with)
