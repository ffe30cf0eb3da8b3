"""The registry: implementations discovered through the ``attnkit.implementations`` entry points.

The pytest process only reads entry-point metadata (names, targets, distributions); it never
imports an implementation. Loading happens in the implementation's own worker process
(:func:`load_implementation`), so an implementation that fails to import, or crashes while
importing, breaks only itself.
"""

from __future__ import annotations

import difflib
import fnmatch
import importlib.metadata
from dataclasses import dataclass
from typing import Any

from pytest_attnkit.contract import AttentionImpl, FunctionImpl

GROUP = "attnkit.implementations"
#: The entry-point group of suites (pytest_attnkit/controller/discovery.py).
SUITE_GROUP = "attnkit.suites"


@dataclass(frozen=True)
class EntryPointRef:
    """Where an implementation comes from: enough for a worker to load it."""

    name: str
    value: str
    distribution: str | None
    #: Set when the entry point cannot be used at all (a duplicate name).
    problem: str | None = None


def discover(group: str = GROUP) -> list[EntryPointRef]:
    """Every implementation (or, with ``group``, every entry point of that group: the suites)
    registered in the environment, sorted by name.

    Two distributions that register the same name are both kept, the later ones with a problem,
    so the run shows the clash instead of silently picking one.
    """
    refs: dict[str, EntryPointRef] = {}
    extras: list[EntryPointRef] = []
    for entry_point in importlib.metadata.entry_points(group=group):
        dist = getattr(entry_point, "dist", None)
        dist_name = dist.metadata["Name"] if dist is not None else None
        ref = EntryPointRef(entry_point.name, entry_point.value, dist_name)
        if entry_point.name in refs:
            previous = refs[entry_point.name]
            if previous.value == ref.value:
                continue  # the same distribution seen twice on sys.path
            problem = (
                f"the name {entry_point.name!r} is registered twice: by {previous.distribution} "
                f"({previous.value}) and by {dist_name} ({entry_point.value})"
            )
            extras.append(EntryPointRef(entry_point.name, entry_point.value, dist_name, problem))
        else:
            refs[entry_point.name] = ref
    return sorted([*refs.values(), *extras], key=lambda ref: ref.name)


def select(refs: list[EntryPointRef], patterns: list[str]) -> list[EntryPointRef]:
    """The refs whose names match any of the glob ``patterns`` (all refs when there are none).

    Raises ``LookupError`` naming the patterns that match nothing, suggesting the known names close
    to each (difflib: a misspelling, as ``torch_spda``), and listing the known names on a second
    line (``known: ...``).
    """
    if not patterns:
        return list(refs)
    unmatched = [pattern for pattern in patterns if not any(fnmatch.fnmatchcase(ref.name, pattern) for ref in refs)]
    if unmatched:
        names = sorted({ref.name for ref in refs})
        known = ", ".join(names) or "none registered"
        guesses = [f"did you mean {' or '.join(map(repr, close))}"
                   + (f" for {pattern!r}" if len(unmatched) > 1 else "") + "?" for pattern in unmatched
                   if (close := difflib.get_close_matches(pattern, names, n=2, cutoff=0.8))]
        raise LookupError(f"no implementation matches {', '.join(map(repr, unmatched))}"
                          + (f"; {' '.join(guesses)}" if guesses else "") + f"\nknown: {known}")
    return [ref for ref in refs if any(fnmatch.fnmatchcase(ref.name, pattern) for pattern in patterns)]


class DeclarationError(ValueError):
    """An implementation's declarations name a value the harness does not know
    (:meth:`AttentionImpl.declaration_problems`). The message is the whole story: the worker
    reports it without the harness's traceback."""


def load_implementation(name: str, value: str) -> AttentionImpl:
    """Import the entry point's target and turn it into an :class:`AttentionImpl` instance."""
    target: Any = importlib.metadata.EntryPoint(name=name, value=value, group=GROUP).load()
    if isinstance(target, type) and issubclass(target, AttentionImpl):
        impl = target()
    elif isinstance(target, AttentionImpl):
        impl = target
    elif isinstance(target, type):
        raise TypeError(
            f"entry point {name} = {value} names the class {target.__name__}, which does not derive from "
            "pytest_attnkit.AttentionImpl"
        )
    elif callable(target):
        impl = FunctionImpl(target)
    else:
        raise TypeError(
            f"entry point {name} = {value} names a {type(target).__name__}, expected a callable "
            "attn(q, k, v, *, causal=False, scale=None) or an AttentionImpl subclass"
        )
    impl.name = name
    problems = impl.declaration_problems()
    if problems:
        raise DeclarationError(f"entry point {name} = {value} declares what the harness does not know: "
                               + "; ".join(problems))
    return impl
