"""The properties suite: behaviour the oracle cannot see, held to what is declared.

Each test asks the implementation's worker to run one property check on one case
(:mod:`pytest_attnkit.worker.properties`): determinism (forward, and backward), batch invariance,
capture and replay in a CUDA graph, ``torch.compile(fullgraph=True)``, and
``torch.library.opcheck`` for an implementation that names its custom op. A property the
implementation declares (``deterministic``, ``batch_invariant``, ``supports_cuda_graphs``,
``supports_torch_compile``, ``custom_op``) fails the test when it does not hold; one it does not
declare is checked all the same and reported (the summary's ``properties`` line, the report's
``properties`` section), without failing: an author sees what to declare, or what to fix.

Each check is a :class:`~pytest_attnkit.properties.Property` of :data:`~pytest_attnkit.properties.PROPERTIES`,
the one list: the suite's test functions (one per property and direction), the skips
(:meth:`Property.not_applicable`) and the failures' words come from it. Like correctness cases,
property checks run ahead of their tests, beside each other, when a
:mod:`~pytest_attnkit.controller.scheduler` runs: each test's plan (:meth:`PropertyCheck.plan`) is its
one request, which the runner (:mod:`pytest_attnkit.controller.runner`) sends; the torch.compile
check's in a worker of its own per implementation (:attr:`Property.isolation`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping, Sequence

from pytest_attnkit.contract import Case, MemoryClass
from pytest_attnkit.controller import footprint
from pytest_attnkit.controller.outcome import Judged, Judgement, Outcomes, failed, skipped
from pytest_attnkit.controller.pool import WorkerPool
from pytest_attnkit.controller.suite import (Planned, Properties, RunParts, Suite, SuiteContext, SuiteItem, TestSpec,
                                            verdict_of)
from pytest_attnkit.messages import Op, Reply, Request, Status
from pytest_attnkit.properties import PROPERTIES, Property, by_name


@dataclass
class PropertyCheck(Suite):
    """The properties suite: one request per test, a check of one property on one case."""

    name: ClassVar[str] = "properties"
    handler: ClassVar[str] = "pytest_attnkit.worker.suites.properties:PropertiesHandler"
    #: A test function per property and direction, in :data:`PROPERTIES`' order.
    tests: ClassVar[tuple[TestSpec, ...]] = tuple(
        TestSpec(check.test_function(direction), "properties", backward=direction == "backward",
                 params={"check": check.name})
        for check in PROPERTIES for direction in check.directions)

    pool: WorkerPool
    outcomes: Outcomes
    seed: int
    device: str
    #: Every check's result, for the report and the summary.
    results: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def build(cls, context: SuiteContext, parts: RunParts) -> PropertyCheck:
        return cls(parts.pool, context.outcomes, context.seed, context.device)

    def report_sections(self, document: Mapping[str, Any]) -> dict[str, Any]:
        return {"properties": list(self.results)}

    def skip_reason(self, check: Property, impl: str, case: Case) -> str | None:
        """Why this check does not apply to this implementation and case, or None."""
        return check.not_applicable(impl, case, self.pool.info(impl).capabilities, self.device)

    def plan(self, item: SuiteItem) -> list[Planned]:
        """The test's check, where it applies (none where :meth:`skip_reason` has a reason), in
        the worker its property asks for (:attr:`Property.isolation`)."""
        check, case = by_name(item.spec.params["check"]), item.case
        assert case is not None
        if self.skip_reason(check, item.impl, case) is not None:
            return []
        linear = self.pool.info(item.impl).capabilities.get("memory_class") == MemoryClass.LINEAR
        return [Planned(Request(Op.RUN, case, item.backward, self.seed, {"check": check.name}, suite=self.name),
                        footprint.request_bytes(case, backward=item.backward, references=True, linear_memory=linear),
                        isolation=check.isolation, tag=check.name)]

    def judge(self, item: SuiteItem, replies: Sequence[Reply | None], **fixtures: Any) -> Judgement:
        """Skip a check that does not apply; fail a declared property that does not hold; report
        one that is not declared, passed."""
        check, impl, case = by_name(item.spec.params["check"]), item.impl, item.case
        assert case is not None
        reason = self.skip_reason(check, impl, case)
        if reason:
            return skipped(reason)
        reply = replies[0]
        assert reply is not None  # not a warm-up: always sent
        return verdict_of(lambda properties: self._check(check, impl, case, item.backward, reply, properties))

    def _check(self, check: Property, impl: str, case: Case, backward: bool, reply: Reply,
               properties: Properties) -> None:
        where = f"{case.id}{' (backward)' if backward else ''}"
        found = reply.data if reply.data.get("check") == check.name else None
        if found is not None:
            self.results.append({"impl": impl, "check": check.name, "case": case.id, "backward": backward,
                                 "declared": found["declared"], "holds": found["holds"], "detail": found["detail"],
                                 "figures": found.get("figures", {})})
            properties.append((f"attnkit_{check.name}", "holds" if found["holds"] else "does not hold"))
            properties.append((f"attnkit_{check.name}_declared", found["declared"]))
        if found is not None and reply.status is Status.WRONG:
            raise Judged(failed(f"{impl} declares {check.declaration}, and on {where}: {found['detail']}"))
        self.outcomes.check(reply, impl=impl, where=f"{where} ({check.title} check)",
                            origin=self.pool.info(impl).origin)
