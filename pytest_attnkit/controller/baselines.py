"""Stored performance baselines: one JSON file per GPU, schema-versioned, written atomically.

A file ``<baseline dir>/<gpu-slug>.json`` holds, per implementation, mode and case, the samples
(milliseconds) of the latest saved run, their median and spread, the versions, the date and the
ratio to the reference implementation measured in the same run, and the history: the medians of
the last ``HISTORY_LIMIT`` saved runs that measured the same implementation (the gate pools them,
see :mod:`pytest_attnkit.controller.gate`), each with the program it timed where the worker read
it (the kernels one call launched, with their grids and blocks): a compiled kernel can become
another program in another process, and the gate compares a run only with saved runs of its
own program, or of programs with its core kernels (:mod:`pytest_attnkit.programs`). A saved run
also keeps the median SM clock its samples ran at, where the worker measured it (the gate's
"slower clock", :func:`pytest_attnkit.controller.gate.explained_by_clock`). Files for other GPUs
are never read for this one: a run on a GPU with no file says so and gates nothing, unless a
baseline is required. JSON only, never pickle.

A file is checked whole when it is read (:func:`validate`): a field of the wrong type, null or
missing is a :class:`BaselineError` naming the file and the field
(``entries["torch_sdpa::forward::b1-..."].median_ms``), which the speed suite turns into a usage
error as it is built, before any test runs: never a crash of the run or a failure charged to a
kernel.

Two runs may save into one folder at once (two CI jobs, or a user's two terminals). A save takes
an exclusive lock on the folder (``flock``), reads the file again under it and adds this run to
each entry's history as the file holds it then, so neither run's save is lost. It writes a
temporary file beside the target, flushes it to disk and renames it over the target, so a crash
mid-write leaves the old file whole; a temporary file that a killed save left behind is removed
by the next run (:func:`remove_stale_temporaries`, under the same lock: no save is running then).
The lock is on the folder, not on a lock file beside the baseline: ``os.replace`` puts a new inode
at the file's path, so a lock on the file itself would not exclude the next run, and a lock file
would be one more file to commit or ignore.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Iterator

try:
    import fcntl
except ImportError:  # Windows: saves are not locked
    fcntl = None  # type: ignore[assignment]

from pytest_attnkit.controller.gate import Decision, GateVerdict, Pool, changed_beyond_noise, pool
from pytest_attnkit.programs import core, plain
from pytest_attnkit.records import EntryKey, SpeedMeasurement

SCHEMA = "pytest-attnkit/baseline"
SCHEMA_VERSION = 2
#: Version 1 files (no history) are read as a history of one run; they are written back as version 2.
READABLE_VERSIONS = (1, 2)
HISTORY_LIMIT = 8
#: The fewest saved runs from which an entry's threshold knows how much runs disagree: with one
#: run there is no spread, and two can agree by chance. A save says how many entries have fewer.
MIN_RUNS = 3


#: How a save's temporary file is named beside ``<gpu-slug>.json`` (see :func:`save`).
TEMPORARY_PREFIX, TEMPORARY_SUFFIX = ".", ".tmp"
#: The most problems one error lists; the rest are counted.
MAX_PROBLEMS = 5


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
    """The entries stored for this device (keyed as written), or None when there is no file for it.
    The whole file is checked first (:func:`validate`)."""
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
    problems = validate(document)
    if problems:
        more = f"; and {len(problems) - MAX_PROBLEMS} more" if len(problems) > MAX_PROBLEMS else ""
        raise BaselineError(f"baseline file {path} is malformed: {'; '.join(problems[:MAX_PROBLEMS])}{more} "
                            "(fix or delete the file, or save it again from a fresh run)")
    stored_device = document["device"]["name"]
    if stored_device != device_name:
        raise BaselineError(f"baseline file {path} was measured on {stored_device!r}, not on {device_name!r}")
    return document["entries"]


def _shown(value: Any) -> str:
    """A JSON value as a problem shows it: its JSON type, and the value itself when short."""
    kind = {type(None): "null", bool: "a boolean", int: "a number", float: "a number", str: "a string",
            list: "a list", dict: "an object"}.get(type(value), type(value).__name__)
    if isinstance(value, (list, dict)):
        return kind
    text = json.dumps(value)
    return f"{kind} ({text})" if len(text) <= 40 and value is not None else kind


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _positive(value: Any) -> bool:
    return _is_number(value) and math.isfinite(value) and value > 0


#: The optional fields of an entry and of a saved run, as :meth:`BaselineStore.save` writes them:
#: (what the value must be, in words; the check).
_NUMBER_OR_NULL = ("a number or null", lambda value: value is None or _is_number(value))
_OPTIONAL_ENTRY_FIELDS: dict[str, tuple[str, Any]] = {
    "iqr_ms": _NUMBER_OR_NULL, "tflops": _NUMBER_OR_NULL, "gbps": _NUMBER_OR_NULL,
    "ratio_to_reference": _NUMBER_OR_NULL,
    "samples": ("a whole number", lambda value: isinstance(value, int) and not isinstance(value, bool)),
    "timer": ("a string", lambda value: isinstance(value, str)),
    "date": ("a string or null", lambda value: value is None or isinstance(value, str)),
    "versions": ("an object", lambda value: isinstance(value, dict)),
    "gpu_state": ("an object", lambda value: isinstance(value, dict)),
}
_OPTIONAL_RUN_FIELDS: dict[str, tuple[str, Any]] = {
    "samples": ("a whole number or null", lambda value: value is None or (isinstance(value, int)
                                                                         and not isinstance(value, bool))),
    "date": ("a string or null", lambda value: value is None or isinstance(value, str)),
    "host": ("a string or null", lambda value: value is None or isinstance(value, str)),
    "program": ("a string or null", lambda value: value is None or isinstance(value, str)),
    "clock_mhz": ("a positive number or null", lambda value: value is None or _positive(value)),
}


def validate(document: dict[str, Any]) -> list[str]:
    """Every problem of a baseline document, each naming its field (``device.name``,
    ``entries["impl::mode::case"].history[2].median_ms``); empty when the file is usable."""
    problems: list[str] = []

    def expect(where: str, value: Any, what: str, ok: bool) -> bool:
        if not ok:
            problems.append(f"{where} is {_shown(value)}, expected {what}")
        return ok

    def optional(where: str, holder: dict[str, Any], fields: dict[str, tuple[str, Any]]) -> None:
        for name, (what, check) in fields.items():
            if name in holder:
                expect(f"{where}.{name}", holder[name], what, check(holder[name]))

    device = document.get("device")
    if "device" not in document:
        problems.append("device is missing")
    elif expect("device", device, "an object with the GPU's name", isinstance(device, dict)):
        if "name" not in device:
            problems.append("device.name is missing")
        else:
            expect("device.name", device["name"], "a string", isinstance(device["name"], str))
        if "ceilings" in device:
            expect("device.ceilings", device["ceilings"], "an object", isinstance(device["ceilings"], dict))
    entries = document.get("entries")
    if "entries" not in document:
        problems.append("entries is missing")
        return problems
    if not expect("entries", entries, "an object", isinstance(entries, dict)):
        return problems
    for name, entry in entries.items():
        where = f"entries[{json.dumps(name)}]"
        if not expect(where, entry, "an object", isinstance(entry, dict)):
            continue
        named = [field_name for field_name in ("impl", "mode", "case") if field_name in entry]
        for field_name in named:
            expect(f"{where}.{field_name}", entry[field_name], "a string", isinstance(entry[field_name], str))
        if len(named) < 3 and len(name.split("::", 2)) < 3:
            problems.append(f"{where} has no impl, mode and case, and its key is not 'impl::mode::case'")
        for field_name in ("median_ms", "samples_ms"):
            if field_name not in entry:
                problems.append(f"{where}.{field_name} is missing")
        if "median_ms" in entry:
            expect(f"{where}.median_ms", entry["median_ms"], "a positive number", _positive(entry["median_ms"]))
        samples = entry.get("samples_ms")
        if "samples_ms" in entry and expect(f"{where}.samples_ms", samples, "a list of positive numbers",
                                            isinstance(samples, list)):
            for index, sample in enumerate(samples):
                if not expect(f"{where}.samples_ms[{index}]", sample, "a positive number", _positive(sample)):
                    break  # one bad sample is enough to name
        optional(where, entry, _OPTIONAL_ENTRY_FIELDS)
        runs = entry.get("history")
        if "history" in entry and expect(f"{where}.history", runs, "a list of saved runs (objects)",
                                         isinstance(runs, list) and bool(runs)):
            for index, run in enumerate(runs):
                run_where = f"{where}.history[{index}]"
                if not expect(run_where, run, "an object", isinstance(run, dict)):
                    continue
                if "median_ms" not in run:
                    problems.append(f"{run_where}.median_ms is missing")
                else:
                    expect(f"{run_where}.median_ms", run["median_ms"], "a positive number", _positive(run["median_ms"]))
                optional(run_where, run, _OPTIONAL_RUN_FIELDS)
    return problems


def history(entry: dict[str, Any]) -> list[dict[str, Any]]:
    """The saved runs behind ``entry``, oldest first; a version-1 entry is its one run."""
    runs = entry.get("history")
    if isinstance(runs, list) and runs:
        return runs
    return [{"date": entry.get("date"), "median_ms": entry["median_ms"], "samples": entry.get("samples")}]


@contextlib.contextmanager
def locked(directory: Path, *, wait: bool = True) -> Iterator[bool]:
    """Hold an exclusive lock on ``directory`` (see the module docstring); yields whether it is
    held: False without waiting when another process holds it and ``wait`` is off, or where
    there is no ``flock``."""
    if fcntl is None:
        yield False
        return
    handle = os.open(directory, os.O_RDONLY)
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(handle)  # releases the lock


def temporaries(directory: Path) -> list[Path]:
    """The temporary files of saves in ``directory`` (``.<gpu-slug>.json.<random>.tmp``)."""
    return sorted(directory.glob(f"{TEMPORARY_PREFIX}*.json.*{TEMPORARY_SUFFIX}"))


def remove_stale_temporaries(directory: Path) -> list[Path]:
    """Remove the temporary files that killed saves left in ``directory`` (a save holds the lock
    while its file exists, so under the lock every one is stale); returns those removed. Nothing
    is removed while another run is saving, or where the folder cannot be written."""
    if not directory.is_dir():
        return []
    removed = []
    with locked(directory, wait=False) as held:
        if not held:
            return []
        for stale in temporaries(directory):
            try:
                stale.unlink()
            except OSError:
                continue
            removed.append(stale)
    return removed


def write_atomically(path: Path, document: dict[str, Any]) -> None:
    """Write ``document`` to a temporary file beside ``path``, flush it to disk and rename it
    over ``path``; on any failure the temporary file is removed and ``path`` is unchanged."""
    handle, temporary = tempfile.mkstemp(prefix=f"{TEMPORARY_PREFIX}{path.name}.", suffix=TEMPORARY_SUFFIX,
                                         dir=path.parent)
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


def save(path: Path, device: dict[str, Any], entries: dict[str, Any]) -> None:
    """Merge ``entries`` into the file for this device, atomically, under the folder's lock."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with locked(path.parent):
        update(path, device, lambda existing: entries)


