"""A worker that dies or hangs fails its test with what happened; a fresh worker takes over;
every other implementation's results stand."""

from __future__ import annotations

import os
import re
import time

import pytest

from helpers import fake, run_attnkit, words

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


@pytest.mark.timing
def test_deadline_kills_a_hung_worker_and_a_fresh_one_takes_over(pytester: pytest.Pytester, fake_dist) -> None:
    fake_dist({name: fake(name) for name in ("good", "hangs")})
    outcomes, _ = run_attnkit(pytester, "--attnkit-impl", "good,hangs", "--attnkit-timeout", "2", "-k", CASES)
    for case in (SMALL, GQA):
        hung = outcomes[f"test_forward[hangs-{case}]"]
        assert hung.outcome == "failed"
        assert "passed its deadline of 2 s while running 'correctness' and was killed" in hung.text
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


def test_a_worker_log_keeps_its_start_and_its_end_within_a_size(pytester: pytest.Pytester, fake_dist,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    # A kernel that prints a megabyte per call, and crashes on its sixth: its log keeps the start and
    # the end (faulthandler's traceback), says what was cut, and never holds the megabytes.
    import os
    import threading

    root = fake_dist({"chatty": fake("chatty_then_segfault")})
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))
    temporary = pytester.mkdir("tmp")
    monkeypatch.setenv("TMPDIR", str(temporary))
    most, done = [0], threading.Event()

    def sample() -> None:
        while not done.wait(0.1):
            most[0] = max(most[0], sum(os.path.getsize(os.path.join(root, name)) for root, _, names in
                                       os.walk(temporary) for name in names if os.path.exists(os.path.join(root, name))))

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        result = pytester.runpytest_subprocess("--attnkit", "-p", "no:cacheprovider", "--attnkit-impl=chatty",
                                               "--attnkit-device=cpu", "--attnkit-suite=speed", "--attnkit-jobs=1",
                                               "--benchmark-disable", "-k", "speed_forward and not causal")
    finally:
        done.set()
        sampler.join()
    text = words(result.stdout.str())  # the message is wrapped at 100 columns
    assert "killed by SIGSEGV" in text
    assert re.search(r"last lines of its log \(.*chatty\.1\.log; \d+ bytes of output were cut from its middle, the "
                     r"first and last 256 KiB are kept\)", text)
    assert "Fatal Python error: Segmentation fault" in text  # the end of the log is kept
    assert most[0] < 4 * 2**20, f"the worker logs held {most[0] / 2**20:.1f} MiB at once"


def test_the_log_file_keeps_the_head_the_tail_and_says_what_was_cut(tmp_path) -> None:
    import os

    from pytest_attnkit.controller.worker_log import HEAD_BYTES, TAIL_BYTES, WorkerLog

    log = WorkerLog(tmp_path / "w.log")
    writer = os.dup(log.writer())
    log.started()
    lines = [f"line {index:07d}\n".encode() for index in range(400_000)]  # 5.2 MB
    for start in range(0, len(lines), 1000):
        os.write(writer, b"".join(lines[start:start + 1000]))
    os.close(writer)  # the worker ends
    assert log.tail(13) == lines[-1]
    text = (tmp_path / "w.log").read_bytes()
    cut = len(b"".join(lines)) - HEAD_BYTES - TAIL_BYTES
    notice = f"[attnkit: {cut} bytes of this worker's output were cut here".encode()
    assert text.startswith(b"".join(lines[:100])) and text.endswith(b"".join(lines[-100:])) and notice in text
    assert len(text) < HEAD_BYTES + TAIL_BYTES + 200


