"""The speed suite end to end on the CPU: baselines saved, clean reruns pass, a real slowdown
fails the run with the table, and a required baseline that is missing fails."""

from __future__ import annotations

import json

import pytest

from conftest import fake

ARGS = ("--attnkit", "--attnkit-suite", "speed", "--attnkit-impl", "repeated", "--attnkit-device", "cpu",
        "--attnkit-baseline-dir", "bl", "--benchmark-disable", "-k", "speed_forward and not causal")


def test_save_then_gate_a_real_slowdown(pytester: pytest.Pytester, fake_dist, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_dist({"repeated": fake("repeated")})
    monkeypatch.setenv("ATTNKIT_TEST_REPEAT", "1")
    saved = pytester.runpytest(*ARGS, "--attnkit-save-baseline")
    saved.assert_outcomes(passed=1)
    saved.stdout.fnmatch_lines(["gate: no baseline for this device *; nothing gated", "baseline saved: *bl*.json"])
    [baseline_file] = (pytester.path / "bl").iterdir()
    document = json.loads(baseline_file.read_text())
    [entry] = document["entries"].values()
    assert document["schema_version"] == 1 and entry["samples"] >= 15 and entry["timer"] == "perf-counter"

    monkeypatch.setenv("ATTNKIT_TEST_REPEAT", "6")  # six times the work
    slower = pytester.runpytest(*ARGS)
    assert slower.ret == pytest.ExitCode.TESTS_FAILED
    slower.stdout.fnmatch_lines([
        "*repeated regressed on b1-h2-q256-k256-d64-fp32 (forward): median * ms -> * ms, +*% *flagged in 3 of 3 independent rounds)",
        "implementation mode     case * baseline ms    now ms   change  machine  thresh  verdict",
        "repeated       forward  b1-h2-q256-k256-d64-fp32 * REGRESSION (3/3 rounds)",
    ])


def test_a_required_baseline_that_is_missing_fails(pytester: pytest.Pytester, fake_dist) -> None:
    fake_dist({"repeated": fake("repeated")})
    result = pytester.runpytest(*ARGS, "--attnkit-require-baseline")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*no baseline file for this device * and a baseline is required (--attnkit-require-baseline)"])


def test_cpu_numbers_are_labelled(pytester: pytest.Pytester, fake_dist) -> None:
    fake_dist({"repeated": fake("repeated")})
    result = pytester.runpytest(*ARGS)
    result.stdout.fnmatch_lines(["CPU numbers: perf_counter around each call on this machine's CPU; not GPU figures"])
