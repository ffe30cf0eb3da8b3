#!/usr/bin/env python3
"""Time the main job, cold and warm, and compare the verdicts of two runs case for case.

``run``: one ``pytest --attnkit`` run as a user runs it, with its own compile-cache folder
(emptied first with ``--cold``), its JUnit XML and report; prints and saves a summary: the
command, the device, the date, the wall time, the outcome counts and the run's "where the time
went" table. nvidia-smi samples the GPU every 2 s beside it, when there is one. ``compare``: the
tests whose outcome differs between two runs' reports (``attnkit-report.json``), and the counts.

The cold and the warm time of issue 32 (one device call, so the warm run finds the cold one's
caches):

    python3 tools/main_job_time.py run OUT cold --cold --cache /tmp/attnkit-cache
    python3 tools/main_job_time.py run OUT warm --cache /tmp/attnkit-cache
    python3 tools/main_job_time.py compare OUT/cold/attnkit-report.json OUT/warm/attnkit-report.json

Arguments after ``--`` go to pytest (``--attnkit-impl=...``, ``--attnkit-jobs=1`` for the serial
run). ``--timeout`` sends SIGTERM after that many seconds, as a CI timeout would: the report of
what ran until then is still written. Standard library only: it runs on the GPU machine as is.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import lzma
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import IO


def _device() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,serial",
                               "--format=csv,noheader"], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "no nvidia-smi (CPU)"


def _host() -> str:
    """The host's processor and cores: compiles (Inductor, Triton) run on them, so a cold run's time
    follows the host as much as the GPU (results/2026-11-26-session5)."""
    model = "unknown processor"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            model = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), model)
    except OSError:
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{model}, {usable} usable cores, load average {os.getloadavg()[0]:.1f}"


def _smi_sampler(path: Path) -> subprocess.Popen[bytes] | None:
    if shutil.which("nvidia-smi") is None:
        return None
    with open(path, "wb") as out:
        return subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,index,utilization.gpu,memory.used",
                                 "--format=csv", "-l", "2"], stdout=out, stderr=subprocess.DEVNULL)


def run(args: argparse.Namespace) -> int:
    folder = Path(args.out) / args.label
    folder.mkdir(parents=True, exist_ok=True)
    cache = Path(args.cache).resolve()
    if args.cold and cache.exists():
        shutil.rmtree(cache)
    command = [sys.executable, "-m", "pytest", "--attnkit", "-p", "no:cacheprovider", "-rs",
               f"--junitxml={folder / 'junit.xml'}", f"--attnkit-report={folder}", f"--attnkit-cache-dir={cache}",
               *args.pytest_args]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    from pytest_attnkit.controller.caches import VARIABLES

    for name in VARIABLES:
        env.pop(name, None)  # the run's cache folder decides, cold or warm
    started_at = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    sampler = _smi_sampler(folder / "smi.csv")
    started = time.monotonic()
    lines_at: list[float] = []  # when pytest printed its first and latest line
    with open(folder / "pytest.log", "wb") as log:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
        copier = threading.Thread(target=_copy_lines, args=(process.stdout, log, lines_at, started), daemon=True)
        copier.start()
        try:
            status = process.wait(timeout=args.timeout)
            stopped = ""
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGTERM)
            status = process.wait()
            stopped = f" (SIGTERM after {args.timeout:g} s)"
        wall = time.monotonic() - started
        copier.join(timeout=30)  # a process left behind that holds pytest's output must not hold this tool
    if sampler is not None:
        sampler.terminate()
        sampler.wait()
    report = folder / "attnkit-report.json"
    lines = [f"command: {' '.join(command)}", f"date: {started_at}", f"device: {_device()}", f"host: {_host()}",
             f"cache: {cache} ({'emptied first' if args.cold else 'as left by earlier runs'})",
             f"exit status: {status}{stopped}", f"wall time: {wall:.1f} s"]
    if lines_at:
        lines.append(f"pytest's output: first line at {lines_at[0]:.1f} s, last at {lines_at[-1]:.1f} s; its "
                     f"process ended at {wall:.1f} s")
    if report.exists():
        document = json.loads(report.read_text())
        counts = Counter(test["outcome"] for test in document["tests"])
        lines.append("outcomes: " + ", ".join(f"{count} {outcome}" for outcome, count in sorted(counts.items())))
        lines += _time_table(document.get("time") or {})
        lines += _first_calls((document.get("speed") or {}).get("measurements") or [])
    text = "\n".join(lines) + "\n"
    (folder / "summary.txt").write_text(text)
    print(text, end="")
    return status


def _copy_lines(stream: IO[bytes], log: IO[bytes], lines_at: list[float], started: float) -> None:
    """Copy pytest's output into the log as it comes, noting when its first and latest lines came
    (seconds from ``started``): the run's start-up and its end outside pytest's own clock."""
    for line in stream:
        log.write(line)
        log.flush()
        now = time.monotonic() - started
        if lines_at:
            lines_at[1:] = [now]
        else:
            lines_at.append(now)


def _time_table(time_section: dict) -> list[str]:
    rows = time_section.get("rows", [])
    lines = [f"where the time went ({time_section.get('wall_s', 0):.0f} s in pytest, up to "
             f"{time_section.get('most_at_once', 0)} requests at once, jobs {time_section.get('jobs')}):",
             f"  {'suite':<14} {'implementation':<16} {'requests':>8} {'busy s':>8} {'compile s':>9} {'span s':>7}"]
    for row in rows:
        lines.append(f"  {row['suite']:<14} {row['impl']:<16} {row['requests']:>8} {row['busy_s']:>8.1f} "
                     f"{row['compile_s']:>9.1f} {row['span_s']:>7.1f}")
    lines.append(f"  worker start-up {sum(time_section.get('startup_s', {}).values()):.0f} s; the pytest thread "
                 f"waited {time_section.get('waited_s', 0):.0f} s for results")
    from pytest_attnkit.controller.ledger import timeline_line

    line = timeline_line(time_section.get("events") or [], time_section.get("marks"))
    if line:
        lines.append(f"  {line}")
    return lines


def _first_calls(measurements: list[dict]) -> list[str]:
    """What the timed cases' first calls took, per implementation: they run with the GPU alone, and
    a case whose warm-up ran in another worker (or was dropped) pays its compile-cache loads,
    library plans and lazy kernel loading there (results/2026-11-27-session10)."""
    from pytest_attnkit.controller.table import first_calls

    calls = first_calls(measurements)
    if not calls:
        return []
    return ["  the timed cases' first calls (GPU alone; cases timed in the worker that warmed them up): "
            + ", ".join(f"{impl} {took:.1f} s ({warm} of {cases})" for impl, (took, warm, cases) in sorted(calls.items()))]


def read_report(path: Path) -> bytes:
    """A report's JSON: plain as a run writes it, or committed under results/ gzipped or, from
    2026-11-29, xz-compressed (told by the first bytes, whatever the name)."""
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        return gzip.decompress(raw)
    if raw[:6] == b"\xfd7zXZ\x00":
        return lzma.decompress(raw)
    return raw


def compare(args: argparse.Namespace) -> int:
    """Outcomes case for case; speed tests are compared too (their verdict is the gate's)."""
    from pytest_attnkit.controller.ledger import timeline_line

    runs, timelines = [], []
    for path in (args.first, args.second):
        document = json.loads(read_report(Path(path)))
        runs.append({test["test"]: test["outcome"] for test in document["tests"]})
        # A report from before the events said "alone": the speed suite's timing was what ran alone.
        events = [event if "alone" in event else {**event, "alone": event["suite"] == "speed"}
                  for event in (document.get("time") or {}).get("events", [])]
        timelines.append(timeline_line(events, (document.get("time") or {}).get("marks"))
                         or "no timeline (no events)")
    first, second = runs
    common = sorted(set(first) & set(second))
    differ = [test for test in common if first[test] != second[test]]
    lines = [f"{args.first}: {len(first)} tests; {args.second}: {len(second)} tests; {len(common)} in both",
             f"same outcome: {len(common) - len(differ)}; different: {len(differ)}"]
    lines += [f"  {test}: {first[test]} -> {second[test]}" for test in differ]
    lines += [f"{label} {line}" for label, line in zip(("first: ", "second:"), timelines)]
    only = sorted(set(first) ^ set(second))
    if only:
        lines.append(f"in one run only: {len(only)}")
        lines += [f"  {test} ({'first' if test in first else 'second'})" for test in only[:50]]
    print("\n".join(lines))
    return 1 if differ else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    runner = commands.add_parser("run", help="one timed run of pytest --attnkit")
    runner.add_argument("out", help="folder for the runs (each in a subfolder named by its label)")
    runner.add_argument("label")
    runner.add_argument("--cache", required=True, help="the run's compile-cache folder (--attnkit-cache-dir)")
    runner.add_argument("--cold", action="store_true", help="empty the cache folder first")
    runner.add_argument("--timeout", type=float, default=None, help="SIGTERM after this many seconds")
    comparer = commands.add_parser("compare", help="outcomes of two runs, case for case")
    comparer.add_argument("first")
    comparer.add_argument("second")
    argv = list(sys.argv[1:] if argv is None else argv)
    pytest_args = argv[argv.index("--") + 1:] if "--" in argv else []
    args = parser.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    args.pytest_args = pytest_args
    return run(args) if args.command == "run" else compare(args)


if __name__ == "__main__":
    sys.exit(main())
