"""The memory suite: sweep the length in the worker, fit the exponent, judge the class.

The worker measures each point (:mod:`pytest_attnkit.worker.memory`). Over a sweep of
lengths, ``fit_power_law`` fits ``log(extra) = a + b log(N)`` by least squares and says how well
the line fits (R^2, and the point farthest from it as a factor); ``classify`` turns ``b`` into a
class: at most linear (``b <= 1.3``), quadratic (``1.7 <= b <= 2.3``), or neither.

A sweep that no power law describes gets the verdict ``MemoryClass.UNCLEAR`` instead of a class
(:func:`unclear_reason`), and a declared class is then not enforced: a class read off such a
sweep would be noise (the compiled kernel whose first call counted its compilation read N^-0.23,
"linear"). Unclear is a first point more than 2x above the line through the others (a
first-call cost), a slope below -0.1 (memory that falls as N grows is a measurement artifact,
not a growth law; -0.1 is a third less over a 32x sweep, beyond a flat sweep's noise), or a poor fit:
R^2 below 0.9 *and* a point more than 1.25x off the line. Below R^2 0.9 the slope's standard
error over six points, ``b * sqrt((1 - R^2) / (R^2 (n - 2)))``, is a sixth of the slope (0.33 at
``b = 2``), as wide as the 0.4 gap between the linear and quadratic bands; R^2 alone says nothing
of a near-flat sweep (a constant workspace plus a small linear part reads R^2 0.83 with every
point within 1% of the line), hence the second condition. The pure functions here are tested on
the CPU with synthetic measurements.

:class:`MemoryCheck` is the suite (:class:`~pytest_attnkit.controller.suite.Suite`). Where each
worker meters its own memory (the environment's ``memory_meter`` is "process"), a test's plan is
its sweep's points, each after the one before and only if that one measured, in one worker, sent
ahead beside other work; where the meter sees the whole device, the plan is a warm-up of each
point, and the test measures the points itself with the GPU alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping, Sequence

from pytest_attnkit.cases import MEMORY_CALL_LIMIT_MS, MIN_SWEEP_POINTS, MemorySweep, named_memory_sweep
from pytest_attnkit.contract import Case, MemoryClass
from pytest_attnkit.controller import footprint
from pytest_attnkit.controller.outcome import Judged, Judgement, Outcomes, failed, skipped
from pytest_attnkit.controller.pool import WorkerPool
from pytest_attnkit.controller.suite import Planned, RunParts, Suite, SuiteContext, SuiteItem, TestSpec, verdict_of
from pytest_attnkit.controller.table import memory_table
from pytest_attnkit.messages import Op, Reply, Request, Status
from pytest_attnkit.records import MemoryPoint, PointStatus

LINEAR_MAX_SLOPE = 1.3
QUADRATIC_SLOPE = (1.7, 2.3)
#: When a sweep is "unclear" (see the module docstring for why these values).
NEGATIVE_SLOPE = -0.1
FIRST_POINT_FACTOR = 2.0
MIN_R2 = 0.9
POOR_FIT_FACTOR = 1.25


@dataclass(frozen=True)
class Fit:
    """The least-squares line through (log N, log extra bytes), and how well it fits."""

    slope: float
    intercept: float
    r2: float  # 1.0 where the points do not vary at all
    worst_factor: float  # the point farthest from the line, as a factor >= 1 (above or below it)
    worst_n: int
    first_factor: float | None  # the first point over the line through the others (None: fewer than 2 others)

    def at(self, seqlen: int) -> float:
        return math.exp(self.intercept + self.slope * math.log(seqlen))


def _line(points: list[tuple[float, float]]) -> tuple[float, float] | None:
    mean_x = sum(x for x, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    if spread == 0:
        return None
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / spread
    return slope, mean_y - slope * mean_x


def fit_power_law(seqlens: list[int], extra_bytes: list[int]) -> Fit | None:
    """Least-squares fit of log(extra bytes) against log(N), over points with extra > 0.

    None when fewer than three points needed extra memory at all (constant, not a power law).
    """
    kept = [(n, b) for n, b in zip(seqlens, extra_bytes) if b > 0]
    points = [(math.log(n), math.log(b)) for n, b in kept]
    if len(points) < 3 or (line := _line(points)) is None:
        return None
    slope, intercept = line
    residuals = [y - (intercept + slope * x) for x, y in points]
    mean_y = sum(y for _, y in points) / len(points)
    total = sum((y - mean_y) ** 2 for _, y in points)
    r2 = 1.0 - sum(r * r for r in residuals) / total if total > 0 else 1.0
    worst = max(range(len(points)), key=lambda i: abs(residuals[i]))
    first_factor = None
    if (rest := _line(points[1:])) is not None:
        first_factor = math.exp(points[0][1] - (rest[1] + rest[0] * points[0][0]))
    return Fit(slope, intercept, r2, math.exp(abs(residuals[worst])), kept[worst][0], first_factor)


def fit_exponent(seqlens: list[int], extra_bytes: list[int]) -> float | None:
    """The fitted exponent of :func:`fit_power_law`, or None where there is no fit."""
    fit = fit_power_law(seqlens, extra_bytes)
    return None if fit is None else fit.slope


def unclear_reason(fit: Fit | None) -> str | None:
    """Why no class can be read off this fit (see the module docstring), or None where it can."""
    if fit is None:
        return None
    if fit.first_factor is not None and fit.first_factor > FIRST_POINT_FACTOR:
        return (f"the first point is {fit.first_factor:.1f}x above the line through the others "
                "(a first-call cost, or a constant that hides the growth)")
    if fit.slope < NEGATIVE_SLOPE:
        return f"the extra memory falls as N grows (N^{fit.slope:.2f})"
    if fit.r2 < MIN_R2 and fit.worst_factor > POOR_FIT_FACTOR:
        return (f"the points follow no power law (R^2 {fit.r2:.2f} < {MIN_R2}, "
                f"N={fit.worst_n} {fit.worst_factor:.2f}x off the line)")
    return None


def verdict(fit: Fit | None) -> MemoryClass:
    """UNCLEAR where :func:`unclear_reason` gives a reason, else the class of the fitted slope."""
    if unclear_reason(fit) is not None:
        return MemoryClass.UNCLEAR
    return classify(None if fit is None else fit.slope)


def classify(slope: float | None) -> MemoryClass:
    """LINEAR (at most linear, including no extra memory), QUADRATIC, or NEITHER."""
    if slope is None or slope <= LINEAR_MAX_SLOPE:
        return MemoryClass.LINEAR
    if QUADRATIC_SLOPE[0] <= slope <= QUADRATIC_SLOPE[1]:
        return MemoryClass.QUADRATIC
    return MemoryClass.NEITHER


def memory_problems(declared: MemoryClass | str | None, points: list[MemoryPoint]) -> list[str]:
    """Every way the sweep contradicts the implementation's claims; empty when it holds.

    The fitted class must match the declared one, unless the sweep is unclear (no class can be
    read off it: the declared one is then not enforced); no allocation may escape the meter; and
    where the implementation gives an analytic model, each measurement is within 10% of it.
    """
    measured = [point for point in points if point.status == PointStatus.MEASURED]
    problems = []
    if len(measured) < 3:
        problems.append(f"only {len(measured)} lengths could be measured; at least 3 are needed to fit an exponent")
    else:
        fit = fit_power_law([p.seqlen for p in measured], [p.extra_bytes for p in measured])
        found = verdict(fit)
        if declared is not None and found not in (declared, MemoryClass.UNCLEAR):
            problems.append(f"declares {declared} memory but its extra memory grows as N^{fit.slope:.2f} ({found})")
    for point in measured:
        if point.unmetered_bytes:
            problems.append(f"at N={point.seqlen} it allocated {point.unmetered_bytes} bytes that torch's allocator "
                            "did not see (a path the meter cannot measure)")
        if point.expected_bytes:
            ratio = point.extra_bytes / point.expected_bytes
            if abs(ratio - 1) > 0.10:
                problems.append(f"at N={point.seqlen} it used {point.extra_bytes} bytes, {ratio:.2f}x its own model "
                                f"({point.expected_bytes} bytes; 10% allowed)")
    return problems


NO_MEMORY_METER_ON_CPU = ("the memory suite measures the CUDA caching allocator's peaks; this run is on the CPU, "
                          "where torch keeps no peak statistics, so nothing is measured")


@dataclass(frozen=True)
class MemorySweepResult:
    """One implementation's sweep in one direction: every point, and the fit over the measured ones."""

    impl: str
    direction: str  # "forward" or "forward+backward"
    declared: MemoryClass | str | None  # as the implementation declared it (a plain string is the same value)
    points: tuple[MemoryPoint, ...]
    sweep: MemorySweep

    @property
    def measured(self) -> list[MemoryPoint]:
        return [point for point in self.points if point.status == PointStatus.MEASURED]

    @property
    def fit(self) -> Fit | None:
        return fit_power_law([p.seqlen for p in self.measured], [p.extra_bytes for p in self.measured])

    @property
    def slope(self) -> float | None:
        fit = self.fit
        return None if fit is None else fit.slope

    @property
    def unclear_reason(self) -> str | None:
        return unclear_reason(self.fit)

    @property
    def largest_n(self) -> int | None:
        return max((p.seqlen for p in self.measured), default=None)

    @property
    def problems(self) -> list[str]:
        return memory_problems(self.declared, list(self.points))

    @property
    def verdict(self) -> MemoryClass:
        return verdict(self.fit)

    @property
    def stopped(self) -> str | None:
        """Why the sweep ended before its last length, or None."""
        last = self.points[-1] if self.points else None
        if last is not None and last.status == PointStatus.MEASURED and last.stop:
            return f"the sweep stopped after N={last.seqlen}: {last.stop}"
        if last is None or last.status == PointStatus.MEASURED:
            return None
        return f"the sweep stopped at N={last.seqlen}: {last.status}"

    def to_dict(self) -> dict[str, Any]:
        fit = self.fit
        return {"impl": self.impl, "direction": self.direction, "declared": self.declared, "slope": self.slope,
                "verdict": self.verdict, "unclear_reason": self.unclear_reason,
                "r2": None if fit is None else fit.r2, "worst_residual": None if fit is None else fit.worst_factor,
                "worst_n": None if fit is None else fit.worst_n,
                "largest_n": self.largest_n, "stopped": self.stopped,
                "points": [point.to_dict() for point in self.points],
                "sweep": {"batch": self.sweep.batch, "heads": self.sweep.heads, "head_dim": self.sweep.head_dim,
                          "dtype": self.sweep.dtype, "layout": self.sweep.layout}}

    def table(self) -> list[str]:
        values = self.to_dict()
        return memory_table(self.impl, self.direction, values["points"], self.slope, self.verdict, r2=values["r2"],
                            worst=values["worst_residual"], worst_n=values["worst_n"],
                            reason=values["unclear_reason"], declared=self.declared) + [
            f"  largest N that fit: {self.largest_n}" + (f" ({self.stopped})" if self.stopped else "")]


