"""The compile clock, as the worker keeps it: seconds this process spent compiling kernels.

Each reply says how long its request took in the worker and how much of that was compilation,
so the run can say where its time went (the pytest side adds it up per suite and
implementation: :mod:`pytest_attnkit.controller.ledger`). Two compilers are timed, each where it
says it starts and ends:

- Triton's JIT: ``JITFunction._do_compile``, which runs once per new specialization of a kernel
  (a disk-cache hit passes through it too, and then takes milliseconds);
- ``torch.compile``: dynamo's compilation callbacks, which fire around every frame it compiles
  and around the lazy compilation of a backward graph (the first backward call).

With ``ATTNKIT_COMPILE_LOG`` set to a folder, every Triton JIT compilation is also written
there, a JSON line each (the kernel, its seconds, its constexprs and specialization), for a
census of what a run compiled (``tools/compile_census.py``).

The pytest process reads the clock while a request runs, so that a request's deadline counts its
running time and not its compiling (:mod:`pytest_attnkit.controller.process`): with
``ATTNKIT_COMPILE_CLOCK`` set to a file, the clock keeps two numbers there, the seconds compiled
so far and when the compilation in progress began (0 when none is), as little-endian doubles
(``time.monotonic``, the same clock in every process of the machine).

Nested compilations (Inductor building Triton kernels inside a dynamo frame) count once. The
hooks are installed when the compiler's module is first imported, through an import hook, so a
worker whose implementation never imports torch._dynamo (an import of almost a second) does not
pay for it. Anything else an implementation compiles (NVRTC through CuPy, a C++ extension) is
not seen and counts as running time.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import mmap
import os
import struct
import sys
import threading
import time
from typing import Any, Callable

#: The published clock (see the module docstring): seconds compiled, and since when compiling now.
PUBLISHED = struct.Struct("<dd")

class CompileClock:
    """Accumulates compile seconds; ``begin``/``end`` may nest and come from several threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._depth = 0
        self._started = 0.0
        self.seconds = 0.0
        self._published: mmap.mmap | None = None

    def publish(self, path: str) -> None:
        """Keep the clock in the file ``path`` from now on, for the pytest process to read."""
        handle = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.ftruncate(handle, PUBLISHED.size)
            self._published = mmap.mmap(handle, PUBLISHED.size)
        finally:
            os.close(handle)
        with self._lock:
            self._publish_seconds()

    def _publish_seconds(self) -> None:
        if self._published is not None:
            self._published[0:8] = struct.pack("<d", self.seconds)

    def _publish_since(self, since: float) -> None:
        # Written after the seconds at an end (and alone at a begin): a reader may count a finished
        # compilation twice for a moment, never miss one.
        if self._published is not None:
            self._published[8:16] = struct.pack("<d", since)

    def begin(self) -> None:
        with self._lock:
            if self._depth == 0:
                self._started = time.perf_counter()
                self._publish_since(time.monotonic())
            self._depth += 1

    def end(self) -> None:
        with self._lock:
            if self._depth == 0:
                return  # an end without its begin (a hook installed in the middle of a compile)
            self._depth -= 1
            if self._depth == 0:
                self.seconds += time.perf_counter() - self._started
                self._publish_seconds()
                self._publish_since(0.0)

    def total(self) -> float:
        """Seconds so far, including a compilation still in progress."""
        with self._lock:
            running = time.perf_counter() - self._started if self._depth else 0.0
            return self.seconds + running


CLOCK = CompileClock()
_installed: set[str] = set()


def _hook_triton(module: Any) -> None:
    jit_function = getattr(module, "JITFunction", None)
    original = getattr(jit_function, "_do_compile", None)
    if original is None or getattr(original, "_attnkit_timed", False):
        return

    def _do_compile(self: Any, *args: Any, **kwargs: Any) -> Any:
        CLOCK.begin()
        started = time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:
            CLOCK.end()
            _log_compile(self, args, time.perf_counter() - started)

    _do_compile._attnkit_timed = True  # type: ignore[attr-defined]
    jit_function._do_compile = _do_compile


def _log_compile(function: Any, args: tuple[Any, ...], seconds: float) -> None:
    """One JSON line in ``$ATTNKIT_COMPILE_LOG/<pid>.jsonl``: what Triton compiled (or took from its cache)."""
    folder = os.environ.get("ATTNKIT_COMPILE_LOG")
    if not folder:
        return
    try:
        # _do_compile(key, signature, device, constexprs, options, attrs, ...)
        constexprs = args[3] if len(args) > 3 else None
        attrs = args[5] if len(args) > 5 else None
        line = {"kernel": getattr(function, "__name__", repr(function)), "seconds": round(seconds, 4),
                "constexprs": repr(constexprs), "specialization": repr(attrs)}
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"{os.getpid()}.jsonl"), "a") as log:
            log.write(json.dumps(line) + "\n")
    except Exception:  # a census must never break a compilation
        pass


def _hook_dynamo(module: Any) -> None:
    try:
        from torch._dynamo.callback import callback_handler
    except ImportError:  # a torch without compilation callbacks: its compile time counts as running
        return
    callback_handler.register_start_callback(lambda *args: CLOCK.begin())
    callback_handler.register_end_callback(lambda *args: CLOCK.end())


_HOOKS: dict[str, Callable[[Any], None]] = {"triton.runtime.jit": _hook_triton, "torch._dynamo": _hook_dynamo}


def _install(name: str) -> None:
    module = sys.modules.get(name)
    if module is not None and name not in _installed:
        _installed.add(name)
        _HOOKS[name](module)


class _Loader(importlib.abc.Loader):
    """Runs the real loader, then installs the module's hook."""

    def __init__(self, loader: Any, name: str) -> None:
        self._loader, self._name = loader, name

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        _install(self._name)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in _HOOKS or fullname in _installed:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _Loader(spec.loader, fullname)
        return spec


def read_published(path: str) -> float:
    """Seconds compiled so far, by the clock a worker publishes at ``path`` (the pytest process
    reads it), the compilation in progress included; 0 when there is none to read."""
    try:
        with open(path, "rb") as stream:
            seconds, since = PUBLISHED.unpack(stream.read(PUBLISHED.size))
    except (OSError, struct.error):
        return 0.0
    return seconds + (max(0.0, time.monotonic() - since) if since else 0.0)


def start() -> None:
    """Time every compilation from now on: hook what is imported, and what will be; publish the
    clock where ``ATTNKIT_COMPILE_CLOCK`` says (a process this one starts does not inherit it)."""
    published = os.environ.pop("ATTNKIT_COMPILE_CLOCK", None)
    if published:
        try:
            CLOCK.publish(published)
        except OSError:  # the deadline then counts compiling as running, as it did
            pass
    for name in _HOOKS:
        _install(name)
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
