"""The worker pool: every worker process of the run, from start to end, and every request to one.

The pool is the only way the pytest process talks to an implementation, and the only owner of
worker processes: it starts one worker per implementation (in parallel: each one imports its
implementation), its *primary*, keeps what each one said about itself
(:class:`~pytest_attnkit.controller.impls.ImplInfo`), and turns every request into a
:class:`~pytest_attnkit.messages.Reply`: a worker that died or missed its deadline becomes a
``CRASHED`` or ``TIMEOUT`` reply (the next request starts a fresh worker), an implementation that
could not be loaded a ``BROKEN`` one. What a reply means for the test is
:meth:`pytest_attnkit.controller.outcome.Outcomes.from_reply`'s to say.

Where requests run ahead of the tests (:mod:`pytest_attnkit.controller.scheduler`, which decides
*which* request starts *when*), the pool decides *where*: :meth:`WorkerPool.lease` lends a worker
of the request's implementation (an idle one, the one that ran the point before it, or a new
*extra* one: at most ``jobs`` extras in all, one more for the request a test waits for; when full,
an idle extra of an implementation with nothing queued is closed to start one, those that hold
no warm-up first, then, for an implementation whose requests compile, the warm-up's worker whose
warm-ups compiled least each), or a worker of
its own per (implementation, tag) for a DEDICATED request, closed after its last one, or a
worker started under a launcher (compute-sanitizer) for one request, closed by
:meth:`WorkerPool.finish` before its reply is handed on;
:meth:`WorkerPool.give_back` takes it back. :meth:`WorkerPool.trim` closes the extras that hold
no warm-up as the GPU-alone phase begins, and :meth:`WorkerPool.evict` stops idle workers so that
a request that ran out of device memory alone can run again: only until what it lacked is free,
cheapest first (by the failure's figures), or every other one. The pool
knows no scheduler: the session hands it the GPU-alone phase (:meth:`WorkerPool.share`).

Requests sent on the caller's thread (:meth:`WorkerPool.request_alone`, the one synchronous path:
speed's timing rounds, memory sweeps on the device meter, and the jobs of
:class:`~pytest_attnkit.controller.inline.InlineScheduler` with ``--attnkit-jobs=1``) go to the
primary with the GPU to itself, when others run beside them. Such a request that runs out of
device memory is sent again after other worker processes are stopped (:meth:`WorkerPool.evict`, a
few rounds by the latest failure's figures, then all of them): idle workers still hold their CUDA
contexts, the kernels they loaded and whatever an implementation keeps, and whether a big case
fits must not depend on them. Every
reply's time goes into the run's :mod:`~pytest_attnkit.controller.ledger`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Iterator

from pytest_attnkit.controller.impls import ImplInfo
from pytest_attnkit.controller.ledger import Ledger
from pytest_attnkit.controller.process import (InProcessWorker, Launch, Spares, Worker, WorkerFailure, WorkerProcess,
                                                close_all)
from pytest_attnkit.controller.worker_log import log_folder
from pytest_attnkit.messages import Op, Reply, Request, Spent, Status
from pytest_attnkit.registry import EntryPointRef

#: An implementation whose requests compiled this long each, on the mean, compiles: it may take
#: another's warm worker to start one of its own (:meth:`WorkerPool.lease`).
COMPILES_S = 0.05

def _added(tally: "tuple[int, float] | None", seconds: float) -> tuple[int, float]:
    """A (requests, compile seconds) tally with one more request that compiled ``seconds``."""
    count, total = tally or (0, 0.0)
    return count + 1, total + float(seconds)


def _mean_s(tally: "tuple[int, float] | None") -> float:
    """A (requests, compile seconds) tally's mean compile seconds (0 for none)."""
    count, total = tally or (0, 0.0)
    return total / count if count else 0.0


