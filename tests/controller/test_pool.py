"""The pool (pytest_attnkit/controller/pool.py), which owns every worker process: its one-off
workers, with real worker processes on the CPU (a worker started ahead is the one the later request
uses, and none outlives the pool), and how it lends its workers to the requests run ahead, with
fake workers (tests/fakes/fake_workers.py): the cap on extra workers and the one more for the
awaited request, the worker a sweep's next point needs, workers of their own (DEDICATED), which
idle workers go to make room for an out-of-memory (cheapest first), the trim as the GPU-alone
phase begins, and that closing ends every worker."""

from __future__ import annotations

import subprocess
import sys

from fakes.fake_workers import FakePool, FakeWorker
from pytest_attnkit.controller.pool import WorkerPool
from pytest_attnkit.controller.process import Launch
from pytest_attnkit.messages import Op, Reply, Request, Status


def counting_pool(started: list) -> WorkerPool:
    pool = WorkerPool(device="cpu", timeout=120.0)
    new_worker = pool._new_worker

    def counted(*args, **kwargs):
        worker = new_worker(*args, **kwargs)
        started.append(worker)
        return worker

    pool._new_worker = counted
    return pool


def test_a_worker_started_ahead_answers_the_one_off_request_and_is_closed_after_it() -> None:
    started: list = []
    pool = counting_pool(started)
    try:
        pool.start_once("ceilings")
        worker, starting = pool._once["ceilings"]
        starting.result(timeout=120)  # started: its interpreter and torch are loaded
        assert worker.alive
        data = pool.run_once("ceilings", Request(Op.CEILINGS))
        assert data["ceilings"] == {}  # the CPU has none; the request ran in the started worker
        assert started == [worker]
        assert not worker.alive and "ceilings" not in pool._once
        pool.run_once("ceilings", Request(Op.CEILINGS))  # nothing started ahead: a new one
        assert len(started) == 2
    finally:
        pool.close()


def test_a_worker_started_ahead_and_never_asked_ends_with_the_pool() -> None:
    started: list = []
    pool = counting_pool(started)
    pool.start_once("ceilings")
    pool.start_once("ceilings")  # once per label
    assert len(started) == 1
    worker, starting = pool._once["ceilings"]
    starting.result(timeout=120)
    assert worker.alive
    pool.close()
    assert not worker.alive


def test_nothing_starts_ahead_in_process() -> None:
    pool = WorkerPool(device="cpu", timeout=60.0, inprocess=True)
    pool.start_once("ceilings")
    assert pool._once == {}
    pool.close()


# -- lending workers to the requests run ahead (fake workers) -------------------------------------
def sharing(names: tuple[str, ...] = ("a", "b"), extras: int = 2) -> FakePool:
    pool = FakePool(names=names)
    pool.share(extras=extras, alone=lambda: None)  # type: ignore[arg-type, return-value]
    return pool


def test_a_lease_takes_an_idle_extra_then_the_primary_then_a_new_extra_up_to_the_cap() -> None:
    pool = sharing(extras=2)
    first = pool.lease("a")
    assert first is not None and first.worker is pool.primaries["a"]
    second, third = pool.lease("a"), pool.lease("b")
    assert second is not None and third is not None and second.worker is pool.extras[0]
    assert third.worker is pool.primaries["b"]
    fourth = pool.lease("b")
    assert fourth is not None and fourth.worker is pool.extras[1]
    assert pool.lease("a") is None  # two extras: the cap
    awaited = pool.lease("a", room=1)  # one more, for the request a test waits for
    assert awaited is not None and awaited.worker is pool.extras[2]
    assert pool.lease("a", room=1) is None
    pool.give_back(second, warmed=False)
    pool.give_back(first, warmed=False)
    again = pool.lease("a")
    assert again is not None and again.worker is second.worker  # an idle extra before the primary
    pool.close()