def update(path: Path, device: dict[str, Any], change: Any) -> None:
    """Read the file's entries (hold :func:`locked` around this), ask ``change(existing)`` for the
    entries to write over them, and write the file atomically. A file that cannot be read now
    raises :class:`BaselineError` and is left as it is: it was readable when the run started, so
    someone changed it since, and this run must not replace what they wrote."""
    existing = dict(load(path, device["name"]) or {})
    existing.update(change(existing))
    write_atomically(path, {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "device": device,
                            "entries": dict(sorted(existing.items()))})


def _keyed(stored: dict[str, Any]) -> dict[EntryKey, dict[str, Any]]:
    """A file's entries by their key (the fields, else the name they are stored under)."""
    return {EntryKey(entry["impl"], entry["mode"], entry["case"]) if {"impl", "mode", "case"} <= set(entry)
            else EntryKey(*name.split("::", 2)): entry for name, entry in stored.items()}


def _plain(run: dict[str, Any]) -> str | None:
    """A saved run's program without its minor marks, or None where it recorded none."""
    return plain(run["program"]) if run.get("program") else None


def _pool_runs(entry: dict[str, Any], runs: list[dict[str, Any]]) -> Pool:
    """``runs`` of ``entry``'s history pooled with the entry's latest samples."""
    return pool([run["median_ms"] for run in runs], entry["samples_ms"], [run.get("clock_mhz") for run in runs])


