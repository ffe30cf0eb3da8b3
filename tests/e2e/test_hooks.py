"""The extension hooks, used from a conftest.py as their docstrings show."""

from __future__ import annotations

import pytest

from helpers import fake

SPEED = ("--attnkit", "--attnkit-suite", "speed", "--attnkit-device", "cpu", "--benchmark-disable",
         "--attnkit-baseline-dir=bl", "-k", "speed_forward and not causal")


def test_modify_cases_adds_a_case(pytester: pytest.Pytester, fake_dist) -> None:
    fake_dist({"good": fake("good")})
    pytester.makeconftest("""
        from pytest_attnkit import Case

        def pytest_attnkit_modify_cases(config, family, cases):
            if family == "correctness":
                cases.append(Case(batch=1, heads_q=6, heads_kv=3, seqlen_q=77, seqlen_k=99, head_dim=48,
                                  dtype="float32", causal=True))
    """)
    result = pytester.runpytest("--attnkit", "--attnkit-impl", "good", "-k", "q77-k99", "-v")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*test_forward[[]good-b1-h6:3-q77-k99-d48-fp32-causal[]] PASSED*"])


@pytest.mark.timing
def test_reference_and_threshold_hooks(pytester: pytest.Pytester, fake_dist, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_dist({"repeated": fake("repeated"), "good": fake("good")})
    pytester.makeconftest("""
        def pytest_attnkit_reference(config):
            return "good"

        def pytest_attnkit_threshold(config, impl, mode, case_id, default):
            if impl == "repeated":
                return 100.0  # this kernel may get 100x slower before it counts
    """)
    # "good" gets a 100% threshold: CPU timings of one process and the next differ by 20% or more.
    args = (*SPEED, "--attnkit-impl", "repeated,good", "--attnkit-threshold", "100%")
    monkeypatch.setenv("ATTNKIT_TEST_REPEAT", "1")
    pytester.runpytest(*args, "--attnkit-save-baseline").assert_outcomes(passed=2)
    monkeypatch.setenv("ATTNKIT_TEST_REPEAT", "6")
    result = pytester.runpytest(*args)
    result.assert_outcomes(passed=2)  # six times slower, but under the hook's threshold
    result.stdout.fnmatch_lines([
        "gate against *",
        "  machine factor * from good (the reference itself is gated without it;*",
        "repeated *fwd *b1-h2-q256-k256-d64-fp32 * 10000.0% *",
    ])
