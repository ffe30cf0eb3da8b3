"""Reports: the headline table, and the files of ``--attnkit-report DIR``.

``DIR/attnkit-report.json`` holds every measurement of the run (schema ``pytest-attnkit/report``,
version 1: environment, implementations, test outcomes, speed measurements and gate verdicts,
memory sweeps), ``DIR/attnkit-report.md`` the same for people, and PNG plots drawn with matplotlib:
TFLOP/s against sequence length per implementation (one figure per mode, a panel per head dim
and masking), peak extra memory against sequence length on log-log axes with the fitted slopes,
and a roofline (FLOP per byte against TFLOP/s under this machine's measured ceilings). With
``GITHUB_STEP_SUMMARY`` set, the Markdown is appended to it (cut well under GitHub's 1 MiB).
"""

from __future__ import annotations

import json
import os
from collections import Counter, defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_attnkit.session import AttnkitSession

SCHEMA = "pytest-attnkit/report"
SCHEMA_VERSION = 1
STEP_SUMMARY_LIMIT = 512 * 1024
HEADLINE_SHAPES = ("b4-h16-q4096-k4096-d128-bf16", "b1-h16-q16384-k16384-d128-bf16")


def build(session: "AttnkitSession", interrupted: bool) -> dict[str, Any]:
    speed = session.speed
    return {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "interrupted": interrupted,
        "environment": session.environment,
        "device": session.device,
        "profile": session.profile,
        "implementations": {name: {"entry_point": info.entry_point, "status": info.status,
                                   "reason": info.load_error or info.unavailable, "capabilities": info.capabilities}
                            for name, info in session.impls.items()},
        "tests": session.outcomes,
        "memory": session.memory_results,
        "speed": {
            "ceilings": (speed.ceilings or {}) if speed else {},
            "gpu_state": speed.gpu_state if speed else {},
            "measurements": list(speed.results.values()) if speed else [],
            "gate": {key: decision.to_dict() for key, decision in speed.decisions.items()} if speed else {},
            "baseline_file": str(speed.path) if speed else None,
            "baseline_found": bool(speed and speed.baseline is not None),
        },
    }


def headline_rows(document: dict[str, Any]) -> list[dict[str, str]]:
    """One row per implementation: what a person reads first."""
    outcomes: dict[str, Counter] = defaultdict(Counter)
    for test in document["tests"]:
        if test["suite"] == "correctness":
            outcomes[test["impl"]][test["outcome"]] += 1
    ceilings = document["speed"]["ceilings"]
    rows = []
    for name, info in document["implementations"].items():
        counts = outcomes.get(name, Counter())
        if info["status"] != "available":
            correctness = info["status"]
        elif counts:
            correctness = ("FAIL" if counts["failed"] else "pass") + f" ({counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped)"
        else:
            correctness = "not run"
        speeds = []
        for measurement in document["speed"]["measurements"]:
            if measurement["impl"] == name and measurement["mode"] == "forward" and measurement["case"] in HEADLINE_SHAPES:
                share = f" ({100 * measurement['tflops'] / ceilings['matmul_bf16_tflops']:.0f}% of matmul)" if ceilings else ""
                seqlen = measurement["case"].split("-q", 1)[1].split("-", 1)[0]
                speeds.append(f"{measurement['tflops']:.0f} TFLOP/s at N={seqlen}{share}")
        slopes = [f"{m['direction'].split('+')[0]} N^{m['slope']:.2f}" if m["slope"] is not None else f"{m['direction']} flat"
                  for m in document["memory"] if m["impl"] == name]
        verdicts = Counter(decision["verdict"] for key, decision in document["speed"]["gate"].items() if key.startswith(f"{name}::"))
        if verdicts:
            gate = "REGRESSION" if verdicts["regression"] else "ok"
            gate += " (" + ", ".join(f"{count} {verdict}" for verdict, count in sorted(verdicts.items())) + ")"
        else:
            gate = "no baseline" if document["speed"]["measurements"] else "not run"
        rows.append({"implementation": name, "correctness": correctness, "speed (forward, bf16, d128)": "; ".join(speeds) or "-",
                     "memory exponent": ", ".join(slopes) or "-", "gate": gate})
    return rows


def headline_lines(document: dict[str, Any]) -> list[str]:
    rows = headline_rows(document)
    if not rows:
        return []
    columns = list(rows[0])
    widths = {column: max(len(column), *(len(row[column]) for row in rows)) for column in columns}
    lines = ["  ".join(column.ljust(widths[column]) for column in columns)]
    lines += ["  ".join(row[column].ljust(widths[column]) for column in columns) for row in rows]
    return lines


