"""From a worker's reply to a pytest outcome: one function, one wording, for every suite.

Every suite's check sends its request through the pool and hands the reply to
:meth:`Outcomes.from_reply` (or :meth:`Outcomes.check`, which raises it as :class:`Judged`): ``OK``
is no judgement, a refusal skips with the implementation's reasons in words, a case that did not
fit on the GPU alone skips with the numbers, everything else fails with what went wrong. A
:class:`Judgement` becomes the test's outcome in one place only, :meth:`Outcomes.settle` (or, for
a refusal known at collection, :meth:`Outcomes.skip_at_collection`); the item keeps it for the
report (:data:`JUDGEMENT_KEY`). A traceback is shown once per implementation
and error; the tests that meet the same error again get a one-line reference to the first. What
the terminal shows of any attnkit failure is wrapped to 100 columns by :func:`fit`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

import pytest

from pytest_attnkit.controller.terminal import NO_BREAK, WIDTH, wrap
from pytest_attnkit.messages import Reply, Status


class Verdict(str, Enum):
    """A test's outcome as the report keeps it, in pytest's words (``TestReport.outcome``)."""

    __str__ = str.__str__  # f"{verdict}" and str(verdict) give the value

    PASSED = "passed"
    FAILED = "failed"
    SKIPPED = "skipped"


def reason_of(message: str) -> str:
    """The short reason the report keeps of a skip: the words after its first ": ", up to a
    ";" ("unavailable: no CUDA device; ..." -> "no CUDA device"). Whole: the views shorten it
    where they must, at a word (table.py: correctness_verdict)."""
    return message.removeprefix("Skipped: ").split(": ", 1)[-1].split(";")[0].strip()


@dataclass(frozen=True)
class Judgement:
    """What a suite decided of one test: the only input of :meth:`Outcomes.settle`."""

    verdict: Verdict
    message: str = ""  # the failure or skip text, as pytest shows it
    reason: str = ""  # the short reason the report keeps of a skip (reason_of(message) if not given)
    properties: tuple[tuple[str, object], ...] = ()  # junit properties (attnkit_...)
    record: Mapping[str, Any] | None = None  # the suite's report entry for this test, if any

    def __post_init__(self) -> None:
        if self.verdict is Verdict.SKIPPED and not self.reason:
            object.__setattr__(self, "reason", reason_of(self.message))


def skipped(message: str, **fields: Any) -> Judgement:
    return Judgement(Verdict.SKIPPED, message, **fields)


def refused(impl: str, why: str) -> Judgement:
    """The skip of a test whose case the implementation's declarations refuse; the report marks it
    (``refused``), so that a run whose named implementation refused every test it selected is not
    green (:func:`pytest_attnkit.controller.session.asked_for_but_untested`)."""
    return skipped(f"{impl} does not support it: {why}", record={"refused": True})


def failed(message: str, **fields: Any) -> Judgement:
    return Judgement(Verdict.FAILED, message, **fields)


class Judged(Exception):
    """Raised with a judgement deep inside a suite's judging; the runner settles it
    (:meth:`pytest_attnkit.controller.runner.Runner.run`)."""

    def __init__(self, judgement: Judgement) -> None:
        super().__init__(judgement.message)
        self.judgement = judgement


#: Where a settled or collection-time judgement waits for :meth:`AttnkitSession.record`.
JUDGEMENT_KEY = pytest.StashKey[Judgement]()


def fit(text: str, width: int = WIDTH) -> str:
    """A failure message as the terminal shows it: every line longer than ``width`` wrapped at
    words, its continuation indented four columns past its own indentation, nothing cut. What
    cannot break stays whole: a path, and a rerun command (its words joined by ``NO_BREAK``),
    which must paste back as one line."""
    lines = []
    for line in text.splitlines():
        if len(line) <= width:
            lines.append(line.replace(NO_BREAK, " "))
            continue
        indent = " " * (len(line) - len(line.lstrip()) + 4)
        lines += wrap(line, indent, width)
    return "\n".join(lines)


class FittedMessage:
    """A failure's message as a test report's ``longrepr``: the terminal gets it wrapped by
    :func:`fit`; ``str()`` (the report files, JUnit XML, pytest-xdist) gets it as it was written."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __str__(self) -> str:
        return self.text.replace(NO_BREAK, " ")

    def toterminal(self, out: Any) -> None:
        for line in fit(self.text).splitlines():
            out.line(line)


