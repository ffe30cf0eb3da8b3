"""The memory suite's worker handler: one point of a sweep
(:func:`pytest_attnkit.worker.memory.measure_point`). A point that ran out of memory replies
``Status.OUT_OF_MEMORY`` with the point as its data: the scheduler reads the status (run it again
with the GPU to itself), and the memory suite reads the point (the sweep's end)."""

from __future__ import annotations

from pytest_attnkit.messages import Reply, Request, Status
from pytest_attnkit.records import PointStatus
from pytest_attnkit.worker.suite import SuiteHandler, WorkerContext


class MemoryHandler(SuiteHandler):
    def handle(self, context: WorkerContext, request: Request) -> Reply:
        from pytest_attnkit.worker.memory import measure_point, release_device_memory

        assert request.case is not None
        point = measure_point(context.impl, request.case, backward=request.backward, seed=request.seed,
                              call_limit_ms=request.option("call_limit_ms"))
        release_device_memory()
        if point.status is PointStatus.OOM:
            return Reply(Status.OUT_OF_MEMORY, point.message, point.to_dict())
        return Reply(Status.OK, "", point.to_dict())
