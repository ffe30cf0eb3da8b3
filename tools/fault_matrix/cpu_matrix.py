"""The CPU fault matrix: broken implementations through ``pytest --attnkit``, in each way a run can
end, with what the harness said, its exit status, its wall time and what it left behind.

The implementations are ``cpu_site/cpu_faults.py`` (each right but for one fault: exits on its
third call, segfaults, hangs, runs out of memory, returns NaN or the wrong shape, raises, prints a
megabyte per call, writes into its input, starts processes that outlive the call) beside the
bundled ``torch_sdpa``. Each mode is a fresh ``pytest --attnkit`` in a folder of its own, with a
temporary folder of its own (``TMPDIR``: the workers' logs go there) and a mark in its
environment that every process it starts inherits. After each run the tool looks for what is
left: a process that carries the mark, a worker log folder, a baseline's temporary file; and it
keeps the most the temporary folder held at once (the workers' logs, capped).

Usage: ``python3 tools/fault_matrix/cpu_matrix.py [--out DIR] [--modes default,jobs1,...]
[--timeout S] [--check]``. It prints two Markdown tables (each fault's verdicts; each mode's exit
status, time and leftovers) and writes them, with every test's outcome, to ``DIR``. With
``--check`` it exits 1 when a fault's verdict, a mode's exit status or time, or a leftover is not
what the table in docs/workers.md promises (tests/e2e/test_fault_matrix.py runs it so in CI).
Standard library only; run it with the interpreter that has pytest-attnkit installed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SITE = HERE / "cpu_site"
IMPLS = "torch_sdpa,fault_*"
#: One correctness case and one speed case per implementation (the smoke set's).
SELECT = "(test_forward and q17-k17) or (test_speed_forward and not causal)"

#: What each implementation's tests must say in a run that ends normally: a rule and the pattern a
#: failure must match (its matching line goes into the table). "pass": every test passes; "fail":
#: every test fails so; "correctness": the correctness test fails so and the speed test passes (the
#: speed suite times a kernel, it does not check its values); "once": one test fails so (the one
#: whose worker makes the third call), the others pass.
EXPECTED: dict[str, tuple[str, str]] = {
    "torch_sdpa": ("pass", ""),
    "fault_chatty": ("pass", ""),
    "fault_child": ("pass", ""),
    "fault_exit_third": ("once", r"died while running .*: it exited with code 3"),
    "fault_segfault": ("fail", r"died while running .*: it was killed by SIGSEGV"),
    "fault_hang": ("fail", r"passed its deadline of [0-9.]+ s while running"),
    "fault_oom": ("fail", r"can't allocate memory"),
    "fault_nan": ("correctness", r"NaN/Inf values"),
    "fault_wrong_shape": ("fail", r"output: returned shape \[.*\] where the contract asks"),
    "fault_raise": ("fail", r"RuntimeError: kernel launch failed: too many resources requested"),
    "fault_modifies_input": ("fail", r"the implementation modified its input k"),
}

#: Each mode: the extra arguments, the signal sent once tests run (None: none), the exit statuses
#: it may end with, and the most seconds it may take after the signal or the first failure.
MODES: dict[str, dict] = {
    "default": {"args": [], "signal": None, "status": [1]},
    "jobs1": {"args": ["--attnkit-jobs=1"], "signal": None, "status": [1]},
    "-x": {"args": ["-x"], "signal": None, "status": [1], "within_s": 20.0},
    "-x jobs1": {"args": ["-x", "--attnkit-jobs=1"], "signal": None, "status": [1], "within_s": 20.0},
    "SIGINT": {"args": [], "signal": signal.SIGINT, "status": [2], "within_s": 15.0},
    "SIGTERM": {"args": [], "signal": signal.SIGTERM, "status": [2], "within_s": 15.0},
    # A killed run cannot remove its workers' log folder: the next run does (a run follows in its folder).
    "SIGKILL": {"args": [], "signal": signal.SIGKILL, "status": [-signal.SIGKILL], "within_s": 10.0,
                "next_run": True},
    "--lf": {"args": ["--lf"], "signal": None, "status": [1], "after": "default"},
    "node ids": {"args": [], "signal": None, "status": [1], "node_ids": ["fault_segfault", "torch_sdpa"]},
}


def _marked(mark: str) -> list[tuple[int, str]]:
    """(pid, command) of the live processes whose environment carries ``mark``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as stream:
                if f"{mark}=1".encode() not in stream.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/comm") as stream:
                found.append((int(entry), stream.read().strip()))
        except OSError:
            pass
    return found