def markdown(document: dict[str, Any], plots: list[str]) -> str:
    env = document["environment"]
    out = ["# pytest-attnkit report", ""]
    if document["interrupted"]:
        out += ["**The run was interrupted: this report holds what was gathered until then.**", ""]
    out += [f"Device: {document['device']} ({env.get('device_name')}); torch {env.get('torch')}, triton {env.get('triton')}, "
            f"cupy {env.get('cupy')}; profile {document['profile']}.", ""]
    rows = headline_rows(document)
    if rows:
        columns = list(rows[0])
        out += ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        out += ["| " + " | ".join(row[column] for column in columns) + " |" for row in rows]
        out.append("")
    ceilings = document["speed"]["ceilings"]
    if ceilings:
        out += [f"Ceilings measured in this run: bf16 matmul {ceilings['matmul_bf16_tflops']:.0f} TFLOP/s, "
                f"device copy {ceilings['copy_gbps']:.0f} GB/s.", ""]
    if document["speed"]["measurements"]:
        out += ["## Speed", "", "| implementation | mode | case | median ms | IQR ms | TFLOP/s | GB/s |", "|---|---|---|---|---|---|---|"]
        for m in sorted(document["speed"]["measurements"], key=lambda m: (m["mode"], m["case"], m["impl"])):
            out.append(f"| {m['impl']} | {m['mode']} | {m['case']} | {m['timing']['median_ms']:.4f} | "
                       f"{m['timing']['iqr_ms']:.4f} | {m['tflops']:.1f} | {m['gbps']:.1f} |")
        out.append("")
    if document["speed"]["gate"]:
        out += ["## Gate", "", "| implementation | mode | case | baseline ms | now ms | change | threshold | verdict |",
                "|---|---|---|---|---|---|---|---|"]
        for key, d in sorted(document["speed"]["gate"].items()):
            impl, mode, case = key.split("::")
            out.append(f"| {impl} | {mode} | {case} | {d['baseline_median_ms']:.4f} | {d['now_median_ms']:.4f} | "
                       f"{100 * (d['ratio'] - 1):+.1f}% | {100 * d['threshold']:.1f}% | {d['verdict']} |")
        out.append("")
    if document["memory"]:
        out += ["## Memory", ""]
        for sweep in document["memory"]:
            slope = "none (no extra memory)" if sweep["slope"] is None else f"{sweep['slope']:.2f}"
            out += [f"**{sweep['impl']}** ({sweep['direction']}, declared {sweep['declared']}): fitted exponent {slope}, "
                    f"largest N that fit {sweep['largest_n']}", "", "| N | extra bytes | bytes per token | note |", "|---|---|---|---|"]
            for point in sweep["points"]:
                per_token = f"{point['extra_bytes'] / point['seqlen']:.1f}" if point["status"] == "measured" else "-"
                note = point["message"] if point["status"] != "measured" else ""
                out.append(f"| {point['seqlen']} | {point['extra_bytes']} | {per_token} | {note} |")
            out.append("")
    failures = [test for test in document["tests"] if test["outcome"] == "failed"]
    if failures:
        out += ["## Failures", ""]
        out += [f"- `{test['test']}`: {test['message'].splitlines()[0] if test['message'] else ''}" for test in failures[:200]]
        out.append("")
    if plots:
        out += ["## Plots", ""] + [f"![{plot}]({plot})" for plot in plots] + [""]
    return "\n".join(out)


def check_writable(directory: Path) -> None:
    """Raise OSError now, at start-up, if the report cannot be written there later."""
    directory.mkdir(parents=True, exist_ok=True)
    probe = directory / ".attnkit-write-test"
    probe.write_text("")
    probe.unlink()


def write(session: "AttnkitSession", directory: Path, *, interrupted: bool) -> list[str]:
    """Write the report files; returns lines saying what was written."""
    document = build(session, interrupted)
    directory.mkdir(parents=True, exist_ok=True)
    lines = []
    try:
        from pytest_attnkit import plots

        written = plots.draw_all(document, directory)
    except ImportError as error:
        written = []
        lines.append(f"report: plots skipped, matplotlib is not installed ({error}); pip install 'pytest-attnkit[report]'")
    json_path = directory / "attnkit-report.json"
    json_path.write_text(json.dumps(document, indent=1, default=str) + "\n", encoding="utf-8")
    text = markdown(document, written)
    (directory / "attnkit-report.md").write_text(text, encoding="utf-8")
    lines.insert(0, f"report: {json_path}, {directory / 'attnkit-report.md'}" + (f", {len(written)} plots" if written else ""))
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if step_summary:
        cut = text if len(text.encode()) <= STEP_SUMMARY_LIMIT else text.encode()[:STEP_SUMMARY_LIMIT].decode(errors="ignore") + "\n\n(cut: see the report artifact)\n"
        with open(step_summary, "a", encoding="utf-8") as stream:
            stream.write(cut + "\n")
        lines.append(f"report: appended to GITHUB_STEP_SUMMARY ({step_summary})")
    return lines
