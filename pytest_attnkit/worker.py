"""The worker process: where implementations are imported and kernels run.

The pytest process never touches CUDA. It starts one worker per implementation as a fresh
interpreter (``python -m pytest_attnkit.worker``, never a fork), talks to it over a socket with
JSON messages, and enforces deadlines (see :mod:`pytest_attnkit.supervisor`). The worker's
stdout and stderr go to a log file whose tail the parent shows when the worker dies; with
faulthandler on, a segfault leaves a Python traceback there, and SIGUSR1 (sent before a deadline
kill) dumps where every thread was.

Messages travel as JSON, both ways: a reply can never carry an object whose unpickling would
import torch into the pytest process. Messages are dicts with an ``op``: ``init`` (sys.path, device and which implementation to load),
``describe``, ``environment``, ``support``, ``correctness``, ``memory``, ``speed``, ``ceilings`` and ``shutdown``. Replies are
``{"ok": True, "result": ...}`` or ``{"ok": False, "error": traceback}``.
"""

from __future__ import annotations

import argparse
import faulthandler
import importlib.metadata
import json
import os
import platform
import signal
import sys
import traceback
from typing import Any

from pytest_attnkit.contract import AttentionImpl, Case


def _distribution_version(*names: str) -> str | None:
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def describe_environment(device: str) -> dict[str, Any]:
    """Versions and the device ("cpu", "cuda" or "auto": the GPU when there is one), as the header
    and the baselines record them."""
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": _distribution_version("torch"),
        "triton": _distribution_version("triton"),
        "cupy": _distribution_version("cupy-cuda13x", "cupy-cuda12x", "cupy-cuda11x", "cupy"),
        "numpy": _distribution_version("numpy"),
        "cuda_available": False,
        "device": device,
        "device_name": platform.processor() or platform.machine(),
    }
    try:
        import torch
    except ImportError as error:
        info["torch_error"] = str(error)
        return info
    info["torch"] = str(torch.__version__)
    if torch.cuda.is_available():
        info["cuda_available"] = True
        info["cuda_runtime"] = torch.version.cuda
        info["cuda_device_count"] = torch.cuda.device_count()
        if device in ("cuda", "auto"):
            properties = torch.cuda.get_device_properties(torch.cuda.current_device())
            info["device_name"] = properties.name
            info["compute_capability"] = f"{properties.major}.{properties.minor}"
            info["device_memory_bytes"] = properties.total_memory
            info["multiprocessors"] = properties.multi_processor_count
    return info


CONTEXT_LOST = ("the worker's CUDA context is unusable after this error (a sticky error such as an illegal "
                "memory access); a fresh worker takes over for the next test")


