"""The report document: everything a run found, built once when the session finishes.

:func:`build` gathers the run's records into one JSON-able document (schema
``pytest-attnkit/report``, version 2): the environment, the implementations, every test's
outcome, and the sections each suite fills
(:meth:`~pytest_attnkit.controller.suite.Suite.report_sections`): the memory sweeps with their
fits, the speed measurements with their figures and the gate's decisions, and so on, each with
structured fields (implementation, mode, the case's shape), never a string to parse back. Every
view renders from it: the terminal summary and the Markdown (:mod:`pytest_attnkit.controller.table`)
and the plots (:mod:`pytest_attnkit.controller.plots`).
:func:`write` puts the files of ``--attnkit-report DIR`` on disk; with ``GITHUB_STEP_SUMMARY`` set,
the Markdown is appended to it (cut well under GitHub's 1 MiB). :func:`save_baseline` saves the
document's speed records for ``--attnkit-save-baseline``.
"""

from __future__ import annotations

import json
import os
import platform
from dataclasses import fields
from pathlib import Path
from typing import Any, Iterable, Mapping

from pytest_attnkit.contract import Case
from pytest_attnkit.controller.baselines import MIN_RUNS, BaselineError, BaselineStore
from pytest_attnkit.controller.gate import Decision, GateVerdict
from pytest_attnkit.controller.impls import ImplInfo
from pytest_attnkit.controller.suite import Suite
from pytest_attnkit.controller.table import markdown
from pytest_attnkit.controller.terminal import NO_BREAK
from pytest_attnkit.records import SpeedMeasurement, Timing

SCHEMA = "pytest-attnkit/report"
SCHEMA_VERSION = 2
STEP_SUMMARY_LIMIT = 512 * 1024
#: What the report says when matplotlib is missing; the README's install line.
PLOTS_NEED = "pip install matplotlib (the README's install line includes it)"


def build(*, environment: dict[str, Any], device: str, profile: str, impls: list[ImplInfo],
          outcomes: list[dict[str, Any]], interrupted: bool, against: dict[str, Any] | None = None,
          suites: Iterable[Suite] = ()) -> dict[str, Any]:
    """The whole run as one document; ``against`` describes --attnkit-against's REV, whose paired
    verdicts are the ``ab`` list. Each of ``suites`` fills its own sections
    (:meth:`Suite.report_sections`, in the order given); a bundled suite's sections are in every
    document, empty where it did not run."""
    document: dict[str, Any] = {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "interrupted": interrupted,
        "environment": environment,
        "device": device,
        "profile": profile,
        "implementations": {info.name: {"entry_point": info.entry_point, "status": info.status,
                                        "reason": info.load_error or info.unavailable,
                                        "capabilities": info.capabilities,
                                        "path_note": info.path_note} for info in impls},
        "tests": outcomes,
        "memory": [],  # controller/memory.py
        "properties": [],  # controller/properties.py
        "sanitize": [],  # controller/sanitize.py
        "against": against,
        "ab": [],  # controller/speed.py, with "speed"
        "speed": {"ceilings": {}, "gpu_state": {}, "measurements": [], "gate": [], "machine_factor": None,
                  "machine_factor_cases": None, "reference": None, "notes": [], "over_limit": [],
                  **baseline_state(None)},
    }
    for suite in suites:
        document.update(suite.report_sections(document))
    return document


def speed_records(document: Mapping[str, Any]) -> list[tuple[SpeedMeasurement, Decision | None, float | None]]:
    """The document's speed measurements as records, with their gate decisions and ratios to the
    reference: what a baseline save writes, whichever process timed them."""
    decisions = {(d["impl"], d["mode"], d["case"]): d for d in document["speed"]["gate"]}
    records = []
    for m in document["speed"]["measurements"]:
        if m.get("of_revision"):
            continue  # --attnkit-against's other version: not this version's baseline
        measurement = SpeedMeasurement(m["impl"], m["mode"], Case.from_dict(m["shape"]), Timing.from_dict(m["timing"]),
                                       m.get("input_sets", 1), m.get("gpu_state") or {}, m.get("program"),
                                       m.get("syncs"), tuple(m.get("shared_with") or ()))
        stored = decisions.get((m["impl"], m["mode"], m["case"]))
        decision = (Decision(**{**{f.name: stored.get(f.name, f.default) for f in fields(Decision)},
                                "verdict": GateVerdict(stored["verdict"])}) if stored else None)
        records.append((measurement, decision, m.get("ratio_to_reference")))
    return records


