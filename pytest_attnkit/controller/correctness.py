"""The correctness suite's check: run one case in the implementation's worker, settle the test.

The worker does the work (:mod:`pytest_attnkit.worker.correctness`: fresh seeded inputs, the
contract, the float64 oracle and the rule); this side names the seed that decided, says how to
rerun just that test, and records the errors as the test's junit properties.
"""

from __future__ import annotations

from dataclasses import dataclass

from pytest_attnkit.contract import Case
from pytest_attnkit.controller.outcome import Outcomes
from pytest_attnkit.controller.pool import WorkerPool
from pytest_attnkit.records import CorrectnessResult

Properties = list[tuple[str, object]]


@dataclass
class CorrectnessCheck:
    pool: WorkerPool
    outcomes: Outcomes
    seed: int
    trials: int

    def check(self, impl: str, case: Case, *, backward: bool, properties: Properties | None = None) -> CorrectnessResult:
        reply = self.pool.request(impl, {"op": "correctness", "case": case.to_dict(), "backward": backward,
                                         "base_seed": self.seed, "trials": self.trials})
        result = CorrectnessResult.from_dict(reply.data) if reply.data else CorrectnessResult(self.trials)
        if properties is not None:
            for comparison in result.comparisons:
                properties.append((f"attnkit_{comparison.name}_max_error", comparison.max_error))
                properties.append((f"attnkit_{comparison.name}_allowed", comparison.allowed))
            if result.seed is not None:
                properties.append(("attnkit_seed", result.seed))
        rerun = ""
        if result.seed is not None:
            rerun = (f", seed {result.seed} (trial {(result.trial or 0) + 1} of {result.trials}); rerun with "
                     f"pytest --attnkit --attnkit-impl={impl} --attnkit-seed={self.seed} -k '{impl} and {case.id}'")
        self.outcomes.settle(reply, impl=impl, where=case.id, rerun=rerun, origin=self.pool.info(impl).origin)
        return result
