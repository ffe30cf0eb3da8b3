"""The plugin stays light: no torch, CuPy or Triton in the pytest process, even during a run."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers import fake

HEAVY = ("torch", "triton", "cupy")


def test_importing_the_plugin_imports_nothing_heavy() -> None:
    code = ("import sys, pytest_attnkit, pytest_attnkit.plugin, pytest_attnkit.controller.session, "
            "pytest_attnkit.records, pytest_attnkit.registry; "
            f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    output = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert output.strip() == "[]"


def test_a_whole_run_leaves_the_pytest_process_free_of_torch(
    pytester: pytest.Pytester, fake_dist, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = fake_dist({"good": fake("good")})
    pytester.makeconftest(f"""
        import sys
        def pytest_sessionfinish(session):
            print("\\nHEAVY MODULES IN PYTEST PROCESS:", sorted(m for m in {HEAVY!r} if m in sys.modules))
    """)
    # The inner pytest is a separate process: it finds the fake distribution through PYTHONPATH.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))
    result = pytester.runpytest_subprocess("--attnkit", "--attnkit-impl", "good", "-k", "q17-k17", "-s")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["HEAVY MODULES IN PYTEST PROCESS: []"])
