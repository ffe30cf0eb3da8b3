"""The speed suite end to end on the CPU: baselines saved, clean reruns pass, a real slowdown
fails the run with the table, and a required baseline that is missing fails."""

from __future__ import annotations

import json

import pytest

from helpers import fake, said

ARGS = ("--attnkit", "--attnkit-suite", "speed", "--attnkit-impl", "repeated", "--attnkit-device", "cpu",
        "--attnkit-baseline-dir", "bl", "--benchmark-disable", "-k", "speed_forward and not causal")


@pytest.mark.timing
def test_save_then_gate_a_real_slowdown(pytester: pytest.Pytester, fake_dist, monkeypatch: pytest.MonkeyPatch) -> None:
    # The kernel's time is a sleep, which load on the machine only lengthens by a scheduler's
    # wake-up: with real work (six times a 0.26 ms call) a CI machine under load read +407% and the
    # samples overlapped too much for the rank test (2026-11-25, two of thirteen runs).
    fake_dist({"sleeps": fake("sleeps")})
    args = [arg if arg != "repeated" else "sleeps" for arg in ARGS]
    monkeypatch.setenv("ATTNKIT_TEST_SLEEP_MS", "10")
    saved = pytester.runpytest(*args, "--attnkit-save-baseline")
    saved.assert_outcomes(passed=1)
    saved.stdout.fnmatch_lines(["NOTHING GATED: no baseline for this device", "baseline saved: *bl*.json*",
                                "  0 entries pooled *, 0 started afresh *, 1 new"])
    [baseline_file] = (pytester.path / "bl").iterdir()
    document = json.loads(baseline_file.read_text())
    [entry] = document["entries"].values()
    assert document["schema_version"] == 2 and entry["samples"] >= 15 and entry["timer"] == "perf-counter"
    assert [run["median_ms"] for run in entry["history"]] == [entry["median_ms"]]

    monkeypatch.setenv("ATTNKIT_TEST_SLEEP_MS", "60")  # six times as long
    slower = pytester.runpytest(*args)
    assert slower.ret == pytest.ExitCode.TESTS_FAILED
    assert said(slower, "sleeps regressed on b1-h2-q256-k256-d64-fp32 (forward): median * ms -> * ms, +*% "
                        "*flagged in 3 of 3 independent rounds)"), slower.stdout.str()
    slower.stdout.fnmatch_lines([
        "implementation*mode*case*base ms*runs*now ms*change*thresh*verdict",
        "sleeps *fwd *b1-h2-q256-k256-d64-fp32 * 1 * REGRESSION 3/3",
    ])


# CPU timings between runs move far more than a GPU's: these tests are about what is saved, so they
# give the gate a wide threshold (a sixty-fourfold speedup still restarts a history under it).
WIDE = ("--attnkit-threshold", "100%")


@pytest.mark.timing
def test_saved_runs_pool_until_a_run_finds_the_implementation_changed(
        pytester: pytest.Pytester, fake_dist, monkeypatch: pytest.MonkeyPatch) -> None:
    # A kernel whose time is a 40 ms sleep: on a loaded two-core machine work's time moved +91%
    # between runs (the gate then restarted the history it should pool), while a sleep only gains a
    # scheduler's wake-up, a few ms. The "changed" kernel drops the sleep: its call takes well under
    # 5 ms even under load, more than the eightfold change (three thresholds of 100%) that restarts.
    fake_dist({"sleeps": fake("sleeps")})
    args = [arg if arg != "repeated" else "sleeps" for arg in ARGS]
    monkeypatch.setenv("ATTNKIT_TEST_SLEEP_MS", "40")
    for _ in range(2):
        pytester.runpytest(*args, *WIDE, "--attnkit-save-baseline").assert_outcomes(passed=1)
    clean = pytester.runpytest(*args, *WIDE, "--attnkit-save-baseline")
    clean.assert_outcomes(passed=1)
    clean.stdout.fnmatch_lines(["sleeps *fwd *b1-h2-q256-k256-d64-fp32 * 2 * unchanged",
                                "baseline saved: *bl*.json", "  1 entries pooled with their earlier runs, 0 started afresh*, 0 new"])
    [baseline_file] = (pytester.path / "bl").iterdir()
    [entry] = json.loads(baseline_file.read_text())["entries"].values()
    assert len(entry["history"]) == 3 and entry["history"][-1]["median_ms"] == entry["median_ms"]
    assert entry["median_ms"] >= 40

    # No sleep: far beyond noise; saving it drops the runs of the slower implementation.
    monkeypatch.setenv("ATTNKIT_TEST_SLEEP_MS", "0")
    faster = pytester.runpytest(*args, *WIDE, "--attnkit-save-baseline")
    faster.assert_outcomes(passed=1)
    faster.stdout.fnmatch_lines(["sleeps * improvement", "baseline saved: *", "  0 entries pooled *, 1 started afresh *"])
    [entry] = json.loads(baseline_file.read_text())["entries"].values()
    assert len(entry["history"]) == 1 and entry["median_ms"] < 40 / 8


