"""Durations (pytest_attnkit/controller/scheduling/durations.py): how long each request took last
time, kept per GPU in the compile-cache folder so that the next run starts the long ones first.
The file's round trip and merge, the key of a request, what counts as long, a file that cannot be
read (set aside, said in the header) or written (said, the run goes on), and the scheduler
starting a request remembered as long before those submitted ahead of it."""

from __future__ import annotations

import json
import threading
from concurrent import futures
from pathlib import Path

import pytest

from fakes.fake_workers import FakePool, work
from pytest_attnkit.controller.ledger import Ledger
from pytest_attnkit.controller.scheduler import Scheduler
from pytest_attnkit.controller.scheduling.durations import LONG_S, SCHEMA, Durations, durations_path, long_s, request_key
from pytest_attnkit.controller.scheduling.job import Job
from pytest_attnkit.messages import Reply, Status


def job(fields: dict, impl: str = "a", suite: str = "correctness", warm: bool = False, seq: int = 0) -> Job:
    return Job(impl, suite, work(fields, suite=suite), 0, seq, warm=warm)


def test_a_request_is_known_by_its_implementation_row_and_what_it_asks() -> None:
    assert request_key(job({"n": 1})) == request_key(job({"n": 1}, seq=7))  # the next run's same request
    keys = {request_key(job({"n": 1})), request_key(job({"n": 2})), request_key(job({"n": 1}, impl="b")),
            request_key(job({"n": 1}, warm=True)), request_key(job({"n": 1}, suite="speed"))}
    assert len(keys) == 5


def test_durations_are_kept_merged_per_device_and_read_back(tmp_path: Path) -> None:
    path = durations_path(tmp_path, "nvidia-h200")
    assert path == tmp_path / "durations" / "nvidia-h200.json" and durations_path(None, "x") is None
    first = Durations(path)
    assert first.remembered == {} and "none remembered yet" in first.describe()
    first.record(job({"n": 1}), 17.6)
    first.record(job({"n": 2}), 0.4)
    assert first.save() is None
    second = Durations(path)
    assert second.of(job({"n": 1})) == 17.6 and long_s(second.of(job({"n": 1}))) == 17.6
    assert second.of(job({"n": 2})) == 0.4 and long_s(second.of(job({"n": 2}))) == 0.0  # under LONG_S
    assert second.of(job({"n": 3})) is None and long_s(second.of(job({"n": 3}))) == 0.0
    assert "2 remembered" in second.describe() and f"the 1 of {LONG_S:g} s or more" in second.describe()
    second.record(job({"n": 1}), 2.0)  # this run's time replaces the last; others are kept
    assert second.save() is None
    third = Durations(path)
    assert third.of(job({"n": 1})) == 2.0 and third.of(job({"n": 2})) == 0.4
    assert not list(path.parent.glob(".durations-*"))  # written whole, then renamed: no leftovers


@pytest.mark.parametrize("text, why", [
    ("{not json", "not JSON"),
    ('{"schema": "attnkit-baseline"}', f"not a {SCHEMA} file"),
    (json.dumps({"schema": SCHEMA, "schema_version": 99, "seconds": {}}), "schema version 99"),
    (json.dumps({"schema": SCHEMA, "schema_version": 1, "seconds": {"k": -1}}), "non-negative numbers"),
    (json.dumps({"schema": SCHEMA, "schema_version": 1, "seconds": {"k": "5"}}), "non-negative numbers"),
    (json.dumps({"schema": SCHEMA, "schema_version": 1, "seconds": [1]}), "non-negative numbers"),
])
def test_a_file_that_cannot_be_read_is_set_aside_and_said_and_replaced(tmp_path: Path, text: str, why: str) -> None:
    path = durations_path(tmp_path, "gpu")
    path.parent.mkdir(parents=True)
    path.write_text(text)
    durations = Durations(path)
    assert durations.remembered == {} and why in durations.describe() and str(path) in durations.describe()
    durations.record(job({"n": 1}), 5.0)
    assert durations.save() is None
    assert Durations(path).of(job({"n": 1})) == 5.0  # this run's durations replace it


def test_a_file_that_cannot_be_written_is_said_and_the_run_goes_on(tmp_path: Path) -> None:
    blocker = tmp_path / "durations"
    blocker.write_text("a file where the folder should be")
    durations = Durations(durations_path(tmp_path, "gpu"))
    durations.record(job({"n": 1}), 5.0)
    problem = durations.save()
    assert problem is not None and "could not be kept" in problem
    assert Durations(None).save() is None and "not remembered" in Durations(None).describe()


def test_the_scheduler_starts_a_request_remembered_as_long_before_those_submitted_ahead_of_it(tmp_path: Path) -> None:
    """One slot; a first request holds it while four more are queued, the last of them
    remembered as long: it starts second. Without the memory, the queue's order. The run's own
    durations are kept for the next run."""

    def run(durations: Durations) -> list:
        release = threading.Event()
        started: list = []

        def behave(options, running):
            started.append(options["n"])
            if options["n"] == "first":
                release.wait(5)
            return Reply(Status.OK, "", {})

        pool = FakePool(names=("a",), behave=behave)
        scheduler = Scheduler(pool, jobs=1, budget_bytes=None, ledger=Ledger(), durations=durations)
        try:
            jobs = [scheduler.submit("a", "correctness", work({"n": "first"}))]
            while not started:
                threading.Event().wait(0.01)
            jobs += [scheduler.submit("a", "correctness", work({"n": n})) for n in ("b", "c", "d", "tail")]
            release.set()
            done, _ = futures.wait([submitted.future for submitted in jobs], timeout=10)  # no test awaits one:
            assert len(done) == len(jobs)  # a request a test waits for would go first of all
        finally:
            scheduler.close()
            pool.close()
        return started

    path = durations_path(tmp_path, "gpu")
    assert run(Durations(path)) == ["first", "b", "c", "d", "tail"]
    remembered = Durations(path)
    assert len(remembered.remembered) == 5  # saved as the scheduler closed
    tail = Job("a", "correctness", work({"n": "tail"}), 0, 0)
    remembered.remembered[request_key(tail)] = 17.6
    assert run(remembered) == ["first", "tail", "b", "c", "d"]
