"""A real worker process on the CPU, seen from the pytest process (controller/process.py): a
Request answered with a Reply, a missed deadline, a crash, a harness error, a closed worker.

The implementations below misbehave in ``unavailable_reason``, which the describe op calls: no
torch is needed, and each worker starts in about a second.
"""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

import pytest

from pytest_attnkit.controller.correctness import CorrectnessCheck
from pytest_attnkit.controller.process import Spares, WorkerFailure, WorkerProcess
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


def _maps_torch(pid: int) -> bool:
    """Whether the process has torch's library loaded (Linux's /proc)."""
    try:
        return "libtorch" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/PID/maps (Linux)")
def test_a_spare_imports_torch_before_its_worker_takes_it_and_one_not_taken_is_ended(tmp_path) -> None:
    """Spares (the scheduler's extra workers' interpreters, started ahead): a spare imports torch
    while it waits; a worker whose environment is the spare's takes it and answers from it, its
    log the spare's; a worker with another environment starts its own; a spare that died is
    passed over; closing ends the spares not taken, and no process of any of them is left."""
    spares = Spares(tmp_path)
    env = {"OMP_NUM_THREADS": "1"}
    spares.add(env, 3)
    assert spares.waiting == 3
    pids = [spawned.process.pid for _, spawned in spares._waiting]
    deadline = time.monotonic() + 120
    while not all(_maps_torch(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert all(_maps_torch(pid) for pid in pids)  # before any INIT was sent
    _, dead = spares._waiting[0]
    dead.process.kill()
    dead.process.wait()
    worker = WorkerProcess("probe", {"device": "cpu"}, tmp_path, env=env, startup_timeout=60, spares=spares)
    other = WorkerProcess("other", {"device": "cpu"}, tmp_path, env={"OMP_NUM_THREADS": "2"},
                          startup_timeout=60, spares=spares)
    try:
        assert worker.request(Request(Op.DESCRIBE), 60).status is Status.OK
        assert worker.process.pid == pids[1] and worker.log_path.name == "spare.2.log"
        assert spares.waiting == 1  # the dead one was ended, the third still waits
        assert other.request(Request(Op.DESCRIBE), 60).status is Status.OK
        assert other.process.pid not in pids and other.log_path.name == "other.1.log"
        spares.close()
        spares.add(env, 1)  # closed: none is started any more
        assert spares.waiting == 0 and spares.take(env) is None
        assert not any(_alive(pid) for pid in (pids[0], pids[2]))
    finally:
        worker.close()
        other.close()
    assert not any(_alive(pid) for pid in pids)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"
