"""The scheduler's rules (pytest_attnkit/controller/scheduler.py and its policies in
pytest_attnkit/controller/scheduling/), with a real pool of fake workers (tests/fakes/fake_workers.py:
no processes): replies land on their own job, no more than ``jobs`` run at once, device-memory
estimates decide what runs beside what (admission), the awaited job and what it waits for start
first (order), an out-of-memory beside another is run again alone and one alone once more with
room made, then with the other workers stopped (the OOM retry), the GPU-alone phase waits for
everything submitted, warm-ups that compile nothing and a stopped sweep's points are cancelled
(pruning), a job remembers its worker, and close() drops what is queued and closes what runs. How
the pool lends, evicts and closes workers is tests/controller/test_pool.py's."""

from __future__ import annotations

import contextlib
import itertools
import re
import threading
import time
from concurrent.futures import CancelledError
from typing import Any

import pytest

from fakes.fake_workers import FakePool, FakeWorker, work
from pytest_attnkit.controller.impls import ImplInfo
from pytest_attnkit.controller.ledger import timeline, timeline_line
from pytest_attnkit.controller.pool import suite_of
from pytest_attnkit.controller.memory import goes_on
from pytest_attnkit.controller.scheduler import Scheduler
from pytest_attnkit.controller.table import time_lines
from pytest_attnkit.messages import Isolation, Reply, Request, Spent, Status


@pytest.fixture
def made():
    schedulers: list[Scheduler] = []

    def make(pool: FakePool, **kwargs: Any) -> Scheduler:
        scheduler = Scheduler(pool, ledger=pool.ledger, **{"jobs": 4, "budget_bytes": None, **kwargs})
        pool.share(extras=scheduler.jobs, alone=scheduler.exclusive)
        schedulers.append(scheduler)
        return scheduler

    yield make
    for scheduler in schedulers:
        scheduler.close()
        scheduler.pool.close()


def test_each_reply_lands_on_its_own_job_and_at_most_jobs_run_at_once(made) -> None:
    pool = FakePool(seconds=0.03)
    scheduler = made(pool, jobs=3)
    jobs = [scheduler.submit("ab"[n % 2], "correctness", work({"n": n})) for n in range(24)]
    assert [scheduler.wait(job).data["echo"] for job in jobs] == list(range(24))
    assert pool.most == 3


def test_device_memory_decides_what_runs_beside_what(made) -> None:
    pool = FakePool(seconds=0.05)
    scheduler = made(pool, jobs=4, budget_bytes=100)
    jobs = [scheduler.submit("a", "correctness", work({"n": n}), gpu_bytes=60) for n in range(4)]
    for job in jobs:
        scheduler.wait(job)
    assert pool.most == 1  # two of 60 do not fit in 100
    big = scheduler.submit("a", "correctness", work({"n": "big"}), gpu_bytes=500)
    small = [scheduler.submit("b", "correctness", work({"n": n}), gpu_bytes=10) for n in range(3)]
    assert big.alone
    for job in (big, *small):
        scheduler.wait(job)


OUT_OF_MEMORY = Reply(Status.OUT_OF_MEMORY, "CUDA out of memory. Tried to allocate 2.00 GiB")


def test_an_out_of_memory_beside_another_runs_again_alone(made) -> None:
    def behave(message: dict[str, Any], running: int) -> Reply:
        if message["n"] == 0 and running > 1:
            return OUT_OF_MEMORY
        return Reply(Status.OK, "", {"ran_with": running})

    pool = FakePool(behave=behave, seconds=0.05)
    scheduler = made(pool, jobs=4)
    # The others hold their slots until n=0 has run out of memory beside them, however loaded the
    # machine (all four short and submitted at once, CI once saw n=0 run alone first: 2026-11-26).
    others = [scheduler.submit("a", "correctness", work({"n": n, "block": True})) for n in (1, 2, 3)]
    jobs = [scheduler.submit("a", "correctness", work({"n": 0})), *others]
    deadline = time.monotonic() + 10
    while jobs[0].first_oom is None and time.monotonic() < deadline:
        time.sleep(0.01)
    pool.release.set()
    replies = [scheduler.wait(job) for job in jobs]
    assert replies[0].status is Status.OK and replies[0].data["ran_with"] == 1
    assert jobs[0].first_oom is not None and jobs[0].first_oom.status is Status.OUT_OF_MEMORY
    assert pool.stops == 0  # alone, it fit: the other workers were left alone


