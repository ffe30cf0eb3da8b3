"""Stored performance baselines: one JSON file per GPU, schema-versioned, written atomically.

A file ``<baseline dir>/<gpu-slug>.json`` holds, per implementation, mode and case, the samples
(milliseconds) of the latest saved run, their median and spread, the versions, the date and the
ratio to the reference implementation measured in the same run, and the history: the medians of
the last ``HISTORY_LIMIT`` saved runs that measured the same implementation (the gate pools them,
see :mod:`pytest_attnkit.gate`). Files for other GPUs are never read for this one: a run
on a GPU with no file says so and gates nothing, unless a baseline is required. Saving writes a
temporary file beside the target, flushes it to disk and renames it over the target, so a crash
mid-write leaves the old file whole. JSON only, never pickle.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

SCHEMA = "pytest-attnkit/baseline"
SCHEMA_VERSION = 2
#: Version 1 files (no history) are read as a history of one run; they are written back as version 2.
READABLE_VERSIONS = (1, 2)
HISTORY_LIMIT = 8


class BaselineError(Exception):
    """A baseline file that cannot be used: unreadable, corrupt, or of an unknown schema."""


def device_slug(device_name: str) -> str:
    """``NVIDIA H100 80GB HBM3`` -> ``nvidia-h100-80gb-hbm3``."""
    slug = re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-")
    return slug or "unknown-device"


def entry_key(impl: str, mode: str, case_id: str) -> str:
    return f"{impl}::{mode}::{case_id}"


def baseline_path(directory: Path, device_name: str) -> Path:
    return directory / f"{device_slug(device_name)}.json"


def load(path: Path, device_name: str) -> dict[str, Any] | None:
    """The entries stored for this device, or None when there is no file for it."""
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
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            json.dump(document, stream, indent=1)
            stream.write("\n")
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
