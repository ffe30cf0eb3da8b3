"""Durations: how long each request took the last time it ran, so the long ones start first.
Runs in the pytest process (loaded and saved on the pytest thread, read and written under the
scheduler's lock).

Requests start in the order they were submitted, and a suite's warm-ups come last. A request
that takes many seconds then starts late and runs on after everything else has ended: on an H200,
torch_flex's speed warm-ups of its paged decode cases (Inductor tunes the flex-decoding kernel
each time a process first meets a shape) took 15-18 s each, started after 57 s and ended the phase
of requests run beside one another at 78-82 s, with 16 slots and work for about 50 s
(results/2026-11-27-session8). Longest-first is the textbook cure for such a tail, and a request's
length is known only once it has run; so the scheduler remembers how long each request took, per
GPU, in the compile-cache folder (``--attnkit-cache-dir``), and the next run starts an
implementation's requests remembered as taking at least :data:`LONG_S` first, longest first
(:func:`pytest_attnkit.controller.scheduling.order.first_ready`). Everything else keeps its order.
A first run, or one with ``--attnkit-cache-dir=none``, remembers nothing and runs as before.

A request is known by its implementation, its row in the time table (its suite, or its suite's
warm-ups) and everything it sends the worker (:func:`request_key`): the case, the direction, the
seed and its options. The file holds the latest time of every request any run took on that GPU
(this run's merged into what was there); it is a hint, never a verdict: one that cannot be read is
set aside with a line in the header, and a run whose file cannot be written says so and goes on.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from pytest_attnkit.controller.scheduling.job import Job

#: Requests remembered as taking at least this long start first (of their implementation's ready
#: requests), longest first. Below it the order is the suites' (pytest's, sweeps first, warm-ups
#: last): a request of a second or two does not make a tail.
LONG_S = 3.0
#: What the file says it is.
SCHEMA = "attnkit-durations"
SCHEMA_VERSION = 1


def long_s(seconds: float | None) -> float:
    """A remembered duration where it is at least :data:`LONG_S` (the request then starts first),
    else 0."""
    return seconds if seconds is not None and seconds >= LONG_S else 0.0


def request_key(job: Job) -> str:
    """The key of a job's request in the file: the same request in the next run has the same."""
    wire = job.request.to_wire()
    wire.pop("release_memory", None)  # set by the scheduler, not part of what is asked
    digest = hashlib.sha1(json.dumps(wire, sort_keys=True, default=str).encode()).hexdigest()[:20]
    return f"{job.impl}|{job.ledger_row}|{digest}"


def durations_path(cache_root: Path | None, device_slug: str) -> Path | None:
    """Where a GPU's (or the CPU's) durations are kept: ``<cache>/durations/<device>.json``; None
    without a cache folder."""
    return None if cache_root is None else cache_root / "durations" / f"{device_slug}.json"


class Durations:
    """The durations remembered from earlier runs (read once) and those of this run."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.remembered: dict[str, float] = {}
        self.now: dict[str, float] = {}
        #: Why the file was set aside, or None.
        self.problem: str | None = None
        if path is not None and path.exists():
            try:
                self.remembered = _read(path)
            except (OSError, ValueError) as error:
                self.problem = f"{path} set aside: {error}"

    def of(self, job: Job) -> float | None:
        """How long the job's request took the last time it ran, or None."""
        return self.remembered.get(request_key(job))

    def record(self, job: Job, seconds: float) -> None:
        self.now[request_key(job)] = round(float(seconds), 3)

    def save(self) -> str | None:
        """Merge this run's durations into the file (written whole, then renamed into place); why
        it could not be, or None."""
        if self.path is None or not self.now:
            return None
        try:
            merged = {**_read(self.path)} if self.path.exists() and self.problem is None else {}
        except (OSError, ValueError):
            merged = {}
        merged.update(self.now)
        document = {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "seconds": dict(sorted(merged.items()))}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            handle, temporary = tempfile.mkstemp(dir=self.path.parent, prefix=".durations-", suffix=".json")
            with os.fdopen(handle, "w", encoding="utf-8") as stream:
                json.dump(document, stream, indent=0)
            os.replace(temporary, self.path)
        except OSError as error:
            return f"the request durations could not be kept in {self.path}: {error}"
        return None

    def describe(self) -> str:
        """The header's words."""
        if self.path is None:
            return "request durations: not remembered (no compile-cache folder)"
        if self.problem:
            return f"request durations: {self.problem}"
        if not self.remembered:
            return f"request durations: none remembered yet (kept in {self.path})"
        long = sum(seconds >= LONG_S for seconds in self.remembered.values())
        return (f"request durations: {len(self.remembered)} remembered ({self.path}); the {long} of "
                f"{LONG_S:g} s or more start first")


def _read(path: Path) -> dict[str, float]:
    """The file's durations; ValueError naming what is wrong with it."""
    try:
        document: Any = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"not JSON ({error})") from None
    if not isinstance(document, dict) or document.get("schema") != SCHEMA:
        raise ValueError(f"not a {SCHEMA} file")
    if document.get("schema_version") != SCHEMA_VERSION:
        raise ValueError(f"schema version {document.get('schema_version')!r}, this version reads {SCHEMA_VERSION}")
    seconds = document.get("seconds")
    if not isinstance(seconds, dict) or not all(
            isinstance(key, str) and isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0
            for key, value in seconds.items()):
        raise ValueError("'seconds' is not a mapping of request keys to non-negative numbers")
    return {key: float(value) for key, value in seconds.items()}