def test_an_out_of_memory_runs_again_in_the_worker_it_ran_in_and_the_report_names_it(made) -> None:
    """The worker holds what the request compiled: on an H100 a torch_flex warm-up run again in
    another worker compiled for 12 s, alone (results/2026-11-27-session9)."""
    ran_in: list[tuple[Any, int]] = []

    class Recording(FakePool):
        def serve(self, worker: FakeWorker, request: Request) -> Reply:
            ran_in.append((request.options["n"], worker.pid))
            return super().serve(worker, request)

    def behave(message: dict[str, Any], running: int) -> Reply:
        if message["n"] == 0 and running > 1:
            return Reply(Status.OUT_OF_MEMORY, "CUDA out of memory", {"out_of_memory": {
                "requested_bytes": 2 << 30, "free_at_failure_bytes": 1 << 30, "other_processes": 3,
                "other_bytes": 60 << 30, "processes": {"11": 10 << 30, "12": 20 << 30, "13": 30 << 30}}})
        return Reply(Status.OK, "", {})

    pool = Recording(behave=behave, seconds=0.05)
    scheduler = made(pool, jobs=4)
    # It starts first, in the primary; the others in extras, which the pool lends before the
    # primary: run again anywhere, it would go to one of them.
    first = scheduler.submit("a", "correctness", work({"n": 0, "seconds": 0.3}))
    others = [scheduler.submit("a", "correctness", work({"n": n, "block": True})) for n in (1, 2, 3)]
    deadline = time.monotonic() + 10
    while first.first_oom is None and time.monotonic() < deadline:
        time.sleep(0.01)
    pool.release.set()
    assert scheduler.wait(first).ok and all(scheduler.wait(job).ok for job in others)
    tries = [pid for n, pid in ran_in if n == 0]
    assert len(tries) == 2 and tries[0] == tries[1]
    entry, = scheduler.ledger.to_dict()["out_of_memory"]
    assert entry["impl"] == "a" and entry["beside"] and entry["requested_bytes"] == 2 << 30
    lines = time_lines({"time": scheduler.ledger.to_dict()})
    text = " ".join(line.strip() for line in lines)
    assert ("a correctness (forward), beside others: asked 2.0 GiB, 1.0 GiB free; 3 other process(es) held "
            "60.0 GiB, the most 30.0 GiB") in text, lines


def test_an_out_of_memory_alone_runs_once_more_with_the_other_workers_stopped(made) -> None:
    def behave(message: dict[str, Any], running: int) -> Reply:
        return Reply(Status.OK, "", {"n": message["n"]}) if pool.stops else OUT_OF_MEMORY

    pool = FakePool(behave=behave)
    scheduler = made(pool, jobs=1)
    reply = scheduler.wait(scheduler.submit("a", "correctness", work({"n": 0})))
    assert reply.ok and pool.order == [0, "stopped the others", 0]
    assert scheduler.ledger.to_dict()["retried_cleared"] == {"a": 1}


def test_an_out_of_memory_with_the_other_workers_stopped_is_the_reply(made) -> None:
    pool = FakePool(behave=lambda message, running: OUT_OF_MEMORY)
    scheduler = made(pool, jobs=1)
    reply = scheduler.wait(scheduler.submit("a", "correctness", work({"n": 0})))
    assert reply.status is Status.OUT_OF_MEMORY and pool.order == [0, "stopped the others", 0]


def test_the_gpu_alone_waits_for_everything_submitted_and_starts_nothing_meanwhile(made) -> None:
    pool = FakePool(seconds=0.05)
    scheduler = made(pool, jobs=4)
    jobs = [scheduler.submit("a", "correctness", work({"n": n})) for n in range(8)]
    with scheduler.exclusive():
        assert all(job.future.done() for job in jobs)
        late = scheduler.submit("b", "correctness", work({"n": "late"}))
        time.sleep(0.1)
        assert not late.future.done() and pool.running == 0
    assert scheduler.wait(late).ok


