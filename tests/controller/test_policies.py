"""The scheduler's policies one by one, without threads or workers
(pytest_attnkit/controller/scheduling/): admission (the memory budget and its hold), order (the
awaited job first, a chain's next job once the one before ended, the most work left first),
pruning (warm-ups that compile nothing and whose first calls build nothing, a chain whose
``follows`` says no) and the out-of-memory
retry (by status, alone, then with room made, then with every other worker stopped)."""

from __future__ import annotations

from collections import deque

import pytest

from pytest_attnkit.controller.pool import ROOM_ROUNDS
from pytest_attnkit.controller.scheduling import oom_retry, order, pruning
from pytest_attnkit.controller.scheduling.admission import Hold, MemoryBudget
from pytest_attnkit.controller.scheduling.job import Job
from pytest_attnkit.controller.scheduling.order import WorkLeft
from pytest_attnkit.controller.scheduling.pruning import (SETUP_CALLS, WARM_COMPILE_S, WARM_EVIDENCE, WarmUpPruning,
                                                           setup_s, shows_setup, spared_s)
from pytest_attnkit.messages import Isolation, Op, Reply, Request, Status

_seq = iter(range(10**6))


def job(impl: str = "a", gpu_bytes: int = 0, **fields) -> Job:
    return Job(impl, "correctness", Request(Op.RUN, suite="correctness"), gpu_bytes, next(_seq), **fields)


# -- admission ------------------------------------------------------------------------------------
def test_requests_run_together_only_while_their_estimates_fit_the_budget() -> None:
    budget = MemoryBudget(100)
    first, second, third = job(gpu_bytes=60), job(gpu_bytes=30), job(gpu_bytes=20)
    assert budget.fits(first, [])
    budget.started(first)
    assert budget.fits(second, [first])
    budget.started(second)
    assert not budget.fits(third, [first, second])  # 110 > 100
    budget.ended(first)
    assert budget.fits(third, [second])
    assert MemoryBudget(None).fits(job(gpu_bytes=10**12), [first])  # no budget: anything goes


def test_a_request_over_the_budget_or_marked_alone_runs_with_nothing_beside_it() -> None:
    budget = MemoryBudget(100)
    big = job(gpu_bytes=500)
    assert budget.over(big) and not budget.over(job(gpu_bytes=100))
    alone, small = job(alone=True), job(gpu_bytes=1)
    assert budget.fits(alone, []) and not budget.fits(alone, [small])
    assert not budget.fits(small, [alone])  # nothing joins one that runs alone


def test_the_earliest_request_waiting_for_room_holds_the_others_after_max_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    budget = MemoryBudget(100)
    running = [job(gpu_bytes=90)]
    budget.started(running[0])
    waiting = job(gpu_bytes=50)
    assert budget.hold(waiting, running) is Hold.NONE and waiting.held_since is not None
    monkeypatch.setattr("pytest_attnkit.controller.scheduling.admission.MAX_HOLD_S", 0.0)
    waiting.held_since -= 1.0
    assert budget.hold(waiting, running) is Hold.BLOCK  # nothing else starts
    budget.ended(running[0])
    assert budget.hold(waiting, []) is Hold.FIRST  # its room has come: it goes first
    assert budget.hold(job(gpu_bytes=10), []) is Hold.NONE


# -- order ----------------------------------------------------------------------------------------
def test_the_awaited_job_comes_first_or_what_it_waits_for() -> None:
    first, second = job(), job()
    chained = job(after=second)
    pending = {"a": deque([first, second, chained])}
    assert order.awaited(pending) is None
    chained.awaited = True
    assert order.awaited(pending) is second  # what the awaited one waits for, not yet started
    pending["a"].remove(second)  # started: running
    assert order.awaited(pending) is None  # the awaited one waits for it to end
    second.future.set_result(Reply(Status.OK))
    assert order.awaited(pending) is chained


def test_the_first_ready_job_skips_those_waiting_for_another_or_for_their_busy_worker() -> None:
    before = job()
    waits, own, free = job(after=before), job(isolation=Isolation.DEDICATED, tag="t"), job()
    queue = deque([waits, own, free])
    assert order.first_ready(queue, busy=lambda candidate: candidate.dedicated is not None) is free
    assert order.first_ready(queue, busy=lambda candidate: False) is own
    before.future.set_result(Reply(Status.OK))
    assert order.first_ready(queue, busy=lambda candidate: False) is waits


