"""Running an inner ``pytest --attnkit`` and reading each test's outcome; importing the GPU lab's scripts."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest


@dataclass
class Outcome:
    outcome: str  # passed, failed, skipped
    text: str


def run_attnkit(pytester: pytest.Pytester, *args: str) -> tuple[dict[str, Outcome], pytest.HookRecorder]:
    """Run ``pytest --attnkit *args`` in-process; outcomes keyed ``test_forward[impl-case]``."""
    recorder = pytester.inline_run("--attnkit", "-p", "no:cacheprovider", *args)
    outcomes: dict[str, Outcome] = {}
    for report in recorder.getreports("pytest_runtest_logreport"):
        if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
            name = report.nodeid.rsplit("::", 1)[-1]
            if report.skipped and isinstance(report.longrepr, tuple):
                text = report.longrepr[2]
            else:
                text = str(report.longrepr or "")
            outcomes[name] = Outcome(report.outcome, text)
    return outcomes, recorder


def only(function: str, cases: dict[str, tuple[str, ...]]) -> str:
    """A ``-k`` expression that selects ``function`` on each implementation's ``cases`` alone
    (``{impl: (case id, ...)}``): a rule's test asserts a fault on the cases it must fail, and its
    other cases would cost a run the time of a request each without an assertion on them."""
    return f"{function} and (" + " or ".join(f"{impl}-{case}" for impl, ids in cases.items() for case in ids) + ")"


def fake(name: str) -> str:
    """The entry-point target of an implementation in tests/fakes/fake_kernels.py."""
    return f"fake_kernels:{name}"


def words(text: str) -> str:
    """``text`` with every run of whitespace made one space: the terminal wraps attnkit's failure
    messages at 100 columns (controller/outcome.py: fit), so a test reads their words, not their
    line breaks."""
    return " ".join(text.split())


def said(result: pytest.RunResult, pattern: str) -> bool:
    """Whether the terminal output of ``result`` says ``pattern`` (``*`` for any words), across the
    line breaks of wrapped messages."""
    import re

    glob = ".{0,200}?".join(re.escape(part) for part in words(pattern).split("*"))  # "*": within a message
    return re.search(glob, words(result.stdout.str())) is not None


@contextmanager
def judged(verdict: str, match: str | None = None) -> Iterator[pytest.ExceptionInfo]:
    """A check raised :class:`Judged` with this verdict ("failed", "skipped"), its message matching
    ``match``: what the test then settles as its outcome."""
    from pytest_attnkit.controller.outcome import Judged

    with pytest.raises(Judged, match=match) as raised:
        yield raised
    assert raised.value.judgement.verdict == verdict, raised.value.judgement


#: tools/flash_bench: the GPU lab's scripts, which some tests import to run their CPU parts.
FLASH_BENCH = Path(__file__).resolve().parents[1] / "tools" / "flash_bench"


def flash_bench_module(name: str) -> Any:
    """Import ``tools/flash_bench/<name>.py`` (its folder on sys.path only while it imports)."""
    import importlib
    import sys

    sys.path.insert(0, str(FLASH_BENCH))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(FLASH_BENCH))
