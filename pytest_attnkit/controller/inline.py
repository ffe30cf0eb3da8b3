"""The inline scheduler: the scheduler's interface with ``--attnkit-jobs=1`` (and in-process), and
no threads.

Nothing runs ahead of the tests: :meth:`InlineScheduler.submit` only makes the job, and a job runs
when a test waits for it (:meth:`InlineScheduler.wait`), on the test's thread, after the job it
starts after (``after``, if ``follows`` says yes of its reply), in the implementation's primary
worker with the GPU to itself (:meth:`~pytest_attnkit.controller.pool.WorkerPool.request_alone`),
or in a worker started under a launcher for it alone (``launch``: the sanitize suite's run under
compute-sanitizer), which the pool closes before the reply is handed on. A warm-up is cancelled
unrun: the test's own request compiles what it needs. So one test's requests run in order, one at
a time, in one worker, as they did when each test sent its own.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from pytest_attnkit.controller.pool import WorkerPool
from pytest_attnkit.controller.scheduling import pruning
from pytest_attnkit.controller.scheduling.job import Job
from pytest_attnkit.controller.scheduling.submission import Submissions
from pytest_attnkit.messages import Reply


class InlineScheduler(Submissions):
    """Runs each job when its test waits for it, in order, on the test's thread."""

    budget_bytes: int | None = None  # no memory budget: one request at a time

    def __init__(self, pool: WorkerPool) -> None:
        super().__init__(pool)
        self.pool: WorkerPool = pool
        self._closed = False

    def _queue(self, job: Job) -> None:
        """Keep a submitted job until a test waits for it; a warm-up, or a job submitted once the
        run stops, is cancelled."""
        if job.warm or self._closed:
            job.future.cancel()

    def wait(self, job: Job) -> Reply:
        """Run ``job`` (after the job it starts after) and return its reply; a job cancelled unrun
        raises ``CancelledError``."""
        self._run(job)
        return job.future.result()

    def _run(self, job: Job) -> None:
        if job.future.done():
            return
        if job.after is not None:
            self._run(job.after)
            if pruning.stopped(job):
                job.future.cancel()
                return
        if self._closed:
            job.future.cancel()
            return
        if job.launch is None:
            job.worker = self.pool.primary(job.impl)
            job.future.set_result(self.pool.request_alone(job.impl, job.request, suite=job.ledger_row))
            return
        lease = self.pool.lease(job.impl, launch=job.launch)
        assert lease is not None  # one at a time: nothing else runs under a launcher
        job.worker = lease.worker
        try:
            reply = self.pool.request_alone(job.impl, job.request, worker=lease.worker, suite=job.ledger_row)
        finally:
            self.pool.finish(lease)  # the tool writes its summary as the worker exits
            self.pool.give_back(lease, warmed=False)
        job.future.set_result(reply)

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """The GPU alone: it always is."""
        yield

    def close(self) -> None:
        """The run stops: jobs not run yet are cancelled when waited for."""
        self._closed = True