def test_a_killed_runs_log_folder_is_removed_by_the_next_run(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess
    import sys
    import tempfile

    from pytest_attnkit.controller import worker_log

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    killed = tmp_path / f"attnkit-workers-{dead.stdout.strip()}-abc"  # a run killed with SIGKILL left it
    (killed / "w.1.log").parent.mkdir()
    (killed / "w.1.log").write_text("log")
    alive = tmp_path / f"attnkit-workers-{os.getppid()}-def"  # a live run's
    alive.mkdir()
    unnamed = tmp_path / "attnkit-workers-ghi"
    unnamed.mkdir()
    mine = worker_log.log_folder()
    assert mine.name.startswith(f"attnkit-workers-{os.getpid()}-")
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted([alive.name, unnamed.name, mine.name])


SLOW_TO_COMPILE = """
    import os, time
    import torch, torch._dynamo  # imported with the implementation, as a compiled kernel's module does
    from fake_kernels import good

    def _slow_backend(graph_module, example_inputs):
        # A compiler that takes ATTNKIT_TEST_COMPILE_S seconds for each graph, as one beside other
        # workers on a busy machine does.
        time.sleep(float(os.environ["ATTNKIT_TEST_COMPILE_S"]))
        return graph_module.forward

    def attn(q, k, v, *, causal=False, scale=None):
        return torch.compile(good, backend=_slow_backend, dynamic=False)(q, k, v, causal=causal, scale=scale)
"""


@pytest.mark.timing
def test_a_deadline_counts_the_call_not_its_compiling(pytester: pytest.Pytester, fake_dist,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # Compiling takes longer than the deadline (and longer still beside other workers); the call does
    # not: the verdict is the call's, the same whatever ran beside it.
    fake_dist({"slow_compile": "slow_compile:attn"}, extra_modules={"slow_compile": SLOW_TO_COMPILE})
    monkeypatch.setenv("ATTNKIT_TEST_COMPILE_S", "4")
    verdicts = {}
    for jobs in ("1", "2"):
        outcomes, _ = run_attnkit(pytester, "--attnkit-impl=slow_compile", f"--attnkit-jobs={jobs}",
                                  "--attnkit-timeout=3", "-k", "test_forward and q17-k17")
        verdicts[jobs] = {name: (outcome.outcome, outcome.text[:300]) for name, outcome in outcomes.items()}
    assert verdicts["1"] == verdicts["2"] == {f"test_forward[slow_compile-{SMALL}]": ("passed", "")}


@pytest.mark.timing
def test_a_compiler_that_hangs_is_killed_at_its_own_deadline(pytester: pytest.Pytester, fake_dist,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    fake_dist({"slow_compile": "slow_compile:attn"}, extra_modules={"slow_compile": SLOW_TO_COMPILE})
    monkeypatch.setenv("ATTNKIT_TEST_COMPILE_S", "3600")
    started = time.monotonic()
    outcomes, _ = run_attnkit(pytester, "--attnkit-impl=slow_compile", "--attnkit-jobs=1", "--attnkit-timeout=2",
                              "-k", "test_forward and q17-k17")
    hung = outcomes[f"test_forward[slow_compile-{SMALL}]"]
    assert hung.outcome == "failed"
    assert "compiled for more than 8 s (4 x its deadline of 2 s) while running 'correctness' and was killed" in hung.text
    assert "in _slow_backend" in hung.text  # faulthandler's dump: stuck in the compiler
    assert time.monotonic() - started < 60


@pytest.mark.timing
def test_a_tight_deadline_is_for_calls_not_for_starting_up(pytester: pytest.Pytester, fake_dist) -> None:
    """``--attnkit-timeout`` bounds one call of a kernel. Loading an implementation whose module
    takes longer than that to import (torch and a kernel's module on a busy machine took over 3 s)
    is start-up work with a deadline of its own: before, it broke the implementation ("passed its
    deadline ... while running 'describe'"), and the environment probe broke the run."""
    fake_dist({"slow_to_import": "slow_import:attention"}, extra_modules={"slow_import": """
        import time
        time.sleep(4)
        from fake_kernels import good as attention
    """})
    outcomes, _ = run_attnkit(pytester, "--attnkit-impl", "slow_to_import", "--attnkit-timeout", "2", "-k", SMALL)
    assert outcomes and {outcome.outcome for outcome in outcomes.values()} == {"passed"}, outcomes


def test_a_hung_workers_excerpt_keeps_the_frame_it_was_stuck_in() -> None:
    """The failure shows the innermost frames of a faulthandler dump whatever the paths' length:
    the last 4000 characters of a 40-frame dump through a long virtual environment's path were its
    outermost frames only, and test_a_compiler_that_hangs_is_killed_at_its_own_deadline failed
    where the venv's path was three characters longer."""
    from pytest_attnkit.controller.worker_log import excerpt

    site = "/home/runner/work/pytest-attnkit/pytest-attnkit/.venv-ci/lib/python3.11/site-packages"
    dump = ["Thread 0x00007f0000000001 (most recent call first):",
            *[f'  File "/usr/lib/python3.11/threading.py", line {n} in wait' for n in range(1, 9)],
            "",
            "Current thread 0x00007f33685fdb80 (most recent call first):",
            '  File "/tmp/site/slow_compile.py", line 9 in _slow_backend',
            *[f'  File "{site}/torch/_dynamo/convert_frame.py", line {n} in frame_{n}' for n in range(40)],
            '  File "<frozen runpy>", line 198 in _run_module_as_main']
    text = "importing torch\n" * 500 + "\n".join(dump)
    assert "_slow_backend" not in text[-4000:]  # what a plain tail showed
    shown = excerpt(text, 4000)
    assert len(shown) <= 4000
    assert "line 9 in _slow_backend" in shown and "Thread 0x00007f0000000001" in shown
    assert "... 26 outer frame(s) left out" in shown and "... 5 outer frame(s) left out" in shown
    assert "_run_module_as_main" not in shown
    assert excerpt("no dump here\n" * 10, 20) == ("no dump here\n" * 10)[-20:]
