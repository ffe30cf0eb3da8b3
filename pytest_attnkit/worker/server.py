"""The worker process's loop: receive a request, run it against the loaded implementation, reply.

The pytest process starts one worker per implementation as a fresh interpreter
(``python -m pytest_attnkit.worker``, never a fork) and talks to it over a socket with JSON
messages (:mod:`pytest_attnkit.controller.process`). The worker's stdout and stderr go to a log
file whose tail the parent shows when the worker dies; with faulthandler on, a segfault leaves a
Python traceback there, and SIGUSR1 (sent before a deadline kill) dumps where every thread was.
A watchdog thread ends the worker, and everything it started, as soon as the pytest process is
gone, even while an implementation hangs. The worker is a subreaper, so what an implementation
starts stays below it, and it kills all of that before it exits
(:mod:`pytest_attnkit.descendants`).

Each request is a :class:`~pytest_attnkit.messages.Request` (its :class:`~pytest_attnkit.messages.Op`:
``init`` (sys.path, device, the suites' handlers and which implementation to load), ``describe``,
``environment``, ``support``, ``run``, ``warm``, ``ceilings`` and ``shutdown``), dispatched
through :attr:`Handler.ops`. A ``run`` request is a suite's: the handler its init named for
``Request.suite`` answers it (:mod:`pytest_attnkit.worker.handlers`,
:class:`~pytest_attnkit.worker.suite.SuiteHandler`; the bundled suites' are in
:mod:`pytest_attnkit.worker.suites`), after the worker has refused what cannot run. Every op answers one
:class:`~pytest_attnkit.messages.Reply`, with ``spent``: the request's seconds in the worker and
the part of them spent compiling (:mod:`pytest_attnkit.worker.compile_clock`). When the harness
itself fails, the reply is ``HARNESS_ERROR`` with the traceback. For the suite ops the status says
what became of the implementation: a breach of the contract is WRONG, in the words of
:mod:`pytest_attnkit.worker.calls`, in every suite, and what the implementation raised is RAISED
with its own frames (:func:`~pytest_attnkit.worker.calls.kernel_traceback`). JSON both ways: a reply can never carry an
object whose unpickling would import torch into the pytest process.

``warm`` runs one case once (forward, or forward and backward) and keeps nothing but what the
implementation compiled: the scheduler sends it ahead of the memory and speed suites, so their
compilation happens while other work fills the GPU (:mod:`pytest_attnkit.controller.scheduler`).
With ``program`` it also says which kernels a call launches
(:func:`pytest_attnkit.worker.speed.kernel_program`), for the gate.
A request with ``release_memory`` hands the device memory torch cached back to the driver when
it is done, for the other workers that share the GPU.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import faulthandler
import importlib
import json
import os
import signal
import sys
import threading
import time
import traceback
from typing import Any, Callable, Mapping

from pytest_attnkit import descendants
from pytest_attnkit.contract import AttentionImpl, Case
from pytest_attnkit.messages import PRELOAD, Op, Reply, Request, Spent, Status
from pytest_attnkit.worker import compile_clock
from pytest_attnkit.worker.calls import ContractViolation, kernel_traceback
from pytest_attnkit.worker.handlers import Handlers
from pytest_attnkit.worker.out_of_memory import out_of_memory_reply
from pytest_attnkit.worker.suite import WorkerContext

CONTEXT_LOST = ("the worker's CUDA context is unusable after this error (a sticky error such as an illegal "
                "memory access); a fresh worker takes over for the next test")
PARENT_POLL_S = 0.5


class Handler:
    """Serves one implementation (or none, for the environment probe) inside a worker."""

    def __init__(self) -> None:
        self.device = "cpu"
        self.impl: AttentionImpl | None = None
        self.load_error: str | None = None
        self.context_lost = False
        #: The suites' handlers the init request named (:mod:`pytest_attnkit.worker.handlers`).
        self.handlers = Handlers()
        #: A shutdown was asked: the loop exits after replying.
        self.stopping = False
        #: The directions (backward or not) this process has run the implementation in: a warm-up
        #: that is the first of its direction here says so (``process_first``), since its first
        #: call also pays the process's own start (a module compiled once per process, CuPy's).
        self._ran: set[bool] = set()
        self.process_first = False
        #: Each op's handler; a request's op is an :class:`Op`, so it names one of these or none.
        self.ops: dict[Op, Callable[[Request], Reply]] = {
            Op.INIT: self.op_init, Op.DESCRIBE: self.op_describe, Op.ENVIRONMENT: self.op_environment,
            Op.SUPPORT: self.op_support, Op.RUN: self.op_run, Op.WARM: self.op_warm,
            Op.CEILINGS: self.op_ceilings, Op.SHUTDOWN: self.op_shutdown,
        }

    def handle(self, request: Request) -> Reply:
        """Run one request; what the harness raises propagates (in the pytest process, with
        ``--attnkit-inprocess``, it meets the test as it is: pdb stops there)."""
        for suite, suite_handler in self.handlers.items():
            if not (request.op is Op.RUN and request.suite == suite):
                suite_handler.forget()  # what a suite's handler keeps must not weigh on other requests
        handler = self.ops.get(request.op)
        if handler is None:
            raise ValueError(f"unknown worker op {request.op!r}")
        held_before = self._bytes_held() if request.release_memory else None
        try:
            return handler(request)
        except BaseException:
            self._check_cuda_context()
            raise
        finally:
            if request.release_memory:
                self._release_memory(held_before)

    def answer(self, wire: Mapping[str, Any]) -> Reply:
        """The one reply to a request as it came over the wire: what :meth:`handle` answers, or
        ``HARNESS_ERROR`` with the traceback when the harness failed (an op this version does
        not know, too); with the request's time and whether the worker is exiting after it."""
        started, compiled = time.perf_counter(), compile_clock.CLOCK.total()
        try:
            reply = self.handle(Request.from_wire(wire))
        except BaseException:
            error = traceback.format_exc()
            reply = Reply(Status.HARNESS_ERROR, error + (f"\n{CONTEXT_LOST}" if self.context_lost else ""))
        return dataclasses.replace(reply, spent=Spent(time.perf_counter() - started,
                                                      compile_clock.CLOCK.total() - compiled),
                                   restart=self.context_lost)

    def _cuda_ready(self) -> bool:
        if self.device != "cuda" or "torch" not in sys.modules or self.context_lost:
            return False
        import torch

        return torch.cuda.is_initialized()

    def _bytes_held(self) -> int | None:
        """What live tensors hold on the device, or None before CUDA is in use."""
        if not self._cuda_ready():
            return None
        from pytest_attnkit.worker.memory import device_bytes_held

        try:
            return device_bytes_held()
        except Exception:
            return None

    def _release_memory(self, held_before: int | None) -> None:
        """Hand the cached device memory back. The cycle collector runs only where the request left
        more held than it found (tensors kept alive by a reference cycle, an exception's frames):
        in a process that compiled with torch.compile a collection takes a tenth of a second or
        more, once per request."""
        if not self._cuda_ready():
            return
        from pytest_attnkit.worker.memory import release_device_memory

        try:
            held = self._bytes_held()
            release_device_memory(collect=held_before is None or held is None or held > held_before)
        except Exception:  # a context that fails here fails the next request, with its reason
            pass

    def _check_cuda_context(self) -> None:
        """After a failure on CUDA, find out whether the context survived. A sticky error (an
        illegal memory access) poisons it for every later call in this process, so the worker
        then exits after replying and the next request starts a fresh one."""
        if self.device != "cuda" or "torch" not in sys.modules:
            return
        import torch

        try:
            torch.cuda.synchronize()
        except Exception:
            self.context_lost = True

    def op_init(self, request: Request) -> Reply:
        for entry in reversed(request.option("sys_path", [])):
            if entry not in sys.path:
                sys.path.insert(0, entry)
        self.device = request.options["device"]
        # This version's handlers, imported before the implementation (whose other version's site,
        # for a --attnkit-against counterpart, comes first on sys.path from here on).
        self.handlers = Handlers(request.option("handlers"))
        if request.option("name"):
            from pytest_attnkit.registry import DeclarationError, load_implementation

            try:
                if request.option("revision_site"):
                    from pytest_attnkit.worker.revision import take_from_revision

                    take_from_revision(request.options["revision_site"], request.options["value"])
                self.impl = load_implementation(request.options["name"], request.options["value"])
            except DeclarationError as error:  # the harness's own check: no traceback of its frames
                self.load_error = f"{type(error).__name__}: {error}"
            except BaseException as error:  # an import that fails in any way breaks only this implementation
                self.load_error = kernel_traceback(error)
        return Reply(Status.OK, data={"pid": os.getpid()})

    def op_shutdown(self, request: Request) -> Reply:
        self.stopping = True
        return Reply(Status.OK)

    def op_environment(self, request: Request) -> Reply:
        from pytest_attnkit.worker.environment import describe_environment

        # The device the run asked for ("auto" where it did not), which this worker may already know.
        return Reply(Status.OK, data=describe_environment(request.option("device") or self.device))

    def op_describe(self, request: Request) -> Reply:
        if self.load_error is not None or self.impl is None:
            return Reply(Status.OK, data={"load_error": self.load_error or "no implementation loaded"})
        try:
            unavailable = self.impl.unavailable_reason(self.device)
        except Exception as error:
            unavailable = "its availability check raised:\n" + kernel_traceback(error)
        try:
            note = None if unavailable else self.impl.path_note(self.device)
        except Exception as error:
            note = f"its path_note() raised {type(error).__name__}: {error}"
        return Reply(Status.OK, data={"unavailable": unavailable, "capabilities": self.impl.capabilities(),
                                      "type": type(self.impl).__qualname__, "path_note": None if note is None else str(note)})

    def _refusal(self, case: Case, backward: bool, *, checked: bool = False) -> Reply | None:
        """A reply that ends the request before running anything, or None to go on. ``checked``:
        the implementation accepted the case at collection, so it is not asked again."""
        if self.load_error is not None or self.impl is None:
            return Reply(Status.BROKEN, self.load_error or "no implementation loaded")
        unavailable = self.impl.unavailable_reason(self.device)
        if unavailable:
            return Reply(Status.UNAVAILABLE, unavailable)
        reasons = [] if checked else self.impl.not_supported_reasons(case, self.device, backward=backward)
        if reasons:
            return Reply(Status.UNSUPPORTED, "; ".join(reasons))
        return None

    def op_support(self, request: Request) -> Reply:
        """For each ``{"case", "backward"}`` query: why it is refused, or None when supported
        (``data["refusals"]``)."""
        refusals = []
        for query in request.options["queries"]:
            refusal = self._refusal(Case.from_dict(query["case"]), bool(query["backward"]))
            refusals.append(None if refusal is None or refusal.status is Status.BROKEN else refusal.message)
        return Reply(Status.OK, data={"refusals": refusals})

    def _run(self, request: Request, backward: bool, measure: Any) -> Reply:
        """Refuse, or run ``measure(impl, case)``; what the implementation raises is a RAISED reply."""
        case = request.case
        if case is None:
            raise ValueError(f"a {request.doing!r} request names no case")
        reply = self._refusal(case, backward, checked=request.checked)
        if reply is None:
            assert self.impl is not None
            self.process_first = backward not in self._ran
            self._ran.add(backward)
            try:
                reply = measure(self.impl, case)
            except ContractViolation as violation:  # the same words in every suite (worker/calls.py)
                reply = Reply(Status.WRONG, str(violation))
            except Exception as error:
                self._check_cuda_context()
                reply = out_of_memory_reply(error) or Reply(Status.RAISED, kernel_traceback(error))
        if reply.status in (Status.RAISED, Status.WRONG):
            self._check_cuda_context()
            if self.context_lost:
                reply = Reply(reply.status, f"{reply.message}\n{CONTEXT_LOST}", reply.data)
        return reply

    def op_run(self, request: Request) -> Reply:
        """A suite's request, answered by its handler (:class:`~pytest_attnkit.worker.suite.SuiteHandler`),
        once the worker has refused what cannot run."""
        suite_handler = self.handlers.get(request.suite)

        def measure(impl: AttentionImpl, case: Case) -> Reply:
            return suite_handler.handle(WorkerContext(self.device, impl, self.process_first), request)

        return self._run(request, request.backward, measure)

    def op_warm(self, request: Request) -> Reply:
        """Run the case once, so that what it compiles is compiled (and in the disk caches). On
        CUDA, where the request asks (``next_call``: the speed and memory suites' warm-ups), a
        short case runs twice, and the reply says how long each call took
        (``first_call_s``, ``next_call_s``: None where there was no second call): the first's
        excess is what the warm-up spares the case's timing with the GPU alone, compiled or not
        (cuDNN builds a plan per shape in each process: :mod:`pytest_attnkit.controller.scheduling.pruning`).
        ``process_first`` says whether this was the process's first request in its direction,
        whose first call also paid what a process pays once."""
        from pytest_attnkit.worker.calls import warm_call

        backward = request.backward

        def measure(impl: AttentionImpl, case: Case) -> Reply:
            first_s, next_s = warm_call(impl, case, device=self.device, seed=request.seed, backward=backward,
                                        again=self.device == "cuda" and bool(request.option("next_call")))
            calls = {"first_call_s": first_s, "next_call_s": next_s, "process_first": self.process_first}
            if request.option("program") and self.device == "cuda":
                from pytest_attnkit.worker.speed import kernel_program

                try:
                    program = kernel_program(impl, case, "backward" if backward else "forward", seed=request.seed)
                except Exception as error:  # a profiler that cannot start: the program stays unknown
                    program = None
                    print(f"attnkit: the kernels of {case.id} could not be read: {error!r}", file=sys.stderr)
                return Reply(Status.OK, "", {"program": program, **calls})
            return Reply(Status.OK, "", calls)

        return self._run(request, backward, measure)

    def op_ceilings(self, request: Request) -> Reply:
        from pytest_attnkit.worker.speed import gpu_state, measure_ceilings

        return Reply(Status.OK, data={"ceilings": measure_ceilings(self.device),
                                      "gpu_state": gpu_state() if self.device == "cuda" else {}})