#: The suite each core request op belongs to, for the ledger: the names the scheduler's jobs carry, so
#: that a suite has one row whether its requests run one at a time or ahead. A suite's own request
#: (``Op.RUN``) names its suite; a request whose op is not its suite's is named by the caller
#: (:meth:`WorkerPool.request_alone`).
SUITE_OF_OP = {Op.WARM: "warm", Op.CEILINGS: "speed"}


def suite_of(request: Request) -> str:
    """The ledger row of a request the pool sends itself when its caller names none."""
    return request.suite or SUITE_OF_OP.get(request.op, request.op.value)


#: The least deadline of start-up work (:attr:`WorkerPool.start_timeout`).
START_TIMEOUT_S = 180.0
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
class Lease:
    """A worker lent to one request (:meth:`WorkerPool.lease`), until :meth:`WorkerPool.give_back`."""

    impl: str
    worker: Worker
    #: An idle extra worker of another implementation taken out to make room for this one: the
    #: request's own thread closes it (:meth:`WorkerPool.begin`; closing takes a second or two).
    retired: "tuple[str, Worker] | None" = None
    #: The (implementation, tag) of the worker of its own it is, or None (a shared worker).
    dedicated: "tuple[str, str] | None" = None
    #: A worker under a launcher, started for this request alone (:meth:`WorkerPool.finish` closes it).
    launched: bool = False


#: The most spares the pool starts: on a host of 128 cores ``--attnkit-jobs=auto`` asks for 128
#: jobs, of which the device memory's budget lets far fewer run, and each spare holds a few hundred
#: MB of host memory for the run.
MAX_SPARES = 16


