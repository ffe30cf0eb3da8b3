"""The worker side of a suite: a :class:`SuiteHandler` answers the suite's requests
(:attr:`~pytest_attnkit.messages.Op.RUN` with :attr:`~pytest_attnkit.messages.Request.suite` its
name) in a worker process, given a :class:`WorkerContext`.

A suite names its handler as ``"package.module:Class"`` (``Suite.handler``); the pytest process
passes the names of the run's suites to each worker when it starts it, and the worker imports and
instantiates each handler once (:mod:`pytest_attnkit.worker.handlers`), before it loads the
implementation. A handler only measures: the worker has already refused what cannot run (an
implementation that failed to load or is unavailable, a case it does not support), and it turns
what the handler raises into the reply the suite judges: a breach of the contract
(:class:`~pytest_attnkit.worker.calls.ContractViolation`) is WRONG, anything else the
implementation raised is RAISED with its own frames, or OUT_OF_MEMORY. A handler module is imported
in every worker of a run, so it imports torch (and anything heavy) inside :meth:`SuiteHandler.handle`,
not at the top.

A minimal handler::

    class Bounds(SuiteHandler):
        def handle(self, context: WorkerContext, request: Request) -> Reply:
            inputs = context.inputs(request.case, request.seed)
            out = context.call(request.case, inputs)
            ...
            return Reply(Status.OK, data={"worst_excess": excess})
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pytest_attnkit.contract import AttentionImpl, Case
from pytest_attnkit.messages import Reply, Request

if TYPE_CHECKING:
    from pytest_attnkit.worker.inputs import Inputs


@dataclass
class WorkerContext:
    """What a handler gets with every request: the device and the loaded implementation, and the
    harness's own way to make a case's inputs and call the implementation on them."""

    device: str
    impl: AttentionImpl
    #: This is the process's first request in its direction (forward or backward): its first call
    #: also pays what a process pays once (a module compiled, a library's start).
    process_first: bool = False

    def inputs(self, case: Case, seed: int) -> "Inputs":
        """q, k, v (and the output gradient, the variant tensors) of ``case`` on the device, drawn
        from ``seed``: the same inputs every suite draws for that case and seed."""
        from pytest_attnkit.worker.inputs import make_inputs

        return make_inputs(case, self.device, seed)

    def call(self, case: Case, inputs: "Inputs", *, backward: bool = False) -> Any:
        """One call of the implementation on ``inputs``, as the contract says it is called, held to
        the contract (the output's shape, dtype and device, the inputs left unchanged): what it
        returned. With ``backward`` the call runs with q, k and v requiring grad and what it
        returned stays attached to autograd. A breach raises ContractViolation, which the worker
        turns into a WRONG reply in the contract's words."""
        import torch

        from pytest_attnkit.worker.calls import checked_call

        q, k, v = (t.detach().requires_grad_(backward) for t in (inputs.q, inputs.k, inputs.v))
        with torch.set_grad_enabled(backward):
            return checked_call(self.impl, case, q, k, v, inputs, backward=backward)


class SuiteHandler:
    """Answers one suite's requests in a worker process: one instance per worker and suite, so it
    may keep state between requests (the speed suite keeps a warm call for A/B blocks)."""

    def handle(self, context: WorkerContext, request: Request) -> Reply:
        """The reply to one of the suite's requests (``request.case`` is set and supported)."""
        raise NotImplementedError

    def forget(self) -> None:
        """Drop what it keeps: another suite's request (or a core op) comes next, and what this
        handler holds must not weigh on it."""
