"""controller/tally.py: what the report keeps of each test, and how many each implementation has."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from pytest_attnkit.contract import Case
from pytest_attnkit.controller.items import ITEM_KEY
from pytest_attnkit.controller.suite import SuiteItem, TestSpec
from pytest_attnkit.controller.tally import Tally

CASE = Case(1, 2, 2, 128, 128, 64)


def _node(nodeid: str, item: SuiteItem | None) -> SimpleNamespace:
    stash = pytest.Stash()
    if item is not None:
        stash[ITEM_KEY] = item
    return SimpleNamespace(nodeid=nodeid, originalname="test_forward", stash=stash)


def test_the_tally_counts_suite_tests_and_records_a_pytest_skip_with_its_stand_in() -> None:
    tally = Tally()
    tally.stand_ins[("k", CASE.id)] = "b1-h2-q100-k100-d64-fp16"
    item = SuiteItem("correctness", TestSpec("test_forward", "correctness"), "k", CASE)
    nodes = [_node("a", item), _node("b", None), _node("c", item)]
    tally.count(nodes)  # type: ignore[arg-type]
    assert tally.collected == {"k": {"correctness": 2}}
    skip = SimpleNamespace(outcome="skipped", skipped=True, longrepr=("f", 1, "Skipped: k is unavailable: no GPU; x"))
    tally.record(nodes[0], skip)  # type: ignore[arg-type]
    tally.record(nodes[1], skip)  # type: ignore[arg-type]  # no suite test: not kept
    [test] = tally.tests
    assert (test["impl"], test["case"], test["twin_of"], test["outcome"], test["reason"]) == (
        "k", CASE.id, "b1-h2-q100-k100-d64-fp16", "skipped", "no GPU")