def goes_on(reply: Reply) -> bool:
    """Whether a sweep's next point runs after this point's reply: it measured, and did not say to
    stop (a call over the profile's limit). After an out-of-memory, a failure or ``stop`` the
    scheduler cancels the sweep's later points (:attr:`~pytest_attnkit.controller.suite.Planned.follows`)."""
    return (reply.status is Status.OK and reply.data.get("status", PointStatus.MEASURED) == PointStatus.MEASURED
            and not reply.data.get("stop"))


@dataclass
class MemoryCheck(Suite):
    """The memory suite: one sweep per test, named by the test (``params["sweep"]``)."""

    name: ClassVar[str] = "memory"
    handler: ClassVar[str] = "pytest_attnkit.worker.suites.memory:MemoryHandler"
    tests: ClassVar[tuple[TestSpec, ...]] = tuple(
        TestSpec(function, backward=backward, params={"sweep": sweep})
        for function, sweep, backward in (("test_memory_forward", "dense", False),
                                          ("test_memory_backward", "dense", True),
                                          ("test_memory_window", "window", False),
                                          ("test_memory_window_backward", "window", True),
                                          ("test_memory_varlen", "varlen", False),
                                          ("test_memory_varlen_backward", "varlen", True),
                                          ("test_memory_paged", "paged", False)))

    pool: WorkerPool
    outcomes: Outcomes
    device: str
    seed: int
    results: list[MemorySweepResult] = field(default_factory=list)
    profile: str = "default"
    #: The environment's ``memory_meter``: "process" where each worker's meter sees its own
    #: allocations only (the sweep runs beside other work), else "device" (the GPU alone).
    meter: str = "device"

    @classmethod
    def build(cls, context: SuiteContext, parts: RunParts) -> MemoryCheck:
        return cls(parts.pool, context.outcomes, context.device, context.seed, profile=context.profile,
                   meter=str(parts.environment.get("memory_meter") or "device"))

    def report_sections(self, document: Mapping[str, Any]) -> dict[str, Any]:
        return {"memory": [sweep.to_dict() for sweep in self.results]}

    def sweep_of(self, item: SuiteItem) -> MemorySweep:
        return named_memory_sweep(self.profile, item.spec.params["sweep"])

    def refusal(self, item: SuiteItem) -> Judgement | None:
        return skipped(NO_MEMORY_METER_ON_CPU) if self.device != "cuda" else None

    def support_query(self, item: SuiteItem) -> tuple[Case, bool] | None:
        """The sweep's first point: what the implementation does not support there, it refuses throughout."""
        sweep = self.sweep_of(item)
        return sweep.case(sweep.seqlens[0]), item.backward

    def order(self, item: SuiteItem) -> int:
        """A sweep first: it is a chain (each point waits for the one before), so its first point
        must start early for the chain to run beside the other requests; submitted in pytest's
        order, after every correctness case, torch_flex's sweeps on a cold H100 started at 206 s
        and ran alone until 274 s, the end of the concurrent phase (results/2026-11-25-h100-main-job,
        B cold). Its warm-ups (a device-wide meter) last, after the requests tests wait for."""
        return -1 if self.meter == "process" else 1

    def _message(self, case: Case, backward: bool, index: int) -> Request:
        """A point's request; from the ``MIN_SWEEP_POINTS``-th point on it carries the profile's
        sweep call limit, past which the point ends the sweep (``cases.MEMORY_CALL_LIMIT_MS``)."""
        limit = MEMORY_CALL_LIMIT_MS.get(self.profile) if index + 1 >= MIN_SWEEP_POINTS else None
        return Request(Op.RUN, case, backward, self.seed, {"call_limit_ms": limit}, suite=self.name)

    def plan(self, item: SuiteItem) -> list[Planned]:
        """With a process meter, the sweep's points, each after the one before and only if that one
        measured (an out-of-memory ends a sweep); with a device-wide meter, a warm-up of each point."""
        if self.device != "cuda":
            return []
        sweep, backward = self.sweep_of(item), item.backward
        linear = self.pool.info(item.impl).capabilities.get("memory_class") == MemoryClass.LINEAR

        def estimate(case: Case) -> int:
            return footprint.request_bytes(case, backward=backward, references=False, linear_memory=linear)

        cases = [sweep.case(seqlen) for seqlen in sweep.seqlens]
        if self.meter == "process":
            return [Planned(self._message(case, backward, index), 2 * estimate(case),
                            after=index - 1 if index else None, follows=goes_on if index else None,
                            same_worker=bool(index))
                    for index, case in enumerate(cases)]
        return [Planned(Request(Op.WARM, case, backward, self.seed, {"program": False, "next_call": True}),
                        estimate(case), warm=True)
                for case in cases]

    def judge(self, item: SuiteItem, replies: Sequence[Reply | None], **fixtures: Any) -> Judgement:
        """The sweep's verdict, from the replies to its points (a process meter) or from points
        measured now with the GPU alone (a device-wide meter: the plan only warmed them up)."""
        return verdict_of(lambda properties: self.check(
            item.impl, backward=item.backward, properties=properties, sweep=self.sweep_of(item),
            replies=replies if self.meter == "process" else None))

    def check(self, impl: str, *, backward: bool, sweep: MemorySweep, properties: list[tuple[str, object]] | None = None,
              replies: Sequence[Reply | None] | None = None) -> MemorySweepResult:
        """Sweep the sequence length in the implementation's worker, fit the exponent of its extra
        memory, and fail when it contradicts the declared class or the implementation's own model.
        An unclear sweep enforces no class: it passes, with the verdict and its reason in the
        summary's table and in the junit properties. ``replies``: the points' replies (None where
        one was not run); without them each point is asked for now, with the GPU alone."""
        direction = "forward+backward" if backward else "forward"
        if sweep.window is not None:
            direction += f", window {sweep.window}"
        if sweep.layout != "dense":
            direction += f", {sweep.layout} (N: total tokens)"
        info = self.pool.info(impl)
        points: list[MemoryPoint] = []
        for index, seqlen in enumerate(sweep.seqlens):
            case = sweep.case(seqlen)
            reply = (replies[index] if replies is not None
                     else self.pool.request_alone(impl, self._message(case, backward, index)))
            if reply is None:  # cancelled: the run is stopping (a stopped sweep ends at the point before)
                points.append(MemoryPoint(seqlen, PointStatus.NOT_RUN))
                break
            if reply.status in (Status.CRASHED, Status.TIMEOUT):
                points.append(MemoryPoint(seqlen, PointStatus.ERROR, message=reply.message.splitlines()[0]))
                break
            if not (reply.status is Status.OUT_OF_MEMORY and "status" in reply.data):  # else: a point that did not fit
                self.outcomes.check(reply, impl=impl, where=f"the memory sweep ({direction}) at {case.id}",
                                    origin=info.origin)
            points.append(MemoryPoint.from_dict(reply.data))
            if points[-1].status == PointStatus.OOM or points[-1].stop:
                break
        result = MemorySweepResult(impl, direction, info.capabilities.get("memory_class"), tuple(points), sweep)
        self.results.append(result)
        if properties is not None:
            properties.append(("attnkit_memory_exponent", result.slope))
            properties.append(("attnkit_memory_verdict", result.verdict.value))  # plain data: xdist sends it on
            fit = result.fit
            properties.append(("attnkit_memory_r2", None if fit is None else fit.r2))
            properties.append(("attnkit_memory_worst_residual", None if fit is None else fit.worst_factor))
            properties.append(("attnkit_largest_n", result.largest_n))
        problems = result.problems
        if problems:
            raise Judged(failed(f"{impl} memory ({direction}):\n" + "\n".join(problems) + "\n" + "\n".join(result.table())))
        return result
