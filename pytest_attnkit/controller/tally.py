"""The run's tally of its tests, kept for the report: how many each implementation has in each
suite once pytest has selected them, and each test's outcome with its failure or skip text.

A test settled by a judgement (:mod:`pytest_attnkit.controller.outcome`) is recorded from the
judgement, no text parsed; a skip pytest made itself, or an error no judgement made, from pytest's
report.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest

from pytest_attnkit.controller.items import ITEM_KEY
from pytest_attnkit.controller.outcome import JUDGEMENT_KEY, Verdict, reason_of
from pytest_attnkit.controller.terminal import NO_BREAK


class Tally:
    def __init__(self) -> None:
        #: Per test: implementation, suite, outcome and the failure or skip text, for the report.
        self.tests: list[dict[str, Any]] = []
        #: implementation -> suite -> how many of its tests were collected.
        self.collected: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        #: (implementation, stand-in's case id) -> the id of the case the stand-in is for, as the
        #: case selection (:mod:`pytest_attnkit.controller.selection`) chose them.
        self.stand_ins: dict[tuple[str, str], str] = {}

    def count(self, items: list[pytest.Item]) -> None:
        """How many tests each implementation has in each suite, after selection (-k, -m)."""
        for node in items:
            item = node.stash.get(ITEM_KEY, None)
            if item is not None:
                self.collected[item.impl][item.suite] += 1

    def record(self, item: pytest.Item, test_report: pytest.TestReport) -> None:
        """Keep the outcome of an attnkit test for the summary and the report files."""
        suite_item = item.stash.get(ITEM_KEY, None)
        if suite_item is None:
            return
        impl, case = suite_item.impl, suite_item.case
        judgement = item.stash.get(JUDGEMENT_KEY, None)
        reason = None
        if judgement is not None and judgement.verdict == test_report.outcome:
            # The judgement the test was settled (or skipped at collection) with: no text parsed.
            if judgement.verdict is Verdict.SKIPPED:
                text, reason = f"Skipped: {judgement.message}", judgement.reason
            else:
                text = judgement.message
            text = text.replace(NO_BREAK, " ")
        else:
            # A skip pytest made itself, or an outcome no judgement made (an error in the test's code).
            skipped = test_report.skipped and isinstance(test_report.longrepr, tuple)
            text = (test_report.longrepr[2] if skipped else str(test_report.longrepr or "")).replace(NO_BREAK, " ")
            if skipped:
                reason = reason_of(text)
        self.tests.append({"test": item.nodeid, "impl": impl, "suite": suite_item.suite,
                           "case": case.id if case is not None else None, "function": item.originalname,
                           # the key reports already written use for a stand-in's case
                           "twin_of": self.stand_ins.get((impl, case.id)) if case is not None else None,
                           "outcome": Verdict(test_report.outcome), "reason": reason, "message": text[:4000]})
        if judgement is not None and judgement.record:
            self.tests[-1].update(judgement.record)
