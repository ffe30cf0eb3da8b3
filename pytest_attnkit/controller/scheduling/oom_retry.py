"""The out-of-memory retry: when a reply that ran out of device memory counts. Runs in the pytest
process, on the jobs' threads.

A request that runs out of device memory while another ran beside it is run again alone; one that
runs out alone is run again after idle workers are stopped until what it lacked is free
(:meth:`pytest_attnkit.controller.pool.WorkerPool.evict`; up to ``ROOM_ROUNDS`` times, each by the
latest failure's figures), then after every other worker is stopped (idle workers hand back what
torch and CuPy cached, not their CUDA contexts, the kernels they loaded, nor what an
implementation keeps), and only the last reply counts: an out-of-memory caused by a neighbour is
never the kernel's failure, and one with the GPU to itself is a case that does not fit, which its
test skips with the numbers (:mod:`pytest_attnkit.worker.out_of_memory`). Out of memory is a
status (``Status.OUT_OF_MEMORY``), never read from a message.
"""

from __future__ import annotations

from collections.abc import Collection
from enum import Enum
from typing import Protocol

from pytest_attnkit.controller.ledger import Ledger
from pytest_attnkit.controller.pool import ROOM_ROUNDS
from pytest_attnkit.controller.process import Worker
from pytest_attnkit.controller.scheduling.job import Job
from pytest_attnkit.messages import Reply, Status


class Again(Enum):
    """How a job that ran out of memory runs again."""

    ALONE = "alone"  # it ran beside others: again with nothing beside it
    WITH_ROOM = "with room"  # it ran alone: again once idle workers are stopped


def beside(job: Job, running: Collection[Job]) -> None:
    """``job`` starts while ``running`` run: each of them ran beside another (an out-of-memory
    then runs again alone)."""
    for other in running:
        other.shared = True
    job.shared = job.shared or bool(running)


def retries(job: Job, reply: Reply) -> bool:
    """Whether ``reply`` sends ``job`` to run again rather than being its reply."""
    return reply.status is Status.OUT_OF_MEMORY and job.cleared <= ROOM_ROUNDS


def run_again(job: Job, reply: Reply) -> Again:
    """Mark ``job`` to run again after ``reply`` ran out of memory (see :func:`retries`)."""
    if job.shared:  # beside others: again, alone
        job.alone, job.shared, job.first_oom = True, False, reply
        return Again.ALONE
    # alone: again with room made (ROOM_ROUNDS times), then with every other worker stopped
    job.alone, job.cleared, job.first_oom = True, job.cleared + 1, reply
    return Again.WITH_ROOM


def room_round(job: Job) -> "tuple[Reply | None, bool] | None":
    """Before a job runs again: None (no room to make), or the failure whose figures say how much
    room to make, and whether every other worker is to be stopped (after ``ROOM_ROUNDS`` rounds)."""
    if not job.cleared:
        return None
    return job.first_oom, job.cleared > ROOM_ROUNDS


def room_made(job: Job, everyone: bool) -> None:
    """Room was made for ``job``; if every other worker was stopped, its next reply is the last."""
    if everyone:
        job.cleared = ROOM_ROUNDS + 1


def make_room(job: Job, worker: Worker, pool: "Evicts", ledger: Ledger) -> None:
    """Before ``job`` runs again in ``worker`` after running out of memory alone: stop idle
    workers (:func:`room_round` says how many), and count them in the ledger."""
    room = room_round(job)
    if room is None:
        return
    failed, every = room
    stopped, everyone = pool.evict(worker, failed, every=every)
    ledger.cleared_gpu(job.impl, stopped)
    room_made(job, everyone)


class Evicts(Protocol):
    """What :func:`make_room` asks of the pool (:meth:`~pytest_attnkit.controller.pool.WorkerPool.evict`)."""

    def evict(self, keep: Worker, failed: Reply | None, *, every: bool = False) -> tuple[int, bool]: ...
