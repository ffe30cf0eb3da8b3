"""Stored performance baselines: one JSON file per GPU, schema-versioned, written atomically.

A file ``<baseline dir>/<gpu-slug>.json`` holds, per implementation, mode and case, the samples
(milliseconds) of the latest saved run, their median and spread, the versions, the date and the
ratio to the reference implementation measured in the same run, and the history: the medians of
the last ``HISTORY_LIMIT`` saved runs that measured the same implementation (the gate pools them,
see :mod:`pytest_attnkit.controller.gate`), each with the program it timed where the worker read
it (the kernels one call launched, with their grids and blocks): a compiled kernel can become
another program in another process, and the gate compares a run only with saved runs of its
own program. Files for other GPUs are never read for this one: a run
on a GPU with no file says so and gates nothing, unless a baseline is required. Saving writes a
temporary file beside the target, flushes it to disk and renames it over the target, so a crash
mid-write leaves the old file whole. JSON only, never pickle.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from pytest_attnkit.controller.gate import Decision, Pool, changed_beyond_noise, pool
from pytest_attnkit.records import EntryKey, SpeedMeasurement

SCHEMA = "pytest-attnkit/baseline"
SCHEMA_VERSION = 2
#: Version 1 files (no history) are read as a history of one run; they are written back as version 2.
READABLE_VERSIONS = (1, 2)
HISTORY_LIMIT = 8
#: The fewest saved runs from which an entry's threshold knows how much runs disagree: with one
#: run there is no spread, and two can agree by chance. A save says how many entries have fewer.
MIN_RUNS = 3


class BaselineError(Exception):
    """A baseline file that cannot be used: unreadable, corrupt, or of an unknown schema."""


def device_slug(device_name: str) -> str:
    """``NVIDIA H100 80GB HBM3`` -> ``nvidia-h100-80gb-hbm3``."""
    slug = re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-")
    return slug or "unknown-device"


def key_string(key: EntryKey) -> str:
    """How a measurement's key is written in a baseline file (and matched by ``attnkit_thresholds``)."""
    return "::".join(key)


def baseline_path(directory: Path, device_name: str) -> Path:
    return directory / f"{device_slug(device_name)}.json"


def load(path: Path, device_name: str) -> dict[str, Any] | None:
    """The entries stored for this device (keyed as written), or None when there is no file for it."""
    if not path.exists():
        return None
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise BaselineError(f"baseline file {path} cannot be read: {error}") from None
    if not isinstance(document, dict) or document.get("schema") != SCHEMA:
        raise BaselineError(f"baseline file {path} is not a pytest-attnkit baseline (no schema {SCHEMA!r})")
    if document.get("schema_version") not in READABLE_VERSIONS:
        raise BaselineError(f"baseline file {path} has schema version {document.get('schema_version')!r}; "
                            f"this pytest-attnkit reads versions {', '.join(map(str, READABLE_VERSIONS))}")
    stored_device = document.get("device", {}).get("name")
    if stored_device != device_name:
        raise BaselineError(f"baseline file {path} was measured on {stored_device!r}, not on {device_name!r}")
    entries = document.get("entries")
    if not isinstance(entries, dict):
        raise BaselineError(f"baseline file {path} has no entries table")
    return entries


def history(entry: dict[str, Any]) -> list[dict[str, Any]]:
    """The saved runs behind ``entry``, oldest first; a version-1 entry is its one run."""
    runs = entry.get("history")
    if isinstance(runs, list) and runs:
        return runs
    return [{"date": entry.get("date"), "median_ms": entry["median_ms"], "samples": entry.get("samples")}]


def save(path: Path, device: dict[str, Any], entries: dict[str, Any]) -> None:
    """Merge ``entries`` into the file for this device, atomically."""
    existing: dict[str, Any] = {}
    if path.exists():
        try:
            existing = load(path, device["name"]) or {}
        except BaselineError:
            existing = {}  # replaced whole by what this run measured
    existing.update(entries)
    document = {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "device": device,
                "entries": dict(sorted(existing.items()))}
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.chmod(temporary, 0o666 & ~umask)  # mkstemp's 0600 would outlive the rename
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            json.dump(document, stream, indent=1)
            stream.write("\n")
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