def test_when_full_an_idle_extra_of_an_implementation_with_nothing_queued_makes_room() -> None:
    """The one holding no warm-up goes first; then the warm-up's worker whose warm-ups compiled
    least each (a Triton kernel loads again from the disk cache in milliseconds, torch_flex's first
    call costs its dynamo trace again), however many it ran; the extras of an implementation with
    work stay."""
    pool = sharing(extras=3)
    leases = [pool.lease("b") for _ in range(4)]  # b's primary and its three extras
    costly, cheap, cold = leases[1], leases[2], leases[3]
    pool.give_back(costly, warmed=True, compile_s=0.4)
    for time in range(3):  # three warm-ups of 0.2 s each: more in all than the costly one's 0.4 s
        again = pool.lease("b", same_as=cheap.worker) if time else cheap
        assert again is not None and again.worker is cheap.worker
        pool.give_back(again, warmed=True, compile_s=0.2)
    pool.give_back(cold, warmed=False)
    first = pool.lease("a")  # a's primary: its request compiled, so a may take warm workers
    assert first is not None
    pool.give_back(first, warmed=False, compile_s=1.0)
    pool.lease("a")  # a's primary, busy
    assert pool.lease("a", queued=lambda impl: impl == "b") is None  # b has work: its extras stay
    taken = []
    for _ in range(3):
        lease = pool.lease("a", queued=lambda impl: False)
        assert lease is not None and lease.retired is not None
        taken.append(lease.retired[1])
        pool.begin(lease)  # on the request's thread: closes the one taken out
    assert taken == [cold.worker, cheap.worker, costly.worker]
    assert all(worker.closed for worker in taken)
    pool.close()


def test_a_warm_up_s_first_call_setup_counts_as_what_its_worker_would_cost_again() -> None:
    """torch_sdpa's warm-ups compile nothing, but each built a cuDNN plan its timing would build
    again elsewhere: its warm worker is taken after one whose warm-ups compiled less than that."""
    pool = sharing(extras=2)
    pool.lease("b")  # b's primary, busy
    planned, compiled = pool.lease("b"), pool.lease("b")
    assert planned is not None and compiled is not None
    pool.give_back(planned, warmed=True, compile_s=0.0, spared_s=0.3)
    pool.give_back(compiled, warmed=True, compile_s=0.1, spared_s=0.05)
    first = pool.lease("a")  # a's primary: its request compiled, so a may take warm workers
    assert first is not None
    pool.give_back(first, warmed=False, compile_s=1.0)
    pool.lease("a")  # busy
    taken = []
    for _ in range(2):
        lease = pool.lease("a", queued=lambda impl: False)
        assert lease is not None and lease.retired is not None
        taken.append(lease.retired[1])
        pool.begin(lease)
    assert taken == [compiled.worker, planned.worker]
    pool.close()


def test_when_full_only_an_implementation_whose_requests_compile_takes_a_warm_worker() -> None:
    """A worker more gains an implementation that compiles nothing one request's GPU time at a
    time, and its start-up costs seconds; the warm worker it would take costs the warmed cases
    their first calls again with the GPU alone (on an H200 torch_sdpa's correctness tail took
    torch_flex's: 6.3 s against 0.6 s, results/2026-11-27-session11)."""
    pool = sharing(names=("a", "b", "c"), extras=1)
    warm = pool.lease("b")
    extra = pool.lease("b")
    assert warm is not None and extra is not None and extra.worker is not pool.primaries["b"]
    pool.give_back(warm, warmed=False)
    pool.give_back(extra, warmed=True, compile_s=1.0)  # b's one extra holds a warm-up
    library = pool.lease("a")  # a's primary: one request of 0.5 s in 20 (a warm Triton run)
    assert library is not None
    pool.give_back(library, warmed=False, compile_s=0.5)
    for _ in range(19):
        library = pool.lease("a")
        assert library is not None
        pool.give_back(library, warmed=False, compile_s=0.0)
    library = pool.lease("a")
    assert pool.lease("a", queued=lambda impl: False) is None  # a compiles little: b's warm extra stays
    compiler = pool.lease("c")  # c's primary
    assert compiler is not None
    pool.give_back(compiler, warmed=False, compile_s=2.5)
    compiler = pool.lease("c")
    taken = pool.lease("c", queued=lambda impl: False)
    assert taken is not None and taken.retired == ("b", extra.worker)
    pool.close()


def test_a_sweeps_next_point_waits_for_the_worker_that_ran_the_point_before() -> None:
    pool = sharing(extras=2)
    point = pool.lease("a")
    other = pool.lease("a")
    assert point is not None and other is not None
    pool.give_back(other, warmed=False)
    assert pool.lease("a", same_as=point.worker) is None  # busy: it waits, though another is idle
    pool.give_back(point, warmed=False)
    following = pool.lease("a", same_as=point.worker)
    assert following is not None and following.worker is point.worker
    pool.close()