def test_warm_ups_that_compile_nothing_are_dropped(made) -> None:
    pool = FakePool(seconds=0.01)
    scheduler = made(pool, jobs=1)
    for n in range(3):  # each implementation's correctness cases first: "a" compiles, "b" does not
        scheduler.wait(scheduler.submit("a", "correctness", work({"n": n, "compile_s": 1.0})))
        scheduler.wait(scheduler.submit("b", "correctness", work({"n": n})))
    compiling = [scheduler.submit("a", "speed", work({"n": n, "compile_s": 1.0}), warm=True) for n in range(5)]
    idle = [scheduler.submit("b", "speed", work({"n": f"b{n}"}), warm=True) for n in range(6)]
    assert all(scheduler.wait(job).ok for job in compiling)
    for job in idle:  # dropped unrun: cancelled, no reply made up
        with pytest.raises(CancelledError):
            scheduler.wait(job)
    assert all(job.future.cancelled() and job.worker is None for job in idle)
    assert not any(str(entry).startswith("b") for entry in pool.order)


def test_on_cuda_warm_ups_whose_first_calls_build_a_plan_per_case_run_and_the_others_are_dropped(made) -> None:
    """torch_sdpa compiles nothing, but cuDNN builds a plan per shape in each process: on a fresh
    H200 its timed cases paid 12.6 s of first calls with the GPU alone once its warm-ups were
    dropped (results/2026-11-27-session13). Each warm-up says how long its two calls took."""
    def behave(message: dict[str, Any], running: int) -> Reply:
        return Reply(Status.OK, "", {key: message[key] for key in ("first_call_s", "next_call_s") if key in message})

    pool = FakePool(names=("plans", "plain"), behave=behave, seconds=0.01)
    scheduler = made(pool, jobs=4, first_calls=True)
    for n in range(3):  # neither compiles in its correctness cases
        for impl in ("plans", "plain"):
            scheduler.wait(scheduler.submit(impl, "correctness", work({"n": f"{impl}{n}"})))
    plans = [scheduler.submit("plans", "speed", work({"n": f"p{n}", "first_call_s": 6.0, "next_call_s": None}),
                              warm=True) for n in range(3)]  # a process's first: too long for a second call
    plans += [scheduler.submit("plans", "speed", work({"n": f"p{n}", "first_call_s": 0.3, "next_call_s": 0.002}),
                               warm=True) for n in range(3, 6)]
    assert all(scheduler.wait(job).ok for job in plans)  # every one spares its test a plan
    # ... in the worker that times the case when its own is gone: the primary, never closed for room
    assert all(job.worker is pool.primaries["plans"] for job in plans)
    plain = [scheduler.submit("plain", "speed", work({"n": f"q{n}", "first_call_s": 0.004, "next_call_s": 0.003}),
                              warm=True) for n in range(6)]
    with scheduler.exclusive():  # everything submitted has ended: one at a time (in the primary), in order
        pass
    assert all(scheduler.wait(job).ok for job in plain[:3])
    for job in plain[3:]:  # three said their first calls cost a call: the rest are dropped unrun
        with pytest.raises(CancelledError):
            scheduler.wait(job)
    assert [entry for entry in pool.order if str(entry).startswith("q")] == ["q0", "q1", "q2"]


def _sweep(made, points: int, data: Any) -> tuple[list[Any], list[Reply], FakePool]:
    """A sweep of ``points`` chained points whose replies carry ``data(n)``: the statuses, the
    replies and the pool (its ``order`` is what ran)."""
    def behave(message: dict[str, Any], running: int) -> Reply:
        point = data(message["n"])  # a point that did not fit says so in its status (worker/suites/memory.py)
        return Reply(Status.OUT_OF_MEMORY if point.get("status") == "oom" else Status.OK, "", point)

    pool = FakePool(behave=behave)
    scheduler = made(pool, jobs=1)
    jobs: list[Any] = []
    for n in range(points):
        jobs.append(scheduler.submit("a", "memory", work({"n": n}), after=jobs[-1] if jobs else None,
                                     follows=goes_on if jobs else None, same_worker=bool(jobs)))
    for job in jobs:
        with contextlib.suppress(CancelledError):
            scheduler.wait(job)
    replies = [None if job.future.cancelled() else job.future.result() for job in jobs]
    return [reply.data.get("status") if reply is not None else "cancelled" for reply in replies], replies, pool


