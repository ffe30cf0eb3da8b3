"""Each collected test of a suite as a :class:`~pytest_attnkit.controller.suite.SuiteItem`, worked
out once at collection and kept in the item's stash (:data:`ITEM_KEY`).

Which suite a test belongs to is its ``attnkit_<suite>`` marker; which of the suite's tests it is,
its function's name (:attr:`Suite.tests`); the implementation, the case and the compute-sanitizer
tool, its parametrization. Everything after collection (the refusals, the requests sent ahead, the
runner, the record) reads the stash, not the markers.
"""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from pytest_attnkit.controller.suite import Suite, SuiteItem

ITEM_KEY = pytest.StashKey[SuiteItem]()


def suite_item(node: pytest.Item, suites: Mapping[str, type[Suite]]) -> SuiteItem | None:
    """What ``node`` is as a test of one of ``suites`` (by name), or None for any other test."""
    params = getattr(getattr(node, "callspec", None), "params", {})
    if "attnkit_impl" not in params:
        return None
    name = next((name for name in suites if node.get_closest_marker(f"attnkit_{name}") is not None), None)
    spec = suites[name].spec(getattr(node, "originalname", node.name)) if name is not None else None
    if spec is None:
        return None
    return SuiteItem(name, spec, params["attnkit_impl"], params.get("attnkit_case"), params.get("attnkit_tool"))


def mark_items(nodes: list[pytest.Item], suites: Mapping[str, type[Suite]]) -> list[tuple[pytest.Item, SuiteItem]]:
    """Stash each suite test's :class:`SuiteItem` (:data:`ITEM_KEY`); the (node, item) pairs."""
    marked = []
    for node in nodes:
        item = node.stash.get(ITEM_KEY, None) or suite_item(node, suites)
        if item is not None:
            node.stash[ITEM_KEY] = item
            marked.append((node, item))
    return marked