def test_a_dedicated_request_gets_a_worker_of_its_own_outside_the_cap_closed_after_its_last() -> None:
    pool = sharing(extras=1)
    shared = [pool.lease("a"), pool.lease("a")]
    assert pool.lease("a") is None  # the cap is full...
    own = pool.lease("a", dedicated=("a", "torch_compile"))
    assert own is not None and own.worker not in {lease.worker for lease in shared if lease}  # ...not for it
    assert pool.busy(("a", "torch_compile"))
    assert pool.lease("a", dedicated=("a", "torch_compile")) is None  # one request at a time
    other_tag = pool.lease("a", dedicated=("a", "other"))
    assert other_tag is not None and other_tag.worker is not own.worker
    assert pool.give_back(own, warmed=False, last=False) is None  # more are queued: kept
    again = pool.lease("a", dedicated=("a", "torch_compile"))
    assert again is not None and again.worker is own.worker
    done = pool.give_back(again, warmed=False, last=True)
    assert done is own.worker and not done.closed
    pool.retire("a", done)
    assert done.closed
    later = pool.lease("a", dedicated=("a", "torch_compile"))
    assert later is not None and later.worker is not own.worker  # a fresh one
    pool.close()


GIB = 2**30


def _failure(held: dict[int, int], requested: int = 16 * GIB, free: int = 10 * GIB) -> Reply:
    return Reply(Status.OUT_OF_MEMORY, "CUDA out of memory", {"out_of_memory": {
        "requested_bytes": requested, "free_at_failure_bytes": free,
        "processes": {str(pid): used for pid, used in held.items()}}})


def test_room_is_made_by_stopping_the_cheapest_workers_until_what_was_lacking_is_free() -> None:
    """An out-of-memory alone that says what it lacked (16 GiB asked, 10 GiB free: 6 GiB) and what
    each process held stops idle workers that hold no warm-up first, biggest first, only until
    the lacking bytes (with a margin) are free; the workers that hold warm-ups are kept."""
    pool = sharing(names=("a", "b", "c"), extras=2)
    warm_b = pool.lease("b")
    c_leases = [pool.lease("c"), pool.lease("c")]  # c's primary and an extra
    assert warm_b is not None and all(c_leases)
    pool.give_back(warm_b, warmed=True)
    for lease in c_leases:
        pool.give_back(lease, warmed=False)
    c_primary, c_extra = pool.primaries["c"], c_leases[1].worker
    held = {pool.primaries["a"].pid: 1 * GIB, c_primary.pid: 3 * GIB, c_extra.pid: 7 * GIB,
            warm_b.worker.pid: 9 * GIB}
    keep = pool.primaries["a"]
    stopped, everyone = pool.evict(keep, _failure(held))
    # 6 GiB lacking x 1.25 + 1 GiB = 8.5 GiB: c's extra (7) then c's primary (3); b's warm worker stays
    assert pool.order[-1] == ("stopped", tuple(sorted((c_primary.pid, c_extra.pid))))
    assert stopped == 2 and not everyone
    held[c_primary.pid] = 1 * GIB  # now the cheap ones are not enough: the warm one goes too
    stopped, everyone = pool.evict(keep, _failure(held))
    assert pool.order[-1] == ("stopped", tuple(sorted((warm_b.worker.pid, c_primary.pid, c_extra.pid))))
    assert everyone
    busy = pool.lease("c")  # a worker lent now is never stopped
    assert busy is not None
    pool.evict(keep, _failure(held))
    assert busy.worker.pid not in pool.order[-1][1]
    pool.close()


def test_of_the_workers_that_hold_warm_ups_those_whose_warm_ups_compiled_least_are_stopped_first() -> None:
    """Triton's kernels load from the disk cache in milliseconds, torch_flex's first calls cost a
    trace each: on an H100 its first calls took 9 s with the GPU alone once its warm workers had
    been stopped (results/2026-11-27-session9). The cheap-to-warm worker goes first, though
    smaller."""
    pool = sharing(names=("a", "b", "c"), extras=2)
    cheap, dear = pool.lease("b"), pool.lease("c")
    assert cheap is not None and dear is not None
    pool.give_back(cheap, warmed=True, compile_s=0.01)
    pool.give_back(dear, warmed=True, compile_s=3.0)
    held = {cheap.worker.pid: 5 * GIB, dear.worker.pid: 9 * GIB}
    keep = pool.primaries["a"]
    stopped, everyone = pool.evict(keep, _failure(held, requested=13 * GIB, free=10 * GIB))
    # 3 GiB lacking x 1.25 + 1 GiB = 4.75 GiB: the cheap one (5 GiB) is enough
    assert pool.order[-1] == ("stopped", (cheap.worker.pid,)) and stopped == 1
    pool.close()