@pytest.mark.timing
def test_a_version_1_baseline_is_read_as_one_run(pytester: pytest.Pytester, fake_dist,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # A sleep's time, as above: a 0.26 ms call of real work moved eightfold under load and the
    # save restarted the history this test counts (2026-11-25).
    fake_dist({"sleeps": fake("sleeps")})
    args = [arg if arg != "repeated" else "sleeps" for arg in ARGS]
    monkeypatch.setenv("ATTNKIT_TEST_SLEEP_MS", "10")
    pytester.runpytest(*args, *WIDE, "--attnkit-save-baseline").assert_outcomes(passed=1)
    [baseline_file] = (pytester.path / "bl").iterdir()
    document = json.loads(baseline_file.read_text())
    document["schema_version"] = 1
    for entry in document["entries"].values():
        del entry["history"]
    baseline_file.write_text(json.dumps(document))
    result = pytester.runpytest(*args, *WIDE, "--attnkit-save-baseline")
    result.assert_outcomes(passed=1)
    # The runs column reads 1 (the verdict is CPU timing under whatever else the machine runs).
    result.stdout.fnmatch_lines(["sleeps *fwd *b1-h2-q256-k256-d64-fp32 * 1 * *% *%  *"])
    [entry] = json.loads(baseline_file.read_text())["entries"].values()
    assert len(entry["history"]) == 2


def test_a_required_baseline_that_is_missing_fails(pytester: pytest.Pytester, fake_dist) -> None:
    fake_dist({"repeated": fake("repeated")})
    result = pytester.runpytest(*ARGS, "--attnkit-require-baseline")
    result.assert_outcomes(failed=1)
    assert said(result, "no baseline file for this device * and a baseline is required "
                        "(--attnkit-require-baseline)"), result.stdout.str()


def test_cpu_numbers_are_labelled(pytester: pytest.Pytester, fake_dist) -> None:
    fake_dist({"repeated": fake("repeated")})
    result = pytester.runpytest(*ARGS)
    result.stdout.fnmatch_lines(["CPU numbers: perf_counter around each call on this machine's CPU; they check the plumbing and are"])


def test_a_history_restarts_only_far_beyond_noise() -> None:
    from pytest_attnkit.controller.gate import Decision
    from pytest_attnkit.controller.gate import changed_beyond_noise

    def decision(verdict: str, ratio: float) -> Decision:
        return Decision(verdict, ratio, ratio, 1.0, 0.0, 0.0, 0.05, 1.0, ratio)

    # Seen on the H200 between sessions for the reference: pooled, not restarted.
    assert not changed_beyond_noise(decision("regression", 1.11))
    assert not changed_beyond_noise(decision("improvement", 0.913))
    # A rewritten kernel: restarted.
    assert changed_beyond_noise(decision("improvement", 0.25))
    assert changed_beyond_noise(decision("regression", 1.5))
    assert not changed_beyond_noise(decision("unchanged", 0.5))


def test_the_reference_s_speed_tests_run_before_any_other_implementation_s(pytester: pytest.Pytester) -> None:
    """The gate divides every other implementation's timings by how much slower the machine runs
    the reference (gate.py: machine_factor), so the speed suite orders its reference's tests first
    (SpeedCheck.test_order); the other suites' tests keep pytest's order."""
    result = pytester.runpytest("--attnkit", "-p", "no:cacheprovider", "--attnkit-suite=correctness,speed",
                                "--attnkit-impl=torch_sdpa,triton_flash", "--attnkit-reference=triton_flash",
                                "--collect-only", "-q")
    ids = [line for line in result.stdout.lines if "::test_" in line]
    speed = [line for line in ids if "test_speed.py::" in line]
    assert speed and ids[:len(speed)] != speed, ids[:3]  # correctness keeps its place, first
    owners = ["triton_flash" in line for line in speed]
    first_other = owners.index(False)
    assert first_other > 0 and not any(owners[first_other:]), speed


def test_after_the_reference_an_implementation_that_may_need_the_whole_gpu_is_timed_last(
        pytester: pytest.Pytester) -> None:
    """cupy_naive declares quadratic memory: its 16k cases may need every idle worker stopped,
    the warm ones too, so its speed tests come after the linear implementations'
    (results/2026-11-27-session11)."""
    result = pytester.runpytest("--attnkit", "-p", "no:cacheprovider", "--attnkit-suite=speed",
                                "--attnkit-impl=cupy_naive,torch_sdpa,triton_flash", "--collect-only", "-q")
    speed = [line for line in result.stdout.lines if "test_speed.py::" in line]
    owners = [next(name for name in ("cupy_naive", "torch_sdpa", "triton_flash") if f"[{name}-" in line)
              for line in speed]
    assert owners and owners == sorted(owners, key=("torch_sdpa", "triton_flash", "cupy_naive").index), owners
