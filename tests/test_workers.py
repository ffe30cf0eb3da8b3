"""A worker that dies or hangs fails its test with what happened; a fresh worker takes over;
every other implementation's results stand."""

from __future__ import annotations

import pytest

from helpers import fake, run_attnkit

CASES = "test_forward and (q17-k17 or q113-k113)"
SMALL = "b1-h2-q17-k17-d32-fp16-causal"
GQA = "b2-h4:2-q113-k113-d64-fp16-causal"


def test_crashes_fail_their_tests_and_the_run_goes_on(pytester: pytest.Pytester, fake_dist) -> None:
    fake_dist({name: fake(name) for name in ("good", "segfault", "aborts")})
    outcomes, recorder = run_attnkit(pytester, "--attnkit-impl", "good,segfault,aborts", "-k", CASES)
    for case in (SMALL, GQA):
        assert outcomes[f"test_forward[good-{case}]"].outcome == "passed"
        segfault = outcomes[f"test_forward[segfault-{case}]"]
        assert segfault.outcome == "failed"
        assert "died while running 'correctness': it was killed by SIGSEGV" in segfault.text
        assert "a fresh worker takes over" in segfault.text
        assert "Fatal Python error: Segmentation fault" in segfault.text  # faulthandler's report, from the log
        assert "in segfault" in segfault.text  # the Python frame where it happened
        aborts = outcomes[f"test_forward[aborts-{case}]"]
        assert aborts.outcome == "failed" and "killed by SIGABRT" in aborts.text
    assert recorder.ret == 1


def test_deadline_kills_a_hung_worker_and_a_fresh_one_takes_over(pytester: pytest.Pytester, fake_dist) -> None:
    fake_dist({name: fake(name) for name in ("good", "hangs")})
    outcomes, _ = run_attnkit(pytester, "--attnkit-impl", "good,hangs", "--attnkit-timeout", "4", "-k", CASES)
    for case in (SMALL, GQA):
        hung = outcomes[f"test_forward[hangs-{case}]"]
        assert hung.outcome == "failed"
        assert "passed its deadline of 4 s while running 'correctness' and was killed" in hung.text
        assert "in hangs" in hung.text  # faulthandler's dump shows where it was stuck
        assert outcomes[f"test_forward[good-{case}]"].outcome == "passed"


def test_inprocess_mode_runs_in_the_pytest_process(pytester: pytest.Pytester, fake_dist) -> None:
    fake_dist({"good": fake("good")})
    outcomes, recorder = run_attnkit(pytester, "--attnkit-impl", "good", "--attnkit-inprocess", "-k", SMALL)
    assert [o.outcome for o in outcomes.values()] == ["passed", "passed"]
    assert recorder.ret == 0


def test_an_implementation_that_breaks_in_a_fresh_worker_says_it_could_not_be_loaded(
        pytester: pytest.Pytester, fake_dist, monkeypatch: pytest.MonkeyPatch) -> None:
    # Imports once, crashes its worker, and then fails to import in the fresh worker that takes over:
    # the worker's "broken" reply must read as a load failure, not as a wrong result with no seed.
    marker = pytester.path / "imported-once"
    monkeypatch.setenv("ATTNKIT_TEST_MARKER", str(marker))
    fake_dist({"flaky": "flaky_import:attn"}, extra_modules={"flaky_import": """
        import ctypes, os, pathlib
        marker = pathlib.Path(os.environ["ATTNKIT_TEST_MARKER"])
        if marker.exists():
            raise ImportError("the second import fails")
        marker.write_text("")

        def attn(q, k, v, *, causal=False, scale=None):
            ctypes.string_at(0)
    """})
    outcomes, _ = run_attnkit(pytester, "--attnkit-impl", "flaky", "-k", CASES)
    first, second = (outcomes[f"test_forward[flaky-{case}]"] for case in (SMALL, GQA))
    assert first.outcome == "failed" and "killed by SIGSEGV" in first.text
    assert second.outcome == "failed"
    assert "flaky could not be loaded from entry point flaky_import:attn" in second.text
    assert "ImportError: the second import fails" in second.text
    assert "seed None" not in second.text
