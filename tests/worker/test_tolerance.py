"""The correctness rule on synthetic tensors: it passes rounding noise and catches real errors."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from pytest_attnkit.worker.tolerance import FORWARD_FACTOR, compare, rounding_floor  # noqa: E402


def _oracle(shape=(2, 3, 5, 8), seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=generator, dtype=torch.float64)


def test_plain_precision_result_passes() -> None:
    oracle = _oracle()
    plain = oracle.to(torch.float16)
    assert compare("out", plain, oracle, plain, dtype=torch.float16, factor=FORWARD_FACTOR).passed


def test_error_past_the_allowed_fails_with_where_and_how_much() -> None:
    oracle = _oracle()
    plain = oracle.to(torch.float16)
    actual = plain.clone()
    actual[1, 2, 3, 4] += 0.5
    result = compare("out", actual, oracle, plain, dtype=torch.float16, factor=FORWARD_FACTOR)
    assert not result.passed
    assert result.worst_index == (1, 2, 3, 4)
    assert result.max_error == pytest.approx(0.5, abs=2e-3)
    assert result.outside_fraction == pytest.approx(1 / oracle.numel())
    text = result.describe()
    assert "worst at index [1, 2, 3, 4]" in text and "exceeds allowed" in text and "0.42% of elements outside" in text


def test_zero_plain_error_does_not_fail_rounding_noise() -> None:
    # A vanishing gradient (dq with one key) is exactly zero in the oracle and in plain math;
    # an implementation's noise of a few ulps must still pass thanks to the floor.
    oracle = torch.zeros(2, 2, 1, 64, dtype=torch.float64)
    noise = torch.full_like(oracle, 3.6e-7).to(torch.float16)
    result = compare("dq", noise, oracle, oracle.to(torch.float16), dtype=torch.float16, factor=3.0)
    assert result.passed, result.describe()
    assert result.floor == pytest.approx(2 * abs(float(torch.tensor(0.3, dtype=torch.float16)) - 0.3))


def test_floor_follows_the_dtype() -> None:
    oracle = _oracle()
    assert rounding_floor(oracle, torch.bfloat16) > rounding_floor(oracle, torch.float16) > rounding_floor(oracle, torch.float32) > 0


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_nan_and_inf_never_pass(bad: float) -> None:
    oracle = _oracle()
    actual = oracle.to(torch.float16)
    actual[0, 0, 0, 1] = bad
    result = compare("out", actual, oracle, actual, dtype=torch.float16, factor=1e9)
    assert not result.passed and result.nonfinite == 1
    assert result.first_nonfinite_index == (0, 0, 0, 1)
    assert "NaN/Inf" in result.describe()
