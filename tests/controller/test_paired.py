"""The A/B gate's decision on paired blocks (pytest_attnkit/controller/paired.py), on synthetic samples."""

from __future__ import annotations

import random

import pytest

from pytest_attnkit.contract import Case
from pytest_attnkit.controller.paired import MIN_PAIRS, SyncKind, decide_paired, sync_kind, wilcoxon_p
from pytest_attnkit.controller.speed import ABResult
from pytest_attnkit.controller.table import ab_lines


def _blocks(median_ms: float, pairs: int, noise: float, seed: int, samples: int = 4) -> list[list[float]]:
    rng = random.Random(seed)
    return [[median_ms * (1 + rng.gauss(0, noise)) for _ in range(samples)] for _ in range(pairs)]


def test_wilcoxon_is_exact() -> None:
    assert wilcoxon_p([0.1] * 8) == pytest.approx((1 / 256, 1.0))
    assert wilcoxon_p([0.0] * 5) == (1.0, 1.0)
    slower, faster = wilcoxon_p([0.1, -0.2, 0.3, -0.4, 0.5])
    assert 0 < slower < 1 and 0 < faster < 1


@pytest.mark.parametrize("slowdown", [0.03, 0.05])
def test_a_small_slowdown_is_caught_and_the_same_code_is_not(slowdown: float) -> None:
    # Noise of 0.5% a sample, as GPU-bound cases show on an H200; the A/B default threshold is 2%.
    for seed in range(10):
        old = _blocks(1.0, 20, 0.005, seed)
        slower = decide_paired(_blocks(1.0 + slowdown, 20, 0.005, seed + 100), old, threshold=0.02)
        same = decide_paired(_blocks(1.0, 20, 0.005, seed + 200), old, threshold=0.02)
        assert slower.verdict == "regression", slower
        assert same.verdict == "unchanged", same
        assert slower.low <= slower.ratio <= slower.high


def test_too_few_pairs_decide_nothing() -> None:
    decision = decide_paired(_blocks(2.0, MIN_PAIRS - 1, 0.001, 0), _blocks(1.0, MIN_PAIRS - 1, 0.001, 1),
                             threshold=0.02)
    assert decision.verdict == "insufficient"
    with pytest.raises(ValueError):
        decide_paired(_blocks(1.0, 3, 0.0, 0), _blocks(1.0, 4, 0.0, 0), threshold=0.02)


def test_calls_that_synchronize_say_so_in_the_table() -> None:
    decision = decide_paired(_blocks(1.10, 20, 0.005, 0), _blocks(1.0, 20, 0.005, 1), threshold=1.0)
    assert decision.verdict == "unchanged"  # both sync: gated at a doubling
    both = {"impl": "k", "mode": "forward", "case": "c", "problem": None,
            "syncs": "both versions' calls synchronize with the device (called a synchronizing op)",
            "sync_kind": "both", **decision.to_dict()}
    new_only = {**both, "case": "d", "syncs": "the new version's call synchronizes with the device and the old "
                "one's does not (called a synchronizing op)", "sync_kind": "new only",
                **decide_paired(_blocks(1.10, 20, 0.005, 0), _blocks(1.0, 20, 0.005, 1), threshold=0.02).to_dict()}
    lines = ab_lines({"against": {"description": "abc"}, "ab": [both, new_only]})
    assert any("unchanged (syncs: 100%)" in line for line in lines), lines
    assert any("REGRESSION (new sync)" in line for line in lines), lines
    assert any(line.startswith("syncs: k forward d: the new version's call") for line in lines), lines
    assert all(len(line) <= 100 for line in lines)


def test_which_versions_sync_is_a_field_and_the_report_keeps_its_words() -> None:
    assert sync_kind("called .item()", "called .item()") is SyncKind.BOTH
    assert sync_kind("called .item()", None) is SyncKind.NEW_ONLY
    assert sync_kind(None, "called .item()") is None and sync_kind(None, None) is None
    case = Case(1, 2, 2, 32, 32, 16, "float32")
    decision = decide_paired(_blocks(1.0, 8, 0.005, 0), _blocks(1.0, 8, 0.005, 1), threshold=1.0)
    both = ABResult("k", "k@rev", "forward", case, decision, syncs=SyncKind.BOTH,
                    sync_detail="called a synchronizing op").to_dict("rev")
    assert both["sync_kind"] == "both"
    assert both["syncs"] == "both versions' calls synchronize with the device (called a synchronizing op)"
    new_only = ABResult("k", "k@rev", "forward", case, decision, syncs=SyncKind.NEW_ONLY,
                        sync_detail="called a synchronizing op").to_dict("rev")
    assert new_only["syncs"] == ("the new version's call synchronizes with the device and the old one's does not "
                                 "(called a synchronizing op)")
    plain = ABResult("k", "k@rev", "forward", case, None, problem="k@rev: raised").to_dict("rev")
    assert plain["syncs"] is None and plain["sync_kind"] is None and plain["verdict"] == "not compared"
    assert any("(syncs: 100%)" in line for line in ab_lines({"against": {"description": "abc"}, "ab": [both]}))
