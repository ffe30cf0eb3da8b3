"""The gate on synthetic samples shaped like the GPU's noise: it never cries wolf on clean runs and
catches real slowdowns.

The noise model follows what was measured on the GPU test machine (shared/ANCHORS.md): the same
call timed repeatedly stays within about 2%, with an occasional outlier far out (11% spread over
ten runs). Each synthetic run draws fresh samples with that noise.
"""

from __future__ import annotations

import random

import pytest

from pytest_attnkit.gate import MIN_SAMPLES, decide, machine_factor, mann_whitney_p

TRUE_MS = 1.25


def noisy_run(rng: random.Random, scale: float = 1.0, count: int = 30, outliers: int = 2) -> list[float]:
    samples = [TRUE_MS * scale * (1 + rng.gauss(0, 0.01)) for _ in range(count)]
    for index in rng.sample(range(count), outliers):
        samples[index] *= 1 + rng.uniform(0.05, 0.15)  # a hiccup: clocks, another process
    return samples


def test_clean_runs_never_regress() -> None:
    rng = random.Random(1)
    verdicts = [decide(noisy_run(rng), noisy_run(rng)).verdict for _ in range(200)]
    assert verdicts.count("regression") == 0
    assert verdicts.count("improvement") == 0


def test_ten_percent_slower_is_caught_at_least_nine_times_in_ten() -> None:
    rng = random.Random(2)
    verdicts = [decide(noisy_run(rng), noisy_run(rng, scale=1.10)).verdict for _ in range(200)]
    assert verdicts.count("regression") >= 180


def test_twenty_five_percent_slower_is_always_caught() -> None:
    rng = random.Random(3)
    assert all(decide(noisy_run(rng), noisy_run(rng, scale=1.25)).verdict == "regression" for _ in range(200))


def test_a_shift_under_the_threshold_is_not_a_regression_even_when_significant() -> None:
    rng = random.Random(4)
    decision = decide(noisy_run(rng), noisy_run(rng, scale=1.03))
    assert decision.p_slower < 0.01 and decision.verdict == "unchanged"


def test_improvements_are_reported() -> None:
    rng = random.Random(5)
    assert decide(noisy_run(rng), noisy_run(rng, scale=0.8)).verdict == "improvement"


def test_a_slower_machine_is_not_a_slower_kernel() -> None:
    rng = random.Random(6)
    factor = machine_factor(noisy_run(rng), noisy_run(rng, scale=1.15))  # the reference got slower too
    decision = decide(noisy_run(rng), noisy_run(rng, scale=1.15), machine_factor=factor)
    assert decision.verdict == "unchanged" and decision.raw_ratio > 1.1


def test_too_few_samples_is_its_own_verdict() -> None:
    decision = decide([1.0] * (MIN_SAMPLES - 1), [2.0] * 30)
    assert decision.verdict == "insufficient"


def test_mann_whitney_p_values() -> None:
    low = [float(value) for value in range(1, 11)]
    high = [float(value) for value in range(11, 21)]
    assert mann_whitney_p(high, low) < 1e-3
    assert mann_whitney_p(low, high) > 0.999
    assert mann_whitney_p(low, low) == pytest.approx(0.5, abs=0.05)
    # scipy.stats.mannwhitneyu(high, low, alternative="greater", method="asymptotic").pvalue
    assert mann_whitney_p(high, low) == pytest.approx(9.1e-05, rel=0.05)
