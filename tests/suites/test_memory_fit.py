"""The memory suite's logic on synthetic measurements: the fit, the classes and the table."""

from __future__ import annotations

import pytest

from pytest_attnkit.controller.memory import (
    MemorySweepResult, classify, fit_exponent, fit_power_law, memory_problems, unclear_reason, verdict)
from pytest_attnkit.controller.table import memory_lines, memory_table
from pytest_attnkit.cases import MemorySweep
from pytest_attnkit.records import MemoryPoint

SEQLENS = [1024, 2048, 4096, 8192, 16384, 32768]


def test_quadratic_scores_fit_two() -> None:
    scores = [4 * 16 * n * n for n in SEQLENS]
    slope = fit_exponent(SEQLENS, scores)
    assert slope == pytest.approx(2.0)
    assert classify(slope) == "quadratic"


def test_linear_with_a_constant_workspace_stays_linear() -> None:
    # A flash kernel: log-sum-exp per row (4*H*N bytes) plus a fixed 32 MiB library workspace.
    extra = [4 * 16 * n + 32 * 2**20 for n in SEQLENS]
    slope = fit_exponent(SEQLENS, extra)
    assert slope is not None and 0 < slope < 1
    assert classify(slope) == "linear"


def test_no_extra_memory_is_linear_at_most() -> None:
    assert fit_exponent(SEQLENS, [0] * len(SEQLENS)) is None
    assert classify(None) == "linear"


def test_between_the_bands_is_neither() -> None:
    assert classify(1.5) == "neither"
    assert classify(2.6) == "neither"


def test_fit_ignores_points_without_extra_memory_and_needs_three() -> None:
    assert fit_exponent([1024, 2048], [1, 4]) is None
    assert fit_exponent([1024, 2048, 4096, 8192], [0, 4, 16, 64]) == pytest.approx(2.0)


def test_table_shows_bytes_per_token_the_model_and_an_oom() -> None:
    points = [
        MemoryPoint(1024, "measured", extra_bytes=64 * 2**20, expected_bytes=64 * 2**20),
        MemoryPoint(2048, "measured", extra_bytes=256 * 2**20, expected_bytes=256 * 2**20, unmetered_bytes=2**30),
        MemoryPoint(4096, "oom", message="CUDA out of memory. Tried to allocate 1.00 GiB"),
    ]
    lines = memory_table("naive", "forward", [point.to_dict() for point in points], 2.0, classify(2.0))
    assert lines[0] == "naive (forward): fitted exponent 2.00 -> quadratic"
    assert "65536.0" in lines[2] and "64.0 MiB" in lines[2]
    assert "unmetered 1.0 GiB" in lines[3]
    assert "oom: CUDA out of memory" in lines[4]


def _points(extra_of_n, **fields) -> list[MemoryPoint]:
    return [MemoryPoint(n, "measured", extra_bytes=extra_of_n(n), **fields) for n in SEQLENS]


def test_declared_linear_but_quadratic_fails() -> None:
    problems = memory_problems("linear", _points(lambda n: 4 * 16 * n * n))
    assert problems == ["declares linear memory but its extra memory grows as N^2.00 (quadratic)"]


def test_declared_quadratic_and_quadratic_passes() -> None:
    assert memory_problems("quadratic", _points(lambda n: 4 * 16 * n * n)) == []


def test_declared_quadratic_but_linear_fails() -> None:
    problems = memory_problems("quadratic", _points(lambda n: 64 * n))
    assert problems == ["declares quadratic memory but its extra memory grows as N^1.00 (linear)"]


def test_unmetered_memory_is_a_failure_not_a_zero() -> None:
    points = _points(lambda n: 0)
    points[2] = MemoryPoint(4096, "measured", extra_bytes=0, unmetered_bytes=512 * 2**20)
    assert memory_problems("linear", points) == [
        "at N=4096 it allocated 536870912 bytes that torch's allocator did not see (a path the meter cannot measure)"]


def test_measurement_must_match_the_model_within_ten_percent() -> None:
    points = [MemoryPoint(n, "measured", extra_bytes=int(1.2 * 4 * n * n), expected_bytes=4 * n * n) for n in SEQLENS]
    problems = memory_problems("quadratic", points)
    assert len(problems) == len(SEQLENS) and "1.20x its own model" in problems[0]


def test_too_few_points_after_an_early_oom_fails() -> None:
    points = [MemoryPoint(1024, "measured", extra_bytes=10), MemoryPoint(2048, "oom", message="out of memory")]
    assert memory_problems("linear", points) == ["only 1 lengths could be measured; at least 3 are needed to fit an exponent"]


def test_undeclared_class_is_reported_not_failed() -> None:
    assert memory_problems(None, _points(lambda n: 4 * 16 * n * n)) == []


# The compiled kernel, forward+backward: the first call's compilation and workspace read
# 48.1 MiB at N=1024, then 258 KiB at 2048 rising to 4 MiB at 32768. The plain fit said N^-0.23, "linear".
SPIKE = [int(48.1 * 2**20)] + [int(258 * 2**10 * (4 * 2**20 / (258 * 2**10)) ** (i / 4)) for i in range(5)]