def shared_gpu(document: Mapping[str, Any]) -> str | None:
    """Why this run's timings cannot be saved as a baseline because other processes computed on
    the GPU while cases were timed (``shared_with``), or None when none did."""
    shared = [m for m in document["speed"]["measurements"] if m.get("shared_with")]
    if not shared:
        return None
    pids = sorted({pid for m in shared for pid in m["shared_with"]})
    return (f"the GPU was shared with other processes (pid {', '.join(map(str, pids))}) while {len(shared)} "
            f"case(s) were timed, so their timings include that work; save again with the GPU to this run alone")


def merge(document: dict[str, Any], parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Fold the documents of pytest-xdist's workers into the controller's: each worker ran a share
    of the tests, and each collected all of them."""
    speed = document["speed"]
    for part in parts:
        document["interrupted"] = document["interrupted"] or part["interrupted"]
        document["tests"] += part["tests"]
        document["memory"] += part["memory"]
        document["properties"] = document.get("properties", []) + part.get("properties", [])
        document["sanitize"] = document.get("sanitize", []) + part.get("sanitize", [])
        document["ab"] = document.get("ab", []) + part.get("ab", [])
        speed["measurements"] += part["speed"]["measurements"]
        speed["gate"] += part["speed"]["gate"]
        speed["over_limit"] = speed.get("over_limit", []) + part["speed"].get("over_limit", [])
        speed["notes"] += [note for note in part["speed"]["notes"] if note not in speed["notes"]]
        for key in ("ceilings", "gpu_state", "machine_factor", "machine_factor_cases"):
            if not speed.get(key) and part["speed"].get(key):
                speed[key] = part["speed"][key]
        collected = document.setdefault("collected", {})
        for name, suites in part.get("collected", {}).items():
            for suite, count in suites.items():
                mine = collected.setdefault(name, {})
                mine[suite] = max(mine.get(suite, 0), count)
        if part.get("time") and "time" in document:
            _merge_time(document["time"], part["time"])
    return document


def _merge_time(time: dict[str, Any], part: dict[str, Any]) -> None:
    """An xdist worker's account of its time, added to the run's (spans: the longest)."""
    rows = {(row["suite"], row["impl"]): row for row in time.setdefault("rows", [])}
    for row in part.get("rows", []):
        mine = rows.setdefault((row["suite"], row["impl"]), {"suite": row["suite"], "impl": row["impl"], "requests": 0,
                                                              "busy_s": 0.0, "compile_s": 0.0, "queued_s": 0.0,
                                                              "span_s": 0.0})
        for key in ("requests", "busy_s", "compile_s", "queued_s"):
            mine[key] = round(mine[key] + row[key], 2)
        mine["span_s"] = max(mine["span_s"], row["span_s"])
    time["rows"] = sorted(rows.values(), key=lambda row: (row["suite"], row["impl"]))
    for impl, seconds in part.get("startup_s", {}).items():
        time.setdefault("startup_s", {})[impl] = round(time["startup_s"].get(impl, 0.0) + seconds, 2)
    time["waited_s"] = round(time.get("waited_s", 0.0) + part.get("waited_s", 0.0), 2)
    for key in ("retried_alone", "retried_cleared"):
        for impl, count in part.get(key, {}).items():
            time.setdefault(key, {})[impl] = time[key].get(impl, 0) + count
    time["stopped_workers"] = time.get("stopped_workers", 0) + part.get("stopped_workers", 0)
    time["out_of_memory"] = time.get("out_of_memory", []) + part.get("out_of_memory", [])
    time["most_at_once"] = time.get("most_at_once", 0) + part.get("most_at_once", 0)
    time["jobs"] = max(time.get("jobs", 1), part.get("jobs", 1))
    time["events"] = time.get("events", []) + [{**event, "xdist_worker": time.get("xdist_workers", 0)}
                                                for event in part.get("events", [])]
    time["xdist_workers"] = time.get("xdist_workers", 0) + 1


#: The lock a run holds on its report folder, from its start to its end (see :func:`claim`).
RUN_LOCK = ".attnkit-run.lock"


class ReportInUse(Exception):
    """Another live run holds the report folder."""


def claim(directory: Path) -> int | None:
    """Hold the report folder for this run: an exclusive ``flock`` on ``DIR/.attnkit-run.lock``,
    which says who holds it. Returns the lock's descriptor (close it to let go; a process that
    dies lets go too), or None where there is no ``flock``; raises :class:`ReportInUse`, naming
    the run that holds it, when another live run does: its report would be replaced silently."""
    try:
        import fcntl
    except ImportError:
        return None
    directory.mkdir(parents=True, exist_ok=True)
    handle = os.open(directory / RUN_LOCK, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(handle, 4096, 0).decode(errors="replace").strip() or "a run that has not said who it is"
        os.close(handle)
        raise ReportInUse(f"the report folder {directory} is in use by another run ({holder}); give this run "
                          "another --attnkit-report, or let that one end first") from None
    import datetime
    import sys

    since = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    os.ftruncate(handle, 0)
    os.pwrite(handle, f"pid {os.getpid()}, since {since}: {' '.join(sys.argv)}"[:1000].encode() + b"\n", 0)
    return handle


def check_writable(directory: Path) -> None:
    """Raise OSError now, at start-up, if the report cannot be written there later."""
    directory.mkdir(parents=True, exist_ok=True)
    probe = directory / ".attnkit-write-test"
    probe.write_text("")
    probe.unlink()


def write(document: dict[str, Any], directory: Path) -> list[str]:
    """Write the report files; returns lines saying what was written."""
    directory.mkdir(parents=True, exist_ok=True)
    lines = []
    try:
        from pytest_attnkit.controller import plots
    except ImportError as error:
        written: list[str] = []
        document["plots_skipped"] = f"matplotlib is not installed ({error}); {PLOTS_NEED}"
        lines.append(f"report: plots skipped, {document['plots_skipped']}")
    else:
        written = plots.draw_all(document, directory)
    document["plots"] = written
    json_path = directory / "attnkit-report.json"
    json_path.write_text(json.dumps(document, indent=1, default=str) + "\n", encoding="utf-8")
    text = markdown(document)
    (directory / "attnkit-report.md").write_text(text, encoding="utf-8")
    lines[:0] = [f"report:{NO_BREAK}{directory}{os.sep}",
                 "  attnkit-report.json, attnkit-report.md" + (f", {len(written)} plots" if written else "")]
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if step_summary:
        cut = text if len(text.encode()) <= STEP_SUMMARY_LIMIT else text.encode()[:STEP_SUMMARY_LIMIT].decode(errors="ignore") + "\n\n(cut: see the report artifact)\n"
        with open(step_summary, "a", encoding="utf-8") as stream:
            stream.write(cut + "\n")
        lines.append(f"report: appended to GITHUB_STEP_SUMMARY:{NO_BREAK}{step_summary}")
    return lines


def baseline_state(store: BaselineStore | None) -> dict[str, Any]:
    """The report's baseline file and whether it was found (None and False without the speed suite)."""
    if store is None:
        return {"baseline_file": None, "baseline_found": False}
    return {"baseline_file": str(store.path), "baseline_found": store.found}


