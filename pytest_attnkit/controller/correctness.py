"""The correctness suite's check: run one case in the implementation's worker, settle the test.

The worker does the work (:mod:`pytest_attnkit.worker.correctness`: fresh seeded inputs, the
contract, the float64 oracle and the rule); this side names the seed that decided, says how to
rerun just that test, and records the errors as the test's junit properties and, through
:attr:`CorrectnessCheck.results`, in the report document, passed or failed.

Which accuracy judges a case is chosen here (the hook ``pytest_attnkit_accuracy``, through the
``accuracy`` callable the session gives) and sent with the request; with none chosen, the worker
uses the implementation's declared ``accuracy``.

When a :mod:`~pytest_attnkit.controller.scheduler` runs requests ahead of the tests, the session
submits each selected test's request at collection (:meth:`CorrectnessCheck.submit`) and the test
waits for that reply; otherwise the test sends its request itself. The reply is the same either
way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from pytest_attnkit.contract import AccuracyBudget, Case, accuracy_to_wire
from pytest_attnkit.controller.outcome import Outcomes
from pytest_attnkit.controller.pool import WorkerPool
from pytest_attnkit.controller.scheduler import Job, Scheduler
from pytest_attnkit.messages import Op, Reply, Request
from pytest_attnkit.records import CorrectnessResult

Properties = list[tuple[str, object]]
#: (implementation, case id, backward): the key of one correctness test's result.
ResultKey = tuple[str, str, bool]
#: The figures each comparison puts in the junit properties, ``attnkit_<name>_<figure>``.
PROPERTY_FIGURES = ("max_error", "allowed", "headroom", "rel_l1", "row_rel_l1", "cosine", "rmse")


@dataclass
class CorrectnessCheck:
    pool: WorkerPool
    outcomes: Outcomes
    seed: int
    trials: int
    #: The accuracy chosen for one (implementation, case), or None for the implementation's own.
    accuracy: Callable[[str, Case], "str | AccuracyBudget | None"] | None = None
    #: Every check's result, pass or fail, for the report document.
    results: dict[ResultKey, CorrectnessResult] = field(default_factory=dict)
    #: The requests submitted ahead of their tests, in the order the tests will ask for them.
    ahead: dict[ResultKey, list[Job]] = field(default_factory=dict)

    def _request(self, impl: str, case: Case, backward: bool) -> Request:
        options: dict[str, Any] = {"trials": self.trials}
        chosen = self.accuracy(impl, case) if self.accuracy is not None else None
        if chosen is not None:
            options["accuracy"] = accuracy_to_wire(chosen)
        return Request(Op.CORRECTNESS, case, backward, self.seed, options)

    def submit(self, scheduler: Scheduler, impl: str, case: Case, *, backward: bool, gpu_bytes: int) -> None:
        """Queue the test's request now; :meth:`check` then waits for its reply."""
        job = scheduler.submit(impl, "correctness", self._request(impl, case, backward), gpu_bytes=gpu_bytes)
        self.ahead.setdefault((impl, case.id, backward), []).append(job)

    def _reply(self, impl: str, case: Case, backward: bool) -> Reply:
        submitted = self.ahead.get((impl, case.id, backward))
        if submitted and self.pool.scheduler is not None:
            return self.pool.scheduler.wait(submitted.pop(0))
        return self.pool.request(impl, self._request(impl, case, backward))

    def check(self, impl: str, case: Case, *, backward: bool, properties: Properties | None = None) -> CorrectnessResult:
        reply = self._reply(impl, case, backward)
        result = CorrectnessResult.from_dict(reply.data) if reply.data else CorrectnessResult(self.trials)
        self.results[(impl, case.id, backward)] = result
        if properties is not None:
            for comparison in result.comparisons:
                for figure in PROPERTY_FIGURES:
                    properties.append((f"attnkit_{comparison.name}_{figure}", getattr(comparison, figure)))
            if result.comparisons:
                properties.append(("attnkit_accuracy_rule", result.comparisons[0].rule))
            if result.seed is not None:
                properties.append(("attnkit_seed", result.seed))
        seed = rerun = ""
        if result.seed is not None:
            seed = f", seed {result.seed} (trial {(result.trial or 0) + 1} of {result.trials})"
            test = "test_backward" if backward else "test_forward"  # suites/test_correctness.py
            rerun = (f"pytest --attnkit --attnkit-impl={impl} --attnkit-seed={self.seed} "
                     f"-k '{test} and {impl} and {case.id}'")
        self.outcomes.check(reply, impl=impl, where=case.id, seed=seed, rerun=rerun,
                             origin=self.pool.info(impl).origin)
        return result
