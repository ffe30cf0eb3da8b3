"""The correctness suite: run one case in the implementation's worker, judge the test.

The worker does the work (:mod:`pytest_attnkit.worker.correctness`: fresh seeded inputs, the
contract, the float64 oracle and the rule); this side names the seed that decided, says how to
rerun just that test, and records the errors as the test's junit properties and, through the
judgement's ``record``, in the report document, passed or failed.

Which accuracy judges a case is chosen here (the hook ``pytest_attnkit_accuracy``, through the
``accuracy`` callable of the run's parts) and sent with the request; with none chosen, the worker
uses the implementation's declared ``accuracy``.

It is a :class:`~pytest_attnkit.controller.suite.Suite`: its plan is the one request of a test,
which the runner (:mod:`pytest_attnkit.controller.runner`) sends ahead of the test or as it runs;
the reply is the same either way, and :meth:`CorrectnessCheck.judge` reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, ClassVar, Sequence

from pytest_attnkit.contract import AccuracyBudget, Case, MemoryClass, accuracy_to_wire
from pytest_attnkit.controller import footprint
from pytest_attnkit.controller.outcome import Judgement, Outcomes, Verdict
from pytest_attnkit.controller.pool import WorkerPool
from pytest_attnkit.controller.suite import Planned, Properties, RunParts, Suite, SuiteContext, SuiteItem, TestSpec
from pytest_attnkit.messages import Op, Reply, Request
from pytest_attnkit.records import CorrectnessResult

#: The figures each comparison puts in the junit properties, ``attnkit_<name>_<figure>``.
PROPERTY_FIGURES = ("max_error", "allowed", "headroom", "rel_l1", "row_rel_l1", "cosine", "rmse")


@dataclass
class CorrectnessCheck(Suite):
    """The correctness suite: one request per test, judged by the worker's rule."""

    name: ClassVar[str] = "correctness"
    handler: ClassVar[str] = "pytest_attnkit.worker.suites.correctness:CorrectnessHandler"
    tests: ClassVar[tuple[TestSpec, ...]] = (TestSpec("test_forward", "correctness"),
                                             TestSpec("test_backward", "correctness", backward=True))

    pool: WorkerPool
    outcomes: Outcomes
    seed: int
    trials: int
    #: The accuracy chosen for one (implementation, case), or None for the implementation's own.
    accuracy: Callable[[str, Case], "str | AccuracyBudget | None"] | None = None
    #: What the rerun line repeats of this run's command line beyond the test: the profile and
    #: the device where they were given there (they choose the case set; a pytest.ini or the
    #: environment gives them to the rerun too).
    rerun_options: tuple[str, ...] = ()

    @classmethod
    def build(cls, context: SuiteContext, parts: RunParts) -> CorrectnessCheck:
        settings = context.settings
        given = tuple(f"--attnkit-{name}={getattr(settings, name)}" for name in ("profile", "device")
                      if settings.sources.get(name, "default").startswith("command line"))
        return cls(parts.pool, context.outcomes, context.seed, settings.trials, accuracy=parts.accuracy,
                   rerun_options=given)

    def _request(self, impl: str, case: Case, backward: bool) -> Request:
        options: dict[str, Any] = {"trials": self.trials}
        chosen = self.accuracy(impl, case) if self.accuracy is not None else None
        if chosen is not None:
            options["accuracy"] = accuracy_to_wire(chosen)
        return Request(Op.RUN, case, backward, self.seed, options, suite=self.name)

    def plan(self, item: SuiteItem) -> list[Planned]:
        """The test's check, estimated with the references it builds (the float64 oracle's scores)."""
        assert item.case is not None
        linear = self.pool.info(item.impl).capabilities.get("memory_class") == MemoryClass.LINEAR
        return [Planned(self._request(item.impl, item.case, item.backward),
                        footprint.request_bytes(item.case, backward=item.backward, references=True,
                                                linear_memory=linear))]

    def judge(self, item: SuiteItem, replies: Sequence[Reply | None], **fixtures: Any) -> Judgement:
        """The reply's judgement, with the errors as junit properties and, for the report, the
        comparisons (:attr:`Judgement.record`), passed or failed."""
        impl, case = item.impl, item.case
        assert case is not None
        reply = replies[0]
        assert reply is not None  # not a warm-up: always sent
        result = CorrectnessResult.from_dict(reply.data) if reply.data else CorrectnessResult(self.trials)
        properties: Properties = []
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
            # The test's whole name, brackets included: -k matches substrings, and a case's id
            # may begin another's (b1-...-causal, b1-...-causal-w16:0-lse in the smoke set).
            rerun = " ".join(["pytest", "--attnkit", f"--attnkit-impl={impl}", f"--attnkit-seed={self.seed}",
                              *self.rerun_options, f"-k '{item.spec.function}[{impl}-{case.id}]'"])
        judgement = self.outcomes.from_reply(reply, impl=impl, where=case.id, seed=seed, rerun=rerun,
                                             origin=self.pool.info(impl).origin) or Judgement(Verdict.PASSED)
        record = dict(judgement.record or {})  # a refusal's mark (outcome.refused) stays
        if result.comparisons:
            record["comparisons"] = [comparison.to_dict() for comparison in result.comparisons]
        return replace(judgement, properties=tuple(properties), record=record or None)