class Handler:
    """Serves one implementation (or none, for the environment probe) inside a worker."""

    def __init__(self) -> None:
        self.device = "cpu"
        self.impl: AttentionImpl | None = None
        self.load_error: str | None = None
        self.context_lost = False

    def handle(self, message: dict[str, Any]) -> Any:
        op = message["op"]
        handler = getattr(self, f"op_{op}", None)
        if handler is None:
            raise ValueError(f"unknown worker op {op!r}")
        try:
            result = handler(message)
        except BaseException:
            self._check_cuda_context()
            raise
        if isinstance(result, dict) and result.get("status") == "error":
            self._check_cuda_context()
            if self.context_lost:
                result["message"] += f"\n{CONTEXT_LOST}"
        return result

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
                self.impl = load_implementation(message["name"], message["value"])
            except BaseException:  # an import that fails in any way breaks only this implementation
                self.load_error = traceback.format_exc()
        return {"pid": os.getpid()}

    def op_environment(self, message: dict[str, Any]) -> dict[str, Any]:
        return describe_environment(self.device)

    def op_describe(self, message: dict[str, Any]) -> dict[str, Any]:
        if self.load_error is not None or self.impl is None:
            return {"load_error": self.load_error or "no implementation loaded"}
        try:
            unavailable = self.impl.unavailable_reason(self.device)
        except Exception:
            unavailable = "its availability check raised:\n" + traceback.format_exc()
        return {"unavailable": unavailable, "capabilities": self.impl.capabilities(), "type": type(self.impl).__qualname__}

    def _refusal(self, case: Case, backward: bool) -> dict[str, Any] | None:
        """A reply that ends the request before running anything, or None to go on."""
        if self.load_error is not None or self.impl is None:
            return {"status": "broken", "message": self.load_error or "no implementation loaded"}
        unavailable = self.impl.unavailable_reason(self.device)
        if unavailable:
            return {"status": "unavailable", "message": unavailable}
        reasons = self.impl.not_supported_reasons(case, self.device, backward=backward)
        if reasons:
            return {"status": "unsupported", "message": "; ".join(reasons)}
        return None

    def _accept(self, message: dict[str, Any], backward: bool) -> tuple[Case, dict[str, Any] | None]:
        """The request's case, and the refusal that ends the request (None to go on)."""
        case = Case.from_dict(message["case"])
        return case, self._refusal(case, backward)

    def op_support(self, message: dict[str, Any]) -> list[str | None]:
        """For each ``{"case", "backward"}`` query: why it is refused, or None when supported."""
        refusals = []
        for query in message["queries"]:
            refusal = self._refusal(Case.from_dict(query["case"]), bool(query["backward"]))
            refusals.append(None if refusal is None or refusal["status"] == "broken" else refusal["message"])
        return refusals

    def op_correctness(self, message: dict[str, Any]) -> dict[str, Any]:
        from pytest_attnkit.correctness import run_correctness

        backward = bool(message["backward"])
        case, refusal = self._accept(message, backward)
        if refusal is not None:
            return refusal
        assert self.impl is not None
        return run_correctness(
            self.impl, case, device=self.device, base_seed=message["base_seed"],
            trials=message["trials"], backward=backward,
        )

    def op_memory(self, message: dict[str, Any]) -> dict[str, Any]:
        from pytest_attnkit.memory import measure_point, release_device_memory

        backward = bool(message["backward"])
        case, refusal = self._accept(message, backward)
        if refusal is not None:
            return refusal
        assert self.impl is not None
        point = measure_point(self.impl, case, backward=backward, seed=message["seed"])
        release_device_memory()
        return {"status": "measured", "point": point.to_dict()}

    def op_speed(self, message: dict[str, Any]) -> dict[str, Any]:
        from pytest_attnkit.speed import gpu_state, measure_speed

        mode = message["mode"]
        case, refusal = self._accept(message, mode == "backward")
        if refusal is not None:
            return refusal
        assert self.impl is not None
        measurement = measure_speed(self.impl, case, mode, device=self.device, seed=message["seed"],
                                    budget_ms=message["budget_ms"])
        if self.device == "cuda":
            measurement["gpu_state"] = gpu_state()
        return {"status": "measured", "measurement": measurement}

    def op_ceilings(self, message: dict[str, Any]) -> dict[str, Any]:
        from pytest_attnkit.speed import gpu_state, measure_ceilings

        return {"ceilings": measure_ceilings(self.device), "gpu_state": gpu_state() if self.device == "cuda" else {}}


def serve(fd: int) -> None:
    from multiprocessing.connection import Connection

    faulthandler.enable()
    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, all_threads=True)
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
        try:
            reply = {"ok": True, "result": handler.handle(message)}
        except BaseException:
            error = traceback.format_exc()
            reply = {"ok": False, "error": error + (f"\n{CONTEXT_LOST}" if handler.context_lost else "")}
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="pytest-attnkit worker (started by the plugin, not by hand)")
    parser.add_argument("--fd", type=int, required=True, help="socket file descriptor to the pytest process")
    args = parser.parse_args(argv)
    serve(args.fd)


if __name__ == "__main__":
    main()
