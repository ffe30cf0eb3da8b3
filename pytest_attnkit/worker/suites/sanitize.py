"""The sanitize suite's worker handler: the case on plain inputs, then on guarded copies of them
(the memcheck tests' run outside the tool, :func:`pytest_attnkit.worker.guards.check_guarded`).
The other tools' runs are warm-ups, a core op of the worker."""

from __future__ import annotations

from pytest_attnkit.messages import Reply, Request
from pytest_attnkit.worker.suite import SuiteHandler, WorkerContext


class SanitizeHandler(SuiteHandler):
    def handle(self, context: WorkerContext, request: Request) -> Reply:
        from pytest_attnkit.worker.guards import check_guarded

        assert request.case is not None
        return check_guarded(context.impl, request.case, device=context.device, seed=request.seed,
                             backward=request.backward)
