"""Fake worker processes for the pool's and the scheduler's tests (tests/controller/test_pool.py,
tests/controller/test_scheduler.py): a :class:`FakePool` is a real
:class:`~pytest_attnkit.controller.pool.WorkerPool` whose workers are :class:`FakeWorker` objects
that answer in this process, each request by ``behave(options, running)``, and whose stops are
recorded instead of ending processes. No process is started."""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

from pytest_attnkit.controller.impls import ImplInfo
from pytest_attnkit.controller.pool import WorkerPool
from pytest_attnkit.controller.process import WorkerFailure
from pytest_attnkit.messages import Op, Reply, Request, Spent, Status


def work(fields: dict[str, Any], op: Op = Op.RUN, suite: str | None = "correctness") -> Request:
    """A request whose options drive the fake pool: ``n`` names it, ``block`` holds it until the
    pool's release, ``seconds`` is how long it runs, ``compile_s`` how long it says it compiled."""
    return Request(op, options=fields, suite=suite if op is Op.RUN else None)


class FakeWorker:
    pids = itertools.count(1000)

    def __init__(self, pool: "FakePool", name: str) -> None:
        self.pool, self.name = pool, name
        self.startup_s = 0.0
        self.closed = False
        self.pid = next(FakeWorker.pids)
        self.process = type("Process", (), {"pid": self.pid})()

    def request(self, request: Request, timeout: float) -> Reply:
        if self.closed:
            raise WorkerFailure("closed", "closed")
        return self.pool.serve(self, request)

    @property
    def alive(self) -> bool:
        return not self.closed

    def stop(self) -> bool:
        return not self.closed

    def close(self) -> None:
        self.closed = True
        self.pool.release.set()


class FakePool(WorkerPool):
    """Answers each request with ``behave(options, running)`` (the request's options), where
    ``running`` counts the requests in flight at that moment; records how many ran at once, the
    order they ran in, and each time workers were stopped to make room."""

    def __init__(self, names: tuple[str, ...] = ("a", "b"), behave: Any = None, seconds: float = 0.02) -> None:
        super().__init__(device="cpu", timeout=10.0)
        self.impls = {name: ImplInfo(name, f"fake:{name}") for name in names}
        self.primaries = {name: FakeWorker(self, name) for name in names}
        self._workers = dict(self.primaries)
        self._all = list(self.primaries.values())
        self.extras: list[FakeWorker] = []
        self.behave = behave or (lambda message, running: Reply(Status.OK, "", {"echo": message.get("n")}))
        self.seconds = seconds
        self.count_lock = threading.Lock()
        self.running = 0
        self.most = 0
        self.order: list[Any] = []
        self.release = threading.Event()
        #: How many times workers were stopped to make room.
        self.stops = 0

    def new_worker(self, name: str) -> FakeWorker:  # type: ignore[override]
        worker = FakeWorker(self, name)
        self.extras.append(worker)
        self._all.append(worker)
        return worker

    def stop_others(self, keep: Any) -> int:
        with self.count_lock:
            self.stops += 1
            self.order.append("stopped the others")
        return len(self.primaries) + len(self.extras) - 1

    def stop_workers(self, workers: list[Any]) -> int:
        with self.count_lock:
            self.stops += 1
            self.order.append(("stopped", tuple(sorted(worker.pid for worker in workers))))
        return len(workers)

    def serve(self, worker: FakeWorker, request: Request) -> Reply:
        message = request.options
        with self.count_lock:
            self.running += 1
            self.most = max(self.most, self.running)
            running = self.running
            self.order.append(message.get("n"))
        try:
            if message.get("block"):
                self.release.wait(10)
            else:
                time.sleep(message.get("seconds", self.seconds))
            with self.count_lock:
                running = max(running, self.running)  # the most that ran beside it, start or end
            reply = self.behave(message, running)
        finally:
            with self.count_lock:
                self.running -= 1
        return Reply(reply.status, reply.message, reply.data, spent=Spent(0.01, message.get("compile_s", 0.0)))

    def ask(self, worker: Any, name: str, request: Request) -> Reply:
        try:
            return worker.request(request, 10)
        except WorkerFailure as failure:
            return Reply(Status.CRASHED, str(failure))