def last_line(text: str) -> str:
    """The last line of ``text`` that is not blank, stripped: an error's own line under its traceback."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else "?"


def describe_out_of_memory(figures: dict[str, Any]) -> str:
    """The numbers of an out-of-memory reply (:mod:`pytest_attnkit.worker.out_of_memory`) in words:
    "asked for 16.0 GiB more while it held 68.8 GiB and 10.3 GiB were free (79.2 GiB in all); no
    other process held memory on the GPU"."""

    def gib(value: Any) -> str:
        return f"{value / 2**30:.1f} GiB"

    parts = []
    if figures.get("requested_bytes"):
        parts.append(f"asked for {gib(figures['requested_bytes'])} more")
    if "process_at_failure_bytes" in figures:
        parts.append(f"while it held {gib(figures['process_at_failure_bytes'])}")
    if "free_at_failure_bytes" in figures:
        parts.append(f"and {gib(figures['free_at_failure_bytes'])} were free")
    elif "free_bytes" in figures:
        parts.append(f"with {gib(figures['free_bytes'])} free once it had let go")
    text = " ".join(parts) or "the device's figures could not be read"
    if figures.get("total_bytes"):
        text += f" ({gib(figures['total_bytes'])} in all)"
    if figures.get("other_processes"):
        text += f"; {figures['other_processes']} other process(es) on the GPU held {gib(figures.get('other_bytes', 0))}"
    elif "other_processes" in figures:
        text += "; no other process held memory on the GPU"
    return text


class Outcomes:
    def __init__(self) -> None:
        #: (implementation, error's last line) -> where it was first shown in full.
        self._shown: dict[tuple[str, str], str] = {}
        self._broken_shown: set[str] = set()

    def _once(self, impl: str, where: str, text: str) -> str | None:
        """None the first time this implementation shows this error; else where it was shown."""
        key = (impl, last_line(text))
        first = self._shown.setdefault(key, where)
        return None if first == where else first

    def from_reply(self, reply: Reply, *, impl: str, where: str, seed: str = "", rerun: str = "",
                   origin: str = "") -> Judgement | None:
        """None for an ``OK`` reply; otherwise the judgement that skips or fails the running test.

        ``where`` names what was run ("b1-h2-q17-k17-d32-fp16-causal", "the memory sweep
        (forward)"); ``seed`` follows it where inputs were drawn (", seed 1946766965 (trial 1 of
        2)"); ``rerun`` is the command that reproduces a failure, given the failure's last line of
        its own so that it pastes back as printed; ``origin`` is the implementation's entry point,
        for an implementation that could not be loaded."""
        status, message = reply.status, reply.message
        last = f"\nrerun:{NO_BREAK}{rerun.replace(' ', NO_BREAK)}" if rerun else ""
        if status is Status.OK:
            return None
        if status is Status.UNSUPPORTED:
            return refused(impl, message)
        if status is Status.UNAVAILABLE:
            return skipped(f"{impl} is unavailable: {message}")
        if status is Status.OUT_OF_MEMORY:
            # The pool and the scheduler run an out-of-memory again with no other worker on the GPU
            # before it gets here: the case does not fit on this GPU, which says nothing of the kernel.
            figures = reply.data.get("out_of_memory", {})
            return skipped(f"{impl} on {where} does not fit on this GPU alone: "
                           f"{describe_out_of_memory(figures)} ({message})")
        if status is Status.BROKEN:
            if impl not in self._broken_shown:
                self._broken_shown.add(impl)
                return failed(f"{impl} could not be loaded from entry point {origin}:\n{message}")
            return failed(f"{impl} could not be loaded (the first of its tests shows why)")
        if status is Status.WRONG:
            return failed(f"{impl} is wrong on {where}{seed}:\n{message}{last}")
        if status is Status.RAISED:
            first = self._once(impl, where, message)
            if first is None:
                return failed(f"{impl} raised on {where}{seed}:\n{message}{last}")
            return failed(f"{impl} raised on {where}{seed}: {last_line(message)} "
                          f"(the traceback is shown once, on {first}){last}")
        # CRASHED, TIMEOUT: the worker's own account, with the tail of its log.
        return failed(f"{impl} on {where}: {message}")

    def check(self, reply: Reply, **where: Any) -> None:
        """Return for an ``OK`` reply; otherwise raise :class:`Judged` with :meth:`from_reply`'s
        judgement, for the test's :meth:`settle` to make it its outcome."""
        judgement = self.from_reply(reply, **where)
        if judgement is not None:
            raise Judged(judgement)

    @staticmethod
    def settle(item: pytest.Item, judgement: Judgement) -> None:
        """Make ``judgement`` the running test's outcome: the package's one ``pytest.skip`` and
        ``pytest.fail`` (besides the fixture's own skip without ``--attnkit``). Its junit properties
        join the item's; the item keeps the judgement (:data:`JUDGEMENT_KEY`) for the report."""
        item.user_properties.extend(judgement.properties)
        item.stash[JUDGEMENT_KEY] = judgement
        if judgement.verdict is Verdict.SKIPPED:
            pytest.skip(judgement.message)
        if judgement.verdict is Verdict.FAILED:
            pytest.fail(judgement.message, pytrace=False)

    @staticmethod
    def skip_at_collection(item: pytest.Item, judgement: Judgement) -> None:
        """Mark ``item`` skipped before it runs (a refusal known at collection): the package's one
        skip marker. The item keeps the judgement (:data:`JUDGEMENT_KEY`) for the report."""
        item.stash[JUDGEMENT_KEY] = judgement
        item.add_marker(pytest.mark.skip(reason=judgement.message))