def test_a_first_call_spike_is_unclear_and_enforces_no_class() -> None:
    fit = fit_power_law(SEQLENS, SPIKE)
    assert fit is not None and fit.slope == pytest.approx(-0.23, abs=0.01)
    assert fit.r2 < 0.1 and fit.worst_n == 1024 and fit.worst_factor > 10 and fit.first_factor > 100
    assert verdict(fit) == "unclear"
    assert "the first point is 381.1x above the line through the others" in unclear_reason(fit)
    points = [MemoryPoint(n, "measured", extra_bytes=b) for n, b in zip(SEQLENS, SPIKE)]
    assert memory_problems("linear", points) == [] and memory_problems("quadratic", points) == []


def test_a_first_point_far_above_the_others_is_unclear_even_with_a_rising_slope() -> None:
    # Linear from 2k on, and a first call 3x above that line: the slope still reads near-linear.
    extra = [3 * 128 * 1024] + [128 * n for n in SEQLENS[1:]]
    fit = fit_power_law(SEQLENS, extra)
    assert fit.slope > 0.7 and fit.first_factor == pytest.approx(3.0)
    assert verdict(fit) == "unclear" and "first point is" in unclear_reason(fit)


def test_clean_sweeps_keep_their_classes_and_report_the_fit() -> None:
    for extra, expected in (([64 * n for n in SEQLENS], "linear"), ([64 * n * n for n in SEQLENS], "quadratic"),
                            ([4 * 16 * n + 32 * 2**20 for n in SEQLENS], "linear")):
        fit = fit_power_law(SEQLENS, extra)
        assert unclear_reason(fit) is None and verdict(fit) == expected
        assert fit.worst_factor < 1.1
    # A constant workspace with a small linear part: R^2 says little (0.83), every point is on the line.
    flat = fit_power_law(SEQLENS, [4 * 16 * n + 32 * 2**20 for n in SEQLENS])
    assert flat.r2 < 0.9 and flat.worst_factor < 1.02
    exact = fit_power_law(SEQLENS, [64 * n * n for n in SEQLENS])
    assert exact.r2 == pytest.approx(1.0) and exact.worst_factor == pytest.approx(1.0)


