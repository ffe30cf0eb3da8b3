"""The CPU fault matrix (tools/fault_matrix/cpu_matrix.py) holds: each broken implementation's
tests say what went wrong, the correct ones pass, the default jobs and ``--attnkit-jobs=1`` agree,
``-x`` stops within seconds, and nothing is left behind; and docs/workers.md shows every fault and
every mode of it. CI runs two of its modes (the rest take minutes: run the tool for all of them)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "fault_matrix" / "cpu_matrix.py"


def _tool():
    spec = importlib.util.spec_from_file_location("cpu_matrix", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.timing  # deadlines of seconds (tests/alone.py)
def test_the_fault_matrix_holds(tmp_path: Path) -> None:
    """The hung kernel holds each run for its deadline (``-x``'s run up to its first failure), so
    the deadline is 6 s, not the tool's 20: the slowest request of the others, fault_child's
    timing, took 0.5 s on a 2-core machine."""
    ran = subprocess.run([sys.executable, str(TOOL), "--out", str(tmp_path), "--modes", "default,-x", "--timeout", "6",
                          "--check"], capture_output=True, text=True, timeout=900)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "| default | 1 |" in ran.stdout and "| -x | 1 |" in ran.stdout


def test_the_check_sees_a_broken_promise() -> None:
    tool = _tool()
    result = {"status": 1, "wall_s": 10.0, "stop_s": None, "left_processes": ["123 sleep"], "left_files": [],
              "most_tmp_bytes": 0, "tests": [
                  {"test": "pytest_attnkit/suites/test_correctness.py::test_forward[fault_hang-x]", "impl": "fault_hang",
                   "outcome": "passed", "message": ""}]}
    problems = tool.check({"default": result})
    assert any("left ['123 sleep']" in problem for problem in problems)
    assert any("fault_hang: expected fail" in problem for problem in problems)


def test_the_docs_show_every_fault_and_every_mode() -> None:
    tool = _tool()
    page = (ROOT / "docs" / "workers.md").read_text(encoding="utf-8")
    table = page[page.index("## The fault matrix"):]
    for impl in tool.EXPECTED:
        assert f"| {impl} |" in table, impl
    for mode in tool.MODES:
        assert f"| {mode} |" in table, mode
