"""pytest-xdist: correctness runs in parallel; the speed suite refuses to time in parallel and says so."""

from __future__ import annotations

import os

import pytest

from helpers import fake

pytest.importorskip("xdist")


def test_correctness_in_parallel_and_no_parallel_timing(pytester: pytest.Pytester, fake_dist,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    root = fake_dist({"good": fake("good")})
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))
    result = pytester.runpytest_subprocess("--attnkit", "--attnkit-impl", "good", "--attnkit-suite", "correctness,speed",
                                           "-n", "2", "-rs", "--benchmark-disable", "-k", "q17-k17 or speed_forward")
    result.assert_outcomes(passed=2, skipped=2)
    result.stdout.fnmatch_lines(["created: 2/2 workers*",
                                 "SKIPPED * the speed suite does not time in parallel: 2 xdist workers share 1 device(s)*"])