def save_baseline(store: BaselineStore, document: Mapping[str, Any], environment: dict[str, Any], *,
                  interrupted: bool) -> list[str]:
    """Save the document's speed records into ``store`` (``--attnkit-save-baseline``); returns the
    summary's lines: what was saved, or why nothing was (an interrupted run, a shared GPU, no
    measurements, the store's own error), so the stored baseline stays whole."""
    records = speed_records(document)
    shared = shared_gpu(document)
    if interrupted:
        return [f"baseline NOT saved: the run was interrupted ({store.path}{NO_BREAK}is unchanged)"]
    if shared:
        return [f"baseline NOT saved: {shared} ({store.path}{NO_BREAK}is unchanged)"]
    if not records:
        return ["baseline not saved: no speed measurements in this run"]
    try:
        counts = store.save(records, environment, document["speed"]["ceilings"], platform.node())
    except BaselineError as error:
        return [f"baseline NOT saved: {error}"]
    lines = [f"baseline{NO_BREAK}saved:{NO_BREAK}{store.path}",
             f"  {counts['pooled']} entries pooled with their earlier runs, {counts['restarted']} "
             f"started afresh (changed beyond noise), {counts['new']} new"]
    if counts["slower_clock"]:
        lines.append(f"  {counts['slower_clock']} entries not saved: their case ran at a lower SM clock than their "
                     "saved runs (verdict \"slower clock\": a hot or power-capped GPU); their earlier runs stay")
    if counts["thin"]:
        lines.append(f"  {counts['thin']} entries have fewer than {MIN_RUNS} runs: until they do, their "
                     "thresholds cannot know how much runs disagree; save again, each time from a fresh "
                     "process (better: another machine of the same GPU)")
    return lines
