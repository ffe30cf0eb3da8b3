"""outcome.py: every reply status to its judgement's words, and the one place a verdict is made
(settle, skip_at_collection). The wording is what the suites' e2e tests and users read: it is
checked here byte for byte."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_attnkit.controller.outcome import (JUDGEMENT_KEY, Judged, Judgement, Outcomes, Verdict, failed,
                                               skipped)
from pytest_attnkit.controller.terminal import NO_BREAK
from pytest_attnkit.messages import Reply, Status

WHERE = {"impl": "kern", "where": "b1-q17", "seed": ", seed 7", "rerun": "pytest -k q17", "origin": "pkg:Kern"}
RERUN = f"\nrerun:{NO_BREAK}pytest{NO_BREAK}-k{NO_BREAK}q17"
OOM = {"requested_bytes": 2**31, "process_at_failure_bytes": 2**32, "free_at_failure_bytes": 2**30,
       "total_bytes": 2**34, "other_processes": 0}


def judge(status: Status, message: str = "why", data: dict[str, Any] | None = None,
          outcomes: Outcomes | None = None) -> Judgement | None:
    return (outcomes or Outcomes()).from_reply(Reply(status, message, data or {}), **WHERE)


@pytest.mark.parametrize(("status", "data", "verdict", "message"), [
    (Status.UNSUPPORTED, None, Verdict.SKIPPED, "kern does not support it: why"),
    (Status.UNAVAILABLE, None, Verdict.SKIPPED, "kern is unavailable: why"),
    (Status.OUT_OF_MEMORY, {"out_of_memory": OOM}, Verdict.SKIPPED,
     "kern on b1-q17 does not fit on this GPU alone: asked for 2.0 GiB more while it held 4.0 GiB and 1.0 GiB "
     "were free (16.0 GiB in all); no other process held memory on the GPU (why)"),
    (Status.BROKEN, None, Verdict.FAILED, "kern could not be loaded from entry point pkg:Kern:\nwhy"),
    (Status.WRONG, None, Verdict.FAILED, f"kern is wrong on b1-q17, seed 7:\nwhy{RERUN}"),
    (Status.RAISED, None, Verdict.FAILED, f"kern raised on b1-q17, seed 7:\nwhy{RERUN}"),
    (Status.CRASHED, None, Verdict.FAILED, "kern on b1-q17: why"),
    (Status.TIMEOUT, None, Verdict.FAILED, "kern on b1-q17: why"),
    (Status.HARNESS_ERROR, None, Verdict.FAILED, "kern on b1-q17: why"),
])
def test_every_status_has_its_words(status: Status, data: dict[str, Any] | None, verdict: Verdict,
                                    message: str) -> None:
    judgement = judge(status, data=data)
    assert judgement is not None
    assert (judgement.verdict, judgement.message) == (verdict, message)


def test_ok_is_no_judgement() -> None:
    assert judge(Status.OK) is None
    Outcomes().check(Reply(Status.OK), **WHERE)  # returns, raises nothing


def test_broken_and_raised_show_their_text_once() -> None:
    outcomes = Outcomes()
    assert judge(Status.BROKEN, outcomes=outcomes).message.startswith("kern could not be loaded from entry point")
    assert judge(Status.BROKEN, outcomes=outcomes).message == "kern could not be loaded (the first of its tests shows why)"
    outcomes.from_reply(Reply(Status.RAISED, "Traceback\n  ...\nValueError: no"), impl="kern", where="first")
    again = outcomes.from_reply(Reply(Status.RAISED, "Traceback\n  ...\nValueError: no"), impl="kern", where="second")
    assert again.message == "kern raised on second: ValueError: no (the traceback is shown once, on first)"


def test_check_raises_the_judgement() -> None:
    with pytest.raises(Judged, match="kern is unavailable: why") as raised:
        Outcomes().check(Reply(Status.UNAVAILABLE, "why"), **WHERE)
    assert raised.value.judgement == skipped("kern is unavailable: why")


def test_a_skip_keeps_the_short_reason_the_report_had() -> None:
    assert skipped("kern is unavailable: no CUDA device; see the log").reason == "no CUDA device"
    assert skipped("kern: x", reason="given").reason == "given"
    assert failed("kern is wrong on q: far off").reason == ""


class Item:
    """What settle and skip_at_collection touch of a pytest.Item."""

    def __init__(self) -> None:
        self.user_properties: list[tuple[str, object]] = [("attnkit_before", 1)]
        self.stash = pytest.Stash()
        self.markers: list[pytest.MarkDecorator] = []

    def add_marker(self, marker: pytest.MarkDecorator) -> None:
        self.markers.append(marker)


@pytest.mark.parametrize(("judgement", "raised"), [
    (skipped("kern does not support it: why", properties=(("attnkit_x", 2),)), pytest.skip.Exception),
    (failed("kern is wrong on q:\nfar", properties=(("attnkit_x", 2),)), pytest.fail.Exception),
])
def test_settle_raises_the_outcome_and_stashes(judgement: Judgement, raised: type[BaseException]) -> None:
    item = Item()
    with pytest.raises(raised) as outcome:
        Outcomes.settle(item, judgement)  # type: ignore[arg-type]
    assert outcome.value.msg == judgement.message
    if raised is pytest.fail.Exception:
        assert outcome.value.pytrace is False  # the message alone, no traceback of the harness
    assert item.stash[JUDGEMENT_KEY] is judgement
    assert item.user_properties == [("attnkit_before", 1), ("attnkit_x", 2)]


def test_settle_of_a_pass_returns() -> None:
    item = Item()
    judgement = Judgement(Verdict.PASSED, properties=(("attnkit_y", 3),))
    Outcomes.settle(item, judgement)  # type: ignore[arg-type]
    assert item.stash[JUDGEMENT_KEY] is judgement and item.user_properties[-1] == ("attnkit_y", 3)


def test_skip_at_collection_marks_and_stashes() -> None:
    item = Item()
    judgement = skipped("kern is unavailable: no CUDA device")
    Outcomes.skip_at_collection(item, judgement)  # type: ignore[arg-type]
    [marker] = item.markers
    assert marker.name == "skip" and marker.kwargs == {"reason": "kern is unavailable: no CUDA device"}
    assert item.stash[JUDGEMENT_KEY] is judgement
