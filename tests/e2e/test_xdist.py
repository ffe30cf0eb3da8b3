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


def test_the_summary_and_the_report_combine_every_xdist_worker(pytester: pytest.Pytester, fake_dist,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    root = fake_dist({"good": fake("good"), "wrong_scale": fake("wrong_scale")})
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))
    result = pytester.runpytest_subprocess("--attnkit", "--attnkit-impl=good,wrong_scale", "--attnkit-suite=correctness",
                                           "-n", "2", "--attnkit-report=out", "-k", "test_forward and (q17-k17 or q113-k113)")
    outcomes = result.parseoutcomes()
    assert (outcomes["passed"], outcomes["failed"]) == (2, 2)
    result.stdout.fnmatch_lines(["good             correctness  pass: 2 of * tests run (2 passed, 0 failed)*",
                                 "wrong_scale      correctness  FAIL: 2 of * tests run (0 passed, 2 failed)*"])
    document = json.loads((pytester.path / "out" / "attnkit-report.json").read_text())
    ran = sorted(test["outcome"] for test in document["tests"] if test["outcome"] != "skipped")
    assert ran == ["failed", "failed", "passed", "passed"]


def test_the_controller_deals_every_test_to_one_worker_by_implementation_and_function() -> None:
    from pytest_attnkit.controller.xdist import dealt

    names = ["a", "b-c", "b"]  # "b-c" is no case of "b": the longest known name wins
    nodeids = [f"s.py::test_forward[{impl}-b1-h2-q{n}-k{n}-d64-fp16]" for impl in ("a", "b-c") for n in range(5)]
    nodeids += ["s.py::test_memory_forward[a]", "s.py::test_memory_forward[b-c]"]
    workers = dealt(nodeids, 2, names)
    assert len(workers) == len(nodeids) and set(workers) == {0, 1}
    for impl in ("a", "b-c"):  # each implementation's cases alternate between the two workers
        mine = [worker for nodeid, worker in zip(nodeids, workers) if f"[{impl}-b1" in nodeid]
        assert sorted(mine) in ([0, 0, 0, 1, 1], [0, 0, 1, 1, 1])
    assert dealt(nodeids, 2, reversed(names)) == workers  # the same on every side, whatever the names' order


def test_a_test_is_dealt_by_the_implementation_it_names_whatever_its_case_id_looks_like() -> None:
    from pytest_attnkit.controller.xdist import dealt, implementation_of

    assert implementation_of("k@v1-b1-h4:2-q65-k65-d64-fp16-causal", ["k", "k@v1"]) == "k@v1"
    assert implementation_of("k", ["k", "k@v1"]) == "k"
    assert implementation_of("kx-b1", ["k"]) is None
    # Cases whose ids a pattern over "-b<batch>-h<heads>" would not find: one group per implementation.
    nodeids = [f"s.py::test_check[k-{case}]" for case in ("one", "two", "three", "four")]
    assert dealt(nodeids, 2, ["k"]) == [0, 1, 0, 1]


def test_each_xdist_worker_runs_the_requests_of_its_own_tests_ahead(pytester: pytest.Pytester, fake_dist,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    root = fake_dist({"good": fake("good")})
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))
    result = pytester.runpytest_subprocess("--attnkit", "--attnkit-impl=good", "--attnkit-suite=correctness",
                                           "-n", "2", "--attnkit-jobs=2", "--attnkit-report=out",
                                           "-k", "test_forward and (q1- or q17- or q113-)")
    document = json.loads((pytester.path / "out" / "attnkit-report.json").read_text())
    ran = [test for test in document["tests"] if test["outcome"] != "skipped"]
    assert ran and all(test["outcome"] == "passed" for test in ran)
    [row] = [row for row in document["time"]["rows"] if row["suite"] == "correctness"]
    assert row["requests"] == len(ran)  # each once, on the worker that ran the test, none twice
    assert document["time"]["xdist_workers"] == 2
    result.stdout.fnmatch_lines(["*attnkit time: where it went*"])
