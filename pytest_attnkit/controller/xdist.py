"""pytest-xdist: which xdist worker this is, which GPU it may use, and which tests it runs.

Under ``-n N`` every xdist worker is a pytest process of its own with its own attnkit session;
each sends its report document to the controller, which merges them, saves the baseline and
writes the summary and the report files for the whole run.
Each pins its implementations' workers to one GPU, round robin over the visible ones, so several
GPUs share the work; the speed suite refuses to time while xdist workers share a GPU.

Each xdist worker runs its own scheduler (:mod:`pytest_attnkit.controller.scheduler`), which
submits the requests of the tests it will run as soon as they are collected. xdist's default
``load`` distribution hands tests out a few at a time as workers finish them, so no worker would
know its tests ahead; under ``--attnkit`` the controller deals them out instead, all at once
(:class:`DealtScheduling`), by a rule each worker applies to its own collection
(:func:`dealt`): every implementation's tests of every suite and test function go round the
workers in turn, so each GPU gets a share of each kind of work. Both sides know the
implementations by name (the controller describes every one before it closes its pool), so a
test's implementation is the known name its parameters start with, not a guess at its case id. Other ``--dist`` modes are left
as they are (and each worker then sends each test's request when the test runs).
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any, Iterable, Sequence


def xdist_worker(config: Any) -> tuple[int, int] | None:
    """(this xdist worker's index, how many there are), or None outside xdist workers."""
    workerinput = getattr(config, "workerinput", None)
    if not workerinput:
        return None
    index = int(str(workerinput.get("workerid", "gw0")).lstrip("gw") or 0)
    return index, int(workerinput.get("workercount", 1))


def is_controller(config: Any) -> bool:
    """Whether this is pytest-xdist's controller: it distributes the tests and runs none."""
    return getattr(config.option, "dist", "no") != "no" and xdist_worker(config) is None


def pinned_gpu(config: Any, cuda_device_count: int) -> str | None:
    """The GPU this xdist worker's implementations run on, or None outside xdist or with one GPU."""
    xdist = xdist_worker(config)
    if xdist is None or cuda_device_count <= 1:
        return None
    visible = [part for part in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if part.strip()]
    ordinals = visible if visible else [str(index) for index in range(cuda_device_count)]
    return ordinals[xdist[0] % len(ordinals)]


def parallel_timing_problem(config: Any, device: str, cuda_device_count: int) -> str | None:
    """Why speed cannot be timed here, or None: xdist workers sharing a GPU measure contention."""
    xdist = xdist_worker(config)
    if xdist is None:
        return None
    gpus = max(1, cuda_device_count) if device == "cuda" else 1
    if xdist[1] > gpus:
        return (f"the speed suite does not time in parallel: {xdist[1]} xdist workers share {gpus} device(s), so each "
                "would measure the others' load; run it without -n, or with -n at most the number of GPUs")
    return None


def implementation_of(params: str, names: Iterable[str]) -> str | None:
    """The implementation a test's parametrization id (``impl-case``, ``impl``) names: the longest
    of the known ``names`` it is or starts with (``impl-``), or None."""
    return next((name for name in sorted(names, key=len, reverse=True)
                 if params == name or params.startswith(f"{name}-")), None)


def _deal_key(nodeid: str, names: Iterable[str]) -> tuple[str, str]:
    """(test function, implementation) of a node id, as both sides of xdist see it (a test of no
    known implementation is a group of its own)."""
    function, _, params = nodeid.rpartition("::")[2].partition("[")
    params = params.rstrip("]")
    return function, implementation_of(params, names) or params


def dealt(nodeids: Sequence[str], count: int, names: Iterable[str]) -> list[int]:
    """For each test, the xdist worker (0 to ``count - 1``) it is dealt to: the tests of each
    (test function, implementation) go round the workers in turn, each group starting where the
    one before left off. ``names``: every implementation of the run, by name."""
    names = list(names)
    seen: Counter[tuple[str, str]] = Counter()
    starts: dict[tuple[str, str], int] = {}
    workers = []
    for nodeid in nodeids:
        key = _deal_key(nodeid, names)
        if key not in starts:
            starts[key] = len(starts) % count
        workers.append((starts[key] + seen[key]) % count)
        seen[key] += 1
    return workers


def share_of_this_worker(config: Any, items: list[Any], names: Iterable[str]) -> list[Any]:
    """The tests this xdist worker runs, when the controller deals them (all of them outside xdist).
    ``names``: every implementation of the run, by name."""
    placed = xdist_worker(config)
    if placed is None or not getattr(config, "workerinput", {}).get("attnkit_dealt"):
        return items
    index, count = placed
    dealing = dealt([item.nodeid for item in items], count, names)
    return [item for item, worker in zip(items, dealing) if worker == index]


def make_dealt_scheduling(config: Any, log: Any, names: Iterable[str]) -> Any:
    """The controller's scheduler for ``--dist load`` under ``--attnkit`` (see the module docstring).
    ``names``: every implementation of the run, by name."""
    from xdist.scheduler import LoadScheduling

    names = list(names)

    class DealtScheduling(LoadScheduling):
        """xdist's load scheduling, except that every worker gets all its tests at the start."""

        def schedule(self) -> None:
            assert self.collection_is_completed
            if self.collection is not None:
                return
            if not self._check_nodes_have_same_collection():
                self.log("**Different tests collected, aborting run**")
                return
            self.collection = next(iter(self.node2collection.values()))
            nodes = {int(str(node.gateway.id).lstrip("gw") or 0): node for node in self.nodes}
            for index, worker in enumerate(dealt(self.collection, self.numnodes, names)):
                self.node2pending[nodes[worker % len(nodes)]].append(index)
            self.pending[:] = []
            for node in self.nodes:
                if self.node2pending[node]:
                    node.send_runtest_some(list(self.node2pending[node]))
                node.shutdown()

    return DealtScheduling(config, log)
