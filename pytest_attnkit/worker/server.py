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

Messages are dicts with an ``op``: ``init`` (sys.path, device and which implementation to load),
``describe``, ``environment``, ``support``, ``correctness``, ``memory``, ``speed``, ``warm``,
``guard``, ``property``, ``ceilings`` and ``shutdown``. Replies are ``{"ok": True, "result": ...}``, or ``{"ok": False,
"error": traceback}`` when the harness itself failed, each with ``spent``: the request's seconds
in the worker and the part of them spent compiling (:mod:`pytest_attnkit.worker.compile_clock`).
The suite ops answer with a :class:`~pytest_attnkit.records.Reply`, whose status says what
became of the implementation: a breach of the contract is WRONG, in the words of
:mod:`pytest_attnkit.worker.calls`, in every suite, and what the implementation raised is RAISED
with its own frames (:func:`~pytest_attnkit.worker.calls.kernel_traceback`). JSON both ways: a reply can never carry an object whose
unpickling would import torch into the pytest process.

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
import faulthandler
import json
import os
import signal
import sys
import threading
import time
import traceback
from typing import Any

from pytest_attnkit import descendants
from pytest_attnkit.contract import AttentionImpl, Case
from pytest_attnkit.messages import Reply, Status
from pytest_attnkit.worker import compile_clock
from pytest_attnkit.worker.calls import ContractViolation, kernel_traceback
from pytest_attnkit.worker.out_of_memory import out_of_memory_reply

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
        #: The call an A/B run samples in blocks (see :meth:`op_speed`), kept warm between requests.
        self._warm_key: tuple[Any, ...] | None = None
        self._warm_call: Any = None
        self._warm_sets = 1
        self._warm_syncs: str | None = None

    def handle(self, message: dict[str, Any]) -> Any:
        op = message["op"]
        if not (op == "speed" and message.get("samples")):
            self._warm_key, self._warm_call = None, None  # its inputs must not weigh on other measurements
        handler = getattr(self, f"op_{op}", None)
        if handler is None:
            raise ValueError(f"unknown worker op {op!r}")
        held_before = self._bytes_held() if message.get("release_memory") else None
        try:
            return handler(message)
        except BaseException:
            self._check_cuda_context()
            raise
        finally:
            if message.get("release_memory"):
                self._release_memory(held_before)

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

    def op_init(self, message: dict[str, Any]) -> dict[str, Any]:
        for entry in reversed(message.get("sys_path", [])):
            if entry not in sys.path:
                sys.path.insert(0, entry)
        self.device = message["device"]
        if message.get("name"):
            from pytest_attnkit.registry import load_implementation

            try:
                if message.get("revision_site"):
                    from pytest_attnkit.worker.revision import take_from_revision

                    take_from_revision(message["revision_site"], message["value"])
                self.impl = load_implementation(message["name"], message["value"])
            except BaseException as error:  # an import that fails in any way breaks only this implementation
                self.load_error = kernel_traceback(error)
        return {"pid": os.getpid()}

    def op_environment(self, message: dict[str, Any]) -> dict[str, Any]:
        from pytest_attnkit.worker.environment import describe_environment

        return describe_environment(self.device)

    def op_describe(self, message: dict[str, Any]) -> dict[str, Any]:
        if self.load_error is not None or self.impl is None:
            return {"load_error": self.load_error or "no implementation loaded"}
        try:
            unavailable = self.impl.unavailable_reason(self.device)
        except Exception as error:
            unavailable = "its availability check raised:\n" + kernel_traceback(error)
        try:
            note = None if unavailable else self.impl.path_note(self.device)
        except Exception as error:
            note = f"its path_note() raised {type(error).__name__}: {error}"
        return {"unavailable": unavailable, "capabilities": self.impl.capabilities(), "type": type(self.impl).__qualname__,
                "path_note": None if note is None else str(note)}

    def _refusal(self, case: Case, backward: bool) -> Reply | None:
        """A reply that ends the request before running anything, or None to go on."""
        if self.load_error is not None or self.impl is None:
            return Reply(Status.BROKEN, self.load_error or "no implementation loaded")
        unavailable = self.impl.unavailable_reason(self.device)
        if unavailable:
            return Reply(Status.UNAVAILABLE, unavailable)
        reasons = self.impl.not_supported_reasons(case, self.device, backward=backward)
        if reasons:
            return Reply(Status.UNSUPPORTED, "; ".join(reasons))
        return None

    def op_support(self, message: dict[str, Any]) -> list[str | None]:
        """For each ``{"case", "backward"}`` query: why it is refused, or None when supported."""
        refusals = []
        for query in message["queries"]:
            refusal = self._refusal(Case.from_dict(query["case"]), bool(query["backward"]))
            refusals.append(None if refusal is None or refusal.status is Status.BROKEN else refusal.message)
        return refusals

    def _run(self, message: dict[str, Any], backward: bool, measure: Any) -> dict[str, Any]:
        """Refuse, or run ``measure(impl, case)``; what the implementation raises is a RAISED reply."""
        case = Case.from_dict(message["case"])
        reply = self._refusal(case, backward)
        if reply is None:
            assert self.impl is not None
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
        return reply.to_wire()

    def op_correctness(self, message: dict[str, Any]) -> dict[str, Any]:
        from pytest_attnkit.worker.correctness import run_correctness

        backward = bool(message["backward"])
        return self._run(message, backward, lambda impl, case: run_correctness(
            impl, case, device=self.device, base_seed=message["base_seed"], trials=message["trials"],
            backward=backward, accuracy=message.get("accuracy")))

    def op_memory(self, message: dict[str, Any]) -> dict[str, Any]:
        from pytest_attnkit.worker.memory import measure_point, release_device_memory

        def measure(impl: AttentionImpl, case: Case) -> Reply:
            point = measure_point(impl, case, backward=bool(message["backward"]), seed=message["seed"],
                                  call_limit_ms=message.get("call_limit_ms"))
            release_device_memory()
            return Reply(Status.OK, "", point.to_dict())

        return self._run(message, bool(message["backward"]), measure)

    def op_speed(self, message: dict[str, Any]) -> dict[str, Any]:
        """Time a case; with ``samples``, take only that many samples of a call kept warm between
        requests (an A/B run alternates such blocks between two workers), and say how many samples
        the budget would give in ``planned_samples``."""
        from pytest_attnkit.worker.speed import gpu_processes, gpu_state, measure_speed

        def measure(impl: AttentionImpl, case: Case) -> Reply:
            beside = gpu_processes() if self.device == "cuda" else None  # others on the GPU, before and after
            if message.get("samples"):
                measured = self._speed_block(impl, case, message)
            else:
                measured = measure_speed(impl, case, message["mode"], device=self.device, seed=message["seed"],
                                         budget_ms=message["budget_ms"], call_limit_ms=message.get("call_limit_ms"))
            if self.device == "cuda":
                measured["gpu_state"] = gpu_state()
                measured["gpu_processes"] = gpu_processes(beside)
            return Reply(Status.OK, "", measured)

        return self._run(message, message["mode"] == "backward", measure)

    def _speed_block(self, impl: AttentionImpl, case: Case, message: dict[str, Any]) -> dict[str, Any]:
        from pytest_attnkit.worker.speed import warm_speed

        key = (case.id, json.dumps(case.to_dict(), sort_keys=True), message["mode"], message["seed"])
        if self._warm_key != key:
            self._warm_call = None  # frees the previous case's inputs before making this one's
            self._warm_call, self._warm_sets, self._warm_syncs = warm_speed(
                impl, case, message["mode"], device=self.device, seed=message["seed"])
            self._warm_key = key
        warmed = self._warm_call
        planned = warmed.sample_count(message["budget_ms"])
        timing = warmed.timing(warmed.samples(int(message["samples"])))
        return {"timing": timing.to_dict(), "input_sets": self._warm_sets, "planned_samples": planned,
                "long_call": warmed.long_call, "syncs": self._warm_syncs}

    def op_warm(self, message: dict[str, Any]) -> dict[str, Any]:
        """Run the case once, so that what it compiles is compiled (and in the disk caches)."""
        from pytest_attnkit.worker.calls import warm_call

        backward = bool(message["backward"])

        def measure(impl: AttentionImpl, case: Case) -> Reply:
            warm_call(impl, case, device=self.device, seed=message["seed"], backward=backward)
            if message.get("program") and self.device == "cuda":
                from pytest_attnkit.worker.speed import kernel_program

                try:
                    program = kernel_program(impl, case, "backward" if backward else "forward", seed=message["seed"])
                except Exception as error:  # a profiler that cannot start: the program stays unknown
                    program = None
                    print(f"attnkit: the kernels of {case.id} could not be read: {error!r}", file=sys.stderr)
                return Reply(Status.OK, "", {"program": program})
            return Reply(Status.OK)

        return self._run(message, backward, measure)

    def op_guard(self, message: dict[str, Any]) -> dict[str, Any]:
        """The case on plain inputs, then on guarded copies of them (the sanitize suite's memcheck
        tests, :mod:`pytest_attnkit.worker.guards`)."""
        from pytest_attnkit.worker.guards import check_guarded

        backward = bool(message["backward"])
        return self._run(message, backward, lambda impl, case: check_guarded(
            impl, case, device=self.device, seed=message["seed"], backward=backward))

    def op_property(self, message: dict[str, Any]) -> dict[str, Any]:
        """One property check (:mod:`pytest_attnkit.worker.properties`) of one case."""
        from pytest_attnkit.worker import properties

        check, backward = message["check"], bool(message.get("backward"))

        def measure(impl: AttentionImpl, case: Case) -> Reply:
            seed = message["seed"]
            if check == "determinism":
                directions = impl.deterministic_directions()
                declared = ("backward" if backward else "forward") in directions
                # A backward run's output and LSE are held only where the forward is declared too.
                return properties.check_determinism(impl, case, device=self.device, seed=seed, backward=backward,
                                                    declared=declared, hold_forward="forward" in directions)
            if check == "batch_invariance":
                return properties.check_batch_invariance(impl, case, device=self.device, seed=seed,
                                                         declared=bool(impl.batch_invariant))
            if check == "cuda_graph":
                return properties.check_cuda_graph(impl, case, seed=seed, declared=bool(impl.supports_cuda_graphs),
                                                   accuracy=message.get("accuracy"))
            if check == "torch_compile":
                return properties.check_torch_compile(impl, case, device=self.device, seed=seed,
                                                      declared=bool(impl.supports_torch_compile),
                                                      accuracy=message.get("accuracy"))
            if check == "opcheck":
                return properties.check_opcheck(impl, case, device=self.device, seed=seed, op_name=str(impl.custom_op))
            raise ValueError(f"unknown property check {check!r}")

        return self._run(message, backward, measure)

    def op_ceilings(self, message: dict[str, Any]) -> dict[str, Any]:
        from pytest_attnkit.worker.speed import gpu_state, measure_ceilings

        return {"ceilings": measure_ceilings(self.device), "gpu_state": gpu_state() if self.device == "cuda" else {}}


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
    while True:
        try:
            message = json.loads(connection.recv_bytes())
        except EOFError:
            return  # the pytest process went away
        if message.get("op") == "shutdown":
            connection.send_bytes(json.dumps({"ok": True, "result": None}).encode())
            return
        started, compiled = time.perf_counter(), compile_clock.CLOCK.total()
        try:
            reply = {"ok": True, "result": handler.handle(message)}
        except BaseException:
            error = traceback.format_exc()
            reply = {"ok": False, "error": error + (f"\n{CONTEXT_LOST}" if handler.context_lost else "")}
        reply["spent"] = {"wall_s": time.perf_counter() - started,
                          "compile_s": compile_clock.CLOCK.total() - compiled}
        reply["restart"] = handler.context_lost
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            payload = json.dumps(reply)
        except (TypeError, ValueError) as error:
            payload = json.dumps({"ok": False, "error": f"the worker's reply is not plain data: {error}"})
        connection.send_bytes(payload.encode())
        if handler.context_lost:
            return  # the next request starts a fresh worker with a clean CUDA context
