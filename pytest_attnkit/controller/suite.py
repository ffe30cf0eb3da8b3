"""What a suite is to the session and the runner: :class:`Suite`, its :class:`TestSpec` per test
function, the :class:`SuiteItem` every collected test becomes, and the :class:`Planned` requests
an item needs.

A suite says, for one collected test (a :class:`SuiteItem`, worked out once at collection by
:func:`pytest_attnkit.controller.items.suite_item`), what the implementation is asked at
collection (:meth:`Suite.support_query`), what it refuses before anything runs
(:meth:`Suite.refusal`), which requests the test needs (:meth:`Suite.plan`) and, once their
replies are in, what the test's outcome is (:meth:`Suite.judge`). It never sends a planned request
itself, nor decides when: the runner (:mod:`pytest_attnkit.controller.runner`) sends the plan ahead
of the test through the scheduler, or on the test's own thread with ``--attnkit-jobs=1``, and
settles the judgement (:meth:`pytest_attnkit.controller.outcome.Outcomes.settle`). Follow-up
requests a judgement needs (speed's timing and confirmation rounds) the suite still sends through
the pool while it judges.

The session builds every suite the same way (:meth:`Suite.build`, with the run's
:class:`SuiteContext` and :class:`RunParts`) and knows none of them by name: it asks each one for
its lines of the header (:meth:`Suite.header_lines`), its sections of the report document
(:meth:`Suite.report_sections`), what it does as the run ends (:meth:`Suite.finish`: the speed
suite saves a baseline) and the summary's last lines (:meth:`Suite.closing_lines`: where the
sanitize suite kept its logs).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar

from pytest_attnkit.contract import Case
from pytest_attnkit.controller.outcome import Judged, Judgement, Outcomes, Verdict
from pytest_attnkit.controller.process import Launch
from pytest_attnkit.messages import Isolation, Reply, Request

if TYPE_CHECKING:
    from pytest_attnkit.controller.against import Revision
    from pytest_attnkit.contract import AccuracyBudget
    from pytest_attnkit.controller.impls import ImplInfo
    from pytest_attnkit.controller.options import Settings
    from pytest_attnkit.controller.pool import WorkerPool
    from pytest_attnkit.controller.scheduler import Job
    from pytest_attnkit.records import EntryKey

Properties = list[tuple[str, object]]


@dataclass(frozen=True)
class TestSpec:
    """One test function of a suite, by the function name its node id keeps."""

    __test__ = False  # not a pytest test class, whatever its name

    function: str  # "test_forward", "test_determinism_backward", "test_memory_window"
    cases: str | None = None  # its case family ("correctness", "speed-forward"); None: no attnkit_case (memory)
    backward: bool = False
    #: What is fixed per test function: {"check": "determinism"}, {"sweep": "window"}.
    params: Mapping[str, Any] = field(default_factory=dict, hash=False)
    per_tool: bool = False  # parametrized by attnkit_tool (sanitize)


@dataclass(frozen=True)
class SuiteItem:
    """One collected test of a suite: the key of every map of the tests' requests and results,
    worked out once at collection instead of from markers, function names and test arguments."""

    suite: str
    spec: TestSpec
    impl: str
    case: Case | None
    tool: str | None = None

    @property
    def backward(self) -> bool:
        return self.spec.backward


@dataclass(frozen=True)
class Planned:
    """One request an item needs, as the runner hands it to the scheduler
    (:meth:`pytest_attnkit.controller.scheduler.Scheduler.submit`)."""

    request: Request
    gpu_bytes: int = 0  # the footprint estimate the scheduler admits it by
    #: A warm-up: nobody needs its reply, only what it compiles. Not sent when nothing runs ahead,
    #: nor when it alone is over the scheduler's memory budget; its reply then reads None.
    warm: bool = False
    #: The index, in the same plan, of the request it starts after...
    after: int | None = None
    #: ...and only if this says yes of that one's reply (a memory sweep's next point: the point
    #: before measured); otherwise it is not run, and its reply reads None...
    follows: Callable[[Reply], bool] | None = None
    #: ...in the worker that ran that one (a sweep is measured in one process).
    same_worker: bool = False
    #: Which worker it runs in when it runs ahead: any of the implementation's (SHARED), or one of
    #: its own per (implementation, ``tag``) that no other request uses (DEDICATED: the
    #: torch.compile check, which resets torch's compile caches).
    isolation: Isolation = Isolation.SHARED
    tag: str | None = None
    #: In a worker started under a launcher for it alone (the sanitize suite's run under
    #: compute-sanitizer), closed before its reply is handed on.
    launch: Launch | None = None


@dataclass(frozen=True)
class SuiteContext:
    """What the session hands a suite installed through the ``attnkit.suites`` entry points when
    it builds it (``Suite(context)``): the run's settings and device, the wording of outcomes
    (:meth:`Outcomes.from_reply`), what each implementation said about itself, pytest's config."""

    settings: "Settings"
    device: str  # "cpu" or "cuda"
    profile: str  # the case set: "smoke", "default", ...
    outcomes: Outcomes
    info: Callable[[str], "ImplInfo"]  # an implementation's name -> its description (capabilities, availability)
    config: Any  # pytest.Config, for a suite's own hooks and options

    @property
    def seed(self) -> int:
        return self.settings.seed