def test_a_sweep_stops_after_a_point_that_did_not_measure(made) -> None:
    statuses, replies, pool = _sweep(made, 5, lambda n: {"status": "oom" if n == 2 else "measured"})
    assert statuses == ["measured", "measured", "oom", "cancelled", "cancelled"]
    assert pool.order == [0, 1, 2, "stopped the others", 2]  # out of memory alone: once more, the GPU cleared


def test_a_sweep_stops_after_a_point_whose_call_was_over_the_profiles_limit(made) -> None:
    statuses, _, pool = _sweep(made, 6, lambda n: {"status": "measured", "stop": "one call took 2300 ms" if n == 3 else ""})
    assert statuses == ["measured"] * 4 + ["cancelled"] * 2
    assert pool.order == [0, 1, 2, 3]


def test_a_broken_implementation_answers_at_once(made) -> None:
    pool = FakePool()
    pool.impls["a"] = ImplInfo("a", "fake:a", load_error="ImportError: no module")
    scheduler = made(pool)
    assert scheduler.wait(scheduler.submit("a", "correctness", work({"n": 0}))).status is Status.BROKEN


def test_close_drops_the_queue_and_closes_the_running_workers(made) -> None:
    pool = FakePool()
    scheduler = made(pool, jobs=2)
    running = [scheduler.submit("a", "correctness", work({"n": n, "block": True})) for n in range(2)]
    queued = [scheduler.submit("a", "correctness", work({"n": n})) for n in range(2, 6)]
    while pool.running < 2:
        time.sleep(0.01)
    started = time.monotonic()
    scheduler.close()
    assert time.monotonic() - started < 5
    assert all(job.future.cancelled() for job in queued)
    assert all(job.future.done() for job in running)
    assert all(worker.closed for worker in pool.extras) and pool.primaries["a"].closed


def test_the_gpu_alone_is_not_kept_waiting_by_dropped_warm_ups(made) -> None:
    pool = FakePool(seconds=0.01)
    scheduler = made(pool, jobs=2)
    for n in range(8):
        scheduler.submit("a", "speed", work({"n": n}), warm=True)
    entered = threading.Event()

    def take_the_gpu() -> None:
        with scheduler.exclusive():
            entered.set()

    threading.Thread(target=take_the_gpu, daemon=True).start()
    assert entered.wait(5), "exclusive() waited for warm-ups that were dropped"


def test_a_job_remembers_the_worker_that_ran_it(made) -> None:
    pool = FakePool()
    scheduler = made(pool, jobs=2)
    jobs = [scheduler.submit("a", "speed", work({"n": n, "compile_s": 1.0}), warm=True) for n in range(4)]
    for job in jobs:
        scheduler.wait(job)
    workers = {id(job.worker) for job in jobs}
    assert None not in (job.worker for job in jobs) and len(workers) == 2


def test_a_job_waiting_for_another_does_not_hold_up_the_ones_behind_it(made) -> None:
    pool = FakePool(seconds=0.1)
    scheduler = made(pool, jobs=4)
    sweeps = []
    for sweep in range(3):  # three chains of three: the chains run side by side
        chain: list[Any] = []
        for point in range(3):
            chain.append(scheduler.submit("a", "memory", work({"n": (sweep, point)}), after=chain[-1] if chain else None,
                                          follows=goes_on if chain else None, same_worker=bool(chain)))
        sweeps.append(chain)
    for chain in sweeps:
        for job in chain:
            scheduler.wait(job)
    assert pool.most == 3


