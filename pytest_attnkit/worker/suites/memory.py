"""The memory suite's worker handler: one point of a sweep
(:func:`pytest_attnkit.worker.memory.measure_point`). A point that ran out of memory replies
``Status.OUT_OF_MEMORY`` with the point as its data, and the failure's figures as any request's
(``out_of_memory``: :mod:`pytest_attnkit.worker.out_of_memory`): the scheduler reads the status and
the figures (run it again with the GPU to itself, room made by them), and the memory suite reads
the point (the sweep's end)."""

from __future__ import annotations

from dataclasses import replace

from pytest_attnkit.messages import Reply, Request, Status
from pytest_attnkit.records import MemoryPoint, PointStatus
from pytest_attnkit.worker.suite import SuiteHandler, WorkerContext


class MemoryHandler(SuiteHandler):
    def handle(self, context: WorkerContext, request: Request) -> Reply:
        from pytest_attnkit.worker.memory import measure_point, release_device_memory

        assert request.case is not None
        point = measure_point(context.impl, request.case, backward=request.backward, seed=request.seed,
                              call_limit_ms=request.option("call_limit_ms"))
        release_device_memory()
        if point.status is PointStatus.OOM:
            return out_of_memory_point(point)
        return Reply(Status.OK, "", point.to_dict())


def out_of_memory_point(point: MemoryPoint) -> Reply:
    """The reply for a point that ran out of memory: the point, its message cut to its first
    sentences, and the failure's figures as for any request's out-of-memory (the allocation asked
    for and the free bytes, from the whole message; what the processes on the GPU hold now), which
    the scheduler reads to make room before the point runs again and the time table lists."""
    from pytest_attnkit.worker.out_of_memory import device_memory, first_sentences, message_figures

    figures = {**message_figures(point.message), **device_memory()}
    short = replace(point, message=first_sentences(point.message))
    return Reply(Status.OUT_OF_MEMORY, short.message, {**short.to_dict(), "out_of_memory": figures})
