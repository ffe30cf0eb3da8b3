"""Admission: which requests may run together on one GPU (:class:`MemoryBudget`). Runs in the
pytest process, under the scheduler's lock.

Each request carries an estimate of the device memory it needs
(:mod:`pytest_attnkit.controller.footprint`); requests run together only while their estimates
fit ``budget_bytes``, and one that fits alone (or that ran out of memory beside another) runs
alone. Smaller requests (its own implementation's too) may start ahead of the earliest one while
it waits for room, for at most ``MAX_HOLD_S``; then nothing new starts until it has its room, and
once it has, it starts first. A warm-up never holds the others: nobody waits for it before the
GPU-alone phase (:func:`pytest_attnkit.controller.scheduling.order.choose`).
"""

from __future__ import annotations

import time
from collections.abc import Collection
from enum import Enum

from pytest_attnkit.controller.scheduling.job import Job

#: How long smaller requests may start ahead of one that waits for device memory.
MAX_HOLD_S = 20.0


class Hold(Enum):
    """What the earliest ready request's wait for room means for the others."""

    NONE = "none"  # it fits, and never waited: the order decides
    BLOCK = "block"  # it has waited MAX_HOLD_S for room: nothing else starts until it has it
    FIRST = "first"  # it waited, and its room has come: it starts before the others


class MemoryBudget:
    """The device memory the running requests' estimates take, against the budget (None: no budget)."""

    def __init__(self, budget_bytes: int | None) -> None:
        self.budget_bytes = budget_bytes
        self.running_bytes = 0

    def over(self, job: Job) -> bool:
        """Whether ``job`` alone needs more than the whole budget (it then runs alone)."""
        return self.budget_bytes is not None and job.gpu_bytes > self.budget_bytes

    def fits(self, job: Job, running: Collection[Job]) -> bool:
        """Whether ``job`` may start beside the ``running`` ones."""
        if job.alone or (running and any(other.alone for other in running)):
            return not running
        if self.budget_bytes is None or not running:
            return True
        return self.running_bytes + job.gpu_bytes <= self.budget_bytes

    def started(self, job: Job) -> None:
        self.running_bytes += job.gpu_bytes

    def ended(self, job: Job) -> None:
        self.running_bytes -= job.gpu_bytes

    def hold(self, earliest: Job, running: Collection[Job]) -> Hold:
        """The hold of the earliest ready request (see the module docstring); marks since when it
        has waited for room."""
        if not self.fits(earliest, running):
            earliest.held_since = earliest.held_since or time.monotonic()
            return Hold.BLOCK if time.monotonic() - earliest.held_since > MAX_HOLD_S else Hold.NONE
        return Hold.FIRST if earliest.held_since is not None else Hold.NONE
