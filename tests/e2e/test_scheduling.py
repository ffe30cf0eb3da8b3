"""Running requests ahead of the tests, several at a time (pytest_attnkit/controller/scheduler.py),
through pytest itself: each result lands on its own test, with the verdicts of the run that sends
one request at a time; a worker that dies takes down only the test it was running; ``-x`` and an
interrupt (SIGTERM, as a CI timeout sends) stop the outstanding work; no worker outlives the run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import fake, run_attnkit

#: The smoke set's forward cases with few rows, and those with 113 (two, with GQA and varlen).
CASES = "test_forward and (q1- or q17- or q113-)"


def _outcomes(pytester: pytest.Pytester, *args: str) -> dict[str, str]:
    outcomes, _ = run_attnkit(pytester, "--attnkit-suite=correctness", *args)
    return {name: outcome.outcome for name, outcome in outcomes.items()}


def _alive(pids: Path) -> list[int]:
    alive = []
    for path in pids.iterdir():
        try:
            os.kill(int(path.name), 0)
        except ProcessLookupError:
            continue
        alive.append(int(path.name))
    return alive


def test_each_result_lands_on_its_own_test_with_the_serial_verdicts(pytester: pytest.Pytester, fake_dist) -> None:
    fake_dist({name: fake(name) for name in ("good", "wrong_on_113", "wrong_scale")})
    impls = "--attnkit-impl=good,wrong_on_113,wrong_scale"
    parallel = _outcomes(pytester, impls, "--attnkit-jobs=4", "-k", CASES)
    serial = _outcomes(pytester, impls, "--attnkit-jobs=1", "-k", CASES)
    assert parallel == serial
    ran = {name: outcome for name, outcome in parallel.items() if outcome != "skipped"}
    assert {name for name, outcome in ran.items() if "wrong_on_113" in name and outcome == "failed"} == {
        name for name in ran if "wrong_on_113" in name and "q113-" in name} != set()
    assert {outcome for name, outcome in ran.items() if "[good-" in name} == {"passed"}
    assert "failed" in {outcome for name, outcome in ran.items() if "[wrong_scale-" in name}


def test_a_worker_that_dies_takes_down_only_its_own_test(pytester: pytest.Pytester, fake_dist) -> None:
    fake_dist({"segfault_on_113": fake("segfault_on_113")})
    outcomes, _ = run_attnkit(pytester, "--attnkit-suite=correctness", "--attnkit-impl=segfault_on_113",
                              "--attnkit-jobs=3", "-k", CASES)
    crashed = {name for name, outcome in outcomes.items() if outcome.outcome == "failed"}
    assert crashed == {name for name, outcome in outcomes.items() if "q113-" in name and outcome.outcome != "skipped"}
    assert crashed and any(outcome.outcome == "passed" for outcome in outcomes.values())
    for name in crashed:
        assert "killed by SIGSEGV" in outcomes[name].text and "a fresh worker takes over" in outcomes[name].text


@pytest.mark.timing
def test_x_stops_the_outstanding_work_and_leaves_no_worker(pytester: pytest.Pytester, fake_dist,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    fake_dist({"slow_but_wrong_on_1": fake("slow_but_wrong_on_1")})
    pids = pytester.mkdir("pids")
    monkeypatch.setenv("ATTNKIT_TEST_PIDS", str(pids))
    monkeypatch.setenv("ATTNKIT_TEST_SLEEP", "30")
    started = time.monotonic()
    outcomes, recorder = run_attnkit(pytester, "--attnkit-suite=correctness", "--attnkit-impl=slow_but_wrong_on_1",
                                     "--attnkit-jobs=2", "-x", "-k", "test_forward")
    assert time.monotonic() - started < 25  # not the 30 s of any slow case
    assert [outcome.outcome for outcome in outcomes.values()] == ["failed"]
    assert recorder.ret == 1
    assert list(pids.iterdir()) and _alive(pids) == []


@pytest.mark.timing
def test_sigterm_stops_the_outstanding_work_and_leaves_no_worker(pytester: pytest.Pytester, fake_dist,
                                                                 tmp_path: Path) -> None:
    root = fake_dist({"slow_but_wrong_on_1": fake("slow_but_wrong_on_1")})
    pids = pytester.mkdir("pids")
    env = {**os.environ, "ATTNKIT_TEST_PIDS": str(pids), "ATTNKIT_TEST_SLEEP": "60",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    log = tmp_path / "run.log"
    with open(log, "wb") as out:
        run = subprocess.Popen([sys.executable, "-m", "pytest", "--attnkit", "-p", "no:cacheprovider",
                                "--attnkit-suite=correctness", "--attnkit-impl=slow_but_wrong_on_1",
                                "--attnkit-jobs=2", "-k", "test_forward"],
                               cwd=pytester.path, env=env, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while len(list(pids.iterdir())) < 2 and time.monotonic() < deadline:  # both workers at work
            time.sleep(0.2)
        time.sleep(1.0)
        sent = time.monotonic()
        run.send_signal(signal.SIGTERM)
        status = run.wait(timeout=30)
    assert time.monotonic() - sent < 20
    assert status == pytest.ExitCode.INTERRUPTED, log.read_text()
    assert "received SIGTERM" in log.read_text()
    assert _alive(pids) == []


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_case_that_fits_only_without_the_other_workers_passes(pytester: pytest.Pytester, fake_dist,
                                                                 jobs: str) -> None:
    """``crowded_out`` runs out of device memory while any other worker process of the run lives
    (as a 16k case did on an H100 beside other workers' CUDA contexts): with one request at a time
    (the pool's own requests) and with the scheduler, it runs once more with the others stopped,
    and passes. Before issue 41 its tests failed with the out-of-memory."""
    fake_dist({name: fake(name) for name in ("good", "crowded_out")})
    outcomes = _outcomes(pytester, "--attnkit-impl=good,crowded_out", "-k", "test_forward and q17-",
                         f"--attnkit-jobs={jobs}")
    crowded = {name: outcome for name, outcome in outcomes.items() if "crowded_out" in name}
    assert crowded and set(crowded.values()) == {"passed"}, outcomes
    assert {outcome for name, outcome in outcomes.items() if "[good-" in name} == {"passed"}


def test_a_case_that_does_not_fit_alone_is_skipped_with_the_numbers(pytester: pytest.Pytester, fake_dist) -> None:
    fake_dist({name: fake(name) for name in ("good", "never_fits")})
    outcomes, _ = run_attnkit(pytester, "--attnkit-suite=correctness", "--attnkit-impl=good,never_fits",
                              "-k", "test_forward and q17-")
    never = [outcome for name, outcome in outcomes.items() if "never_fits" in name]
    assert never and {outcome.outcome for outcome in never} == {"skipped"}
    text = never[0].text
    assert "does not fit on this GPU alone" in text
    assert "asked for 16.0 GiB more while it held 68.8 GiB and 10.3 GiB were free" in text, text


@pytest.mark.timing
def test_x_stops_within_seconds_when_requests_ahead_hang(pytester: pytest.Pytester, fake_dist,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # The first test fails at once, but the scheduler gives both slots to the implementation with the
    # most work queued, which hangs: the test pytest waits for must not wait for them (before, -x took
    # the whole deadline here; --attnkit-jobs=1 stops at once).
    fake_dist({"a_wrong": fake("wrong_scale"), "b_hangs": fake("hangs")})
    pids = pytester.mkdir("pids")
    monkeypatch.setenv("ATTNKIT_TEST_PIDS", str(pids))
    started = time.monotonic()
    outcomes, recorder = run_attnkit(pytester, "--attnkit-suite=correctness", "--attnkit-impl=a_wrong,b_hangs",
                                     "--attnkit-jobs=2", "--attnkit-timeout=90", "-x",
                                     "-k", "(a_wrong and test_forward and q17-k17) or b_hangs")
    took = time.monotonic() - started
    assert [(name.split("-")[0], outcome.outcome) for name, outcome in outcomes.items()] == [
        ("test_forward[a_wrong", "failed")]
    assert recorder.ret == 1
    assert took < 45, f"-x took {took:.0f} s"
    assert list(pids.iterdir()) and _alive(pids) == []
