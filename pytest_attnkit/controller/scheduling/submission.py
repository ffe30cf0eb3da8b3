"""Submission: what both schedulers share (:class:`Submissions`). Runs in the pytest process.

A request submitted becomes a :class:`~pytest_attnkit.controller.scheduling.job.Job`; one of an
implementation that could not be loaded is answered at once with the load error (there is no
worker to ask). What happens to the others is the scheduler's: queued for the threads of
:class:`pytest_attnkit.controller.scheduler.Scheduler`, or kept until a test waits for it by
:class:`pytest_attnkit.controller.inline.InlineScheduler`.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Protocol

from pytest_attnkit.controller.process import Launch
from pytest_attnkit.controller.scheduling.job import Job
from pytest_attnkit.messages import Isolation, Reply, Request


class Described(Protocol):
    """What submission asks of the pool: whether an implementation loaded, and the reply if not."""

    def info(self, name: str) -> Any: ...

    def broken_reply(self, name: str) -> Reply: ...


class Submissions:
    """The scheduler's interface on the pytest thread's side: :meth:`submit` (then ``wait``)."""

    def __init__(self, pool: Described) -> None:
        self.pool = pool
        self._seq = itertools.count()

    def submit(self, impl: str, suite: str, request: Request, *, gpu_bytes: int = 0, warm: bool = False,
               after: Job | None = None, follows: Callable[[Reply], bool] | None = None, same_worker: bool = False,
               isolation: Isolation = Isolation.SHARED, tag: str | None = None, launch: Launch | None = None) -> Job:
        """Submit ``request`` for ``impl``; its reply comes through ``wait``. ``after``: start
        only once that job has ended; with ``follows``, only if it says yes of that job's reply
        (else the future is cancelled); with ``same_worker``, in the worker that ran it.
        ``isolation`` DEDICATED: in a worker of its own per (``impl``, ``tag``); ``launch``: in a
        worker started under a launcher for it alone."""
        job = Job(impl, suite, request, int(gpu_bytes), next(self._seq), warm=warm, after=after, follows=follows,
                  same_worker=same_worker, isolation=isolation, tag=tag, launch=launch)
        if self.pool.info(impl).load_error:  # no worker to ask: the reply is the load error
            job.future.set_result(self.pool.broken_reply(impl))
        else:
            self._queue(job)
        return job

    def _queue(self, job: Job) -> None:
        """Take a job of an implementation that loaded."""
        raise NotImplementedError
