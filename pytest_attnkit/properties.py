"""The properties suite's checks: each property one class, every one listed once (:data:`PROPERTIES`).

A :class:`Property` says everything both processes need to know about one check: its name (the
request's ``check`` option, the junit property ``attnkit_<name>``, the report's ``check``), its
title in the summary, how a failure names what the implementation declared, which key of
:meth:`~pytest_attnkit.contract.AttentionImpl.capabilities` holds that declaration, the
directions it runs in (a test function each: ``test_<name>``, ``test_<name>_backward``), which
worker it runs in (:class:`~pytest_attnkit.messages.Isolation`), and its checker, the function
that runs it in a worker (``"module:function"``, imported there only). The pytest side
(:mod:`pytest_attnkit.controller.properties`) makes the suite's tests from this list, asks
:meth:`Property.not_applicable` for a skip and words the failures; the worker side
(:mod:`pytest_attnkit.worker.suites.properties`) calls the checker with
:meth:`Property.declared`; the summary (:mod:`pytest_attnkit.controller.table`) shows them in this
order, under their titles.

Light, as :mod:`pytest_attnkit.messages`: both processes import it, and it imports nothing heavy.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from pytest_attnkit.contract import Case
from pytest_attnkit.messages import Isolation


class Property:
    """One property check. A subclass sets the class attributes; :meth:`declared` and
    :meth:`not_applicable` have defaults that fit a yes-or-no declaration that applies everywhere."""

    #: The check's name: the request's ``check`` option, junit ``attnkit_<name>``, the report's ``check``.
    name: ClassVar[str]
    #: Its title in the summary's ``properties`` line.
    title: ClassVar[str]
    #: How a failure names what the implementation declared ("declares <declaration>, and on ...").
    declaration: ClassVar[str]
    #: The key of :meth:`AttentionImpl.capabilities` that holds the declaration.
    capability: ClassVar[str]
    #: The directions it is checked in, a test function each, in this order.
    directions: ClassVar[tuple[str, ...]] = ("forward",)
    #: The worker its requests run in when they run ahead of the tests.
    isolation: ClassVar[Isolation] = Isolation.SHARED
    #: ``"module:function"``: the check, imported in the worker only. It is called as
    #: ``check(impl, case, *, device, seed, backward, declared, accuracy)`` and returns
    #: :func:`pytest_attnkit.worker.properties.result`'s reply.
    checker: ClassVar[str]

    def declared(self, capabilities: Mapping[str, Any], backward: bool) -> bool:
        """Whether the implementation (its ``capabilities()``) declares the property, for ``backward``."""
        return bool(capabilities.get(self.capability))

    def not_applicable(self, impl: str, case: Case, capabilities: Mapping[str, Any], device: str) -> str | None:
        """Why the check does not apply to implementation ``impl`` on ``case`` on ``device`` (the
        test's skip reason), or None."""
        return None

    def test_function(self, direction: str) -> str:
        """The name of its test function for ``direction`` (the node id keeps it)."""
        return f"test_{self.name}" + ("_backward" if direction == "backward" else "")

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class Determinism(Property):
    """The same inputs give the same bits, run after run (forward; backward: the gradients)."""

    name = "determinism"
    title = "deterministic"
    declaration = "deterministic"
    capability = "deterministic"  # the directions declared: ["forward", "backward"], one, or none
    directions = ("forward", "backward")
    checker = "pytest_attnkit.worker.properties:check_determinism"

    def declared(self, capabilities: Mapping[str, Any], backward: bool) -> bool:
        return ("backward" if backward else "forward") in (capabilities.get(self.capability) or ())


class BatchInvariance(Property):
    """A sequence's result does not depend on what else is in the batch."""

    name = "batch_invariance"
    title = "batch-invariant"
    declaration = "batch_invariant = True"
    capability = "batch_invariant"
    checker = "pytest_attnkit.worker.properties:check_batch_invariance"

    def not_applicable(self, impl: str, case: Case, capabilities: Mapping[str, Any], device: str) -> str | None:
        return "a batch of one sequence has no other composition" if case.batch < 2 else None


class CudaGraph(Property):
    """Captured in a CUDA graph and replayed on new inputs, the result is right."""

    name = "cuda_graph"
    title = "CUDA graphs"
    declaration = "supports_cuda_graphs = True"
    capability = "cuda_graphs"
    checker = "pytest_attnkit.worker.properties:check_cuda_graph"

    def not_applicable(self, impl: str, case: Case, capabilities: Mapping[str, Any], device: str) -> str | None:
        return "CUDA graphs need a CUDA device; this run is on the CPU" if device != "cuda" else None


class TorchCompile(Property):
    """Inside ``torch.compile(fullgraph=True)``, no graph break and the result is right. It resets
    torch's compile caches first, so it runs in a worker of its own (DEDICATED)."""

    name = "torch_compile"
    title = "torch.compile"
    declaration = "supports_torch_compile = True"
    capability = "torch_compile"
    isolation = Isolation.DEDICATED
    checker = "pytest_attnkit.worker.properties:check_torch_compile"


class Opcheck(Property):
    """``torch.library.opcheck`` on the custom op the implementation names (``custom_op``)."""

    name = "opcheck"
    title = "opcheck"
    declaration = "custom_op"
    capability = "custom_op"  # the op's name, "namespace::name", or None
    checker = "pytest_attnkit.worker.properties:check_opcheck"

    def not_applicable(self, impl: str, case: Case, capabilities: Mapping[str, Any], device: str) -> str | None:
        if not capabilities.get(self.capability):
            return f"{impl} names no custom op (custom_op), so there is nothing for torch.library.opcheck"
        return None


#: Every property check, in the order of the suite's tests and of the summary.
PROPERTIES: tuple[Property, ...] = (Determinism(), BatchInvariance(), CudaGraph(), TorchCompile(), Opcheck())


def by_name(name: str) -> Property:
    """The property check named ``name``; KeyError for a name no check has."""
    for check in PROPERTIES:
        if check.name == name:
            return check
    raise KeyError(f"no property check is named {name!r} (known: {', '.join(p.name for p in PROPERTIES)})")