class BaselineStore:
    """This GPU's baseline file: read once at the start, pooled per entry, written at the end."""

    def __init__(self, directory: Path, device_name: str) -> None:
        self.device_name = device_name
        self.path = baseline_path(directory, device_name)
        stored = load(self.path, device_name)
        self.found = stored is not None
        self.entries: dict[EntryKey, dict[str, Any]] = {}
        for name, entry in (stored or {}).items():
            self.entries[EntryKey(entry.get("impl"), entry.get("mode"), entry.get("case"))
                         if {"impl", "mode", "case"} <= set(entry) else EntryKey(*name.split("::", 2))] = entry

    def pooled(self, key: EntryKey, program: str | None = None) -> Pool | None:
        """The entry's saved runs, pooled (:func:`pytest_attnkit.controller.gate.pool`); None without one.
        With ``program``, only the runs that timed that program, where the entry records programs
        and one of them is it (see :meth:`programs`)."""
        entry = self.entries.get(key)
        if entry is None:
            return None
        runs = history(entry)
        if program is not None and any(run.get("program") == program for run in runs):
            runs = [run for run in runs if run.get("program") == program]
        return pool([run["median_ms"] for run in runs], entry["samples_ms"])

    def programs(self, key: EntryKey) -> set[str]:
        """The programs (the kernels a call launched) the entry's saved runs timed, where they recorded one."""
        entry = self.entries.get(key)
        return {run["program"] for run in history(entry) if run.get("program")} if entry else set()

    def save(self, measured: list[tuple[SpeedMeasurement, Decision | None, float | None]],
             environment: dict[str, Any], ceilings: dict[str, Any], host: str) -> dict[str, int]:
        """Write this run into the file: (measurement, the gate's decision, ratio to the reference)
        per entry. Each entry keeps the runs saved before it (its history, pooled by the gate) unless
        this run's gate found it changed far beyond noise: then the earlier runs describe another
        implementation, and its history starts again from this run. Returns how many entries were
        pooled, restarted and new, and how many have fewer than :data:`MIN_RUNS` runs ("thin")."""
        date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        versions = {lib: environment.get(lib) for lib in ("torch", "triton", "cupy", "python")}
        entries = {}
        counts = {"pooled": 0, "restarted": 0, "new": 0, "thin": 0}
        for measurement, decision, ratio in measured:
            timing = measurement.timing
            run = {"date": date, "median_ms": timing.median_ms, "samples": len(timing.samples_ms), "host": host}
            if measurement.program:
                run["program"] = measurement.program
            old = self.entries.get(measurement.key)
            if old is None:
                runs, outcome = [run], "new"
            elif decision is not None and changed_beyond_noise(decision):
                runs, outcome = [run], "restarted"
            else:
                runs, outcome = (history(old) + [run])[-HISTORY_LIMIT:], "pooled"
            counts[outcome] += 1
            counts["thin"] += len(runs) < MIN_RUNS
            entries[key_string(measurement.key)] = {
                "impl": measurement.impl, "mode": measurement.mode, "case": measurement.case.id,
                "median_ms": timing.median_ms, "iqr_ms": timing.iqr_ms, "samples": len(timing.samples_ms),
                "samples_ms": list(timing.samples_ms), "timer": timing.timer, "tflops": measurement.tflops,
                "gbps": measurement.gbps, "ratio_to_reference": ratio, "versions": versions, "date": date,
                "gpu_state": measurement.gpu_state, "history": runs,
            }
        device = {"name": self.device_name, "compute_capability": environment.get("compute_capability"),
                  "ceilings": ceilings}
        save(self.path, device, entries)
        return counts

