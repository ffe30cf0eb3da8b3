"""The speed suite's worker handler: time a case (:func:`pytest_attnkit.worker.speed.measure_speed`),
or, with ``options["samples"]``, take only that many samples of a call kept warm between requests
(an A/B run alternates such blocks between two workers) and say how many samples the budget would
give (``planned_samples``). With ``options["program"]`` (a run that saves baselines, where the
case's warm-up read no program), the reply also says which kernels a call launches. The warm
call is dropped before any other request: another suite's (:meth:`SpeedHandler.forget`, called
by the worker), or a speed request that is no block."""

from __future__ import annotations

import json
import sys
from typing import Any

from pytest_attnkit.contract import AttentionImpl, Case
from pytest_attnkit.messages import Reply, Request, Status
from pytest_attnkit.worker.suite import SuiteHandler, WorkerContext


def _program(impl: AttentionImpl, request: Request) -> str | None:
    """The kernels one call of the timed case launches (read after its timing, in the worker that
    timed it: the program the timing measured); None where the profiler cannot say."""
    from pytest_attnkit.worker.speed import kernel_program

    assert request.case is not None
    try:
        return kernel_program(impl, request.case, request.mode, seed=request.seed)
    except Exception as error:  # a profiler that cannot start: the program stays unknown
        print(f"attnkit: the kernels of {request.case.id} could not be read: {error!r}", file=sys.stderr)
        return None


class SpeedHandler(SuiteHandler):
    def __init__(self) -> None:
        #: The call an A/B run samples in blocks, kept warm between requests.
        self._warm_key: tuple[Any, ...] | None = None
        self._warm_call: Any = None
        self._warm_sets = 1
        self._warm_syncs: str | None = None

    def forget(self) -> None:
        self._warm_key, self._warm_call = None, None  # its inputs must not weigh on other measurements

    def handle(self, context: WorkerContext, request: Request) -> Reply:
        from pytest_attnkit.worker.speed import gpu_processes, gpu_state, measure_speed

        assert request.case is not None
        if not request.option("samples"):
            self.forget()
        cuda = context.device == "cuda"
        beside = gpu_processes() if cuda else None  # others on the GPU, before and after
        if request.option("samples"):
            measured = self._block(context.impl, request.case, request, context.device)
        else:
            measured = measure_speed(context.impl, request.case, request.mode, device=context.device,
                                     seed=request.seed, budget_ms=request.options["budget_ms"],
                                     call_limit_ms=request.option("call_limit_ms"),
                                     # a process's first call also pays its start: a second call decides
                                     first_call_limit_ms=None if context.process_first
                                     else request.option("first_call_limit_ms"))
        if cuda:
            measured["gpu_state"] = gpu_state()
            measured["gpu_processes"] = gpu_processes(beside)
            if request.option("program") and "timing" in measured and not request.option("samples"):
                measured["program"] = _program(context.impl, request)
        return Reply(Status.OK, "", measured)

    def _block(self, impl: AttentionImpl, case: Case, request: Request, device: str) -> dict[str, Any]:
        from pytest_attnkit.worker.speed import warm_speed

        mode = request.mode
        key = (case.id, json.dumps(case.to_dict(), sort_keys=True), mode, request.seed)
        if self._warm_key != key:
            self._warm_call = None  # frees the previous case's inputs before making this one's
            self._warm_call, self._warm_sets, self._warm_syncs = warm_speed(impl, case, mode, device=device,
                                                                            seed=request.seed)
            self._warm_key = key
        warmed = self._warm_call
        planned = warmed.sample_count(request.options["budget_ms"])
        timing = warmed.timing(warmed.samples(int(request.options["samples"])))
        return {"timing": timing.to_dict(), "input_sets": self._warm_sets, "planned_samples": planned,
                "long_call": warmed.long_call, "syncs": self._warm_syncs}
