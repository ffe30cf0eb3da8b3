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


#: Set on xdist's controller when this plugin named the run, so that it removes the lock files.
NAMED = pytest.StashKey[str]()


def _distributing(config: pytest.Config) -> bool:
    """Whether this is the controller of a ``pytest -n`` run (``--dist`` is not ``no``)."""
    return not hasattr(config, "workerinput") and config.getoption("dist", "no") != "no"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARK)
    if _distributing(config) and not config.getoption("testrunuid", None):
        # Name the run now (xdist takes --testrunuid when given), so that the controller knows
        # the lock files its workers share and can remove them at the end. A run named on the
        # command line keeps its files: whoever named it may share them.
        config.option.testrunuid = config.stash[NAMED] = uuid.uuid4().hex


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``-n``, the timing tests go last, in one block: interleaved, each makes one worker
    idle while the other finishes its test; last, the workers wait for each other once. What it
    gained is not measured apart from the machine's load: on a 2-core machine whole runs took
    962 s with them interleaved and 991-1048 s with them last, against 1046 s one at a time
    (2026-11-28; the cores are busy with one test's workers already). Every worker sorts alike,
    as xdist requires."""
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
    testrunuid = session.config.stash.get(NAMED, None)
    if testrunuid:
        for suffix in (".turnstile", ".lock"):
            Path(f"{lock_stem(testrunuid)}{suffix}").unlink(missing_ok=True)