def _die_with_parent() -> None:
    """End this worker and its process group once the pytest process is gone (killed with
    SIGKILL, say): an implementation that hangs must not outlive the run."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            threading.Event().wait(PARENT_POLL_S)
            if os.getppid() != parent:
                try:
                    descendants.end_descendants()
                    os.killpg(os.getpgid(0), signal.SIGKILL)
                finally:
                    os._exit(1)

    threading.Thread(target=watch, name="attnkit-parent-watch", daemon=True).start()


def serve(fd: int) -> None:
    from multiprocessing.connection import Connection

    # Whatever this worker starts ends with it: on shutdown, at the end of the socket, after a lost
    # context. Registered first, so it runs after the exit handlers registered later (the libraries'
    # own, which shut their helper processes down politely).
    descendants.become_subreaper()
    atexit.register(descendants.end_descendants)
    faulthandler.enable()
    compile_clock.start()
    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    # SIGINT and SIGTERM are the pytest process's to handle: it closes its workers itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent()
    connection = Connection(fd)
    handler = Handler()
    if os.environ.pop(PRELOAD, None) == "torch":  # a spare: the import is done while it waits for its INIT
        with contextlib.suppress(Exception):  # a torch that fails to import fails again at INIT, reported
            importlib.import_module("torch")
    while True:
        try:
            wire = json.loads(connection.recv_bytes())
        except EOFError:
            return  # the pytest process went away
        reply = handler.answer(wire)
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            payload = json.dumps(reply.to_wire())
        except (TypeError, ValueError) as error:
            payload = json.dumps(Reply(Status.HARNESS_ERROR, f"the worker's reply is not plain data: {error}",
                                       spent=reply.spent, restart=reply.restart).to_wire())
        connection.send_bytes(payload.encode())
        if handler.stopping or handler.context_lost:
            return  # asked to exit; or the next request starts a fresh worker with a clean CUDA context
