"""The worker pool: the workers of each implementation, looked up by name, replaced when they die.

The pool is the only way the pytest process talks to an implementation. It starts one worker
per implementation (in parallel: each one imports its implementation), its *primary*, keeps what
each one said about itself (:class:`~pytest_attnkit.controller.impls.ImplInfo`), starts more
workers of an implementation when the scheduler asks (:meth:`WorkerPool.new_worker`), and turns
every request into a :class:`~pytest_attnkit.messages.Reply`: a worker that died or missed its
deadline becomes a ``CRASHED`` or ``TIMEOUT`` reply (the next request starts a fresh worker), an
implementation that could not be loaded a ``BROKEN`` one. What a reply means for the test is
:meth:`pytest_attnkit.controller.outcome.Outcomes.from_reply`'s to say.

Requests the pool sends itself (:meth:`WorkerPool.request`: memory sweeps, speed timing, a
correctness case nobody submitted ahead) go to the primary with the GPU to itself, when a
:mod:`~pytest_attnkit.controller.scheduler` runs others beside them; the scheduler sends the rest
through :meth:`WorkerPool.ask`. A request of its own that runs out of device memory is sent again
after other worker processes are stopped, enough of them to free what it lacked
(:meth:`pytest_attnkit.controller.scheduler.Scheduler.make_room`, a few rounds, each by the latest
failure's figures), then all of them
(:meth:`WorkerPool.stop_others`): idle workers still hold their CUDA contexts, the kernels they
loaded and whatever an implementation keeps, and whether a big case fits must not depend on them. Every reply's time goes into the run's
:mod:`~pytest_attnkit.controller.ledger`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Iterator

from pytest_attnkit.controller.impls import ImplInfo
from pytest_attnkit.controller.ledger import Ledger
from pytest_attnkit.controller.process import InProcessWorker, Worker, WorkerFailure, WorkerProcess, close_all
from pytest_attnkit.controller.worker_log import log_folder
from pytest_attnkit.messages import Op, Reply, Request, Spent, Status
from pytest_attnkit.registry import EntryPointRef

if TYPE_CHECKING:
    from pytest_attnkit.controller.scheduler import Scheduler

#: The suite each core request op belongs to, for the ledger: the names the scheduler's jobs carry, so
#: that a suite has one row whether its requests run one at a time or ahead. A suite's own request
#: (``Op.RUN``) names its suite; a request whose op is not its suite's is named by the caller
#: (:meth:`WorkerPool.request`).
SUITE_OF_OP = {Op.WARM: "warm", Op.CEILINGS: "speed"}


def suite_of(request: Request) -> str:
    """The ledger row of a request the pool sends itself when its caller names none."""
    return request.suite or SUITE_OF_OP.get(request.op, request.op.value)


#: The least deadline of start-up work (:attr:`WorkerPool.start_timeout`).
START_TIMEOUT_S = 180.0


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
        #: Set by the session when requests run ahead of the tests, several at a time.
        self.scheduler: "Scheduler | None" = None
        #: One-off workers started ahead (:meth:`start_once`), by label, with their start-up's future.
        self._once: dict[str, tuple[Worker, Future[Reply]]] = {}
        self._once_threads = ThreadPoolExecutor(max_workers=1, thread_name_prefix="attnkit-once")

    def _new_worker(self, label: str, init: dict[str, Any], env: dict[str, str] | None = None) -> Worker:
        env = {**self.env, **(env or {})}
        if self.inprocess:
            return InProcessWorker(label, init, env=env)
        return WorkerProcess(label, init, self.log_dir, env=env)

    @contextlib.contextmanager
    def _gpu_alone(self) -> Iterator[None]:
        if self.scheduler is None:
            yield
        else:
            with self.scheduler.exclusive():
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

    def primary(self, name: str) -> Worker:
        """The worker that described ``name``: the one that sweeps memory and times speed."""
        return self._workers[name]

    def new_worker(self, name: str) -> Worker:
        """One more worker for ``name`` (started by its first request), for the scheduler."""
        init, env = self._starts[name]
        self._extra_count[name] = self._extra_count.get(name, 0) + 1
        worker = self._new_worker(f"{name}.{self._extra_count[name] + 1}", init, {**(env or {}), **self.extra_env})
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

    def worker_under(self, name: str, launcher: list[str], *, env: dict[str, str], label: str,
                     shutdown_timeout: float) -> Worker:
        """A worker of ``name`` that runs under ``launcher`` (compute-sanitizer), for one check."""
        init, own_env = self._starts[name]
        return WorkerProcess(label, init, self.log_dir, env={**self.env, **(own_env or {}), **env}, launcher=launcher,
                             shutdown_timeout=shutdown_timeout)

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

    def request(self, name: str, request: Request, *, worker: Worker | None = None,
                suite: str | None = None) -> Reply:
        """Send a suite request to ``name``'s primary worker (or to ``worker``, one of its
        workers that has the case warmed up), with the GPU to itself. The ledger counts it under
        ``suite``, else its op's suite (:data:`SUITE_OF_OP`): the sanitize suite's runs are ``warm``
        requests, and are not the warm-ups of the memory and speed suites."""
        with self._gpu_alone():
            started = time.monotonic()
            self.ledger.began()
            if worker is None and name in self._workers:
                worker = self._workers[name]
            if self.scheduler is not None:
                # Other workers share the GPU: what this request cached must not crowd out the next.
                request = dataclasses.replace(request, release_memory=True)
            reply = self.ask(worker, name, request) if worker is not None else self.broken_reply(name)
            tries, everyone = 0, False
            while worker is not None and reply.status is Status.OUT_OF_MEMORY and not everyone:
                # Other workers' processes still hold device memory: end enough of them (then
                # all) and try again.
                tries += 1
                if self.scheduler is not None:
                    stopped, everyone = self.scheduler.make_room(worker, reply, attempt=tries)
                else:
                    stopped, everyone = self.stop_others(worker), True
                if not stopped:
                    break
                self.ledger.cleared_gpu(name, stopped)
                reply = self.ask(worker, name, request)
            self.ledger.record(suite or suite_of(request), name, reply.spent, started,
                               time.monotonic())
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
        if self.scheduler is not None:
            self.scheduler.close()
            self.scheduler = None
        once = [worker for worker, _ in self._once.values()]
        self._once.clear()
        close_all([*self._workers.values(), *once])  # a worker still starting is killed
        self._once_threads.shutdown(wait=False, cancel_futures=True)
        self._workers.clear()
        shutil.rmtree(self.log_dir, ignore_errors=True)
