"""One worker process, seen from the pytest process: start it, send requests with a deadline,
survive its death.

A :class:`WorkerProcess` owns one worker. When the worker dies (segfault, abort, an illegal
memory access that kills the process) or misses the deadline set by the parent, the request
raises :class:`WorkerFailure` with what happened in words (the exit signal, the deadline, and
the tail of the worker's log) and the next request starts a fresh worker. An
:class:`InProcessWorker` runs the same handler inside the pytest process for debugging with pdb.

One thread at a time sends requests to a worker (a lock sees to it: the scheduler's threads and
the pytest thread share the workers, :mod:`pytest_attnkit.controller.scheduler`); ``close`` may
come from another thread while a request is in flight, and then kills the worker, whose request
raises a ``WorkerFailure`` of kind "closed". A request is a :class:`~pytest_attnkit.messages.Request`
and its answer a :class:`~pytest_attnkit.messages.Reply`, which says how long the worker spent on
the request and how much of that was compiling (``Reply.spent``); a ``HARNESS_ERROR`` reply (the
harness failed in the worker) raises a ``WorkerFailure`` of kind "error". The worker's start-up
time is kept (``startup_s``): :mod:`pytest_attnkit.controller.ledger` adds them up.

A request's deadline counts the time the worker spends running it, not compiling: the worker
publishes its compile clock (:mod:`pytest_attnkit.worker.compile_clock`) in a file the pytest
process reads while it waits, and the seconds spent compiling move the deadline on. Compiling has
a deadline of its own, :data:`COMPILE_DEADLINE_FACTOR` times the request's, so that a compiler
that hangs still ends. A compilation takes longer beside other work (``--attnkit-jobs``: other
workers compile on the same cores, and TorchInductor compiles in the worker itself rather than
in a pool of processes), and a verdict must not depend on what ran beside it.

A worker's interpreter may have been started ahead, as a spare (:class:`Spares`): it imports torch
while it waits, and the worker whose environment is the spare's takes it and sends its INIT.

Whatever ends a worker ends what it started (:mod:`pytest_attnkit.descendants`): a live worker
that is killed has its process tree frozen and killed with it, and once a worker has ended, its
process group and every process that carries its mark in the environment are killed.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pytest_attnkit import descendants
from pytest_attnkit.controller.worker_log import HEAD_BYTES, WorkerLog, excerpt
from pytest_attnkit.messages import PRELOAD, Op, Reply, Request, Status
from pytest_attnkit.worker.compile_clock import read_published

#: A request's compiling may take this many times its deadline (see the module docstring).
COMPILE_DEADLINE_FACTOR = 4.0
#: How often the deadline is looked at again while a request runs (the compiling moves it on).
DEADLINE_POLL_S = 0.5

LOG_TAIL_CHARS = 4000
#: Every worker process this pytest process started (see :func:`worker_pids`).
_STARTED: set[int] = set()


def worker_pids() -> set[int]:
    """The pids of every worker process this pytest process started, live or ended: a GPU's list
    of the processes on it leaves these out as this run's own (the speed check)."""
    return set(_STARTED)


class Worker(Protocol):
    """What the pool and the scheduler ask of a worker: a process's or the in-process one."""

    startup_s: float

    def request(self, request: Request, timeout: float) -> Reply: ...

    @property
    def alive(self) -> bool:
        """Whether its process runs now: a stopped one starts again at its next request, without
        the kernels it had loaded."""
        ...

    def stop(self) -> bool: ...

    def close(self) -> None: ...