def test_a_negative_slope_is_unclear() -> None:
    fit = fit_power_law(SEQLENS, [2**30 // n for n in SEQLENS])
    assert fit.slope == pytest.approx(-1.0) and verdict(fit) == "unclear"
    # Flat within noise is not negative.
    assert verdict(fit_power_law(SEQLENS, [2**20, 2**20 - 4096, 2**20 + 2048, 2**20 - 8192, 2**20, 2**20 - 4096])) == "linear"


def test_points_that_follow_no_power_law_are_unclear() -> None:
    extra = [64 * n * (3 if i % 2 else 1) for i, n in enumerate(SEQLENS)]  # a zigzag, 3x apart
    fit = fit_power_law(SEQLENS, extra)
    assert fit.r2 < 0.9 and fit.worst_factor > 1.25 and fit.first_factor < 2
    assert verdict(fit) == "unclear" and "follow no power law" in unclear_reason(fit)


def test_unclear_still_fails_on_unmetered_memory() -> None:
    points = [MemoryPoint(n, "measured", extra_bytes=b) for n, b in zip(SEQLENS, SPIKE)]
    points[3] = MemoryPoint(SEQLENS[3], "measured", extra_bytes=SPIKE[3], unmetered_bytes=2**30)
    assert len(memory_problems("linear", points)) == 1


def test_an_unclear_sweep_shows_its_points_and_no_class() -> None:
    points = tuple(MemoryPoint(n, "measured", extra_bytes=b) for n, b in zip(SEQLENS, SPIKE))
    result = MemorySweepResult("compiled", "forward+backward", "linear", points, MemorySweep(seqlens=tuple(SEQLENS)))
    document = result.to_dict()
    assert document["verdict"] == "unclear" and document["r2"] < 0.1 and document["worst_residual"] > 10
    assert result.problems == []
    lines = memory_lines({"memory": [document]})
    assert lines == result.table()
    text = " ".join("\n".join(lines).split())
    assert "unclear, no class: the first point is 381.1x above the line through the others" in text
    assert "fitted exponent -0.23, R^2 0.025, worst point 16.95x off the line at N=1024" in text
    assert "declared linear not enforced" in text and "-> " not in text
    assert "linear" not in text.replace("declared linear", "")
    assert sum(line.lstrip().startswith(str(n)) for line in lines for n in SEQLENS) == len(SEQLENS)
    [spike] = [line for line in lines if line.lstrip().startswith("1024 ")]
    assert "48.1 MiB" in spike and "x off the line" in spike


def test_a_clean_sweep_shows_its_class_and_fit_quality() -> None:
    points = tuple(MemoryPoint(n, "measured", extra_bytes=64 * n * n) for n in SEQLENS)
    result = MemorySweepResult("naive", "forward", "quadratic", points, MemorySweep(seqlens=tuple(SEQLENS)))
    document = result.to_dict()
    assert document["verdict"] == "quadratic" and document["r2"] == pytest.approx(1.0)
    assert document["worst_residual"] == pytest.approx(1.0)
    assert result.table()[0].startswith("naive (forward): fitted exponent 2.00 -> quadratic (R^2 1.000, worst point 1.00x")


def test_a_point_over_the_default_profiles_call_limit_ends_the_sweep_and_says_why() -> None:
    """The memory check against a pool that answers every point: from the fourth point on the
    requests carry the default profile's call limit, a point that says ``stop`` is the last asked
    for, and the result says where and why the sweep stopped (the fit has its points)."""
    from pytest_attnkit.cases import MEMORY_CALL_LIMIT_MS, MIN_SWEEP_POINTS
    from pytest_attnkit.controller.memory import MemoryCheck
    from pytest_attnkit.controller.outcome import Outcomes
    from pytest_attnkit.controller.impls import ImplInfo
    from pytest_attnkit.messages import Reply, Request, Status

    asked: list[Request] = []

    class Pool:
        def info(self, name: str) -> ImplInfo:
            return ImplInfo(name, "fake:naive", capabilities={"memory_class": "quadratic"})

        def request_alone(self, name: str, request: Request) -> Reply:
            asked.append(request)
            n = request.case.seqlen_q
            stop = "one call took 2300 ms" if n == 16384 else ""
            return Reply(Status.OK, "", MemoryPoint(n, "measured", extra_bytes=n * n * 64, peak_bytes=n * n * 64,
                                                    call_ms=2300.0 if stop else 10.0, stop=stop).to_dict())

    check = MemoryCheck(Pool(), Outcomes(), "cuda", 0, profile="default")
    result = check.check("naive", backward=False, sweep=MemorySweep(seqlens=tuple(SEQLENS)))
    assert [m.case.seqlen_q for m in asked] == SEQLENS[:-1]  # 32768 never asked for
    limit = MEMORY_CALL_LIMIT_MS["default"]
    assert [m.options["call_limit_ms"] for m in asked] == [None] * (MIN_SWEEP_POINTS - 1) + [limit] * 2
    assert result.largest_n == 16384 and result.verdict == "quadratic"
    assert result.stopped == "the sweep stopped after N=16384: one call took 2300 ms"
    full = MemoryCheck(Pool(), Outcomes(), "cuda", 0, profile="full")
    asked.clear()
    assert full._message(MemorySweep(seqlens=(1024,)).case(1024), False, 5).options["call_limit_ms"] is None


def test_a_point_that_ran_out_of_memory_ends_the_sweep_as_data_not_as_a_skip() -> None:
    """A point that did not fit replies ``Status.OUT_OF_MEMORY`` with the point as its data (the
    scheduler reads the status, worker/suites/memory.py): the memory check reads it as the sweep's
    last point, and asks for nothing after it. An out-of-memory without a point (raised outside
    the meter) is still the outcome's to word: a skip with the numbers."""
    from pytest_attnkit.controller.impls import ImplInfo
    from pytest_attnkit.controller.memory import MemoryCheck
    from pytest_attnkit.controller.outcome import Judged, Outcomes
    from pytest_attnkit.messages import Reply, Request, Status

    asked: list[int] = []

    class Pool:
        def __init__(self, point: bool) -> None:
            self.point = point

        def info(self, name: str) -> ImplInfo:
            return ImplInfo(name, "fake:naive", capabilities={"memory_class": "quadratic"})

        def request_alone(self, name: str, request: Request) -> Reply:
            n = request.case.seqlen_q
            asked.append(n)
            if n == 4096:
                data = MemoryPoint(n, "oom", message="CUDA out of memory").to_dict() if self.point else {}
                return Reply(Status.OUT_OF_MEMORY, "CUDA out of memory", data)
            return Reply(Status.OK, "", MemoryPoint(n, "measured", extra_bytes=n * n * 64, peak_bytes=n * n * 64).to_dict())

    check = MemoryCheck(Pool(True), Outcomes(), "cuda", 0)
    try:  # two points are too few for a verdict on the class: whatever it says, the points are the data
        check.check("naive", backward=False, sweep=MemorySweep(seqlens=tuple(SEQLENS)))
    except Judged as judged:
        assert "out of memory" not in str(judged.judgement.message).splitlines()[0]
    assert asked == [1024, 2048, 4096]
    assert [point.status for point in check.results[-1].points] == ["measured", "measured", "oom"]
    asked.clear()
    other = MemoryCheck(Pool(False), Outcomes(), "cuda", 0)
    with pytest.raises(Judged) as raised:
        other.check("naive", backward=False, sweep=MemorySweep(seqlens=tuple(SEQLENS)))
    assert raised.value.judgement.verdict == "skipped" and not other.results and asked == [1024, 2048, 4096]
