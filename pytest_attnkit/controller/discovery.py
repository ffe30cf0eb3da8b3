"""The suites a run can select: the bundled five, and those other distributions register through
the ``attnkit.suites`` entry-point group (:data:`pytest_attnkit.registry.SUITE_GROUP`).

A suite's entry point names its :class:`~pytest_attnkit.controller.suite.Suite` subclass
(``bounds = "attnkit_example_suite.controller:BoundsSuite"``), whose module the pytest process
imports when the suite is selected: only then, and never its worker handler, which the workers
import (:mod:`pytest_attnkit.worker.handlers`). Names are known from the entry-point metadata
alone (:func:`suite_names`), so ``--attnkit-suite`` is checked without importing anything.

pytest-attnkit registers its own five suites in the same group (pyproject.toml), pointing at the
classes below; the session builds those itself, so a checkout whose installed metadata is older
than this code (``pip install -e .`` not re-run) still finds them.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path

import pytest

from pytest_attnkit.controller.correctness import CorrectnessCheck
from pytest_attnkit.controller.memory import MemoryCheck
from pytest_attnkit.controller.properties import PropertyCheck
from pytest_attnkit.controller.sanitize import SanitizeCheck
from pytest_attnkit.controller.speed import SpeedCheck
from pytest_attnkit.controller.suite import Suite
from pytest_attnkit.registry import SUITE_GROUP, EntryPointRef, discover

#: The bundled suites by name, in the order of --attnkit-suite's list.
BUNDLED: dict[str, type[Suite]] = {suite.name: suite for suite in (CorrectnessCheck, MemoryCheck, SpeedCheck,
                                                                    PropertyCheck, SanitizeCheck)}
#: The bundled suites in the order the session builds them (the order of its ``suites``).
BUILD_ORDER: tuple[type[Suite], ...] = (CorrectnessCheck, MemoryCheck, PropertyCheck, SanitizeCheck, SpeedCheck)
#: The distribution that registers the bundled suites.
OWN_DISTRIBUTION = "pytest-attnkit"


def _where(ref: EntryPointRef) -> str:
    return f"the {SUITE_GROUP} entry point {ref.name} = {ref.value} (distribution {ref.distribution or 'unknown'})"


def installed_suites() -> list[EntryPointRef]:
    """The suites other distributions register (a duplicate name kept, with its problem); the
    bundled suites' own entries are left out (the session builds those)."""
    return [ref for ref in discover(SUITE_GROUP)
            if not (ref.name in BUNDLED and ref.distribution == OWN_DISTRIBUTION and ref.problem is None)]


def suite_names() -> list[str]:
    """Every suite a run can select: the bundled ones, then the installed ones by name."""
    return [*BUNDLED, *sorted({ref.name for ref in installed_suites()} - set(BUNDLED))]


def load_suite(ref: EntryPointRef) -> type[Suite]:
    """Import the entry point's target: a :class:`Suite` subclass whose ``name`` is the entry
    point's. Anything else (a name registered twice, an import that fails, another kind of
    object) is a :class:`pytest.UsageError` naming the entry point and its distribution."""
    if ref.problem or ref.name in BUNDLED:
        raise pytest.UsageError(f"attnkit: {_where(ref)}: "
                                + (ref.problem or f"the name {ref.name!r} is a bundled suite's"))
    try:
        target = importlib.metadata.EntryPoint(name=ref.name, value=ref.value, group=SUITE_GROUP).load()
    except Exception as error:
        raise pytest.UsageError(f"attnkit: {_where(ref)} could not be imported: "
                                f"{type(error).__name__}: {error}") from None
    if not (isinstance(target, type) and issubclass(target, Suite)):
        raise pytest.UsageError(f"attnkit: {_where(ref)} names {target!r}, which is not a subclass of "
                                "pytest_attnkit.Suite")
    missing = [attribute for attribute in ("name", "handler", "tests") if not hasattr(target, attribute)]
    if missing:
        raise pytest.UsageError(f"attnkit: {_where(ref)} names {target.__name__}, which does not set "
                                f"{', '.join(missing)} (docs/suites.md)")
    if target.name != ref.name:
        raise pytest.UsageError(f"attnkit: {_where(ref)} names {target.__name__}, whose name is {target.name!r}: "
                                "the entry point's name and the suite's must be the same")
    return target


def load_selected(names: list[str]) -> dict[str, type[Suite]]:
    """The installed suites among ``names``, imported (:func:`load_suite`)."""
    refs = installed_suites()
    selected = {}
    for name in names:
        if name in BUNDLED:
            continue
        found = [ref for ref in refs if ref.name == name]
        for ref in found[1:] + found[:1]:  # a duplicate's problem first
            selected[name] = load_suite(ref)
    return selected


def suite_file(ref: EntryPointRef) -> Path | None:
    """The file of the module an installed suite's class lives in, found without importing that
    module (None where it cannot be found): the path pytest collects the suite's tests from."""
    module = ref.value.partition(":")[0].strip()
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    return Path(spec.origin).resolve() if spec is not None and spec.origin else None