def test_room_is_made_by_stopping_every_worker_when_the_figures_say_nothing_was_lacking_or_every_is_asked() -> None:
    """Free memory above what was asked, and yet out of memory (fragmentation): the figures cannot
    say whom to stop, so all of them go, rather than none and a "does not fit" skip; so do they
    without figures, and after the rounds by the figures (``every``)."""
    pool = sharing(names=("a", "b"))
    keep = pool.primaries["a"]
    fragmented = _failure({pool.primaries["b"].pid: GIB}, requested=GIB, free=2 * GIB)
    assert pool.evict(keep, fragmented) == (1, True) and pool.order[-1] == "stopped the others"
    assert pool.evict(keep, None) == (1, True)
    pool.order.clear()
    assert pool.evict(keep, _failure({pool.primaries["b"].pid: 9 * GIB}), every=True) == (1, True)
    assert pool.order == ["stopped the others"]
    pool.close()


def test_the_trim_closes_the_idle_extras_that_hold_no_warm_up() -> None:
    pool = sharing(extras=3)
    leases = [pool.lease("a") for _ in range(4)]  # a's primary and three extras
    assert all(leases)
    primary, warm, cold, busy = leases
    pool.give_back(primary, warmed=False)
    pool.give_back(warm, warmed=True)
    pool.give_back(cold, warmed=False)
    cold.worker.startup_s = 2.0
    pool.trim()
    assert cold.worker.closed
    assert not warm.worker.closed and not primary.worker.closed and not busy.worker.closed
    assert pool.ledger.to_dict({})["startup_s"] == {"a": 2.0}  # its start-up counted as it closes
    again = pool.lease("a")
    assert again is not None and again.worker is warm.worker  # the closed one is not lent again
    pool.close()


def test_stopping_kills_the_lent_workers_and_closing_ends_every_worker() -> None:
    pool = sharing(extras=2)
    lent = pool.lease("a")
    idle_extra = pool.lease("a")
    own = pool.lease("a", dedicated=("a", "torch_compile"))
    assert lent is not None and idle_extra is not None and own is not None
    pool.give_back(idle_extra, warmed=False)
    pool.give_back(own, warmed=False, last=False)
    for worker in pool.extras:
        worker.startup_s = 1.5
    spare = pool.stop_lending()
    assert lent.worker.closed and not idle_extra.worker.closed  # what runs is killed at once
    assert {worker for _, worker in spare} == {idle_extra.worker, own.worker}
    pool.retire_all(spare)
    assert idle_extra.worker.closed and own.worker.closed
    assert pool.ledger.to_dict({})["startup_s"] == {"a": 3.0}  # the two closed here, once each
    assert pool.lease("b") is not None and pool.lease("b", dedicated=("b", "x")) is not None
    pool.close()
    assert all(worker.closed for worker in [*pool.primaries.values(), *pool.extras])


def test_the_pool_imports_no_scheduler() -> None:
    """The pool knows no scheduler (the session hands it the GPU-alone phase): importing it loads
    no scheduling module, so there is no cycle to hide."""
    code = ("import sys, pytest_attnkit.controller.pool; "
            "print(sorted(m for m in sys.modules if 'schedul' in m))")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "[]"


def test_a_worker_under_a_launcher_is_lent_for_one_request_and_ends_before_its_reply_or_with_the_run(
        monkeypatch) -> None:
    """The sanitize suite's workers under compute-sanitizer are the pool's: a request with a
    Launch gets one of its own, started under the launcher, up to ``at_once`` at a time; finish()
    closes it (the tool writes its summary then), stop_lending() kills one that runs (the run
    stops), and close() one still lent."""
    pool = sharing()
    pool._starts["a"] = ({"name": "a"}, None)
    made: list = []

    def process(label, init, log_dir, **options):
        made.append((FakeWorker(pool, label), options["launcher"], options["env"]))
        return made[-1][0]

    monkeypatch.setattr("pytest_attnkit.controller.pool.WorkerProcess", process)
    launch = Launch(("tool", "--check"), {"TOOL": "1"}, label="a.memcheck", shutdown_timeout=1.0, at_once=1)
    lease = pool.lease("a", launch=launch)
    assert lease is not None and lease.launched and lease.worker is made[-1][0]
    assert made[-1][1] == ["tool", "--check"] and made[-1][2]["TOOL"] == "1"
    assert pool.busy(None, launch) and pool.lease("a", launch=launch) is None  # one at a time
    pool.finish(lease)
    assert lease.worker.closed and pool.give_back(lease, warmed=False) is None
    assert not pool.busy(None, launch) and lease.worker not in pool._idle.get("a", [])
    running = pool.lease("a", launch=launch)
    pool.stop_lending()
    assert running is not None and running.worker.closed
    pool.finish(running)  # as its request's thread does once the request fails
    left = pool.lease("a", launch=launch)
    pool.close()
    assert left is not None and left.worker.closed
