"""The bounds suite's pytest side: which tests it has, what each one asks a worker, and how a
reply becomes the test's outcome. Registered in pyproject.toml's ``attnkit.suites`` group."""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from attnkit_example_suite.worker import BoundsFinding
from pytest_attnkit import Case, Judgement, Planned, Suite, SuiteItem, TestSpec, Verdict
from pytest_attnkit.contract import is_fp8
from pytest_attnkit.messages import Op, Reply, Request


class BoundsSuite(Suite):
    """Each output element lies between the smallest and the largest value of V over the keys."""

    name = "bounds"
    handler = "attnkit_example_suite.worker:BoundsHandler"
    # One test function, test_bounds, on the correctness suite's cases (the ones accepted below).
    tests = (TestSpec("test_bounds", cases="correctness"),)

    def accepts(self, spec: TestSpec, case: Case) -> bool:
        """Dense cases where every query sees a key and V is what the output averages: no sinks
        (a sink takes weight without a value), no FP8 (V is scaled by a descale)."""
        return (case.kind == "dense" and not case.sinks and not is_fp8(case.dtype) and case.window is None
                and not (case.causal and case.seqlen_q > case.seqlen_k))

    def plan(self, item: SuiteItem) -> list[Planned]:
        return [Planned(Request(Op.RUN, item.case, False, self.context.seed, suite=self.name))]

    def judge(self, item: SuiteItem, replies: Sequence[Reply | None], **fixtures: Any) -> Judgement:
        reply = replies[0]
        assert reply is not None and item.case is not None
        found = BoundsFinding.from_dict(reply.data) if "worst_excess" in reply.data else None
        properties = (("attnkit_bounds_worst_excess", found.worst_excess),) if found else ()
        record = {"bounds": found.to_dict()} if found else None
        # The harness's wording for every status (wrong, raised, unsupported, a crashed worker...).
        judgement = self.context.outcomes.from_reply(reply, impl=item.impl, where=item.case.id,
                                                     seed=f", seed {self.context.seed}")
        if judgement is None:
            return Judgement(Verdict.PASSED, properties=properties, record=record)
        return dataclasses.replace(judgement, properties=properties, record=record)
