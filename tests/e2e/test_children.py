"""No process an implementation starts outlives its worker, however the run ends: at its end, after
``-x``, on SIGINT and SIGTERM, when the pytest process is killed with SIGKILL, and when the worker
itself crashes (pytest_attnkit/descendants.py). Each run's implementations start a ``sleep`` in
their worker's process group and another through a daemon's double fork with ``setsid`` (the fakes'
``_start_children``); every process of the run carries a marker in its environment, and none may be
left once the run is over."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import fake, words

CASES = "test_forward and (q17-k17 or q113-k113)"


def _marked(marker: str) -> list[tuple[int, str]]:
    """(pid, command) of the live processes whose environment carries ``marker``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as stream:
                if marker.encode() not in stream.read():
                    continue
            with open(f"/proc/{entry}/comm") as stream:
                found.append((int(entry), stream.read().strip()))
        except OSError:
            pass
    return found


def _sleeps(marker: str) -> list[int]:
    return [pid for pid, command in _marked(marker) if command == "sleep"]


def _wait_gone(marker: str, seconds: float) -> list[tuple[int, str]]:
    deadline = time.monotonic() + seconds
    while _marked(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    return _marked(marker)


@pytest.fixture
def marker():
    """A marker for this test's processes; whatever carries it at the end is killed (never left to
    the next test, whatever the outcome)."""
    value = f"ATTNKIT_CHILDREN_TEST_{os.getpid()}_{time.monotonic_ns()}"
    yield value
    for pid, _ in _marked(value):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _start(pytester: pytest.Pytester, root: Path, marker: str, *args: str) -> tuple[subprocess.Popen[bytes], Path]:
    log = pytester.path / "run.log"
    started = pytester.mkdir("children")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])),
               PYTHONUNBUFFERED="1", ATTNKIT_TEST_CHILDREN=str(started), **{marker: "1"})
    with open(log, "wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "pytest", "--attnkit", "-p", "no:cacheprovider",
                                    "--attnkit-device=cpu", "--attnkit-suite=correctness", *args],
                                   cwd=pytester.path, env=env, stdout=out, stderr=subprocess.STDOUT,
                                   preexec_fn=_interruptible)
    return process, log


def _interruptible() -> None:
    # SIGINT as Ctrl-C in a terminal finds it. A shell that starts a job in the background without
    # job control (`bash .ci/run &`) hands it SIGINT ignored, every process under it inherits that,
    # and the run rightly went on when this test sent SIGINT (it waited out its 60 s).
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("ending", ["end", "-x", "SIGINT", "SIGTERM", "SIGKILL"])
def test_no_process_an_implementation_started_outlives_the_run(pytester: pytest.Pytester, fake_dist, marker: str,
                                                              ending: str) -> None:
    root = fake_dist({name: fake(name) for name in
                      ("starts_children", "starts_children_and_crashes", "starts_children_and_hangs")})
    if ending in ("end", "-x"):
        # Default jobs: requests run ahead of the tests; -x stops at the first crash.
        process, log = _start(pytester, root, marker, "--attnkit-impl=starts_children,starts_children_and_crashes",
                              "-k", CASES, *(["-x"] if ending == "-x" else []))
        status = process.wait(timeout=240)
        assert status == pytest.ExitCode.TESTS_FAILED, log.read_text()
        assert "killed by SIGSEGV" in words(log.read_text())  # wrapped at 100 columns
        assert list((pytester.path / "children").iterdir())  # children were started
    else:
        process, log = _start(pytester, root, marker, "--attnkit-impl=starts_children,starts_children_and_hangs",
                              "--attnkit-jobs=1", "-k", CASES)
        deadline = time.monotonic() + 120
        while len(_sleeps(marker)) < 4 and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.2)  # both implementations' children run, and one of them hangs
        assert len(_sleeps(marker)) >= 4, log.read_text()
        process.send_signal(getattr(signal, ending))
        status = process.wait(timeout=60)
        if ending != "SIGKILL":
            assert status == pytest.ExitCode.INTERRUPTED, log.read_text()
    left = _wait_gone(marker, 10)
    assert left == [], f"left behind after the run ended ({ending}): {left}\n{log.read_text()[-3000:]}"


@pytest.mark.timing
def test_what_a_worker_started_ends_with_the_worker_not_the_run(pytester: pytest.Pytester, fake_dist,
                                                                marker: str) -> None:
    # A worker that crashes and one killed at its deadline: their children end then, while the run goes on.
    root = fake_dist({**{name: fake(name) for name in ("starts_children_and_crashes", "starts_children_and_hangs")},
                      "zz_hangs": fake("hangs")})
    process, log = _start(pytester, root, marker, "--attnkit-impl=starts_children_and_crashes,starts_children_and_hangs,"
                          "zz_hangs", "--attnkit-jobs=1", "--attnkit-timeout=5", "-v", "-k",
                          "test_forward and q17-k17")
    try:
        # The crash and the deadline come first (tests run in the implementations' order); zz_hangs
        # then holds the run for its 5 s, long past the look below.
        deadline = time.monotonic() + 120
        while "[zz_hangs-" not in log.read_text() and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.2)
        time.sleep(1.0)
        assert process.poll() is None, log.read_text()
        assert _sleeps(marker) == [], log.read_text()
    finally:
        process.wait(timeout=120)
    assert _wait_gone(marker, 10) == []
