"""Report files, the step summary, an unwritable report directory, an interrupted run, and the words
the report writes for verdicts and statuses."""

from __future__ import annotations

import json
import os
import stat

import pytest

from helpers import fake
from pytest_attnkit.contract import MemoryClass
from pytest_attnkit.controller.gate import GateVerdict
from pytest_attnkit.controller.impls import ImplStatus
from pytest_attnkit.controller.outcome import Verdict
from pytest_attnkit.controller.paired import SyncKind
from pytest_attnkit.records import PointStatus

SPEED = ("--attnkit", "--attnkit-impl", "repeated", "--attnkit-device", "cpu", "--benchmark-disable",
         "--attnkit-baseline-dir=bl", "-k", "q17-k17 or (speed_forward and not causal)")


def test_report_files_and_step_summary(pytester: pytest.Pytester, fake_dist, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_dist({"repeated": fake("repeated")})
    summary = pytester.path / "step-summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    result = pytester.runpytest(*SPEED, "--attnkit-report=out")
    result.assert_outcomes(passed=3)  # two correctness tests and one speed test
    result.stdout.fnmatch_lines([
        "*attnkit summary: each implementation*",
        "repeated         correctness  pass: 2 of 2 tests run (2 passed, 0 failed), 0 skipped",
        "                 gate         NOT GATED: no baseline file for this device",
        "report: *out/",
        "  attnkit-report.json, attnkit-report.md, 1 plots",
    ])
    document = json.loads((pytester.path / "out" / "attnkit-report.json").read_text())
    assert (document["schema"], document["schema_version"], document["interrupted"]) == ("pytest-attnkit/report", 2, False)
    assert {test["outcome"] for test in document["tests"]} == {"passed"}
    [measurement] = document["speed"]["measurements"]
    assert measurement["impl"] == "repeated" and measurement["timing"]["timer"] == "perf-counter"
    assert (pytester.path / "out" / "speed-forward.png").stat().st_size > 10_000
    markdown = (pytester.path / "out" / "attnkit-report.md").read_text()
    assert "| repeated | pass: 2 of 2 tests run (2 passed, 0 failed), 0 skipped |" in markdown
    assert summary.read_text().startswith("# pytest-attnkit report")


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere")
def test_unwritable_report_directory_is_a_usage_error(pytester: pytest.Pytester) -> None:
    locked = pytester.mkdir("locked")
    locked.chmod(stat.S_IRUSR | stat.S_IXUSR)
    result = pytester.runpytest("--attnkit", "--attnkit-report=locked/report")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: attnkit: the report directory cannot be written (command line --attnkit-report): *"])


def test_report_path_that_is_a_file_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makefile(".txt", occupied="a file, not a folder")
    result = pytester.runpytest("--attnkit", "--attnkit-report=occupied.txt")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: attnkit: the report directory cannot be written (command line --attnkit-report): *"])


def test_interruption_keeps_the_baseline_and_writes_the_report(
    pytester: pytest.Pytester, fake_dist, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = fake_dist({"repeated": fake("repeated")})
    pytester.runpytest(*SPEED, "--attnkit-save-baseline").assert_outcomes(passed=3)
    [baseline_file] = (pytester.path / "bl").iterdir()
    before = baseline_file.read_bytes()
    # A plugin, not a conftest: conftest runtest hooks only reach items below their folder.
    pytester.makepyfile(interrupter="""
        def pytest_runtest_call(item):
            if "speed" in item.name:
                raise KeyboardInterrupt  # as Ctrl-C or a CI timeout would
    """)
    # Its own process: a KeyboardInterrupt in an in-process run would stop this test run too.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(root), str(pytester.path), os.environ.get("PYTHONPATH")])))
    result = pytester.runpytest_subprocess(*SPEED, "-p", "interrupter", "--attnkit-save-baseline", "--attnkit-report=out")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["baseline NOT saved: the run was interrupted*", "*bl*", "*unchanged)", "report: *"])
    assert baseline_file.read_bytes() == before
    document = json.loads((pytester.path / "out" / "attnkit-report.json").read_text())
    assert document["interrupted"] is True and [t["outcome"] for t in document["tests"]] == ["passed", "passed"]


def test_junit_properties_carry_the_figures(pytester: pytest.Pytester, fake_dist) -> None:
    fake_dist({"repeated": fake("repeated")})
    pytester.runpytest(*SPEED, "--junitxml=junit.xml").assert_outcomes(passed=3)
    xml = (pytester.path / "junit.xml").read_text()
    for name in ("attnkit_out_max_error", "attnkit_out_allowed", "attnkit_dq_max_error", "attnkit_seed",
                 "attnkit_median_ms", "attnkit_tflops", "attnkit_gbps"):
        assert f'name="{name}"' in xml, name


def test_a_report_folder_in_use_by_another_live_run_is_refused(pytester: pytest.Pytester) -> None:
    import signal
    import subprocess
    import sys

    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from pathlib import Path; "
                               "from pytest_attnkit.controller import report; report.claim(Path('out')); "
                               "print('held', flush=True); time.sleep(300)"],
                              cwd=pytester.path, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        result = pytester.runpytest("--attnkit", "--attnkit-suite=correctness", "--attnkit-report=out",
                                    "-k", "nothing_is_called_this")
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        result.stderr.fnmatch_lines([f"ERROR: attnkit: the report folder *out is in use by another run (pid {holder.pid}, "
                                     "since *: *); give this run another --attnkit-report, or let that one end first "
                                     "(command line --attnkit-report)"])
    finally:
        holder.send_signal(signal.SIGKILL)  # a run that dies lets go of its folder
        holder.wait()
    result = pytester.runpytest("--attnkit", "--attnkit-suite=correctness", "--attnkit-report=out",
                                "-k", "nothing_is_called_this")
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    assert (pytester.path / "out" / "attnkit-report.json").exists()


#: The words the report, the baseline files, the junit properties and the tables wrote before
#: these became enums (issue 45): they must not change.
WORDS = {Verdict: ["passed", "failed", "skipped"],
         GateVerdict: ["regression", "improvement", "unchanged", "insufficient", "other program", "not compared",
                       "other machine", "slower clock"],
         SyncKind: ["both", "new only"],
         MemoryClass: ["linear", "quadratic", "neither", "unclear"],
         PointStatus: ["measured", "oom", "error", "not run"],
         ImplStatus: ["available", "unavailable", "broken"]}


@pytest.mark.parametrize("kind", list(WORDS), ids=lambda kind: kind.__name__)
def test_verdicts_and_statuses_are_written_as_the_words_they_were(kind) -> None:
    assert [member.value for member in kind] == WORDS[kind]
    for member in kind:
        assert member == member.value and hash(member) == hash(member.value)
        assert str(member) == f"{member}" == f"{member:<4}".strip() == "%s" % member == member.value
        assert json.dumps({member: [member]}) == json.dumps({member.value: [member.value]})
        assert kind(member.value) is member  # what a report or a worker wrote reads back
