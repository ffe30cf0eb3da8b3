"""A real worker process on the CPU, seen from the pytest process (controller/process.py): a
Request answered with a Reply, a missed deadline, a crash, a harness error, a closed worker.

The implementations below misbehave in ``unavailable_reason``, which the describe op calls: no
torch is needed, and each worker starts in about a second.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from pytest_attnkit.controller.correctness import CorrectnessCheck
from pytest_attnkit.controller.process import WorkerFailure, WorkerProcess
from pytest_attnkit.messages import Op, Request, Status

IMPLS = textwrap.dedent('''
    import os, signal, time
    from pytest_attnkit.contract import AttentionImpl

    class Sleepy(AttentionImpl):
        def unavailable_reason(self, device):
            time.sleep(120)

    class Crashing(AttentionImpl):
        def unavailable_reason(self, device):
            print("the fake implementation is about to die", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
''')


@pytest.fixture
def start(tmp_path: Path):
    (tmp_path / "attnkit_fake_impls.py").write_text(IMPLS)
    workers: list[WorkerProcess] = []

    def start(impl: str | None = None) -> WorkerProcess:
        init = {"device": "cpu", "sys_path_first": [str(tmp_path)], "handlers": {
            "correctness": CorrectnessCheck.handler, "broken": "attnkit_no_such_module:Handler"}}
        if impl is not None:
            init.update(name=impl.lower(), value=f"attnkit_fake_impls:{impl}")
        worker = WorkerProcess(impl or "probe", init, tmp_path, startup_timeout=60)
        workers.append(worker)
        return worker

    yield start
    for worker in workers:
        worker.close()


def test_a_request_is_answered_with_a_reply(start) -> None:
    worker = start()
    reply = worker.request(Request(Op.DESCRIBE), 60)
    assert reply.status is Status.OK
    assert reply.data == {"load_error": "no implementation loaded"}
    assert reply.spent.wall_s is not None and 0 <= reply.spent.wall_s < 60
    pid = worker.process.pid
    worker.request(Request(Op.DESCRIBE), 60)
    assert worker.process.pid == pid  # one worker serves request after request


def test_a_missed_deadline_kills_the_worker_and_says_so(start) -> None:
    worker = start("Sleepy")
    with pytest.raises(WorkerFailure) as failure:
        worker.request(Request(Op.DESCRIBE), 1.0)
    assert failure.value.kind == "timeout"
    assert "passed its deadline of 1 s while running 'describe' and was killed" in str(failure.value)
    assert not worker.alive


def test_a_crash_says_how_the_worker_died_with_its_log(start) -> None:
    worker = start("Crashing")
    with pytest.raises(WorkerFailure) as failure:
        worker.request(Request(Op.DESCRIBE), 60)
    text = str(failure.value)
    assert failure.value.kind == "crashed"
    assert "died while running 'describe': it was killed by SIGKILL" in text
    assert "--- last lines of its log" in text and "the fake implementation is about to die" in text


def test_a_harness_error_raises_with_the_workers_traceback_and_the_worker_goes_on(start) -> None:
    worker = start()
    with pytest.raises(WorkerFailure) as failure:
        worker.request(Request(Op.RUN, options={"trials": 1}, suite="correctness"), 60)  # no case: the harness's bug
    assert failure.value.kind == "error"
    assert "raised while running 'correctness'" in str(failure.value)
    assert "Traceback" in str(failure.value) and "names no case" in str(failure.value)
    pid = worker.process.pid
    assert worker.request(Request(Op.DESCRIBE), 60).status is Status.OK
    assert worker.process.pid == pid


def test_a_closed_worker_ends_and_takes_no_more_requests(start) -> None:
    worker = start()
    worker.request(Request(Op.DESCRIBE), 60)
    process = worker.process
    worker.close()
    assert process.poll() is not None and not worker.alive
    with pytest.raises(WorkerFailure) as failure:
        worker.request(Request(Op.DESCRIBE), 60)
    assert failure.value.kind == "closed"
    assert worker.process is None  # not started again


def test_a_worker_closed_while_it_starts_does_not_run_on(tmp_path) -> None:
    """A worker may be closed while another thread starts it (the pool ending beside a worker
    it started ahead): the process spawned after the close is ended at once, not left running."""
    worker = WorkerProcess("late", {"device": "cpu"}, tmp_path, startup_timeout=60)
    worker.close()  # before any process exists
    worker.closed = False  # as if the close came between the request's check and the spawn:
    original_start = worker._start

    def start_then_closed():
        worker.closed = True
        original_start()

    worker._start = start_then_closed
    try:
        worker.request(Request(Op.ENVIRONMENT), 60)
    except WorkerFailure as failure:
        assert failure.kind == "closed"
    else:
        raise AssertionError("a worker closed while starting answered a request")
    assert worker.process is None


def test_a_suite_whose_handler_cannot_be_imported_fails_its_requests_and_the_worker_goes_on(start) -> None:
    worker = start()
    with pytest.raises(WorkerFailure) as failure:
        worker.request(Request(Op.RUN, options={"trials": 1}, suite="broken"), 60)
    assert failure.value.kind == "error"
    assert "raised while running 'broken'" in str(failure.value)
    assert ("the broken suite's worker handler attnkit_no_such_module:Handler could not be made" in str(failure.value)
            and "No module named 'attnkit_no_such_module'" in str(failure.value))
    pid = worker.process.pid
    assert worker.request(Request(Op.DESCRIBE), 60).status is Status.OK
    assert worker.process.pid == pid
