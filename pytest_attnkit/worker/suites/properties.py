"""The properties suite's worker handler: one property check (``options["check"]``, a
:class:`~pytest_attnkit.properties.Property`'s name) of one case, by the property's checker
(:mod:`pytest_attnkit.worker.properties`), told whether the implementation declares it."""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable

from pytest_attnkit.messages import Reply, Request
from pytest_attnkit.properties import by_name
from pytest_attnkit.worker.suite import SuiteHandler, WorkerContext


def checker(path: str) -> Callable[..., Reply]:
    """The check function at ``"module:function"`` (a :attr:`Property.checker`)."""
    module, _, function = path.partition(":")
    return getattr(importlib.import_module(module), function)


class PropertiesHandler(SuiteHandler):
    def handle(self, context: WorkerContext, request: Request) -> Reply:
        impl, case = context.impl, request.case
        assert case is not None
        check = by_name(request.options["check"])
        capabilities: dict[str, Any] = impl.capabilities()
        reply = checker(check.checker)(impl, case, device=context.device, seed=request.seed,
                                       backward=request.backward,
                                       declared=check.declared(capabilities, request.backward),
                                       accuracy=request.option("accuracy"))
        return dataclasses.replace(reply, data={"check": check.name, **reply.data})
