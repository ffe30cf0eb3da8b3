"""pytest-xdist, seen from one xdist worker: which one it is, and which GPU it may use.

Under ``-n N`` every xdist worker is a pytest process of its own with its own attnkit session;
each sends its report document to the controller, which merges them, saves the baseline and
writes the summary and the report files for the whole run.
Each pins its implementations' workers to one GPU, round robin over the visible ones, so several
GPUs share the correctness work; the speed suite refuses to time while xdist workers share a GPU.
"""

from __future__ import annotations

import os
from typing import Any


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
