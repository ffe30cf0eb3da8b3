"""The memory suite's check: sweep the length in the worker, fit the exponent, judge the class.

The worker measures each point (:mod:`pytest_attnkit.worker.memory`). Over a sweep of
lengths, ``fit_exponent`` fits ``log(extra) = a + b log(N)`` by least squares, and ``classify`` turns ``b`` into a class: at most linear (``b <= 1.3``), quadratic
(``1.7 <= b <= 2.3``), or neither. The pure functions here are tested on the CPU with synthetic
measurements.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pytest

from pytest_attnkit.cases import MemorySweep
from pytest_attnkit.controller.outcome import Outcomes
from pytest_attnkit.controller.pool import WorkerPool
from pytest_attnkit.controller.table import memory_table
from pytest_attnkit.records import MemoryPoint, Status

LINEAR_MAX_SLOPE = 1.3
QUADRATIC_SLOPE = (1.7, 2.3)


def fit_exponent(seqlens: list[int], extra_bytes: list[int]) -> float | None:
    """Least-squares slope of log(extra bytes) against log(N), over points with extra > 0.

    None when fewer than three points needed extra memory at all (constant, not a power law).
    """
    points = [(math.log(n), math.log(b)) for n, b in zip(seqlens, extra_bytes) if b > 0]
    if len(points) < 3:
        return None
    mean_x = sum(x for x, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    if spread == 0:
        return None
    return sum((x - mean_x) * (y - mean_y) for x, y in points) / spread


def classify(slope: float | None) -> str:
    """'linear' (at most linear, including no extra memory), 'quadratic', or 'neither'."""
    if slope is None or slope <= LINEAR_MAX_SLOPE:
        return "linear"
    if QUADRATIC_SLOPE[0] <= slope <= QUADRATIC_SLOPE[1]:
        return "quadratic"
    return "neither"


def memory_problems(declared: str | None, points: list[MemoryPoint]) -> list[str]:
    """Every way the sweep contradicts the implementation's claims; empty when it holds.

    The fitted class must match the declared one; no allocation may escape the meter; and where
    the implementation gives an analytic model, each measurement is within 10% of it.
    """
    measured = [point for point in points if point.status == "measured"]
    problems = []
    if len(measured) < 3:
        problems.append(f"only {len(measured)} lengths could be measured; at least 3 are needed to fit an exponent")
    else:
        slope = fit_exponent([p.seqlen for p in measured], [p.extra_bytes for p in measured])
        if declared is not None and classify(slope) != declared:
            problems.append(f"declares {declared} memory but its extra memory grows as N^{slope:.2f} ({classify(slope)})")
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
    declared: str | None
    points: tuple[MemoryPoint, ...]
    sweep: MemorySweep

    @property
    def measured(self) -> list[MemoryPoint]:
        return [point for point in self.points if point.status == "measured"]

    @property
    def slope(self) -> float | None:
        return fit_exponent([p.seqlen for p in self.measured], [p.extra_bytes for p in self.measured])

    @property
    def largest_n(self) -> int | None:
        return max((p.seqlen for p in self.measured), default=None)

    @property
    def problems(self) -> list[str]:
        return memory_problems(self.declared, list(self.points))

    @property
    def verdict(self) -> str:
        return classify(self.slope)

    @property
    def stopped(self) -> str | None:
        """Why the sweep ended before its last length, or None."""
        last = self.points[-1] if self.points else None
        return None if last is None or last.status == "measured" else f"the sweep stopped at N={last.seqlen}: {last.status}"

    def to_dict(self) -> dict[str, Any]:
        return {"impl": self.impl, "direction": self.direction, "declared": self.declared, "slope": self.slope,
                "verdict": self.verdict, "largest_n": self.largest_n, "stopped": self.stopped,
                "points": [point.to_dict() for point in self.points],
                "sweep": {"batch": self.sweep.batch, "heads": self.sweep.heads, "head_dim": self.sweep.head_dim,
                          "dtype": self.sweep.dtype}}

    def table(self) -> list[str]:
        values = self.to_dict()
        return memory_table(self.impl, self.direction, values["points"], self.slope, self.verdict) + [
            f"  largest N that fit: {self.largest_n}" + (f" ({self.stopped})" if self.stopped else "")]


@dataclass
class MemoryCheck:
    pool: WorkerPool
    outcomes: Outcomes
    sweep: MemorySweep
    device: str
    seed: int
    results: list[MemorySweepResult] = field(default_factory=list)

    def check(self, impl: str, *, backward: bool, properties: list[tuple[str, object]] | None = None) -> MemorySweepResult:
        """Sweep the sequence length in the implementation's worker, fit the exponent of its extra
        memory, and fail when it contradicts the declared class or the implementation's own model."""
        direction = "forward+backward" if backward else "forward"
        if self.device != "cuda":
            pytest.skip(NO_MEMORY_METER_ON_CPU)
        info = self.pool.info(impl)
        points: list[MemoryPoint] = []
        for seqlen in self.sweep.seqlens:
            case = self.sweep.case(seqlen)
            reply = self.pool.request(impl, {"op": "memory", "case": case.to_dict(), "backward": backward,
                                             "seed": self.seed})
            if reply.status in (Status.CRASHED, Status.TIMEOUT):
                points.append(MemoryPoint(seqlen, "error", message=reply.message.splitlines()[0]))
                break
            self.outcomes.settle(reply, impl=impl, where=f"the memory sweep ({direction}) at {case.id}",
                                 origin=info.origin)
            points.append(MemoryPoint.from_dict(reply.data))
            if points[-1].status == "oom":
                break
        result = MemorySweepResult(impl, direction, info.capabilities.get("memory_class"), tuple(points), self.sweep)
        self.results.append(result)
        if properties is not None:
            properties.append(("attnkit_memory_exponent", result.slope))
            properties.append(("attnkit_largest_n", result.largest_n))
        problems = result.problems
        if problems:
            pytest.fail(f"{impl} memory ({direction}):\n" + "\n".join(problems) + "\n" + "\n".join(result.table()),
                        pytrace=False)
        return result
