"""What the pytest process knows about each implementation: :class:`ImplInfo` and its :class:`ImplStatus`.

The pool (:mod:`pytest_attnkit.controller.pool`) fills these in from what each worker said about
its implementation; the session, the speed check and the report read them. They live apart from
the pool so that a module can read an implementation's state without importing the pool and its
worker processes. Nothing of the package is imported here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class ImplStatus(str, Enum):
    """Whether an implementation can be tested here; its value is what the report writes."""

    __str__ = str.__str__  # f"{status}" and str(status) give the value, as the plain strings did

    AVAILABLE = "available"
    UNAVAILABLE = "unavailable"  # it cannot run on this machine (its unavailable_reason)
    BROKEN = "broken"  # it could not be loaded


@dataclass(frozen=True)
class ImplInfo:
    """What the pytest process knows about one implementation, as its worker described it."""

    name: str
    entry_point: str
    distribution: str | None = None
    load_error: str | None = None
    unavailable: str | None = None
    capabilities: dict[str, Any] = field(default_factory=dict)
    #: The implementation's line on which code path runs on this machine (``path_note``), or None.
    path_note: str | None = None

    @property
    def status(self) -> ImplStatus:
        if self.load_error:
            return ImplStatus.BROKEN
        if self.unavailable:
            return ImplStatus.UNAVAILABLE
        return ImplStatus.AVAILABLE

    @property
    def origin(self) -> str:
        return self.entry_point + (f" from {self.distribution}" if self.distribution else "")