def test_requests_that_took_long_last_time_start_first_longest_first_and_the_rest_keep_their_order() -> None:
    """A tail in the making (results/2026-11-27-session8): the long requests of an
    implementation, remembered from the last run (``Job.last_s``, at least LONG_S), go
    before its others, the longest first; a long one that waits for another does not, nor one that
    must run alone; requests under LONG_S keep the suites' order, as does every request without
    ``long_first``."""
    before = job()
    short, long, longer = job(last_s=0.4), job(last_s=5.0), job(last_s=17.6)
    waits = job(after=before, last_s=40.0)
    queue = deque([short, long, longer, waits])
    assert order.first_ready(queue, busy=lambda candidate: False) is short
    assert order.first_ready(queue, busy=lambda candidate: False, long_first=True) is longer
    queue.remove(longer)
    assert order.first_ready(queue, busy=lambda candidate: False, long_first=True) is long
    queue.remove(long)
    assert order.first_ready(queue, busy=lambda candidate: False, long_first=True) is short
    before.future.set_result(Reply(Status.OK))
    assert order.first_ready(queue, busy=lambda candidate: False, long_first=True) is waits
    alone = job(alone=True, last_s=60.0)  # moved ahead, it would hold its queue until the GPU is free
    assert order.first_ready(deque([short, alone]), busy=lambda candidate: False, long_first=True) is short
    assert order.first_ready(deque(), busy=lambda candidate: False, long_first=True) is None


