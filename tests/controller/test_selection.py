"""controller/selection.py: the pairs a family runs, and the hooks' thresholds and accuracy, checked."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from pytest_attnkit.contract import Case
from pytest_attnkit.controller.selection import CaseSelection
from pytest_attnkit.controller.speed import CPU_THRESHOLD
from pytest_attnkit.records import EntryKey


class Hooks:
    def __init__(self, threshold: Any = None, accuracy: Any = None) -> None:
        self.threshold, self.accuracy = threshold, accuracy

    def pytest_attnkit_modify_cases(self, **_: Any) -> None:
        return None

    def pytest_attnkit_threshold(self, **_: Any) -> Any:
        return self.threshold

    def pytest_attnkit_accuracy(self, **_: Any) -> Any:
        return self.accuracy


def _selection(device: str = "cpu", **hooks: Any) -> CaseSelection:
    settings = SimpleNamespace(threshold_for=lambda key: 0.08, threshold_is_default=True, against_threshold=0.05,
                               sources={"against_threshold": "default"})
    pool = SimpleNamespace(impls={"k": SimpleNamespace(capabilities={"seqlen_multiple": 64}),
                                  "k@rev": SimpleNamespace(capabilities={})})
    return CaseSelection(settings, SimpleNamespace(hook=Hooks(**hooks)), device, "smoke",  # type: ignore[arg-type]
                         pool, ["k@rev"], {})  # type: ignore[arg-type]


def test_counterparts_run_the_speed_families_only_and_stand_ins_are_recorded() -> None:
    selection = _selection()
    assert {name for name, _ in selection.pairs("correctness")} == {"k"}
    assert selection.stand_ins and all(name == "k" for name, _ in selection.stand_ins)
    assert {name for name, _ in selection.pairs("speed-forward")} == {"k", "k@rev"}
    with pytest.raises(ValueError, match="unknown case family"):
        selection.cases("nonsense")


def test_thresholds_a_doubling_on_the_cpu_and_the_hooks_answers_checked() -> None:
    key = EntryKey("k", "forward", "c")
    assert _selection().threshold(key) == CPU_THRESHOLD and _selection().ab_threshold(key) == CPU_THRESHOLD
    assert _selection("cuda").threshold(key) == 0.08 and _selection("cuda").ab_threshold(key) == 0.05
    assert _selection(threshold=0.2).threshold(key) == 0.2
    with pytest.raises(pytest.UsageError, match="returned 0 for k forward c"):
        _selection(threshold=0).threshold(key)
    case = Case(1, 2, 2, 64, 64, 64)
    assert _selection().accuracy("k", case) is None
    with pytest.raises(pytest.UsageError, match="hook pytest_attnkit_accuracy returned"):
        _selection(accuracy="no such rule").accuracy("k", case)
