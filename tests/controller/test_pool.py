"""The pool's one-off workers (controller/pool.py), with real worker processes on the CPU: a worker
started ahead is the one the later request uses, and none outlives the pool."""

from __future__ import annotations

from pytest_attnkit.controller.pool import WorkerPool
from pytest_attnkit.messages import Op, Request


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
