"""The two envelopes between the pytest process and a worker, one each way: a :class:`Request` to
the worker and a :class:`Reply` back, for every op.

Both ends are this package, always the same version, so the wire format is whatever
:meth:`Request.to_wire` and :meth:`Reply.to_wire` write: plain JSON (a reply can never carry an
object whose unpickling would import torch into the pytest process). A request names its op
(:class:`Op`); the fields every suite request shares (the case, forward or backward, the seed,
whether to hand cached device memory back) are typed, and what one op alone reads travels in
``options``. A reply says what became of the request (:class:`Status`), with the data measured, the
worker's account of its time (:class:`Spent`) and whether the worker is exiting after it.

Nothing heavy is imported here: both processes read this module, and it imports only
:mod:`pytest_attnkit.contract`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any, Mapping

from pytest_attnkit.contract import Case


#: Set in a worker's environment (to ``torch``), it imports torch before it reads its first
#: request: a spare worker does, while it waits for an implementation
#: (:class:`pytest_attnkit.controller.process.Spares`).
PRELOAD = "ATTNKIT_PRELOAD"


class Op(str, Enum):
    """What a request asks a worker to do: one of the worker's core ops
    (pytest_attnkit/worker/server.py has one handler each), or :attr:`RUN`, a suite's request,
    which the handler of the suite :attr:`Request.suite` names answers
    (:mod:`pytest_attnkit.worker.handlers`)."""

    INIT = "init"  # sys.path, the device, the suites' handlers and which implementation to load
    DESCRIBE = "describe"  # the implementation's availability and capabilities
    ENVIRONMENT = "environment"  # the machine: torch, CUDA, the GPU
    SUPPORT = "support"  # which (case, backward) queries the implementation refuses
    RUN = "run"  # a suite's request: Request.suite names its handler
    WARM = "warm"  # run a case once, for what it compiles (warm-ups, the sanitize suite)
    CEILINGS = "ceilings"  # the machine's compute and bandwidth ceilings
    SHUTDOWN = "shutdown"  # exit after replying


class Status(str, Enum):
    """What became of one request about one implementation."""

    OK = "ok"  # passed, or measured
    WRONG = "wrong"  # a result outside the rule, or a breach of the contract
    RAISED = "raised"  # the implementation raised
    OUT_OF_MEMORY = "out of memory"  # the case did not fit in the device's free memory (worker/out_of_memory.py)
    UNSUPPORTED = "unsupported"  # the implementation declines the case
    UNAVAILABLE = "unavailable"  # the implementation cannot run on this machine
    BROKEN = "broken"  # the implementation could not be loaded
    CRASHED = "crashed"  # the worker process died (set by the pytest process)
    TIMEOUT = "timeout"  # the worker missed its deadline and was killed (set by the pytest process)
    #: The harness itself failed in the worker (the message is its traceback); the pytest process
    #: raises it as a WorkerFailure, which a suite's request turns into CRASHED's wording.
    HARNESS_ERROR = "harness error"


class Isolation(str, Enum):
    """Which worker a suite's request may run in, when requests run ahead of the tests
    (:mod:`pytest_attnkit.controller.scheduler`)."""

    SHARED = "shared"  # any idle worker of the implementation
    #: A worker of its own per (implementation, tag), never lent to other requests, closed once
    #: its last request has run: the torch.compile check resets torch's compile caches, which
    #: must not throw away what a warm-up compiled in a worker shared with other suites.
    DEDICATED = "dedicated"


#: Suites whose requests a failure names in the words of the op they were sent as before the suites
#: had handlers (so a crash in a property check still says "while running 'property'").
_DOING = {"properties": "property", "sanitize": "guard"}


@dataclass(frozen=True)
class Request:
    """The pytest process's envelope to a worker."""

    op: Op
    case: Case | None = None
    backward: bool = False
    seed: int = 0
    #: What this op alone reads (the trials of a correctness check, a speed request's mode and
    #: budget, a property's check, the init's implementation), plain JSON values.
    options: Mapping[str, Any] = field(default_factory=dict)
    #: Hand the device memory torch cached back to the driver after the request (set where
    #: other workers share the GPU).
    release_memory: bool = False
    #: The suite whose handler answers an :attr:`Op.RUN` request (None for the core ops).
    suite: str | None = None
    #: The implementation accepted this (case, backward) when it was asked at collection: the
    #: worker does not ask ``not_supported_reasons`` again (set by the runner).
    checked: bool = False

    @property
    def doing(self) -> str:
        """What the worker is doing, in the words of a failure ("died while running 'correctness'"):
        the op, or for a suite's request its suite; the bundled properties and sanitize suites'
        requests keep the words they were said in before they were suites' requests."""
        if self.op is Op.RUN and self.suite:
            return _DOING.get(self.suite, self.suite)
        return self.op.value

    @property
    def mode(self) -> str:
        """"backward" or "forward": the speed suite's word for :attr:`backward`."""
        return "backward" if self.backward else "forward"

    def option(self, name: str, default: Any = None) -> Any:
        return self.options.get(name, default)

    def with_options(self, **options: Any) -> "Request":
        return replace(self, options={**self.options, **options})

    def to_wire(self) -> dict[str, Any]:
        return {"op": self.op.value, "case": None if self.case is None else self.case.to_dict(),
                "backward": self.backward, "seed": self.seed, "options": dict(self.options),
                "release_memory": self.release_memory, "suite": self.suite, "checked": self.checked}

    @classmethod
    def from_wire(cls, values: Mapping[str, Any]) -> "Request":
        """The request :meth:`to_wire` wrote; an op this version does not know raises ValueError."""
        case = values.get("case")
        return cls(Op(values["op"]), None if case is None else Case.from_dict(case), bool(values.get("backward")),
                   int(values.get("seed") or 0), dict(values.get("options") or {}),
                   bool(values.get("release_memory")), values.get("suite"), bool(values.get("checked")))


@dataclass(frozen=True)
class Spent:
    """The worker's account of one request: its seconds there, and the part of them compiling
    (:mod:`pytest_attnkit.worker.compile_clock`). ``wall_s`` is None where nobody measured (a
    reply the pytest process made up, for a broken implementation): the ledger then counts the
    time it waited."""

    wall_s: float | None = None
    compile_s: float = 0.0

    def to_wire(self) -> dict[str, Any]:
        return {"wall_s": self.wall_s, "compile_s": self.compile_s}

    @classmethod
    def from_wire(cls, values: Mapping[str, Any] | None) -> "Spent":
        values = values or {}
        wall = values.get("wall_s")
        return cls(None if wall is None else float(wall), float(values.get("compile_s") or 0.0))


@dataclass(frozen=True)
class Reply:
    """A worker's envelope back, for every op: its status, its message, the data (a record's
    ``to_dict()``, or what describe, environment, support and ceilings answer)."""

    status: Status
    message: str = ""
    data: dict[str, Any] = field(default_factory=dict)
    spent: Spent = field(default_factory=Spent, compare=False)
    #: The worker's CUDA context is lost: it exits after this reply, and the next request starts a
    #: fresh one.
    restart: bool = False

    @property
    def ok(self) -> bool:
        return self.status is Status.OK

    def to_wire(self) -> dict[str, Any]:
        return {"status": self.status.value, "message": self.message, "data": self.data,
                "spent": self.spent.to_wire(), "restart": self.restart}

    @classmethod
    def from_wire(cls, values: Mapping[str, Any]) -> "Reply":
        return cls(Status(values["status"]), values.get("message", ""), values.get("data") or {},
                   Spent.from_wire(values.get("spent")), bool(values.get("restart")))