class WorkerFailure(Exception):
    """The worker died, missed its deadline, or failed to start; the message says which."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "is still running"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name}"
    return f"exited with code {returncode}"


@dataclass(frozen=True)
class Launch:
    """How to start a worker under a launcher (compute-sanitizer) for one request: the pool starts
    one per request (:meth:`pytest_attnkit.controller.pool.WorkerPool.lease`) and closes it once it
    has answered, before the reply is handed on (the tool writes its summary as the worker exits);
    at most ``at_once`` of them run at a time."""

    command: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict, hash=False)
    label: str = "launched"
    shutdown_timeout: float = 10.0
    at_once: int = 1


@dataclass
class Spawned:
    """A worker's process just started (:func:`spawn`), before its INIT: the process, its end of
    the socket, its log (and the log's path), the mark its processes carry and the file of its
    compile clock."""

    process: subprocess.Popen[bytes]
    socket: socket.socket
    log: WorkerLog
    mark: str
    clock: Path


def spawn(name: str, env: dict[str, str], log_dir: Path, launcher: list[str] | None = None, *,
          preload: bool = False) -> Spawned:
    """Start a worker interpreter (under ``launcher`` when given) with ``env`` over this process's
    environment, logging to ``log_dir/name.log``; ``preload``: it imports torch before it reads
    its first request (a spare's, :class:`Spares`)."""
    parent_socket, child_socket = socket.socketpair()
    mark = uuid.uuid4().hex  # the mark this worker's processes carry, so that none outlives it (descendants.py)
    clock = log_dir / f"{name}.clock"
    full = dict(os.environ)
    full.update(PYTHONUNBUFFERED="1", PYTHONFAULTHANDLER="1", **env, **{descendants.MARK: mark},
                ATTNKIT_COMPILE_CLOCK=str(clock), **({PRELOAD: "torch"} if preload else {}))
    log = WorkerLog(log_dir / f"{name}.log")  # capped: its start and its end (controller/worker_log.py)
    try:
        process = subprocess.Popen(
            [*(launcher or []), sys.executable, "-m", "pytest_attnkit.worker", "--fd", str(child_socket.fileno())],
            pass_fds=(child_socket.fileno(),),
            stdin=subprocess.DEVNULL,
            stdout=log.writer(),
            stderr=subprocess.STDOUT,
            env=full,
            start_new_session=True,  # so a deadline kill reaches the worker's own children too
        )
    except BaseException:
        parent_socket.close()
        raise
    finally:
        log.started()
        child_socket.close()
    _STARTED.add(process.pid)
    return Spawned(process, parent_socket, log, mark, clock)


class Spares:
    """Worker interpreters started ahead, each importing torch while it waits to be given an
    implementation (its INIT): a worker whose environment is a spare's takes that spare instead of
    starting an interpreter of its own. The scheduler's extra workers start in the first second
    of the run's requests, a dozen at once, and each start is mostly ``import torch``: 5-6 s on
    session 12's H100 hosts, time in which the run's first requests waited
    (results/2026-11-27-session12). Spares started while the session probes the device and the
    implementations' first workers load are ready by then. Thread-safe."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self._lock = threading.Lock()
        self._waiting: list[tuple[dict[str, str], Spawned]] = []
        self._count = 0
        self.closed = False

    def add(self, env: dict[str, str], count: int) -> None:
        """Start ``count`` spares with ``env`` (the environment their workers will have)."""
        for _ in range(count):
            with self._lock:
                if self.closed:
                    return
                self._count += 1
                name = f"spare.{self._count}"
            spawned = spawn(name, env, self.log_dir, preload=True)
            with self._lock:
                if not self.closed:
                    self._waiting.append((dict(env), spawned))
                    continue
            _end(spawned)

    def take(self, env: dict[str, str]) -> Spawned | None:
        """A waiting spare started with exactly ``env``, or None (a spare that died is ended)."""
        while True:
            with self._lock:
                index = next((i for i, (their, _) in enumerate(self._waiting) if their == env), None)
                if index is None:
                    return None
                _, spawned = self._waiting.pop(index)
            if spawned.process.poll() is None:
                return spawned
            _end(spawned)

    @property
    def waiting(self) -> int:
        with self._lock:
            return len(self._waiting)

    def close(self) -> None:
        """End every spare not taken; none is started from now on."""
        with self._lock:
            self.closed = True
            waiting, self._waiting = self._waiting, []
        for _, spawned in waiting:
            _end(spawned)


def _end(spawned: Spawned) -> None:
    """End a spare that no worker took: it runs no request, so it is killed with what it started."""
    end_process(spawned.process, spawned.mark)
    spawned.socket.close()


def end_process(process: subprocess.Popen[bytes], mark: str) -> None:
    """Kill a worker's process, its tree and its group, and every process carrying its mark."""
    if process.poll() is None:
        descendants.kill_tree(process.pid, include_root=True)
    try:  # also after the worker exited: what it started in its group may still run
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if process.poll() is None:
        process.kill()
    process.wait()
    descendants.kill_marked(mark)


class WorkerProcess:
    """A worker interpreter for one implementation (or for the environment probe)."""

    def __init__(self, label: str, init: dict[str, Any], log_dir: Path, *, env: dict[str, str] | None = None,
                 startup_timeout: float = 180.0, launcher: list[str] | None = None,
                 shutdown_timeout: float = 10.0, spares: Spares | None = None) -> None:
        self.label = label
        #: Interpreters started ahead, one of which this worker takes when its environment matches.
        self.spares = spares
        #: A command the worker runs under (compute-sanitizer and its options), or None.
        self.launcher = list(launcher or [])
        #: How long an idle worker may take to exit when asked (a sanitizer writes its report then).
        self.shutdown_timeout = shutdown_timeout
        self.init = init
        self.log_dir = log_dir
        self.env = env or {}
        self.startup_timeout = startup_timeout
        self.process: subprocess.Popen[bytes] | None = None
        self.connection: Any = None
        self.log_path: Path | None = None
        self.log: WorkerLog | None = None
        self.starts = 0
        #: A request was sent and its reply not yet read: the worker is still working on it
        #: (the run was interrupted mid-request, by Ctrl-C or SIGTERM) or it hangs.
        self.busy = False
        #: Seconds spent starting this worker's processes (interpreter, imports, the implementation).
        self.startup_s = 0.0
        self._requests = threading.Lock()  # one request at a time
        self._state = threading.Lock()  # guards process and connection against a concurrent close
        self.closed = False
        self._mark = ""
        #: Where the worker publishes its compile clock (see the module docstring).
        self._clock: Path | None = None

    # -- life cycle -------------------------------------------------------------------------
    def _start(self) -> None:
        from multiprocessing.connection import Connection

        started = time.monotonic()
        self.starts += 1
        taken = self.spares.take(self.env) if self.spares is not None and not self.launcher else None
        spawned = taken or spawn(f"{self.label}.{self.starts}", self.env, self.log_dir, self.launcher)
        self.log_path, self.log, self._mark, self._clock = spawned.log.path, spawned.log, spawned.mark, spawned.clock
        self.process = spawned.process
        self.connection = Connection(spawned.socket.detach())
        self.busy = False
        # The worker sees this process's sys.path, after any entries the implementation needs first
        # (another version's site, for --attnkit-against).
        init = {key: value for key, value in self.init.items() if key != "sys_path_first"}
        sys_path = [*self.init.get("sys_path_first", []), *sys.path]
        try:
            self._exchange(Request(Op.INIT, options={"sys_path": sys_path, **init}), self.startup_timeout, "starting")
        finally:
            self.startup_s += time.monotonic() - started

    def close(self) -> None:
        """Ask an idle worker to exit, and make sure it did; kill a busy one at once. Safe to call
        from any thread, also while another thread waits for this worker's reply (that request
        then raises a ``WorkerFailure`` of kind "closed"); no request starts a worker afterwards.

        A busy worker (the run was interrupted in the middle of its request, or it hangs) would
        answer the shutdown only after the request, if ever: waiting for it turned a SIGTERM
        from a CI timeout into 20 s of waiting per worker."""
        self.closed = True
        if self.busy or not self._requests.acquire(blocking=False):
            self._kill()
            return
        try:
            self._shut_down()
        finally:
            self._requests.release()

    @property
    def alive(self) -> bool:
        process = self.process
        return process is not None and process.poll() is None

    def stop(self) -> bool:
        """End an idle worker's process, handing back everything it held on the device (its CUDA
        context too); the next request starts a fresh one. A busy worker is left alone. Whether a
        process was ended: the pool stops idle workers this way (``WorkerPool.evict``) to give a
        request that ran out of memory the GPU to itself."""
        if self.closed or self.busy or not self._requests.acquire(blocking=False):
            return False
        try:
            running = self.process is not None and self.process.poll() is None
            self._shut_down()
            return running
        finally:
            self._requests.release()

    def _shut_down(self) -> None:
        """Ask the worker to exit, wait for it, and kill what is left (the caller holds the request lock)."""
        try:
            if self.process is not None and self.process.poll() is None:
                self.connection.send_bytes(json.dumps(Request(Op.SHUTDOWN).to_wire()).encode())
                if self.connection.poll(self.shutdown_timeout):
                    self.connection.recv_bytes()
                self.process.wait(timeout=self.shutdown_timeout)
        except (OSError, EOFError, subprocess.TimeoutExpired):
            pass
        finally:
            self._kill()

    def _kill(self) -> None:
        with self._state:
            process, connection = self.process, self.connection
            self.process = None
            self.connection = None
            self.busy = False
        if process is not None:
            end_process(process, self._mark)
        if connection is not None:
            connection.close()

    def log_tail(self) -> str:
        if self.log is None:
            return ""
        return excerpt(self.log.tail(16 * LOG_TAIL_CHARS).decode("utf-8", errors="replace"), LOG_TAIL_CHARS).strip()

    # -- requests ---------------------------------------------------------------------------
    def request(self, request: Request, timeout: float) -> Reply:
        """Send ``request`` and return the worker's reply, or raise :class:`WorkerFailure`."""
        with self._requests:
            if self.closed:
                raise WorkerFailure("closed", f"the worker for {self.label} was closed (the run is ending)")
            if self.process is None or self.process.poll() is not None:
                self._kill()
                self._start()
            return self._exchange(request, timeout, f"running {request.doing!r}")

    def _exchange(self, request: Request, timeout: float, doing: str) -> Reply:
        with self._state:
            process, connection = self.process, self.connection
            closed = process is None or self.closed
            # Set until the reply is read: a KeyboardInterrupt (Ctrl-C, SIGTERM) raised while
            # waiting leaves it set, and close() then kills the worker instead of waiting on it.
            self.busy = not closed
        if closed:  # closed while this thread started the worker: it must not outlive the close
            self._kill()
            raise WorkerFailure("closed", f"the worker for {self.label} was closed (the run is ending)")
        started = time.monotonic()
        compiling = 0.0
        try:
            connection.send_bytes(json.dumps(request.to_wire()).encode())
            ready, compiling = self._wait_for_reply(connection, timeout)
            reply = Reply.from_wire(json.loads(connection.recv_bytes())) if ready else None
        except (EOFError, OSError):
            reply = None
            ready = True
        if reply is not None:
            self.busy = False
        if reply is None:
            if self.closed:
                self._kill()
                raise WorkerFailure("closed", f"the worker for {self.label} (pid {process.pid}) was closed while "
                                              f"{doing} (the run is ending)")
            self._fail(process, doing, timed_out=not ready, timeout=timeout, elapsed=time.monotonic() - started,
                       compiling=compiling)
        if reply.restart:
            # The worker lost its CUDA context and is exiting; wait for it, so the next request
            # starts a fresh one instead of writing into a closing socket.
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
            self._kill()
        if reply.status is Status.HARNESS_ERROR:
            raise WorkerFailure("error", f"the worker for {self.label} (pid {process.pid}) raised while {doing}:\n"
                                         f"{reply.message}")
        return reply

    def _compiled(self) -> float:
        """Seconds the worker has spent compiling, by its published clock (0 where it has none)."""
        return read_published(str(self._clock)) if self._clock is not None else 0.0

    def _wait_for_reply(self, connection: Any, timeout: float) -> tuple[bool, float]:
        """Wait for the reply until the request has run ``timeout`` seconds, not counting its
        compiling, or compiled :data:`COMPILE_DEADLINE_FACTOR` times as long: (whether it came,
        the seconds it compiled meanwhile)."""
        started, compiled_before = time.monotonic(), self._compiled()
        while True:
            compiling = max(0.0, self._compiled() - compiled_before)
            running = time.monotonic() - started - compiling
            left = min(timeout - running, COMPILE_DEADLINE_FACTOR * timeout - compiling)
            if left <= 0:
                return False, compiling
            if connection.poll(min(left, DEADLINE_POLL_S)):
                return True, compiling

    def _fail(self, process: subprocess.Popen[bytes], doing: str, *, timed_out: bool, timeout: float,
              elapsed: float, compiling: float = 0.0) -> None:
        pid = process.pid
        if timed_out:
            # Ask faulthandler where the worker is stuck before killing it.
            try:
                os.kill(pid, signal.SIGUSR1)
                time.sleep(0.5)
            except (ProcessLookupError, AttributeError):
                pass
            self._kill()
            kind = "timeout"
            limit = COMPILE_DEADLINE_FACTOR * timeout
            if compiling >= limit:
                what = (f"the worker for {self.label} (pid {pid}) compiled for more than {limit:g} s "
                        f"({COMPILE_DEADLINE_FACTOR:g} x its deadline of {timeout:g} s) while {doing} and was killed")
            else:
                what = (f"the worker for {self.label} (pid {pid}) passed its deadline of {timeout:g} s while {doing} "
                        "and was killed" + (f" (it also compiled for {compiling:.1f} s, which the deadline does not "
                                            "count)" if compiling >= 0.1 else ""))
        else:
            try:
                returncode = process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                returncode = None
            self._kill()
            kind = "crashed"
            what = f"the worker for {self.label} (pid {pid}) died while {doing}: it {describe_exit(returncode)} after {elapsed:.1f} s"
        tail = self.log_tail()
        cut = (f"; {self.log.cut} bytes of output were cut from its middle, the first and last {HEAD_BYTES // 1024} KiB "
               "are kept" if self.log is not None and self.log.cut else "")
        detail = f"\n--- last lines of its log ({self.log_path}{cut}) ---\n{tail}" if tail else " (its log is empty)"
        raise WorkerFailure(kind, what + "; a fresh worker takes over for the next test" + detail)


class InProcessWorker:
    """The same handler, in the pytest process: no isolation, no deadline; for debugging."""

    def __init__(self, label: str, init: dict[str, Any], env: dict[str, str] | None = None) -> None:
        from pytest_attnkit.worker.server import Handler

        self.label = label
        self.startup_s = 0.0
        for key, value in (env or {}).items():
            os.environ.setdefault(key, value)
        self.handler = Handler()
        self.handler.handle(Request(Op.INIT, options={"sys_path": [], **init}))

    def request(self, request: Request, timeout: float) -> Reply:
        """The handler's reply; what the harness raises propagates, on the test's own thread (pdb).
        The reply's ``spent`` is left unmeasured: the pool counts the time it waited."""
        return self.handler.handle(request)

    alive = True  # the pytest process itself

    def stop(self) -> bool:
        return False  # the pytest process itself: nothing to end

    def close(self) -> None:
        pass

    def log_tail(self) -> str:
        return ""


def close_all(workers: list[Any]) -> None:
    """Close workers side by side: each takes a second or two to tear down its CUDA context, and
    twenty of them one after another kept an interrupted run waiting half a minute."""
    from concurrent.futures import ThreadPoolExecutor

    if len(workers) <= 1:
        for worker in workers:
            worker.close()
        return
    with ThreadPoolExecutor(max_workers=len(workers)) as threads:
        list(threads.map(lambda worker: worker.close(), workers))