@dataclass(frozen=True)
class RunParts:
    """The run's own parts, which the session hands :meth:`Suite.build` beside the
    :class:`SuiteContext`: what the bundled suites are built from. An installed suite needs none
    of them (the default :meth:`Suite.build` leaves them out)."""

    pool: "WorkerPool"
    environment: Mapping[str, Any]  # what the probe found (device name, memory meter, ...)
    #: The case set's choices (:class:`~pytest_attnkit.controller.selection.CaseSelection`): the
    #: accuracy of an (implementation, case), None for the implementation's own; the speed gate's
    #: threshold of a case; the A/B gate's.
    accuracy: Callable[[str, Case], "str | AccuracyBudget | None"]
    threshold: Callable[["EntryKey"], float]
    ab_threshold: Callable[["EntryKey"], float]
    jobs: int  # requests that may run at once
    revision: "Revision | None"  # --attnkit-against's REV, materialised
    #: The jobs the runner sent ahead for an item's plan (:meth:`Runner.sent`).
    sent: Callable[[SuiteItem], Sequence["Job | None"]]
    #: Why timings cannot be taken here (beside another pytest-xdist worker on one device), or None.
    parallel_problem: str | None


class Suite:
    """The contract of a suite, as the session and the runner use it.

    A subclass names itself (``name``: its ``--attnkit-suite`` name and ``attnkit_<name>`` marker),
    its worker handler (``handler``) and its test functions (``tests``), and gives :meth:`plan` and
    :meth:`judge`; the other
    methods have defaults that fit a suite whose tests each run one case."""

    name: ClassVar[str]
    #: Its worker handler, ``"package.module:Class"`` (a
    #: :class:`~pytest_attnkit.worker.suite.SuiteHandler`): imported in the worker processes only,
    #: where it answers the suite's :attr:`~pytest_attnkit.messages.Op.RUN` requests.
    handler: ClassVar[str]
    tests: ClassVar[tuple[TestSpec, ...]]

    def __init__(self, context: SuiteContext) -> None:
        """An installed suite is built with the run's :class:`SuiteContext` (the bundled suites
        take what they need one by one, in their :meth:`build`)."""
        self.context = context

    @classmethod
    def build(cls, context: SuiteContext, parts: RunParts) -> Suite | None:
        """The suite for this run, or None where it does not take part in it (sanitize and speed
        when ``--attnkit-suite`` leaves them out). An installed suite, built only when selected,
        is ``cls(context)``; the bundled suites take what they need of ``parts``."""
        return cls(context)

    def header_lines(self) -> list[str]:
        """Lines for the run's header, each shown after ``attnkit:`` (the speed suite's gate, the
        sanitize suite's tool)."""
        return []

    def report_sections(self, document: Mapping[str, Any]) -> dict[str, Any]:
        """The report document's keys this suite fills, from its results; ``document``: what is
        built so far (the environment, the implementations, the tests, ``against``). A bundled
        suite's keys are in every document, empty where it did not run
        (:func:`pytest_attnkit.controller.report.build`)."""
        return {}

    def finish(self, document: Mapping[str, Any], *, interrupted: bool) -> list[str]:
        """What the suite does once the document is built, before the report files are written
        (the speed suite saves a baseline); returns lines for the terminal summary. Run by the
        process that reports the run (under pytest-xdist, the controller), ``interrupted`` when
        the run was (Ctrl-C, SIGTERM)."""
        return []

    def closing_lines(self, document: Mapping[str, Any]) -> list[str]:
        """The terminal summary's last lines, after the report files' (the sanitize suite: where
        it kept compute-sanitizer's logs)."""
        return []

    @classmethod
    def spec(cls, function: str) -> TestSpec | None:
        """The test function of this suite named ``function``, or None."""
        return next((spec for spec in cls.tests if spec.function == function), None)

    def accepts(self, spec: TestSpec, case: Case) -> bool:
        """Whether the test function ``spec`` runs on ``case`` of its family (an installed suite's
        tests are made for the cases it accepts; the bundled suites' modules take the whole family)."""
        return True

    def refusal(self, item: SuiteItem) -> Judgement | None:
        """A skip decided at collection, before the implementation is asked anything; None to run it."""
        return None

    def support_query(self, item: SuiteItem) -> tuple[Case, bool] | None:
        """The (case, backward) the implementation is asked at collection whether it supports."""
        return None if item.case is None else (item.case, item.backward)

    def order(self, item: SuiteItem) -> int:
        """Where the item's requests go in the order they are sent ahead (lower first; pytest's
        order among equals)."""
        return 0

    def test_order(self, item: SuiteItem) -> int:
        """Where the item's test runs among the collected tests (lower first; pytest's order among
        equals): the speed suite runs its reference's tests before any other implementation's."""
        return 0

    def plan(self, item: SuiteItem) -> list[Planned]:
        """The requests the item needs, sent ahead of it or, with ``--attnkit-jobs=1``, as it runs."""
        raise NotImplementedError

    def judge(self, item: SuiteItem, replies: Sequence[Reply | None], **fixtures: Any) -> Judgement:
        """The item's outcome from the replies to its plan (``replies[i]`` answers ``plan[i]``;
        None where it was not run: a dropped warm-up, a cancelled request). ``fixtures``: what the
        test function passes on (the speed suite's pytest-benchmark fixture)."""
        raise NotImplementedError

    def close(self) -> None:
        """End whatever the suite keeps running (the run is over, or stopped)."""


def verdict_of(check: Callable[[Properties], object]) -> Judgement:
    """Run ``check``, which appends the test's junit properties to the list it is given and raises
    :class:`Judged` for a skip or a failure: its judgement, with those properties, or a pass."""
    properties: Properties = []
    try:
        check(properties)
    except Judged as judged:
        return replace(judged.judgement, properties=(*properties, *judged.judgement.properties))
    return Judgement(Verdict.PASSED, properties=tuple(properties))