def _size(folder: Path) -> int:
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


class Sampler:
    """The most ``folder`` held at once, sampled in a thread."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.most = folder, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            self.most = max(self.most, _size(self.folder))

    def __enter__(self) -> "Sampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _node_ids(names: list[str]) -> list[str]:
    """The node ids of the selection's correctness test for ``names``, as pytest prints them."""
    from pytest_attnkit import cases

    case = next(case.id for case in cases.correctness_cases("smoke") if "-q17-k17-" in case.id)
    return [f"pytest_attnkit/suites/test_correctness.py::test_forward[{name}-{case}]" for name in names]


def run_mode(name: str, folder: Path, timeout: float) -> dict:
    """One ``pytest --attnkit`` run as the mode says; what it said and left."""
    mode = MODES[name]
    folder.mkdir(parents=True, exist_ok=True)
    temporary = folder / "tmp"
    temporary.mkdir(exist_ok=True)
    mark = f"ATTNKIT_FAULT_MATRIX_{os.getpid()}_{re.sub(r'[^A-Za-z0-9]', '_', name)}"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(SITE), os.environ.get("PYTHONPATH")])),
               TMPDIR=str(temporary), PYTHONUNBUFFERED="1", **{mark: "1"})
    # Node ids alone start only the implementations they name (no --attnkit-impl).
    selection = _node_ids(mode["node_ids"]) if mode.get("node_ids") else [f"--attnkit-impl={IMPLS}", "-k", SELECT]
    cache = [] if mode.get("after") or name == "default" else ["-p", "no:cacheprovider"]
    command = [sys.executable, "-m", "pytest", "--attnkit", "--attnkit-device=cpu",
               "--attnkit-suite=correctness,speed", f"--attnkit-timeout={timeout:g}",
               "--attnkit-report=report", "--attnkit-baseline-dir=baselines", "--attnkit-save-baseline",
               "--benchmark-disable", "-rA", "--tb=line", "-v", *cache, *mode["args"], *selection]
    log_path = folder / "pytest.log"
    started = time.monotonic()
    signalled = failed_at = None
    with open(log_path, "wb") as log, Sampler(temporary) as sampler:
        # SIGINT as Ctrl-C finds it, even where this tool runs as a background job (which inherits
        # SIGINT ignored, and so would the run it sends SIGINT to).
        process = subprocess.Popen(command, cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT,
                                   preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        while process.poll() is None:
            text = log_path.read_text(errors="replace")
            if failed_at is None and re.search(r" FAILED( |$)", text, re.MULTILINE):
                failed_at = time.monotonic()
            if mode["signal"] is not None and signalled is None and "[fault_hang-" in text:
                time.sleep(2.0)  # into the hung call, with other requests running ahead
                signalled = time.monotonic()
                process.send_signal(mode["signal"])
            time.sleep(0.1)
        status = process.returncode
    ended = time.monotonic()
    time.sleep(1.0)  # what a worker's watchdog ends takes it half a second to notice
    deadline = time.monotonic() + 10
    while _marked(mark) and time.monotonic() < deadline:
        time.sleep(0.2)
    processes = _marked(mark)
    for pid, _ in processes:  # never leave them behind on the machine that runs the matrix
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if mode.get("next_run"):
        subprocess.run([sys.executable, "-m", "pytest", "--attnkit", "--attnkit-device=cpu", "-p", "no:cacheprovider",
                        "--attnkit-suite=correctness", "--attnkit-impl=torch_sdpa", "-k", "no_test_is_called_this"],
                       cwd=folder, env=env, capture_output=True, timeout=600)
    left_files = sorted(str(path.relative_to(folder)) for path in temporary.iterdir())
    left_files += sorted(str(path.relative_to(folder)) for path in (folder / "baselines").glob(".*.tmp")) \
        if (folder / "baselines").exists() else []
    report = folder / "report" / "attnkit-report.json"
    tests = json.loads(report.read_text())["tests"] if report.exists() and status != -signal.SIGKILL else []
    since = signalled if signalled is not None else failed_at if name.startswith("-x") else None
    return {"mode": name, "command": " ".join(command[1:]), "status": status, "wall_s": round(ended - started, 1),
            "stop_s": round(ended - since, 1) if since is not None else None,
            "left_processes": [f"{pid} {command}" for pid, command in processes], "left_files": left_files,
            "most_tmp_bytes": sampler.most, "tests": [{key: test[key] for key in ("test", "impl", "outcome", "message")}
                                                      for test in tests]}


def _said(impl: str, message: str) -> str:
    """The line of a failure that says what happened (the one the expectation matches), shortened."""
    pattern = EXPECTED.get(impl, ("", ""))[1]
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    line = next((line for line in lines if pattern and re.search(pattern, line)), lines[0] if lines else "")
    line = re.sub(r"\(pid \d+\) ", "", line)
    line = re.sub(r"^.*?: (?=the worker for )", "", line)
    line = re.sub(r"^\S+ raised on \S+ \(\w+\): ", "", line)
    line = line.split("; a fresh worker takes over")[0]
    return line if len(line) <= 100 else line[:97] + "..."


def _verdicts_hold(impl: str, tests: list[dict]) -> list[str]:
    """How ``tests`` (one implementation's, in one run) differ from :data:`EXPECTED`."""
    rule, pattern = EXPECTED[impl]
    ran = [test for test in tests if test["outcome"] != "skipped"]
    said = [test for test in ran if test["outcome"] == "failed" and re.search(pattern, test["message"])]
    passed = [test for test in ran if test["outcome"] == "passed"]
    correctness = [test for test in ran if "/test_correctness.py::" in test["test"]]
    wanted = {"pass": (passed == ran),
              "fail": (said == ran),
              "correctness": all(test in said if test in correctness else test in passed for test in ran),
              "once": (len(said) == 1 and len(passed) == len(ran) - 1) or (not ran)}[rule]
    if wanted:
        return []
    return [f"{impl}: expected {rule} {pattern!r}, got " + "; ".join(
        f"{test['test'].split('::')[-1]} {test['outcome']} {_said(impl, test['message'])}" for test in ran)]


def check(results: dict[str, dict]) -> list[str]:
    """Every way the runs differ from what the matrix promises."""
    problems = []
    for name, result in results.items():
        mode = MODES[name]
        if result["status"] not in mode["status"]:
            problems.append(f"{name}: exit status {result['status']}, expected {mode['status']}")
        if mode.get("within_s") and (result["stop_s"] is None or result["stop_s"] > mode["within_s"]):
            problems.append(f"{name}: took {result['stop_s']} s to stop, more than {mode['within_s']:g} s")
        if result["left_processes"] or result["left_files"]:
            problems.append(f"{name}: left {result['left_processes'] + result['left_files']}")
        if name in ("default", "jobs1"):
            for impl in EXPECTED:
                problems += [f"{name}: {problem}" for problem in
                             _verdicts_hold(impl, [test for test in result["tests"] if test["impl"] == impl])]
    if "default" in results and "jobs1" in results:
        # exits on its third call: which test makes the third call depends on the worker, not a verdict
        serial = {test["test"]: test["outcome"] for test in results["jobs1"]["tests"] if test["impl"] != "fault_exit_third"}
        ahead = {test["test"]: test["outcome"] for test in results["default"]["tests"]
                 if test["impl"] != "fault_exit_third"}
        if serial != ahead:
            problems.append(f"the default jobs and --attnkit-jobs=1 disagree: "
                            f"{sorted(set(serial.items()) ^ set(ahead.items()))}")
    if "-x" in results and "-x jobs1" in results and results["-x"]["wall_s"] > results["-x jobs1"]["wall_s"] + 20:
        problems.append(f"-x took {results['-x']['wall_s']} s with the default jobs, "
                        f"{results['-x jobs1']['wall_s']} s with --attnkit-jobs=1")
    if "--lf" in results and "default" in results:
        failed = sorted(test["test"] for test in results["default"]["tests"] if test["outcome"] == "failed")
        rerun = sorted(test["test"] for test in results["--lf"]["tests"] if test["outcome"] != "skipped")
        if rerun != failed:
            problems.append(f"--lf ran {rerun}, not the failed {failed}")
    if "node ids" in results:
        ran = sorted(test["test"] for test in results["node ids"]["tests"])
        if ran != sorted(_node_ids(MODES["node ids"]["node_ids"])):
            problems.append(f"node ids ran {ran}")
    return problems


def tables(results: dict[str, dict]) -> str:
    source = results.get("default") or next(iter(results.values()))
    lines = ["| implementation | test | outcome | what the harness says |", "|---|---|---|---|"]
    for test in sorted(source["tests"], key=lambda test: (test["impl"] != "torch_sdpa", test["impl"], test["test"])):
        function = test["test"].split("::")[-1].split("[")[0]
        said = _said(test["impl"], test["message"]) if test["outcome"] != "passed" else ""
        lines.append(f"| {test['impl']} | {function} | {test['outcome']} | {said.replace('|', '/')} |")
    lines += ["", "| mode | exit status | wall s | stopped in s | most in TMPDIR | left behind |",
              "|---|---|---|---|---|---|"]
    for name, result in results.items():
        left = ", ".join(result["left_processes"] + result["left_files"]) or "none"
        stop = "" if result["stop_s"] is None else f"{result['stop_s']:g}"
        lines.append(f"| {name} | {result['status']} | {result['wall_s']:g} | {stop} | "
                     f"{result['most_tmp_bytes'] / 2**20:.1f} MiB | {left} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="where to keep the runs' folders and the tables (default: a "
                                                 "temporary folder, removed after)")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of: {', '.join(MODES)}")
    parser.add_argument("--timeout", type=float, default=20.0, help="--attnkit-timeout of each run (seconds)")
    parser.add_argument("--check", action="store_true", help="exit 1 unless every promise of the matrix holds")
    args = parser.parse_args(argv)
    modes = [mode.strip() for mode in args.modes.split(",") if mode.strip()]
    unknown = [mode for mode in modes if mode not in MODES]
    if unknown:
        parser.error(f"unknown modes {unknown}; known: {', '.join(MODES)}")
    for mode in modes:
        after = MODES[mode].get("after")
        if after and after not in modes:
            parser.error(f"mode {mode!r} runs after {after!r}: give both")
    out = args.out or Path(tempfile.mkdtemp(prefix="attnkit-fault-matrix-"))
    out.mkdir(parents=True, exist_ok=True)
    results = {}
    for mode in modes:
        folder = out / (MODES[mode].get("after") or re.sub(r"[^A-Za-z0-9]+", "-", mode).strip("-"))
        results[mode] = run_mode(mode, folder, args.timeout)
        print(f"{mode}: exit {results[mode]['status']} in {results[mode]['wall_s']} s", file=sys.stderr, flush=True)
    text = tables(results)
    (out / "fault-matrix.md").write_text(text)
    (out / "fault-matrix.json").write_text(json.dumps(results, indent=1) + "\n")
    print(text)
    problems = check(results) if args.check else []
    for problem in problems:
        print(f"PROBLEM: {problem}", file=sys.stderr)
    if args.out is None:
        shutil.rmtree(out, ignore_errors=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
