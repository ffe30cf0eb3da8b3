"""The suites' handlers in one worker process, by suite name.

The pytest process names them in the worker's init request (``{"correctness":
"pytest_attnkit.worker.suites.correctness:CorrectnessHandler", ...}``: each selected suite's
``Suite.handler``); the worker never reads entry points. :class:`Handlers` imports and
instantiates each one at init, before the implementation is loaded, so that a
``--attnkit-against`` counterpart (whose other version's site comes first on ``sys.path``) still runs this
version's handlers.

A handler that cannot be imported, or is not a
:class:`~pytest_attnkit.worker.suite.SuiteHandler`, breaks its suite only: the worker and the
implementation stay usable for the other suites, and each request of that suite fails with the
error (:meth:`Handlers.get` raises :class:`HandlerError`, which the worker answers as a harness
error).
"""

from __future__ import annotations

import importlib
import traceback
from collections.abc import Iterator, Mapping

from pytest_attnkit.worker.suite import SuiteHandler


class HandlerError(LookupError):
    """A suite's request that no handler of this worker can answer."""


class Handlers:
    """The handler of each suite named at init, imported and instantiated once."""

    def __init__(self, paths: Mapping[str, str] | None = None) -> None:
        self.paths = dict(paths or {})
        self._handlers: dict[str, SuiteHandler] = {}
        #: Per suite whose handler could not be made: why, in words with the traceback.
        self._errors: dict[str, str] = {}
        for suite, path in self.paths.items():
            try:
                self._handlers[suite] = load_handler(path)
            except Exception:
                self._errors[suite] = (f"the {suite} suite's worker handler {path} could not be made:\n"
                                       + traceback.format_exc())

    def get(self, suite: str | None) -> SuiteHandler:
        """The handler of ``suite``; raises :class:`HandlerError` when there is none."""
        if suite in self._errors:
            raise HandlerError(self._errors[suite])
        handler = self._handlers.get(suite or "")
        if handler is None:
            known = ", ".join(sorted(self.paths)) or "none"
            raise HandlerError(f"this worker has no handler for the suite {suite!r} (its init named: {known})")
        return handler

    def items(self) -> Iterator[tuple[str, SuiteHandler]]:
        return iter(self._handlers.items())


def load_handler(path: str) -> SuiteHandler:
    """Import ``"package.module:Attr"`` and make the handler: ``Attr`` is a SuiteHandler subclass
    (instantiated with no arguments) or an instance of one."""
    module_name, sep, attribute = path.partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(f"{path!r} is not 'package.module:Class'")
    target: object = importlib.import_module(module_name)
    for part in attribute.split("."):
        target = getattr(target, part)
    if isinstance(target, type) and issubclass(target, SuiteHandler):
        return target()
    if isinstance(target, SuiteHandler):
        return target
    raise TypeError(f"{path} is {target!r}, not a pytest_attnkit.worker.suite.SuiteHandler subclass")
