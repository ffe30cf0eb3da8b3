"""The worker pool: one worker per implementation, looked up by name, replaced when it dies.

The pool is the only way the pytest process talks to an implementation. It starts the workers
(in parallel: each one imports its implementation), keeps what each one said about itself
(:class:`ImplInfo`), and turns every request into a :class:`~pytest_attnkit.records.Reply`: a
worker that died or missed its deadline becomes a ``CRASHED`` or ``TIMEOUT`` reply (the next
request starts a fresh worker), an implementation that could not be loaded a ``BROKEN`` one.
What a reply means for the test is :func:`pytest_attnkit.controller.outcome.settle`'s to say.
"""

from __future__ import annotations

import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pytest_attnkit.controller.process import InProcessWorker, WorkerFailure, WorkerProcess
from pytest_attnkit.records import Reply, Status
from pytest_attnkit.registry import EntryPointRef


@dataclass(frozen=True)
class ImplInfo:
    """What the pytest process knows about one implementation, as its worker described it."""

    name: str
    entry_point: str
    distribution: str | None = None
    load_error: str | None = None
    unavailable: str | None = None
    capabilities: dict[str, Any] = field(default_factory=dict)

    @property
    def status(self) -> str:
        if self.load_error:
            return "broken"
        if self.unavailable:
            return "unavailable"
        return "available"

    @property
    def origin(self) -> str:
        return self.entry_point + (f" from {self.distribution}" if self.distribution else "")


class Worker(Protocol):
    def request(self, message: dict[str, Any], timeout: float) -> Any: ...

    def close(self) -> None: ...


class WorkerPool:
    """Workers for the selected implementations, plus short-lived ones (the probe, the ceilings).

    ``env`` is the environment every worker starts with (the interpreter flag for Triton on the
    CPU, the GPU an xdist worker is pinned to); ``inprocess`` runs the handlers in this process.
    """

    def __init__(self, *, device: str, timeout: float, env: dict[str, str] | None = None,
                 inprocess: bool = False) -> None:
        self.device = device
        self.timeout = timeout
        self.env = dict(env or {})
        self.inprocess = inprocess
        self.log_dir = Path(tempfile.mkdtemp(prefix="attnkit-workers-"))
        self.impls: dict[str, ImplInfo] = {}
        self._workers: dict[str, Worker] = {}

    def _new_worker(self, label: str, init: dict[str, Any], env: dict[str, str] | None = None) -> Worker:
        env = {**self.env, **(env or {})}
        if self.inprocess:
            return InProcessWorker(label, init, env=env)
        return WorkerProcess(label, init, self.log_dir, env=env)

    # -- one-off workers ----------------------------------------------------------------------
    def run_once(self, label: str, message: dict[str, Any], *, device: str | None = None) -> Any:
        """Start a worker with no implementation, send one request, stop it; raises
        :class:`WorkerFailure` when it dies."""
        worker = self._new_worker(label, {"device": device or self.device})
        try:
            return worker.request(message, self.timeout)
        finally:
            worker.close()

    # -- the implementations' workers ---------------------------------------------------------
    def start(self, refs: list[EntryPointRef], setups: dict[str, dict[str, Any]] | None = None) -> None:
        """Start one worker per implementation and ask each to describe itself. ``setups`` gives
        some implementations more for their workers: ``init`` entries (another version's sys.path)
        and ``env`` entries (its own compile caches); see :mod:`pytest_attnkit.controller.against`."""
        setups = setups or {}
        with ThreadPoolExecutor(max_workers=max(1, len(refs))) as threads:
            infos = list(threads.map(lambda ref: self._describe(ref, setups.get(ref.name, {})), refs))
        self.impls = {info.name: info for info in infos}

    def _describe(self, ref: EntryPointRef, setup: dict[str, Any]) -> ImplInfo:
        if ref.problem:
            return ImplInfo(ref.name, ref.value, ref.distribution, load_error=ref.problem)
        worker = self._new_worker(ref.name, {"device": self.device, "name": ref.name, "value": ref.value,
                                             **setup.get("init", {})}, setup.get("env"))
        self._workers[ref.name] = worker
        try:
            described = worker.request({"op": "describe"}, self.timeout)
        except WorkerFailure as failure:
            return ImplInfo(ref.name, ref.value, ref.distribution, load_error=str(failure))
        return ImplInfo(ref.name, ref.value, ref.distribution, load_error=described.get("load_error"),
                        unavailable=described.get("unavailable"), capabilities=described.get("capabilities", {}))

    @property
    def names(self) -> list[str]:
        return list(self.impls)

    def info(self, name: str) -> ImplInfo:
        return self.impls[name]

    def request(self, name: str, message: dict[str, Any]) -> Reply:
        """Send a suite request to ``name``'s worker; every outcome comes back as a Reply."""
        info = self.impls[name]
        if info.load_error:
            return Reply(Status.BROKEN, info.load_error)
        try:
            return Reply.from_wire(self._workers[name].request(message, self.timeout))
        except WorkerFailure as failure:
            status = Status.TIMEOUT if failure.kind == "timeout" else Status.CRASHED
            return Reply(status, str(failure))

    def support(self, name: str, queries: list[dict[str, Any]]) -> list[str | None] | None:
        """Why the implementation refuses each query (None where it does not); None when its
        worker could not answer (each test then meets the failure itself, with the details)."""
        try:
            return self._workers[name].request({"op": "support", "queries": queries}, self.timeout)
        except WorkerFailure:
            return None

    def close(self) -> None:
        for worker in self._workers.values():
            worker.close()
        self._workers.clear()
        shutil.rmtree(self.log_dir, ignore_errors=True)
