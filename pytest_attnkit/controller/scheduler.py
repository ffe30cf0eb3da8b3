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
  another is closed.
- **Order.** Each implementation's requests start in the order they were submitted (memory
  sweeps first, then pytest's order, warm-ups last: :meth:`pytest_attnkit.controller.suite.Suite.order`),
  skipping those that wait for another to end (a memory sweep's next point waits for
  the point before; its other sweeps and requests go ahead meanwhile). A free slot goes to the implementation with the most work left per running request:
  its queued requests times the mean time its requests took so far (the mean over all until it
  has one). So the run ends when the slowest implementation ends, not long after the others:
  a compiled kernel that takes seconds per case gets most of the slots, one that takes
  milliseconds few.
- **GPU memory.** Each request carries an estimate of the device memory it needs; requests run
  together only while their estimates fit ``budget_bytes``, and one that fits alone runs alone.
  Smaller requests may start ahead of one that waits for room, for at most ``MAX_HOLD_S``; then
  nothing new starts until it has its room. A request that runs out of device memory while
  another ran beside it is run again alone; one that runs out alone is run again after idle
  workers are stopped until what it lacked is free (:meth:`Scheduler.make_room`; up to
  ``ROOM_ROUNDS`` times, each by the latest failure's figures), then after every other worker is
  stopped (idle workers hand back what torch and CuPy cached, not their CUDA
  contexts, the kernels they loaded, nor what an implementation keeps), and only the last reply
  counts: an out-of-memory caused by a neighbour is never the kernel's failure, and one with the
  GPU to itself is a case that does not fit, which its test skips with the numbers
  (:mod:`pytest_attnkit.worker.out_of_memory`).
- **Warm-ups only where they compile.** Once an implementation's requests so far (its
  correctness cases come first) compiled nothing (a kernel built ahead of time, a library call,
  kernels all in the disk cache), its warm-ups are dropped unrun: they would only take GPU time. To make room for another implementation's worker, an idle one that
  holds no warm-up is closed first.
