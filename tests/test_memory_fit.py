"""The memory suite's logic on synthetic measurements: the fit, the classes and the table."""

from __future__ import annotations

import pytest

from pytest_attnkit.controller.memory import classify, fit_exponent, memory_problems
from pytest_attnkit.controller.table import memory_table
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