def test_a_request_that_needs_the_gpu_alone_gets_it_and_the_rest_go_on_beside_it_before_and_after(
        made, monkeypatch: pytest.MonkeyPatch) -> None:
    # The earliest request is too big to share the GPU: smaller ones go ahead for at most
    # MAX_HOLD_S, then the GPU drains, it runs alone, and the others resume side by side. (Once,
    # the drained GPU went to another request each time, and the big one waited for ever while
    # everything else ran one at a time.)
    monkeypatch.setattr("pytest_attnkit.controller.scheduling.admission.MAX_HOLD_S", 0.2)
    pool = FakePool(seconds=0.05)
    scheduler = made(pool, jobs=4, budget_bytes=100)
    busy = [scheduler.submit("b", "correctness", work({"n": f"b{n}", "block": True})) for n in range(2)]
    while pool.running < 2:
        time.sleep(0.01)
    big = scheduler.submit("a", "memory", work({"n": "big"}), gpu_bytes=1000)
    later_a = [scheduler.submit("a", "correctness", work({"n": f"a{n}"})) for n in range(3)]
    later_b = [scheduler.submit("b", "correctness", work({"n": f"b{n + 2}"})) for n in range(20)]
    time.sleep(0.5)
    assert not big.future.done()
    pool.release.set()  # the two that held the GPU end
    assert scheduler.wait(big).ok
    for job in later_a + later_b + busy:
        assert scheduler.wait(job).ok
    assert pool.order.index("big") < pool.order.index("a0")
    assert pool.order.index("big") < pool.order.index("b10")  # not after everything else


def test_a_sweep_runs_in_one_worker_point_after_point(made) -> None:
    pool = FakePool(behave=lambda message, running: Reply(Status.OK, "", {"status": "measured"}))
    scheduler = made(pool, jobs=2)
    first = scheduler.submit("a", "memory", work({"n": "p0", "seconds": 0.3}))  # on the primary
    filler = scheduler.submit("a", "correctness", work({"n": "filler", "seconds": 0.01}))  # on a new worker, idle first
    second = scheduler.submit("a", "memory", work({"n": "p1"}), after=first, follows=goes_on, same_worker=True)
    for job in (first, filler, second):
        scheduler.wait(job)
    assert filler.worker is not first.worker
    assert second.worker is first.worker


def test_the_time_table_has_a_row_per_suite_run_ahead_or_not_in_the_suites_order(made) -> None:
    """A property check run ahead (the scheduler's "properties" job) and one the pool sends itself
    (a request of the suite "properties", as with --attnkit-jobs=1) share a row; the table lists the suites in the order
    they run, each suite's warm-ups before it."""
    pool = FakePool(names=("a",))
    scheduler = made(pool, jobs=2)
    ledger = scheduler.ledger
    for suite in ("sanitize", "speed", "properties", "memory", "speed (warm)", "correctness", "memory (warm)"):
        ledger.record(suite, "a", Spent(1.0), 0.0, 1.0, counted=False)
    scheduler.wait(scheduler.submit("a", "properties", work({"n": 1}, suite="properties")))
    ledger.record(suite_of(work({"n": 2}, suite="properties")), "a", Spent(1.0), 0.0, 1.0, counted=False)
    lines = time_lines({"time": ledger.to_dict()})
    header = next(index for index, line in enumerate(lines) if line.startswith("suite "))
    end = next(index for index, line in enumerate(lines) if line.startswith("in all:"))
    assert [line[:14].strip() for line in lines[header + 1:end]] == [
        "correctness", "memory (warm)", "memory", "speed (warm)", "speed", "properties", "sanitize"]
    [properties] = [row for row in ledger.to_dict()["rows"] if row["suite"] == "properties"]
    assert properties["requests"] == 3


