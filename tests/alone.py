"""``@pytest.mark.timing``: a test whose verdict depends on wall-clock time runs alone under ``pytest -n``.

The project's tests run in two processes in CI (``pytest -n 2``, README). Most of them time
nothing, but some do: a gate judging CPU timings against a threshold, a deadline of seconds that
an honest call must meet. Beside another test on a two-core machine such a test measures the
other's load (a 12-fold slowdown read as unchanged, 2026-11-28), so it is marked ``timing`` and
runs with no other test beside it: every test holds a shared lock on one file of the session's,
a timing test an exclusive one. Writers go first: a timing test takes the turnstile before it
waits for the lock, and a test arriving meanwhile waits behind it, so the other worker's stream
of short tests does not starve it. Without ``-n`` the hook does nothing.
"""

from __future__ import annotations

import fcntl
import tempfile
import uuid
from pathlib import Path

import pytest

MARK = ("timing: its verdict depends on wall-clock time (CPU timings against a threshold, a deadline of "
        "seconds); under pytest -n it runs with no other test beside it (tests/alone.py)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARK)
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        # xdist's controller: name the run now (xdist takes --testrunuid when given), so that it
        # knows the lock files its workers share and can remove them at the end.
        if not config.getoption("testrunuid", None):
            config.option.testrunuid = uuid.uuid4().hex


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``-n``, the timing tests go last, in one block: interleaved, each made one worker idle
    while the other finished its test (a whole run took 962 s against 1046 s one at a time,
    2026-11-28); last, the workers wait for each other once. Every worker sorts alike, as
    xdist requires."""
    if hasattr(config, "workerinput"):
        items.sort(key=lambda item: item.get_closest_marker("timing") is not None)  # stable


def lock_stem(testrunuid: str) -> Path:
    """The two lock files of one ``pytest -n`` session (the same for all its workers)."""
    return Path(tempfile.gettempdir()) / f"attnkit-tests-{testrunuid}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    workerinput = getattr(item.config, "workerinput", None)
    if workerinput is None:  # not an xdist worker: tests run one at a time anyway
        yield
        return
    stem = lock_stem(workerinput["testrunuid"])
    alone = item.get_closest_marker("timing") is not None
    mode = fcntl.LOCK_EX if alone else fcntl.LOCK_SH
    with open(f"{stem}.turnstile", "a") as turnstile, open(f"{stem}.lock", "a") as lock:
        fcntl.flock(turnstile, mode)
        fcntl.flock(lock, mode)
        if not alone:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            fcntl.flock(turnstile, fcntl.LOCK_UN)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """The controller (not a worker) removes the session's lock files when the run ends."""
    if hasattr(session.config, "workerinput") or not getattr(session.config.option, "numprocesses", None):
        return
    testrunuid = session.config.getoption("testrunuid", None)
    if testrunuid:
        for suffix in (".turnstile", ".lock"):
            Path(f"{lock_stem(testrunuid)}{suffix}").unlink(missing_ok=True)