def test_while_a_queue_s_first_job_waits_for_room_the_ones_behind_it_that_fit_start(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """results/2026-11-27-session9 (h100-cold): a torch_flex warm-up that ran out of memory beside
    others went back to the head of the last busy queue to run alone, and its 15 queued warm-ups
    waited behind it for 31 s. Now the jobs behind a waiting head that fit start, until the head
    has waited MAX_HOLD_S; a warm-up never holds them (nobody waits for it until the GPU-alone
    phase), and starts once it fits."""
    budget = MemoryBudget(100)
    running = [job("a", gpu_bytes=10)]
    budget.started(running[0])

    def choose(pending: dict) -> object:
        return order.choose(pending, running, jobs=4, budget=budget, work_left=WorkLeft(),
                            busy=lambda candidate: False, lease=lambda candidate, room: "worker")

    alone, small = job("a", alone=True), job("a", gpu_bytes=10)
    assert choose({"a": deque([alone, small])}) == (small, "worker")
    monkeypatch.setattr("pytest_attnkit.controller.scheduling.admission.MAX_HOLD_S", 0.0)
    assert alone.held_since is not None
    alone.held_since -= 1.0
    assert choose({"a": deque([alone, small])}) is None  # it has waited long enough: it holds all
    warm = job("a", alone=True, warm=True)
    assert choose({"a": deque([warm, small])}) == (small, "worker")  # a warm-up holds nobody
    big = job("a", gpu_bytes=95)  # behind a warm-up, it holds the others once it has waited
    big.held_since = alone.held_since
    assert choose({"a": deque([warm, big]), "b": deque([job("b", gpu_bytes=1)])}) is None
    running.clear()
    others = {"b": deque([job("b", gpu_bytes=1) for _ in range(50)])}  # much more work left than a's
    assert choose({"a": deque([warm, small]), **others}) == (warm, "worker")  # the GPU is free: it first


def test_a_free_slot_goes_to_the_most_work_left_per_running_request() -> None:
    work = WorkLeft()
    assert work.mean_s("a") == 1.0  # nothing finished yet
    for _ in range(4):
        work.record("slow", 2.0)
        work.record("fast", 0.01)
    assert work.mean_s("new") == pytest.approx((8.0 + 0.04) / 8)  # the mean over all until it has one
    slow, fast = job("slow"), job("fast")
    pending = {"slow": deque([slow] + [job("slow") for _ in range(2)]), "fast": deque([fast] + [job("fast") for _ in range(50)])}
    assert work.ranked([fast, slow], pending, {}) == [slow, fast]
    assert work.ranked([fast, slow], pending, {"slow": 20}) == [fast, slow]  # slow already has many slots


def test_the_work_left_counts_what_queued_requests_took_last_time_and_not_those_run_alone() -> None:
    """results/2026-11-27-session9: an implementation with as many requests as another but four
    times their remembered seconds gets the free slots, until its share of running requests
    matches; a request not remembered counts as its implementation's mean so far, and one that
    must run alone (with nothing beside it, whoever holds the slots) counts nothing."""
    work = WorkLeft()
    for _ in range(4):
        work.record("flex", 2.0)
        work.record("sdpa", 2.0)  # the same mean: a count of requests could not tell them apart
    flex = deque(job("flex", last_s=4.0) for _ in range(10))
    sdpa = deque(job("sdpa", last_s=1.0) for _ in range(10))
    pending = {"flex": flex, "sdpa": sdpa}
    assert work.queued_s("flex", flex) == pytest.approx(40.0) and work.queued_s("sdpa", sdpa) == pytest.approx(10.0)
    assert work.ranked([sdpa[0], flex[0]], pending, {}) == [flex[0], sdpa[0]]
    assert work.ranked([sdpa[0], flex[0]], pending, {"flex": 3}) == [flex[0], sdpa[0]]  # 40/4 > 10/1
    assert work.ranked([sdpa[0], flex[0]], pending, {"flex": 4}) == [sdpa[0], flex[0]]  # 40/5 < 10/1
    sdpa.extend(job("sdpa") for _ in range(10))  # not remembered: the mean so far, 2 s each
    assert work.queued_s("sdpa", sdpa) == pytest.approx(30.0)
    sdpa.extend(job("sdpa", last_s=100.0, alone=True) for _ in range(3))
    assert work.queued_s("sdpa", sdpa) == pytest.approx(30.0)
    assert work.queued_s("new", deque([job("new")])) == pytest.approx(2.0)  # the mean over all


# -- pruning --------------------------------------------------------------------------------------
def test_warm_ups_are_pointless_once_an_implementation_has_shown_it_compiles_nothing() -> None:
    pruned = WarmUpPruning()
    warm = job(warm=True)
    for _ in range(WARM_EVIDENCE - 1):
        pruned.record("a", 0.0)
    assert not pruned.pointless(warm)  # not enough evidence yet
    pruned.record("a", WARM_COMPILE_S / 2)
    assert pruned.pointless(warm) and not pruned.pointless(job())  # only warm-ups go
    pruned.record("a", 1.0)
    assert not pruned.pointless(warm)  # one request compiled: its warm-ups are worth their time


def warmed(first_s: float, next_s: float | None, *, process_first: bool = False) -> Reply:
    """A warm-up's reply with the worker's timing of its two calls."""
    return Reply(Status.OK, "", {"first_call_s": first_s, "next_call_s": next_s, "process_first": process_first})


def test_a_warm_up_shows_setup_where_its_first_call_cost_many_calls_beyond_the_next() -> None:
    assert setup_s(warmed(0.3, 0.002)) == pytest.approx(0.298)
    assert shows_setup(warmed(0.3, 0.002))  # a cuDNN plan: 150 calls
    assert not shows_setup(warmed(0.3, 0.05))  # 5 calls: a long case's first call, not setup
    assert shows_setup(warmed(0.002 + 0.001 * SETUP_CALLS + WARM_COMPILE_S, 0.001))
    assert not shows_setup(warmed(WARM_COMPILE_S / 2, 0.0001))  # many calls, but too little to matter
    assert setup_s(warmed(1.5, None)) is None and shows_setup(warmed(1.5, None)) is None  # called once: unknown
    assert shows_setup(warmed(0.3, 0.002, process_first=True)) is None  # the process's own start, maybe
    assert setup_s(Reply(Status.OK)) is None and shows_setup(Reply(Status.OK)) is None  # the CPU: no timing
    assert spared_s(warmed(0.3, 0.002)) == pytest.approx(0.298) and spared_s(warmed(6.0, None)) == 6.0
    assert spared_s(Reply(Status.OK)) is None


def test_on_cuda_warm_ups_that_compile_nothing_stay_once_a_later_first_call_showed_setup() -> None:
    pruned = WarmUpPruning(first_calls=True)
    warm = job(warm=True)
    for _ in range(WARM_EVIDENCE):
        pruned.record("a", 0.0)  # its correctness cases compiled nothing
    assert not pruned.pointless(warm)  # no warm-up has said how long its first call took
    for _ in range(WARM_EVIDENCE):  # first calls too long for a second (cuDNN's start: 1.3-6.0 s on an H100)
        pruned.record("a", 0.0, warm_up=warmed(6.0, None))
    assert not pruned.pointless(warm)  # they say nothing either way
    pruned.record("a", 0.0, warm_up=warmed(0.5, 0.001, process_first=True))  # the process's start (CuPy's)
    for _ in range(WARM_EVIDENCE - 1):
        pruned.record("a", 0.0, warm_up=warmed(0.004, 0.003))
    assert not pruned.pointless(warm)  # the start says nothing: two have told so far
    pruned.record("a", 0.0, warm_up=warmed(0.004, 0.003))
    assert pruned.pointless(warm)  # three showed none: the start was once per process
    pruned.record("a", 0.0, warm_up=warmed(0.3, 0.002))  # a plan per shape, in a later warm-up
    assert not pruned.pointless(warm)
    for _ in range(2 * WARM_EVIDENCE):  # shapes whose plans cost less than ten of their calls
        pruned.record("a", 0.0, warm_up=warmed(0.07, 0.008))
    assert not pruned.pointless(warm)  # a plan per shape stays shown: the next shape may pay 0.5 s
    queued = job(warm=True)
    pruned.record("a", 0.0, warm_up=warmed(0.004, 0.003, process_first=True))
    assert not pruning.drop_unrun({"a": deque([queued])}, pruned) and not queued.pointless  # a plan shown
    backward = Job("a", "speed", Request(Op.WARM, backward=True), 0, next(_seq), warm=True)
    assert not pruned.pointless(backward)  # its backwards are judged apart: none has said anything yet
    for _ in range(WARM_EVIDENCE):
        pruned.record("a", 0.0, warm_up=warmed(0.004, 0.003), backward=True)
    assert pruned.pointless(backward) and not pruned.pointless(warm)
    assert pruning.drop_unrun({"a": deque([backward])}, pruned) and backward.future.cancelled()
    assert backward.pointless  # its test may let the case's first call decide (controller/speed.py)
    compiling = WarmUpPruning(first_calls=True)
    for _ in range(WARM_EVIDENCE):
        compiling.record("a", 1.0, warm_up=warmed(0.004, 0.003))
    assert not compiling.pointless(warm)  # what compiles keeps its warm-ups, as on the CPU
    cpu = WarmUpPruning()
    for _ in range(WARM_EVIDENCE):
        cpu.record("a", 0.0)
    assert cpu.pointless(warm)  # without first calls, compile seconds alone decide


def test_a_chain_stops_where_follows_says_no_or_the_job_before_was_cancelled() -> None:
    before = job()
    goes_on = job(after=before, follows=lambda reply: reply.status is Status.OK)
    unconditional = job(after=before)
    assert not pruning.stopped(goes_on)  # the one before has not ended
    before.future.set_result(Reply(Status.OUT_OF_MEMORY))
    assert pruning.stopped(goes_on) and not pruning.stopped(unconditional)
    cancelled = job()
    cancelled.future.cancel()
    assert pruning.stopped(job(after=cancelled, follows=lambda reply: True))


# -- the out-of-memory retry ----------------------------------------------------------------------
def test_only_an_out_of_memory_status_is_run_again_never_a_message() -> None:
    assert oom_retry.retries(job(), Reply(Status.OUT_OF_MEMORY))
    assert not oom_retry.retries(job(), Reply(Status.RAISED, "CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert not oom_retry.retries(job(), Reply(Status.OK, "", {"status": "oom"}))


def test_beside_others_again_alone_then_with_room_made_then_with_every_worker_stopped() -> None:
    failed = Reply(Status.OUT_OF_MEMORY)
    shared = job(shared=True)
    assert oom_retry.run_again(shared, failed) is oom_retry.Again.ALONE
    assert shared.alone and not shared.shared and shared.first_oom is failed and shared.cleared == 0
    assert oom_retry.room_round(shared) is None  # alone, first: no room made
    rounds = []
    while oom_retry.retries(shared, failed):
        assert oom_retry.run_again(shared, failed) is oom_retry.Again.WITH_ROOM
        rounds.append(oom_retry.room_round(shared))
    assert rounds == [(failed, False)] * ROOM_ROUNDS + [(failed, True)]  # then every other worker
    assert shared.cleared == ROOM_ROUNDS + 1  # that reply is the last


def test_room_made_by_stopping_everyone_makes_the_next_reply_the_last() -> None:
    alone = job()
    oom_retry.run_again(alone, Reply(Status.OUT_OF_MEMORY))
    oom_retry.room_made(alone, everyone=False)
    assert oom_retry.retries(alone, Reply(Status.OUT_OF_MEMORY))
    oom_retry.room_made(alone, everyone=True)
    assert not oom_retry.retries(alone, Reply(Status.OUT_OF_MEMORY))
