"""One request submitted ahead of its test (:class:`Job`): what the scheduler's policies read.
Runs in the pytest process; the scheduler's threads and the pytest thread share jobs."""

from __future__ import annotations

import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable

from pytest_attnkit.controller.process import Launch, Worker
from pytest_attnkit.messages import Isolation, Reply, Request


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
    #: workers are stopped until what its latest failure lacked is free
    #: (:meth:`pytest_attnkit.controller.pool.WorkerPool.evict`); ``ROOM_ROUNDS + 1``, every other
    #: worker is stopped (:mod:`pytest_attnkit.controller.scheduling.oom_retry`).
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
    #: A warm-up dropped unrun because its implementation's first calls show no setup
    #: (:mod:`pytest_attnkit.controller.scheduling.pruning`): its case's first call then tells
    #: how long a call takes.
    pointless: bool = False
    #: A test waits for its reply now (:meth:`pytest_attnkit.controller.scheduler.Scheduler.wait`):
    #: it starts before any other.
    awaited: bool = False
    #: Which worker it may run in: any of its implementation's (SHARED), or the one of its own per
    #: (implementation, ``tag``) (DEDICATED).
    isolation: Isolation = Isolation.SHARED
    tag: str | None = None
    #: Runs in a worker started under a launcher for it alone (the sanitize suite's run under
    #: compute-sanitizer), which the pool closes before the reply is handed on.
    launch: Launch | None = None
    #: How long its request took the last time it ran, or None (never run, or nothing remembered:
    #: :mod:`~pytest_attnkit.controller.scheduling.durations`). Where that was long it starts before
    #: the rest of its implementation's queue, longest first
    #: (:func:`~pytest_attnkit.controller.scheduling.order.first_ready`), and the work left in that
    #: queue counts it (:class:`~pytest_attnkit.controller.scheduling.order.WorkLeft`).
    last_s: float | None = None

    @property
    def dedicated(self) -> "tuple[str, str] | None":
        """The key of the worker of its own it runs in, or None (it runs in any)."""
        if self.isolation is not Isolation.DEDICATED:
            return None
        return self.impl, self.tag or self.suite

    @property
    def ledger_row(self) -> str:
        """Its row in the time table: its suite, or its suite's warm-ups."""
        return self.suite if not self.warm else f"{self.suite} (warm)"