def test_room_is_made_again_by_the_next_failure_s_figures_before_every_worker_is_stopped(made) -> None:
    """A case whose first allocation fits once room is made and whose next one does not: the
    second failure's figures stop one more worker, not all of them (a fresh H100 stopped all 19
    idle workers for one such case, and every primary started again: issue 41)."""
    gib = 2**30
    pool = FakePool(names=("a", "b", "c"))
    scheduler = made(pool, jobs=1)
    for name in ("b", "c"):
        scheduler.wait(scheduler.submit(name, "correctness", work({"n": name})))
    leases = [pool.lease("c", room=1) for _ in range(2)]  # c's primary and an extra, idle again
    for lease in leases:
        pool.give_back(lease, warmed=False)
    extra = leases[1].worker
    held = {pool.primaries["b"].pid: 4 * gib, pool.primaries["c"].pid: 5 * gib, extra.pid: 6 * gib}

    def behave(message: dict[str, Any], running: int) -> Reply:
        if message.get("n") != "big" or pool.stops >= 2:
            return Reply(Status.OK, "", {"n": message.get("n")})
        free = 10 * gib + sum(held[pid] for pid in stopped_pids())  # what was stopped is free
        asked = 15 * gib if not pool.stops else free + 2 * gib  # a later, bigger allocation
        return Reply(Status.OUT_OF_MEMORY, "CUDA out of memory", {"out_of_memory": {
            "requested_bytes": asked, "free_at_failure_bytes": free,
            "processes": {str(pid): used for pid, used in held.items() if pid not in stopped_pids()}}})

    def stopped_pids() -> set[int]:
        return {pid for entry in pool.order if isinstance(entry, tuple) for pid in entry[1]}

    pool.behave = behave
    reply = scheduler.wait(scheduler.submit("a", "correctness", work({"n": "big"})))
    assert reply.ok
    # 5 GiB lacking x 1.25 + 1 GiB: the two biggest; then 2 GiB lacking: the last one, by its figures
    assert pool.order[-5:] == ["big", ("stopped", (pool.primaries["c"].pid, extra.pid)), "big",
                               ("stopped", (pool.primaries["b"].pid,)), "big"]
    assert "stopped the others" not in pool.order


def test_after_the_rounds_by_figures_every_other_worker_is_stopped(made) -> None:
    """Each failure's figures name a worker to stop, and the case still does not fit: after
    ``ROOM_ROUNDS`` rounds by the figures, the next stops every other worker, and that reply is the
    last."""
    from pytest_attnkit.controller.pool import ROOM_ROUNDS

    gib = 2**30
    pool = FakePool(names=("a", "b", "c", "d", "e", "f"))
    scheduler = made(pool, jobs=1)
    for name in pool.names[1:]:
        scheduler.wait(scheduler.submit(name, "correctness", work({"n": name})))
    held = {pool.primaries[name].pid: 1 * gib for name in pool.names[1:]}

    def behave(message: dict[str, Any], running: int) -> Reply:
        if message.get("n") != "big":
            return Reply(Status.OK, "", {})
        return Reply(Status.OUT_OF_MEMORY, "CUDA out of memory", {"out_of_memory": {
            "requested_bytes": 2 * gib, "free_at_failure_bytes": 2 * gib - 1,
            "processes": {str(pid): used for pid, used in held.items()}}})

    pool.behave = behave
    reply = scheduler.wait(scheduler.submit("a", "correctness", work({"n": "big"})))
    assert reply.status is Status.OUT_OF_MEMORY
    rounds = [entry for entry in pool.order if isinstance(entry, tuple) or entry == "stopped the others"]
    assert len(rounds) == ROOM_ROUNDS + 1 and rounds[-1] == "stopped the others"
    assert all(isinstance(entry, tuple) and len(entry[1]) == 2 for entry in rounds[:-1])  # 1 B x 1.25 + 1 GiB: two
    assert pool.order.count("big") == ROOM_ROUNDS + 2


def test_the_gpu_alone_begins_by_closing_the_extra_workers_that_hold_no_warm_up(made) -> None:
    pool = FakePool(seconds=0.05)
    scheduler = made(pool, jobs=3)
    jobs = [scheduler.submit("a", "correctness", work({"n": n})) for n in range(6)]
    warm = [scheduler.submit("b", "speed", work({"n": f"w{n}", "compile_s": 1.0}), warm=True) for n in range(3)]
    for job in jobs + warm:
        scheduler.wait(job)
    holders = {job.worker for job in warm}
    spare = [worker for worker in pool.extras if worker not in holders]
    assert spare, "the run made no extra worker that holds no warm-up"
    with scheduler.exclusive():
        assert all(worker.closed for worker in spare)
        assert not any(worker.closed for worker in holders)
        assert not any(worker.closed for worker in pool.primaries.values())