class WorkerPool:
    """Workers for the selected implementations, plus short-lived ones (the probe, the ceilings).

    ``env`` is the environment every worker starts with (the interpreter flag for Triton on the
    CPU, the GPU an xdist worker is pinned to); ``inprocess`` runs the handlers in this process.
    """

    def __init__(self, *, device: str, timeout: float, env: dict[str, str] | None = None,
                 inprocess: bool = False) -> None:
        self.device = device
        self.timeout = timeout
        #: The deadline of start-up work (probing the environment, loading and describing an
        #: implementation, measuring the ceilings): importing torch and a kernel's module on a busy
        #: machine took longer than a tight --attnkit-timeout meant for one call of a kernel.
        self.start_timeout = max(timeout, START_TIMEOUT_S)
        self.env = dict(env or {})
        self.inprocess = inprocess
        self.log_dir = log_folder()  # named by this run; a killed run's is removed by the next
        #: Interpreters started ahead for the extra workers (:meth:`start_spares`).
        self.spares = Spares(self.log_dir)
        #: Set by :meth:`close`: a worker made after it is closed at once.
        self.closed = False
        self.impls: dict[str, ImplInfo] = {}
        self._workers: dict[str, Worker] = {}
        #: How each implementation's workers start: (init message, environment), for more of them.
        self._starts: dict[str, tuple[dict[str, Any], dict[str, str] | None]] = {}
        self._extra_count: dict[str, int] = {}
        #: Every worker of an implementation started so far (primaries and extras), for stop_others.
        self._all: list[Worker] = []
        #: Environment only the scheduler's extra workers get (their share of the CPU threads).
        self.extra_env: dict[str, str] = {}
        self.ledger = Ledger()
        #: The GPU-alone phase of whoever runs requests beside the pool's own (:meth:`share`); None:
        #: nothing else runs.
        self._alone: "Callable[[], ContextManager[None]] | None" = None
        #: How many extra workers the leases may start in all (:meth:`share`).
        self.extras_cap = 0
        # -- the workers lent to requests run ahead (under _lock) --
        self._lock = threading.Lock()
        #: Per implementation: its workers not lent now (the primary among them), and its extras.
        self._idle: dict[str, list[Worker]] = {}
        self._extras: dict[str, list[Worker]] = {}
        #: The workers that hold a warm-up's kernels: how many warm-ups each ran, and how long they
        #: compiled in all (their mean says, roughly, what losing the worker costs a case: see
        #: :meth:`lease`).
        self._warm_holders: dict[Worker, tuple[int, float]] = {}
        #: Per implementation: how many of its requests came back and how long they compiled in
        #: all (whether its requests gain from a worker more: see :meth:`lease`).
        self._compiled: dict[str, tuple[int, float]] = {}
        #: The workers of DEDICATED requests, by (implementation, tag); lent to no other request.
        self._dedicated: dict[tuple[str, str], Worker] = {}
        #: The workers lent now.
        self._leased: set[Worker] = set()
        #: The workers under a launcher (a request's :class:`Launch`) that run now.
        self._launched: set[Worker] = set()
        #: One-off workers started ahead (:meth:`start_once`), by label, with their start-up's future.
        self._once: dict[str, tuple[Worker, Future[Reply]]] = {}
        self._once_threads = ThreadPoolExecutor(max_workers=1, thread_name_prefix="attnkit-once")

    def _new_worker(self, label: str, init: dict[str, Any], env: dict[str, str] | None = None, *,
                    extra: bool = False) -> Worker:
        """A worker (its process starts with its first request); ``extra``: one of the scheduler's
        extra workers, the only ones that take a spare (with ``OMP_NUM_THREADS`` set outside, their
        environment is the primaries' too, and a primary must not use up the extras' spares)."""
        env = {**self.env, **(env or {})}
        if self.inprocess:
            return InProcessWorker(label, init, env=env)
        return WorkerProcess(label, init, self.log_dir, env=env, spares=self.spares if extra else None)

    def start_spares(self, count: int) -> None:
        """Start ``count`` interpreters (at most :data:`MAX_SPARES`) for the scheduler's extra
        workers now (their environment: :attr:`env` and :attr:`extra_env`, as :meth:`new_worker`
        gives them), so that they have imported torch by the time the first requests start extra
        workers (:class:`Spares`)."""
        if not self.inprocess and count > 0:
            self.spares.add({**self.env, **self.extra_env}, min(count, MAX_SPARES))

    def share(self, *, extras: int, alone: Callable[[], ContextManager[None]]) -> None:
        """Requests run ahead of the tests, several at a time, from now on: the leases may start
        ``extras`` extra workers in all (one more for the request a test waits for), and the
        pool's own requests take the GPU alone through ``alone`` (the scheduler's ``exclusive``)."""
        self.extras_cap = extras
        self._alone = alone

    @contextlib.contextmanager
    def _gpu_alone(self) -> Iterator[None]:
        if self._alone is None:
            yield
        else:
            with self._alone():
                yield

    # -- one-off workers ----------------------------------------------------------------------
    def start_once(self, label: str) -> None:
        """Start the one-off worker that :meth:`run_once` will use for ``label`` now, in a thread of
        its own: its interpreter, torch and its CUDA context (an environment request) load while
        other work runs, not in the GPU-alone phase that the ceilings open, where every second of
        start-up was a second of an idle GPU (5.7 s on an H200, results/2026-11-26-gpus). Nothing
        to do in-process: the request would import torch into the pytest process."""
        if self.inprocess or label in self._once:
            return
        worker = self._new_worker(label, {"device": self.device})
        self._once[label] = (worker, self._once_threads.submit(worker.request, Request(Op.ENVIRONMENT),
                                                               self.start_timeout))

    def run_once(self, label: str, request: Request, *, device: str | None = None) -> dict[str, Any]:
        """Start a worker with no implementation (or take the one :meth:`start_once` started),
        send one request, stop it: the reply's data; raises :class:`WorkerFailure` when it dies
        (a worker that died while starting ahead is started again by the request)."""
        started = self._once.pop(label, None) if device in (None, self.device) else None
        if started is not None:
            worker, starting = started
            with contextlib.suppress(Exception):
                starting.result()
        else:
            worker = self._new_worker(label, {"device": device or self.device})
        try:
            with self._gpu_alone():
                return worker.request(request, self.start_timeout).data
        finally:
            worker.close()

    # -- the implementations' workers ---------------------------------------------------------
    def start(self, refs: list[EntryPointRef], setups: dict[str, dict[str, Any]] | None = None, *,
              handlers: dict[str, str] | None = None) -> None:
        """Start one worker per implementation and ask each to describe itself. ``setups`` gives
        some implementations more for their workers: ``init`` entries (another version's sys.path)
        and ``env`` entries (its own compile caches); see :mod:`pytest_attnkit.controller.against`.
        ``handlers``: each suite's worker handler (``Suite.handler``), which every worker of an
        implementation imports at start to answer the suite's requests."""
        setups = setups or {}
        handlers = dict(handlers or {})
        with ThreadPoolExecutor(max_workers=max(1, len(refs))) as threads:
            infos = list(threads.map(lambda ref: self._describe(ref, setups.get(ref.name, {}), handlers), refs))
        self.impls = {info.name: info for info in infos}

    def _describe(self, ref: EntryPointRef, setup: dict[str, Any], handlers: dict[str, str]) -> ImplInfo:
        if ref.problem:
            return ImplInfo(ref.name, ref.value, ref.distribution, load_error=ref.problem)
        init = {"device": self.device, "name": ref.name, "value": ref.value, "handlers": handlers,
                **setup.get("init", {})}
        self._starts[ref.name] = (init, setup.get("env"))
        worker = self._new_worker(ref.name, init, setup.get("env"))
        self._workers[ref.name] = worker
        self._all.append(worker)
        if self.closed:  # closed while starting beside the probe (the probe failed): none may outlive it
            worker.close()
        try:
            described = worker.request(Request(Op.DESCRIBE), self.start_timeout).data
        except WorkerFailure as failure:
            return ImplInfo(ref.name, ref.value, ref.distribution, load_error=str(failure))
        return ImplInfo(ref.name, ref.value, ref.distribution, load_error=described.get("load_error"),
                        unavailable=described.get("unavailable"), capabilities=described.get("capabilities", {}),
                        path_note=described.get("path_note"))

    @property
    def names(self) -> list[str]:
        return list(self.impls)

    def info(self, name: str) -> ImplInfo:
        return self.impls[name]

    def described_workers(self) -> Iterator[Worker]:
        """The first workers that loaded their implementation and described it, in start order:
        alive, and with torch imported (the session asks one for the environment on the CPU)."""
        for name, info in self.impls.items():
            if info.load_error is None and name in self._workers:
                yield self._workers[name]

    def primary(self, name: str) -> Worker:
        """The worker that described ``name``: the one that sweeps memory and times speed."""
        return self._workers[name]

    def new_worker(self, name: str) -> Worker:
        """One more worker for ``name`` (its process starts with its first request)."""
        init, env = self._starts[name]
        self._extra_count[name] = self._extra_count.get(name, 0) + 1
        worker = self._new_worker(f"{name}.{self._extra_count[name] + 1}", init, {**(env or {}), **self.extra_env},
                                  extra=True)
        self._all.append(worker)
        return worker

    def stop_others(self, keep: Worker) -> int:
        """Stop every idle worker process but ``keep`` (each starts again at its next request), so
        that a request that ran out of device memory can run again with nothing else holding any:
        a worker hands back what torch and CuPy cache after each request, but its CUDA context,
        its libraries' workspaces and whatever the implementation keeps stay while it lives. How
        many processes were stopped."""
        return self.stop_workers([worker for worker in self._all if worker is not keep])

    def stop_workers(self, workers: list[Worker]) -> int:
        """Stop these idle workers' processes side by side (each takes a second or two to tear down
        its CUDA context); how many were running."""
        workers = [worker for worker in workers if not getattr(worker, "closed", False)]
        if len(workers) <= 1:
            return sum(worker.stop() for worker in workers)
        with ThreadPoolExecutor(max_workers=len(workers)) as threads:
            return sum(threads.map(lambda worker: worker.stop(), workers))

    def primary_startups(self) -> dict[str, float]:
        """Seconds each primary worker has spent starting so far (a crash starts it again)."""
        return {name: worker.startup_s for name, worker in self._workers.items()}

    # -- workers lent to the requests run ahead ------------------------------------------------
    def lease(self, impl: str, *, room: int = 0, dedicated: "tuple[str, str] | None" = None,
              same_as: Worker | None = None, queued: Callable[[str], bool] = lambda impl: False,
              launch: Launch | None = None) -> Lease | None:
        """A worker for one request of ``impl``, or None (none may be lent now: the request waits).

        A request under a launcher (``launch``: compute-sanitizer's) gets a worker of its own
        started under it, or None while ``launch.at_once`` such workers run; :meth:`finish` closes it.
        A DEDICATED request (``dedicated``: its (implementation, tag)) gets the worker of its own,
        started for the first one, or None while it is busy. Any other gets the worker that ran
        the request before it (``same_as``: a sweep's point), or None while that one is busy;
        else an idle extra, else the primary, else a new extra: ``room`` more than
        :attr:`extras_cap` may exist (one for the request a test waits for). When that is full,
        an idle extra of another implementation that has nothing ``queued`` is taken out to
        start one, and the request's thread closes it (:meth:`begin`): one that holds no warm-up
        first, then the one whose warm-ups compiled least each. A warm-up's worker times its case
        later, with the GPU alone, and a worker started for it there pays the case's first call
        again: on an H200 (2026-11-27) torch_flex's timings took 34.2 s with the GPU alone after
        torch_sdpa's tail had taken its warm workers, 21.1-21.4 s in runs that kept them, where
        triton_flash's kernels load from the disk cache in milliseconds. Never taking a warm worker
        cost more in a cold run: torch_flex's compiling tail ran on 12 slots for 55 s,
        triton_flash's idle warm workers holding the other 4 (results/2026-11-27-session10). The
        compile seconds are the first compile's, not a reload's: a cold run's Triton warm-up
        compiles for seconds and reloads in milliseconds, so the mean per warm-up (torch_flex's
        about twice triton_flash's, cold; fifty times, warm) ranks them, not the sum. A warm
        worker is taken only for an implementation whose requests compile (they took
        :data:`COMPILES_S` or more each, on the mean: a warm run's triton_flash compiled 0.05 s or
        more in 3-4 requests of hundreds): one that compiles nothing gains a request's GPU time from a
        worker more, and its start-up costs seconds. On an H200 warm run torch_sdpa's
        correctness tail took torch_flex's warm workers, and torch_flex's timings paid 6.3 s of
        first calls with the GPU alone, against 0.6 s (results/2026-11-27-session11)."""
        with self._lock:
            if launch is not None:
                if len(self._launched) >= launch.at_once:
                    return None
                init, own_env = self._starts[impl]
                worker = WorkerProcess(launch.label, init, self.log_dir,
                                       env={**self.env, **(own_env or {}), **launch.env},
                                       launcher=list(launch.command), shutdown_timeout=launch.shutdown_timeout)
                self._launched.add(worker)
                self._leased.add(worker)
                return Lease(impl, worker, launched=True)
            primary = self.primary(impl)
            idle = self._idle.setdefault(impl, [primary])
            self._extras.setdefault(impl, [])
            if dedicated is not None:
                worker = self._dedicated.get(dedicated)
                if worker is not None and worker in self._leased:
                    return None
                if worker is None:
                    worker = self._dedicated[dedicated] = self.new_worker(impl)
                return self._lend(Lease(impl, worker, dedicated=dedicated))
            if same_as is not None:
                if same_as in idle:
                    return self._lend(Lease(impl, same_as))
                if same_as in self._extras[impl] or same_as is primary:
                    return None  # busy: the point waits for its sweep's worker
            extras = [worker for worker in idle if worker is not primary]
            if extras:
                return self._lend(Lease(impl, extras[0]))
            if primary in idle:
                return self._lend(Lease(impl, primary))
            if sum(len(workers) for workers in self._extras.values()) < self.extras_cap + room:
                return self._lend(Lease(impl, self._new_extra(impl)))
            # Full: close an idle extra of an implementation with nothing queued, to start one here:
            # one that holds no warm-up, else the one whose warm-ups compiled least each (the docstring).
            takes_warm = _mean_s(self._compiled.get(impl)) >= COMPILES_S
            closable = [((worker in self._warm_holders, _mean_s(self._warm_holders.get(worker))), other, worker)
                      for other, workers in self._extras.items() if other != impl and not queued(other)
                      for worker in workers if worker in self._idle[other]
                      and (takes_warm or worker not in self._warm_holders)]
            if closable:
                _, other, retiring = min(closable, key=lambda candidate: candidate[0])
                self._extras[other].remove(retiring)
                self._idle[other].remove(retiring)
                return self._lend(Lease(impl, self._new_extra(impl), retired=(other, retiring)))
            return None

    def _lend(self, lease: Lease) -> Lease:
        self._idle[lease.impl] = [idle for idle in self._idle[lease.impl] if idle is not lease.worker]
        self._leased.add(lease.worker)
        return lease

    def _new_extra(self, impl: str) -> Worker:
        worker = self.new_worker(impl)
        self._extras[impl].append(worker)
        return worker

    def busy(self, dedicated: "tuple[str, str] | None", launch: Launch | None = None) -> bool:
        """Whether a request must wait for a worker of its own: the one of (implementation, tag)
        ``dedicated`` is lent now, or ``launch.at_once`` workers under a launcher run."""
        with self._lock:
            if launch is not None:
                return len(self._launched) >= launch.at_once
            worker = self._dedicated.get(dedicated) if dedicated is not None else None
            return worker is not None and worker in self._leased

    def begin(self, lease: Lease) -> None:
        """On the request's thread, before it is sent: close the worker taken out to make room."""
        if lease.retired is not None:
            self.retire(*lease.retired)

    def finish(self, lease: Lease) -> None:
        """On the request's thread, once the reply is in and before it is handed on: close a
        worker under a launcher (the tool writes its summary as the worker exits)."""
        if lease.launched:
            lease.worker.close()
            with self._lock:
                self._launched.discard(lease.worker)

    def give_back(self, lease: Lease, *, warmed: bool, last: bool = True,
                  compile_s: float = 0.0, spared_s: float | None = None) -> Worker | None:
        """Take back a lent worker: idle again (it holds a warm-up's kernels if ``warmed``, which
        compiled ``compile_s``, and whose first call cost ``spared_s`` beyond its next: what its
        case's timing would pay again elsewhere, the larger of the two counts). A worker of its
        own whose ``last`` queued request this was is dropped, and returned for the caller to
        :meth:`retire` once the reply is out (closing takes a second or two)."""
        worker = lease.worker
        with self._lock:
            self._leased.discard(worker)
            self._compiled[lease.impl] = _added(self._compiled.get(lease.impl), compile_s)
            if warmed:
                self._warm_holders[worker] = _added(self._warm_holders.get(worker), max(compile_s, spared_s or 0.0))
            if worker in self._extras.get(lease.impl, ()) or worker is self._workers.get(lease.impl):
                self._idle.setdefault(lease.impl, []).append(worker)
            if lease.dedicated is not None and last and self._dedicated.get(lease.dedicated) is worker:
                return self._dedicated.pop(lease.dedicated)
        return None

    def retire(self, impl: str, worker: Worker) -> None:
        """Close one of ``impl``'s extra workers for good; its start-up time goes into the ledger."""
        worker.close()
        self.ledger.started_worker(impl, worker.startup_s)

    def trim(self) -> None:
        """Close the extra workers that are idle and hold no warm-up (the GPU-alone phase begins:
        nothing submitted is left for them, and each holds device memory while it lives: on an
        H100, twenty idle workers held 40 GB). The others stay: a speed test is timed in the
        worker that warmed its case up, which has its kernels compiled and loaded."""
        with self._lock:
            unheld = [(impl, worker) for impl, workers in self._extras.items() for worker in workers
                      if worker not in self._warm_holders and worker in self._idle[impl]]
            for impl, worker in unheld:
                self._extras[impl].remove(worker)
                self._idle[impl].remove(worker)
        close_all([worker for _, worker in unheld])
        for impl, worker in unheld:
            self.ledger.started_worker(impl, worker.startup_s)

    def stop_lending(self) -> "list[tuple[str, Worker]]":
        """The requests run ahead are over (the run ends or stops: ``-x``, Ctrl-C, SIGTERM): kill
        the workers lent now, so that their requests fail at once, and hand back the extra
        workers and the idle workers of their own, for :meth:`retire_all` once the requests'
        threads have ended."""
        with self._lock:
            lent = list(self._leased)
            extras = [(impl, worker) for impl, workers in self._extras.items() for worker in workers]
            extras += [(impl, worker) for (impl, _), worker in self._dedicated.items() if worker not in lent]
            self._dedicated.clear()
            self._extras = {}
            self._idle = {}
        close_all(lent)
        return extras

    def retire_all(self, workers: "list[tuple[str, Worker]]") -> None:
        close_all([worker for _, worker in workers])
        for impl, worker in workers:
            self.ledger.started_worker(impl, worker.startup_s)

    def evict(self, keep: Worker, failed: Reply | None, *, every: bool = False) -> tuple[int, bool]:
        """Stop idle workers so that a request that ran out of device memory alone in ``keep`` can
        run again; how many were stopped, and whether that was every other one. With the
        failure's figures (what the allocation asked for, what was free, what each process held:
        :mod:`pytest_attnkit.worker.out_of_memory`), only until what it lacked is free, cheapest
        first: workers that hold no warm-up, biggest first, then those that do (their cases' first
        calls would be paid again with the GPU alone), those whose warm-ups compiled least each
        first (Triton's kernels load from the disk cache in milliseconds; a torch.compile
        worker's first calls cost 9 s on an H100 once its warm workers were stopped,
        results/2026-11-27-session9), then biggest first. Without them, when they name no worker to stop (what was
        free already covered the request with the margin: fragmentation, or memory the figures do
        not show), or with ``every`` (after :data:`ROOM_ROUNDS` rounds), every other worker."""
        if every or failed is None:
            return self.stop_others(keep), True
        figures = failed.data.get("out_of_memory", {})
        held = {int(pid): int(used) for pid, used in (figures.get("processes") or {}).items()}
        lacking = figures.get("requested_bytes", 0) - figures.get("free_at_failure_bytes", 0)
        if not held or not figures.get("requested_bytes") or "free_at_failure_bytes" not in figures:
            return self.stop_others(keep), True
        with self._lock:
            idle = [worker for workers in self._idle.values() for worker in workers if worker is not keep]
            idle += [worker for worker in self._dedicated.values() if worker is not keep
                     and worker not in self._leased]
            warm = {worker: _mean_s(tally) for worker, tally in self._warm_holders.items()}
            idle += [primary for primary in self._workers.values() if primary is not keep
                     and primary not in idle and primary not in self._leased]
        by_pid = {worker: held.get(getattr(getattr(worker, "process", None), "pid", -1), 0) for worker in idle}
        chosen, freed = [], 0
        for worker in sorted(idle, key=lambda worker: (worker in warm, warm.get(worker, 0.0), -by_pid[worker])):
            if freed >= lacking * ROOM_MARGIN + ROOM_SLACK_BYTES:
                break
            chosen.append(worker)
            freed += by_pid[worker]
        if not chosen:  # the figures name no one (enough was free, yet it failed): all of them
            return self.stop_others(keep), True
        return self.stop_workers(chosen), len(chosen) == len(idle)

    def broken_reply(self, name: str) -> Reply:
        return Reply(Status.BROKEN, self.impls[name].load_error or "")

    def ask(self, worker: Worker, name: str, request: Request) -> Reply:
        """Send a suite request to one of ``name``'s workers; every outcome comes back as a Reply,
        with the worker's account of its time (``Reply.spent``)."""
        if self.impls[name].load_error:
            return self.broken_reply(name)
        started = time.monotonic()
        try:
            reply = worker.request(request, self.timeout)
        except WorkerFailure as failure:
            status = Status.TIMEOUT if failure.kind == "timeout" else Status.CRASHED
            reply = Reply(status, str(failure))
        if reply.spent.wall_s is None:  # no worker's account (it died, or it runs in this process)
            reply = dataclasses.replace(reply, spent=Spent(time.monotonic() - started, reply.spent.compile_s))
        return reply

    def request_alone(self, name: str, request: Request, *, worker: Worker | None = None,
                      suite: str | None = None) -> Reply:
        """The one synchronous path: send a request to ``name``'s primary worker (or to
        ``worker``, one of its workers that has the case warmed up) on the caller's thread, with
        the GPU to itself, and wait for it. For what must be decided while a test judges and run
        with nothing beside it (speed's timing rounds, memory sweeps on the device meter), and for
        :class:`~pytest_attnkit.controller.inline.InlineScheduler`'s jobs; everything else is
        submitted to the scheduler. The ledger counts it under ``suite``, else its op's suite
        (:data:`SUITE_OF_OP`)."""
        with self._gpu_alone():
            started = time.monotonic()
            self.ledger.began()
            if worker is None and name in self._workers:
                worker = self._workers[name]
            if self._alone is not None:
                # Other workers share the GPU: what this request cached must not crowd out the next.
                request = dataclasses.replace(request, release_memory=True)
            reply = self.ask(worker, name, request) if worker is not None else self.broken_reply(name)
            tries, everyone = 0, False
            while worker is not None and reply.status is Status.OUT_OF_MEMORY and not everyone:
                # Other workers' processes still hold device memory: end enough of them (then
                # all) and try again.
                tries += 1
                if self._alone is not None:
                    stopped, everyone = self.evict(worker, reply, every=tries > ROOM_ROUNDS)
                else:
                    stopped, everyone = self.stop_others(worker), True
                if not stopped:
                    break
                self.ledger.ran_out(suite or suite_of(request), name, request, reply, beside=False)
                self.ledger.cleared_gpu(name, stopped)
                reply = self.ask(worker, name, request)
            self.ledger.record(suite or suite_of(request), name, reply.spent, started,
                               time.monotonic(), alone=True)
        return reply

    def support(self, name: str, queries: list[dict[str, Any]]) -> list[str | None] | None:
        """Why the implementation refuses each query (None where it does not); None when its
        worker could not answer (each test then meets the failure itself, with the details)."""
        try:
            reply = self._workers[name].request(Request(Op.SUPPORT, options={"queries": queries}), self.start_timeout)
        except WorkerFailure:
            return None
        return reply.data["refusals"]

    def close(self) -> None:
        """End every worker process the pool started (the scheduler, which stops lending first,
        is closed before it: :meth:`stop_lending`)."""
        self.closed = True
        once = [worker for worker, _ in self._once.values()]
        self._once.clear()
        with self._lock:
            lent = [*self._leased, *self._dedicated.values(), *self._launched,
                    *(worker for workers in self._extras.values() for worker in workers)]
        self.spares.close()
        close_all([*self._workers.values(), *once, *lent])  # a worker still starting is killed
        self._once_threads.shutdown(wait=False, cancel_futures=True)
        self._workers.clear()
        shutil.rmtree(self.log_dir, ignore_errors=True)