- **The GPU alone.** :meth:`exclusive` is for what must have the GPU to itself (speed timing, and
  memory sweeps where the meter sees every process's allocations): it waits until everything
  submitted has finished, and starts nothing else until it ends. The pool takes it for every
  request it sends itself (:meth:`pytest_attnkit.controller.pool.WorkerPool.request`). Extra
  workers that hold no warm-up are closed as it begins: nothing is left for them, and each holds
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
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Protocol

from pytest_attnkit.controller.ledger import Ledger
from pytest_attnkit.controller.process import Worker, close_all
from pytest_attnkit.messages import Isolation, Reply, Request, Status


class Workers(Protocol):
    """What the scheduler asks of the pool (:class:`pytest_attnkit.controller.pool.WorkerPool`)."""

    names: list[str]

    def info(self, name: str) -> Any: ...

    def primary(self, name: str) -> Worker: ...

    def new_worker(self, name: str) -> Worker: ...

    def broken_reply(self, name: str) -> Reply: ...

    def ask(self, worker: Worker, name: str, request: Request) -> Reply: ...

    def stop_others(self, keep: Worker) -> int: ...

    def stop_workers(self, workers: list[Worker]) -> int: ...

#: How long smaller requests may start ahead of one that waits for device memory.
MAX_HOLD_S = 20.0
#: Warm-ups of an implementation whose requests compiled less than this, each, are not worth
#: their GPU time once this many requests have shown it.
WARM_COMPILE_S = 0.05
WARM_EVIDENCE = 3
#: Room made for a request that ran out of memory alone: what it lacked, times this, plus this.
ROOM_MARGIN = 1.25
ROOM_SLACK_BYTES = 1 << 30
#: Rounds of room made by the failure's figures before every other worker is stopped: a case's
#: first allocation may fit once room is made and a later one (the backward's, a bias's copy)
#: not, and its reply then says what that one lacks. On a fresh H100 one round then "every"
#: stopped all 19 idle workers of a run twice, and each primary started again for the next case
#: (results/2026-11-25-h100-session3).
ROOM_ROUNDS = 3


@dataclass(eq=False)
class Job:
    """One request submitted ahead of its test."""

    impl: str
    suite: str
    request: Request
    gpu_bytes: int
    seq: int
    #: A warm-up request (``warm``): nobody waits for its reply.
    warm: bool = False
    #: Starts only once this job has ended.
    after: "Job | None" = None
    future: "Future[Reply]" = field(default_factory=Future)
    submitted: float = field(default_factory=time.monotonic)
    #: Runs with nothing beside it: it alone is over the budget, or it ran out of memory beside another.
    alone: bool = False
    #: Another request ran at some moment while this one did.
    shared: bool = False
    #: The out-of-memory reply that sent this job to run again alone (the ledger counts them).
    first_oom: Reply | None = None
    #: How much room it is given after running out of memory alone: 1 to ``ROOM_ROUNDS``, other
    #: workers are stopped until what its latest failure lacked is free (:meth:`Scheduler.make_room`);
    #: ``ROOM_ROUNDS + 1``, every other worker is stopped.
    cleared: int = 0
    #: Since when it has waited at the head of the queue for device memory (None: not waiting).
    held_since: float | None = None
    #: Runs only if this says yes of ``after``'s reply (a memory sweep's next point runs only if
    #: the point before measured, and says not to stop): otherwise its future is cancelled, unrun,
    #: and so are the jobs that follow it. The suite gives it; the scheduler reads no reply's data.
    follows: "Callable[[Reply], bool] | None" = None
    #: Runs in the worker that ran ``after`` (a sweep is measured in one process, point after
    #: point, as when each test sent its own requests).
    same_worker: bool = False
    #: The worker that ran it (a warm-up's: the one to time that case in).
    worker: "Worker | None" = None
    #: A test waits for its reply now (:meth:`Scheduler.wait`): it starts before any other.
    awaited: bool = False
    #: Which worker it may run in: any of its implementation's (SHARED), or the one of its own per
    #: (implementation, ``tag``) (DEDICATED).
    isolation: Isolation = Isolation.SHARED
    tag: str | None = None

    @property
    def dedicated(self) -> "tuple[str, str] | None":
        """The key of the worker of its own it runs in, or None (it runs in any)."""
        if self.isolation is not Isolation.DEDICATED:
            return None
        return self.impl, self.tag or self.suite


class Scheduler:
    def __init__(self, pool: Workers, *, jobs: int, budget_bytes: int | None, ledger: Ledger) -> None:
        self.pool = pool
        self.jobs = max(1, jobs)
        self.budget_bytes = budget_bytes
        self.ledger = ledger
        self._cond = threading.Condition()
        self._seq = itertools.count()
        self._pending: dict[str, deque[Job]] = {}
        self._running: dict[Job, Worker] = {}
        self._running_bytes = 0
        self._idle: dict[str, list[Worker]] = {}
        self._extras: dict[str, list[Worker]] = {}
        self._paused = False
        self._closed = False
        self._shut = False  # close() has run
        #: Per implementation: (requests finished, seconds they took), for the work left.
        self._done: dict[str, tuple[int, float]] = {}
        #: Per implementation: (requests finished, the most one of them compiled, in seconds).
        self._compiled: dict[str, tuple[int, float]] = {}
        #: Workers that ran a warm-up: their compiled kernels are worth keeping.
        self._warm_holders: set[Worker] = set()
        #: The workers of DEDICATED requests, by (implementation, tag); lent to no other request.
        self._dedicated: dict[tuple[str, str], Worker] = {}
        # One thread more than jobs: the job a test waits for may run beside jobs others.
        self._executor = ThreadPoolExecutor(max_workers=self.jobs + 1, thread_name_prefix="attnkit-job")
        self._dispatcher = threading.Thread(target=self._dispatch_loop, name="attnkit-scheduler", daemon=True)
        self._dispatcher_started = False

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
        if self.budget_bytes is not None and job.gpu_bytes > self.budget_bytes:
            job.alone = True
        with self._cond:
            if self._closed:
                job.future.cancel()
                return job
            if impl not in self._idle:
                self._idle[impl] = [self.pool.primary(impl)]
                self._extras[impl] = []
            self._pending.setdefault(impl, deque()).append(job)
            if not self._dispatcher_started:
                self._dispatcher_started = True
                self._dispatcher.start()
            self._cond.notify_all()
        return job

    def wait(self, job: Job) -> Reply:
        """The job's reply, once it has one (the pytest thread waits here; Ctrl-C interrupts)."""
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
        extra workers that hold no warm-up are closed first: nothing submitted is left for them,
        and each holds device memory while it lives (on an H100, twenty idle workers held 40 GB)."""
        started = time.monotonic()
        with self._cond:
            while (any(self._pending.values()) or self._running) and not self._closed:
                self._cond.wait()
            self._paused = True
            spare = [(impl, worker) for impl, workers in self._extras.items() for worker in workers
                     if worker not in self._warm_holders and worker in self._idle[impl]]
            for impl, worker in spare:
                self._extras[impl].remove(worker)
                self._idle[impl].remove(worker)
        close_all([worker for _, worker in spare])
        for impl, worker in spare:
            self.ledger.started_worker(impl, worker.startup_s)
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
            self._pending.clear()
            running = list(self._running.values())
            extras = [(impl, worker) for impl, workers in self._extras.items() for worker in workers]
            extras += [(impl, worker) for (impl, _), worker in self._dedicated.items() if worker not in running]
            self._dedicated.clear()
            self._cond.notify_all()
        for job in dropped:
            job.future.cancel()
        close_all(running)
        if self._dispatcher_started:
            self._dispatcher.join()
        self._executor.shutdown(wait=True)
        close_all([worker for _, worker in extras])
        for impl, worker in extras:
            self.ledger.started_worker(impl, worker.startup_s)

    def make_room(self, keep: Worker, failed: Reply | None, *, attempt: int = 1) -> tuple[int, bool]:
        """Stop idle workers so that a request that ran out of device memory alone in ``keep`` can
        run again (its ``attempt``-th try since); how many were stopped, and whether that was every
        other one. With the failure's figures (what the allocation asked for, what was free, what
        each process held: :mod:`pytest_attnkit.worker.out_of_memory`), only until what it lacked
        is free, cheapest first: workers that hold no warm-up, then those that do (their kernels
        would be loaded again), each group biggest first. Without them, when they name no worker
        to stop (what was free already covered the request with the margin: fragmentation, or
        memory the figures do not show), or after ``ROOM_ROUNDS`` rounds, every other worker."""
        if attempt > ROOM_ROUNDS or failed is None:
            return self.pool.stop_others(keep), True
        figures = failed.data.get("out_of_memory", {})
        held = {int(pid): int(used) for pid, used in (figures.get("processes") or {}).items()}
        lacking = figures.get("requested_bytes", 0) - figures.get("free_at_failure_bytes", 0)
        if not held or not figures.get("requested_bytes") or "free_at_failure_bytes" not in figures:
            return self.pool.stop_others(keep), True
        with self._cond:
            idle = [worker for workers in self._idle.values() for worker in workers if worker is not keep]
            idle += [worker for worker in self._dedicated.values() if worker is not keep
                     and worker not in self._running.values()]
            warm = set(self._warm_holders)
        idle += [primary for name in self.pool.names if (primary := self.pool.primary(name)) is not keep
                 and primary not in idle and not self._is_running(primary)]
        by_pid = {worker: held.get(getattr(getattr(worker, "process", None), "pid", -1), 0) for worker in idle}
        chosen, freed = [], 0
        for worker in sorted(idle, key=lambda worker: (worker in warm, -by_pid[worker])):
            if freed >= lacking * ROOM_MARGIN + ROOM_SLACK_BYTES:
                break
            chosen.append(worker)
            freed += by_pid[worker]
        if not chosen:  # the figures name no one (enough was free, yet it failed): all of them
            return self.pool.stop_others(keep), True
        return self.pool.stop_workers(chosen), len(chosen) == len(idle)

    def _is_running(self, worker: Worker) -> bool:
        with self._cond:
            return any(running is worker for running in self._running.values())

    # -- the dispatcher thread -----------------------------------------------------------------
    def _dispatch_loop(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (choice := self._next()) is None:
                    self._cond.wait()
                if self._closed:
                    return
                job, worker, retire = choice
                for other in self._running:
                    other.shared = True
                job.shared = job.shared or bool(self._running)
                self._running[job] = worker
                self._running_bytes += job.gpu_bytes
                self._pending[job.impl].remove(job)
                self._idle[job.impl] = [idle for idle in self._idle[job.impl] if idle is not worker]
            self.ledger.began()
            self._executor.submit(self._run, job, worker, retire)

    def _mean_s(self, impl: str) -> float:
        """The mean time of ``impl``'s requests so far (of every request, before it has one)."""
        count, seconds = self._done.get(impl, (0, 0.0))
        if count:
            return seconds / count
        total_count = sum(count for count, _ in self._done.values())
        return sum(seconds for _, seconds in self._done.values()) / total_count if total_count else 1.0

    def _work_left(self, impl: str, running: dict[str, int]) -> float:
        """Seconds of queued work per running request (plus the one it would start)."""
        return len(self._pending.get(impl, ())) * self._mean_s(impl) / (running.get(impl, 0) + 1)

    def _fits(self, job: Job) -> bool:
        if job.alone or (self._running and any(other.alone for other in self._running)):
            return not self._running
        if self.budget_bytes is None or not self._running:
            return True
        return self._running_bytes + job.gpu_bytes <= self.budget_bytes

    def _pointless(self, job: Job) -> bool:
        """Whether a warm-up would compile nothing (see the module docstring)."""
        if not job.warm:
            return False
        count, most = self._compiled.get(job.impl, (0, 0.0))
        return count >= WARM_EVIDENCE and most < WARM_COMPILE_S

    @staticmethod
    def _stopped(job: Job) -> bool:
        """Whether a job that runs only if its ``follows`` says yes of ``after``'s reply is told no
        (or ``after`` was itself cancelled)."""
        if job.follows is None or job.after is None or not job.after.future.done():
            return False
        return job.after.future.cancelled() or not job.follows(job.after.future.result())

    def _drop_pointless(self) -> None:
        """Cancel, unrun, the warm-ups that would compile nothing and the jobs whose ``follows``
        says no (a stopped sweep's points: each cancelled point stops the next). A cancelled
        future is "not run" to the suite that reads it."""
        for queue in self._pending.values():
            while dropped := [job for job in queue if self._pointless(job) or self._stopped(job)]:
                for job in dropped:
                    queue.remove(job)
                    job.future.cancel()
                self._cond.notify_all()  # exclusive() may be waiting for the queue to empty

    def _first_ready(self, queue: deque[Job]) -> Job | None:
        """The first job of an implementation's queue that waits for no other (nor for its own
        worker, busy with the request before it)."""
        return next((job for job in queue if (job.after is None or job.after.future.done())
                     and not self._dedicated_busy(job)), None)

    def _dedicated_busy(self, job: Job) -> bool:
        worker = self._dedicated.get(job.dedicated) if job.dedicated is not None else None
        return worker is not None and worker in self._running.values()

    def _awaited(self) -> Job | None:
        """The pending job that a waiting test needs first: the awaited job, or the job it waits
        for to end (``after``), where that one has not started either."""
        job = next((job for queue in self._pending.values() for job in queue if job.awaited), None)
        while job is not None and job.after is not None and not job.after.future.done():
            if job.after not in self._pending.get(job.after.impl, ()):
                return None  # what it waits for is running
            job = job.after
        return job

    def _next(self) -> "tuple[Job, Worker, tuple[str, Worker] | None] | None":
        """The job to start now, its worker and an idle worker to close first to make room; or None."""
        if self._paused:
            return None
        self._drop_pointless()
        awaited = self._awaited()
        if awaited is not None and self._fits(awaited) and len(self._running) <= self.jobs:
            placed = self._worker_for(awaited, room=1)  # one slot more than jobs, for it alone
            if placed is not None:
                return (awaited, *placed)
        if len(self._running) >= self.jobs:
            return None
        heads = [job for queue in self._pending.values() if (job := self._first_ready(queue)) is not None]
        if not heads:
            return None
        earliest = min(heads, key=lambda job: job.seq)
        if not self._fits(earliest):
            earliest.held_since = earliest.held_since or time.monotonic()
            if time.monotonic() - earliest.held_since > MAX_HOLD_S:
                return None  # it has waited long enough: nothing else starts until it has room
        elif earliest.held_since is not None:
            placed = self._worker_for(earliest)  # its room has come: it goes first
            return (earliest, *placed) if placed is not None else None
        running = {impl: sum(job.impl == impl for job in self._running) for impl in self._pending}
        ready = [job for job in heads if self._fits(job)]
        for job in sorted(ready, key=lambda job: (-self._work_left(job.impl, running), job.seq)):
            placed = self._worker_for(job)
            if placed is not None:
                return (job, *placed)
        return None

    def _worker_for(self, job: Job, room: int = 0) -> "tuple[Worker, tuple[str, Worker] | None] | None":
        """An idle worker of the job's implementation, or a new one: ``room`` more than ``jobs``
        extra workers may exist (one for the job a test waits for). A DEDICATED job: its own worker,
        started for the first of its (implementation, tag), or None while it is busy."""
        if job.dedicated is not None:
            if self._dedicated_busy(job):
                return None
            if job.dedicated not in self._dedicated:
                self._dedicated[job.dedicated] = self.pool.new_worker(job.impl)
            return self._dedicated[job.dedicated], None
        primary = self.pool.primary(job.impl)
        idle = self._idle[job.impl]
        if job.same_worker and job.after is not None and job.after.worker is not None:
            before = job.after.worker
            if before in idle:
                return before, None
            if before in self._extras[job.impl] or before is primary:
                return None  # busy: the point waits for its sweep's worker
        extras = [worker for worker in idle if worker is not primary]
        if extras:
            return extras[0], None
        if primary in idle:
            return primary, None
        if sum(len(workers) for workers in self._extras.values()) < self.jobs + room:
            return self._new_extra(job.impl), None
        # Full: close an idle extra of an implementation with nothing queued, to start one here.
        spares = [(worker in self._warm_holders, impl, worker) for impl, workers in self._extras.items()
                  if impl != job.impl and not self._pending.get(impl) for worker in workers
                  if worker in self._idle[impl]]
        if spares:
            _, impl, spare = min(spares, key=lambda spare: spare[0])
            self._extras[impl].remove(spare)
            self._idle[impl].remove(spare)
            return self._new_extra(job.impl), (impl, spare)
        return None

    def _new_extra(self, impl: str) -> Worker:
        worker = self.pool.new_worker(impl)
        self._extras[impl].append(worker)
        return worker

    # -- a job's thread ------------------------------------------------------------------------
    def _retire(self, impl: str, worker: Worker) -> None:
        worker.close()
        self.ledger.started_worker(impl, worker.startup_s)

    def _run(self, job: Job, worker: Worker, retire: "tuple[str, Worker] | None") -> None:
        if retire is not None:
            self._retire(*retire)
        if job.cleared:
            stopped, everyone = self.make_room(worker, job.first_oom, attempt=job.cleared)
            self.ledger.cleared_gpu(job.impl, stopped)
            job.cleared = ROOM_ROUNDS + 1 if everyone else job.cleared
        started = time.monotonic()
        job.worker = worker
        reply = Reply(Status.CRASHED, "the request was not sent")
        try:
            reply = self.pool.ask(worker, job.impl, job.request)
        except BaseException as error:  # a bug of the harness must not leave the test waiting forever
            reply = Reply(Status.CRASHED, f"the scheduler failed to run the request: {error!r}")
        ended = time.monotonic()
        self.ledger.record(job.suite if not job.warm else f"{job.suite} (warm)", job.impl, reply.spent, started,
                           ended, queued_s=started - job.submitted)
        retry = reply.status is Status.OUT_OF_MEMORY and job.cleared <= ROOM_ROUNDS
        with self._cond:
            self._running.pop(job, None)
            self._running_bytes -= job.gpu_bytes
            count, seconds = self._done.get(job.impl, (0, 0.0))
            self._done[job.impl] = (count + 1, seconds + (ended - started))
            if job.warm:
                self._warm_holders.add(worker)
            count, most = self._compiled.get(job.impl, (0, 0.0))
            self._compiled[job.impl] = (count + 1, max(most, float(reply.spent.compile_s)))
            if worker in self._extras.get(job.impl, ()) or worker is self.pool.primary(job.impl):
                self._idle[job.impl].append(worker)
            if retry and not self._closed:
                if job.shared:  # beside others: again, alone
                    job.alone, job.shared, job.first_oom = True, False, reply
                    self.ledger.ran_out_of_memory(job.impl)
                else:  # alone: again with room made (ROOM_ROUNDS times), then with every other worker stopped
                    job.alone, job.cleared, job.first_oom = True, job.cleared + 1, reply
                self._pending[job.impl].appendleft(job)
            done_with = None  # a worker of its own whose last queued request this was: closed
            if (job.dedicated is not None and self._dedicated.get(job.dedicated) is worker
                    and not any(other.dedicated == job.dedicated for other in self._pending.get(job.impl, ()))):
                done_with = self._dedicated.pop(job.dedicated)
            self._cond.notify_all()
        if self._closed and not job.future.done():
            job.future.cancel()
        elif not retry:
            job.future.set_result(reply)
        if done_with is not None:
            self._retire(job.impl, done_with)