def test_the_job_a_test_waits_for_starts_at_once_even_with_every_slot_taken(made) -> None:
    # Both slots hang on b's requests (b has the most work queued); a's request, which pytest waits
    # for, starts in one slot more instead of waiting behind them.
    pool = FakePool()
    scheduler = made(pool, jobs=2)
    hung = [scheduler.submit("b", "correctness", work({"n": f"b{n}", "block": True})) for n in range(6)]
    while pool.running < 2:
        time.sleep(0.01)
    awaited = scheduler.submit("a", "correctness", work({"n": "a0"}))
    started = time.monotonic()
    assert scheduler.wait(awaited).data == {"echo": "a0"}
    assert time.monotonic() - started < 5
    assert pool.most == 3 and not any(job.future.done() for job in hung)
    later = scheduler.submit("a", "correctness", work({"n": "a1"}))  # not waited for: behind the slots again
    time.sleep(0.3)
    assert not later.future.done()


def test_a_job_a_waited_one_needs_first_starts_first(made) -> None:
    pool = FakePool()
    scheduler = made(pool, jobs=1)
    hung = scheduler.submit("b", "correctness", work({"n": "b0", "block": True}))
    while pool.running < 1:
        time.sleep(0.01)
    point = scheduler.submit("a", "memory", work({"n": "a0"}))
    after = scheduler.submit("a", "memory", work({"n": "a1"}), after=point, follows=lambda reply: True, same_worker=True)
    assert scheduler.wait(after).data == {"echo": "a1"}
    assert pool.order[-2:] == ["a0", "a1"] and not hung.future.done()


def test_close_twice_counts_the_workers_once(made) -> None:
    pool = FakePool()
    scheduler = made(pool, jobs=2)
    scheduler.wait(scheduler.submit("a", "correctness", work({"n": 0})))
    jobs = [scheduler.submit("a", "correctness", work({"n": n, "block": True})) for n in range(2)]
    while pool.running < 2:
        time.sleep(0.01)
    for worker in pool.extras:
        worker.startup_s = 1.5  # each extra worker's start-up goes into the ledger when it is closed
    scheduler.close()
    counted = scheduler.ledger.to_dict({})
    assert counted["startup_s"]
    scheduler.close()
    assert scheduler.ledger.to_dict({}) == counted and all(job.future.done() for job in jobs)


def _finish_closing(worker: FakeWorker) -> bool:
    """Whether ``worker`` is closed within a few seconds (it is closed after its job's reply is set)."""
    deadline = time.monotonic() + 5
    while not worker.closed and time.monotonic() < deadline:
        time.sleep(0.01)
    return worker.closed


def test_a_dedicated_job_runs_in_a_worker_of_its_own_closed_after_the_last_one(made) -> None:
    pool = FakePool(seconds=0.02)
    scheduler = made(pool, jobs=2)
    shared, dedicated = [], []
    for n in range(4):  # warm-ups that compile, and the torch.compile checks between them
        shared.append(scheduler.submit("a", "speed", work({"n": n, "compile_s": 1.0}), warm=True))
        dedicated.append(scheduler.submit("a", "properties", work({"n": 10 + n}, suite="properties"),
                                          isolation=Isolation.DEDICATED, tag="torch_compile"))
        shared.append(scheduler.submit("a", "correctness", work({"n": 20 + n})))
    for job in shared + dedicated:
        scheduler.wait(job)
    (own,) = {job.worker for job in dedicated}
    assert own is not None and own not in {job.worker for job in shared}
    assert own is not pool.primaries["a"]
    assert _finish_closing(own), "the worker of its own outlived its last request"
    again = scheduler.submit("a", "properties", work({"n": 99}, suite="properties"), isolation=Isolation.DEDICATED,
                             tag="torch_compile")
    scheduler.wait(again)
    assert again.worker is not own and not {again.worker} & {job.worker for job in shared}