class BaselineStore:
    """This GPU's baseline file: read once at the start, pooled per entry, written at the end
    (merged then with what other runs saved meanwhile). Starting removes the temporary files that
    killed saves left in the folder (``removed``)."""

    def __init__(self, directory: Path, device_name: str) -> None:
        self.device_name = device_name
        self.path = baseline_path(directory, device_name)
        self.removed = remove_stale_temporaries(directory)
        stored = load(self.path, device_name)
        self.found = stored is not None
        self.entries: dict[EntryKey, dict[str, Any]] = _keyed(stored or {})

    def pooled(self, key: EntryKey, program: str | None = None) -> Pool | None:
        """The entry's saved runs, pooled (:func:`pytest_attnkit.controller.gate.pool`); None without one.
        With ``program``, only the runs that timed that program, where the entry records programs
        and one of them is it (see :meth:`programs`; programs compare without their minor marks,
        :func:`pytest_attnkit.programs.plain`)."""
        entry = self.entries.get(key)
        if entry is None:
            return None
        runs = history(entry)
        if program is not None and any(_plain(run) == plain(program) for run in runs):
            runs = [run for run in runs if _plain(run) == plain(program)]
        return _pool_runs(entry, runs)

    def pooled_by_core(self, key: EntryKey, kernels: str) -> Pool | None:
        """The entry's saved runs whose programs have the core ``kernels``
        (:func:`pytest_attnkit.programs.core`: they differ from it only in kernels that took at
        most 1% of a call's kernel time), pooled; None where none has."""
        entry = self.entries.get(key)
        runs = [run for run in history(entry) if run.get("program") and core(run["program"]) == kernels] if entry else []
        return _pool_runs(entry, runs) if runs else None

    def programs(self, key: EntryKey) -> set[str]:
        """The programs (the kernels a call launched) the entry's saved runs timed, where they
        recorded one, without their minor marks."""
        entry = self.entries.get(key)
        return {plain(run["program"]) for run in history(entry) if run.get("program")} if entry else set()

    def save(self, measured: list[tuple[SpeedMeasurement, Decision | None, float | None]],
             environment: dict[str, Any], ceilings: dict[str, Any], host: str) -> dict[str, int]:
        """Write this run into the file: (measurement, the gate's decision, ratio to the reference)
        per entry. Each entry keeps the runs saved before it (its history, pooled by the gate) unless
        this run's gate found it changed far beyond noise: then the earlier runs describe another
        implementation, and its history starts again from this run (keeping the runs other runs
        saved while this one ran: the gate did not see them). The history is the file's as it is
        when saving, read under the folder's lock, so a run saved by another process meanwhile
        stays. An entry whose gate said "slower clock" keeps its earlier runs and not this one: a
        run of a throttled GPU would widen the entry's threshold (the pool's spread) for no change
        of the kernel. Returns how many entries were pooled, restarted, new and left for a slower
        clock ("slower_clock"), and how many have fewer than :data:`MIN_RUNS` runs ("thin"); raises
        :class:`BaselineError` when the file cannot be read now (see :func:`update`)."""
        date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        versions = {lib: environment.get(lib) for lib in ("torch", "triton", "cupy", "python")}
        counts = {"pooled": 0, "restarted": 0, "new": 0, "thin": 0, "slower_clock": 0}

        def change(existing: dict[str, Any]) -> dict[str, Any]:
            now = _keyed(existing)
            entries = {}
            for measurement, decision, ratio in measured:
                timing = measurement.timing
                run = {"date": date, "median_ms": timing.median_ms, "samples": len(timing.samples_ms), "host": host}
                if measurement.program:
                    run["program"] = measurement.program
                if timing.clock_mhz_median:
                    run["clock_mhz"] = round(timing.clock_mhz_median, 1)
                current, seen = now.get(measurement.key), self.entries.get(measurement.key)
                if current is not None and decision is not None and decision.verdict == GateVerdict.SLOWER_CLOCK:
                    counts["slower_clock"] += 1  # a throttled run would widen the entry's threshold
                    counts["thin"] += len(history(current)) < MIN_RUNS
                    continue
                if current is None:
                    runs, outcome = [run], "new"
                elif decision is not None and changed_beyond_noise(decision):
                    seen_runs = history(seen) if seen is not None else []
                    runs, outcome = [old for old in history(current) if old not in seen_runs] + [run], "restarted"
                else:
                    runs, outcome = history(current) + [run], "pooled"
                runs = runs[-HISTORY_LIMIT:]
                counts[outcome] += 1
                counts["thin"] += len(runs) < MIN_RUNS
                entries[key_string(measurement.key)] = {
                    "impl": measurement.impl, "mode": measurement.mode, "case": measurement.case.id,
                    "median_ms": timing.median_ms, "iqr_ms": timing.iqr_ms, "samples": len(timing.samples_ms),
                    "samples_ms": list(timing.samples_ms), "timer": timing.timer, "tflops": measurement.tflops,
                    "gbps": measurement.gbps, "ratio_to_reference": ratio, "versions": versions, "date": date,
                    "gpu_state": measurement.gpu_state, "history": runs,
                }
            return entries

        device = {"name": self.device_name, "compute_capability": environment.get("compute_capability"),
                  "ceilings": ceilings}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with locked(self.path.parent):
            update(self.path, device, change)
        return counts
