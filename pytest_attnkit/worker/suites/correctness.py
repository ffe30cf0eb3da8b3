"""The correctness suite's worker handler: one case checked against the oracle
(:func:`pytest_attnkit.worker.correctness.run_correctness`)."""

from __future__ import annotations

from pytest_attnkit.messages import Reply, Request
from pytest_attnkit.worker.suite import SuiteHandler, WorkerContext


class CorrectnessHandler(SuiteHandler):
    def handle(self, context: WorkerContext, request: Request) -> Reply:
        from pytest_attnkit.worker.correctness import run_correctness

        assert request.case is not None
        return run_correctness(context.impl, request.case, device=context.device, base_seed=request.seed,
                               trials=request.options["trials"], backward=request.backward,
                               accuracy=request.option("accuracy"))
