"""``@pytest.mark.timing``: a test whose verdict depends on wall-clock time runs alone under ``pytest -n``.

The project's tests run in two processes in CI (``pytest -n 2``, README). Most of them time
nothing, but some do: a gate judging CPU timings against a threshold, a deadline of seconds that
an honest call must meet. Beside another test on a two-core machine such a test measures the
other's load (a 12-fold slowdown read as unchanged, 2026-11-28), so it is marked ``timing`` and
runs with no other test beside it: every test holds a shared lock on one file of the session's,
a timing test an exclusive one. Writers go first: a timing test takes the turnstile before it
waits for the lock, and a test arriving meanwhile waits behind it, so the other worker's stream
of short tests does not starve it. Without ``-n`` the hook does nothing.

Work that several tests read and that takes a minute (a child process running Triton's
interpreter over a batch of cases) is done once per run, not once per xdist worker:
:func:`once_per_run`.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
import uuid
from pathlib import Path
from typing import Any, Callable

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
    """Under ``-n``, the timing tests go last, in one block: interleaved, each made one worker idle
    while the other finished its test (a whole run took 962 s against 1046 s one at a time,
    2026-11-28); last, the workers wait for each other once. Every worker sorts alike, as
    xdist requires."""
    if hasattr(config, "workerinput"):
        items.sort(key=lambda item: item.get_closest_marker("timing") is not None)  # stable


def lock_stem(testrunuid: str) -> Path:
    """The two lock files of one ``pytest -n`` session (the same for all its workers)."""
    return Path(tempfile.gettempdir()) / f"attnkit-tests-{testrunuid}"


def distributed() -> bool:
    """Whether this process is one of a ``pytest -n`` run's workers."""
    return bool(os.environ.get("PYTEST_XDIST_TESTRUNUID"))


def once_per_run(name: str, compute: Callable[[], Any]) -> Any:
    """``compute()``'s result (JSON), computed once per run: under ``pytest -n`` the first worker
    to ask computes it while another that asks waits, then reads what it wrote (two workers each
    running the same interpreter batch took the CI machine's two cores for a minute, 2026-11-28).
    A computation that raises writes nothing: the next worker to ask tries again. Without ``-n``,
    ``compute()``."""
    testrunuid = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if not testrunuid:
        return compute()
    stem = lock_stem(testrunuid)
    path = Path(f"{stem}.{name}.json")
    with open(f"{stem}.{name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.exists():
            return json.loads(path.read_text(encoding="utf-8"))
        value = compute()
        written = path.with_name(path.name + ".part")
        written.write_text(json.dumps(value), encoding="utf-8")
        written.replace(path)
        return value


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
    """The controller (not a worker) removes the session's files when the run ends: its locks,
    and what :func:`once_per_run` wrote."""
    testrunuid = session.config.stash.get(NAMED, None)
    if testrunuid:
        stem = lock_stem(testrunuid)
        for path in stem.parent.glob(f"{stem.name}.*"):
            path.unlink(missing_ok=True)