def test_a_dedicated_job_waiting_for_its_busy_worker_holds_up_nothing_else(made) -> None:
    pool = FakePool(seconds=0.01)
    scheduler = made(pool, jobs=3)
    first = scheduler.submit("a", "properties", work({"n": "first", "block": True}, suite="properties"),
                             isolation=Isolation.DEDICATED, tag="torch_compile")
    second = scheduler.submit("a", "properties", work({"n": "second"}, suite="properties"),
                              isolation=Isolation.DEDICATED, tag="torch_compile")
    others = [scheduler.submit("a", "correctness", work({"n": n})) for n in range(3)]
    for job in others:
        assert scheduler.wait(job).ok
    assert not first.future.done() and not second.future.done()
    assert "second" not in pool.order  # it waits for its worker, busy with the first
    pool.release.set()
    scheduler.wait(second)
    assert second.worker is first.worker
    assert pool.order.index("second") > pool.order.index("first")


def test_close_closes_the_workers_of_their_own_too(made) -> None:
    pool = FakePool()
    scheduler = made(pool, jobs=2)
    job = scheduler.submit("a", "properties", work({"n": 0, "block": True}, suite="properties"),
                           isolation=Isolation.DEDICATED, tag="torch_compile")
    while pool.running < 1:
        time.sleep(0.01)
    scheduler.close()
    assert job.worker is not None and job.worker.closed


def test_the_timeline_tells_the_requests_run_together_from_those_that_had_the_gpu_alone(made) -> None:
    """The time table's timeline: a scheduled request counts as run beside others, one the pool
    sends with the GPU to itself (speed's timing) as alone, with its seconds, from when to when.
    On an H200 the alone phase was 112 s of a 206 s run (results/2026-11-27-session8): the line
    says so without reading the events by hand."""
    pool = FakePool(names=("a",), seconds=0.2)
    scheduler = made(pool, jobs=2)
    scheduler.wait(scheduler.submit("a", "correctness", work({"n": 1})))
    pool.request_alone("a", work({"n": 2}, suite="speed"), suite="speed")
    section = scheduler.ledger.to_dict()
    assert [event["alone"] for event in section["events"]] == [False, True]
    phases = timeline(section["events"])
    assert phases is not None and phases["alone_requests"] == 1
    # The events' start and wall seconds are rounded to 1 ms each: their sum may pass the next start.
    assert phases["together_until_s"] <= phases["alone_from_s"] + 0.002
    assert phases["alone_from_s"] < phases["alone_until_s"]
    assert 0.15 < phases["alone_s"] < 5
    lines = time_lines({"time": section})
    start = next(index for index, line in enumerate(lines) if line.startswith("timeline:"))
    line = " ".join([lines[start], *itertools.takewhile(lambda more: more.startswith("  "), lines[start + 1:])])
    line = re.sub(r" +", " ", line)
    assert all(len(text) <= 100 for text in lines)
    assert re.fullmatch(r"timeline: the first request started at \d+ s; requests ran beside one another until "
                        r"\d+ s; 1 requests run alone took \d+ s, from \d+ to \d+ s", line), line
    # The session's moments before the first request, in the order they happened, where recorded.
    scheduler.ledger.mark("collected")
    scheduler.ledger.mark("probed")  # too late: the first mark of a moment counts, this one is new
    scheduler.ledger.mark("collected")
    marks = scheduler.ledger.to_dict()["marks"]
    assert list(marks) == ["collected", "probed"] and marks["collected"] <= marks["probed"]
    text = timeline_line(section["events"], {"probed": 2.4, "started": 8.0, "collected": 15.2})
    assert "started at 0 s (the device probed at 2 s, the implementations' first workers ready at 8 s, the " \
           "tests collected at 15 s); requests" in text, text
    assert "(" not in timeline_line(section["events"], {})
    assert "(the implementations' first workers ready at 5 s, the device probed at 6 s)" in \
        timeline_line(section["events"], {"probed": 6.1, "started": 5.0})
    # Under pytest-xdist each process counts from its own start: the merged report has no timeline.
    assert not [line for line in time_lines({"time": {**section, "xdist_workers": 2}}) if "timeline" in line]
    # A report written before the field existed: every request counts as run beside others.
    old = [{key: value for key, value in event.items() if key != "alone"} for event in section["events"]]
    assert timeline(old)["alone_requests"] == 0 and timeline([]) is None
