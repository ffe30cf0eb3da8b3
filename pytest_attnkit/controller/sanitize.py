"""The sanitize suite's check: each case run once in a worker started under compute-sanitizer.

A read past the end of a sequence, a page or a tensor that lands in memory the kernel may read
gives the right numbers and passes every comparison; a race between warps may lose only now and
then. NVIDIA's compute-sanitizer sees both: its memcheck tool checks every device access against
the allocations, racecheck the shared-memory hazards, initcheck reads of memory nothing wrote,
synccheck misused barriers. Each test starts a worker of the implementation under the tool
(``compute-sanitizer --tool TOOL --log-file FILE ... python -m pytest_attnkit.worker``), runs
the case once (forward, or forward and backward), asks the worker to exit so that the tool writes
its summary, and reads the tool's report (:func:`parse_report`): an error fails the test with
the kernel, the access and the case. A warning does not: racecheck grades each race ERROR (very
likely to give wrong results) or WARNING (a programming-model hazard that may be meant, such as
warp-synchronous code), and its summary counts them apart (``RACECHECK SUMMARY: 1 hazard displayed
(0 errors, 1 warning)``); warnings go into the report entry, the junit properties and, beside an
error, the failure.

The worker runs with ``PYTORCH_NO_CUDA_MEMORY_CACHING=1``: torch's caching allocator hands out
pieces of larger blocks, inside which a read past a tensor's end is not out of bounds for the
tool; without the cache each tensor is an allocation of its own. API errors of the CUDA runtime
(``--report-api-errors no``) are left out: libraries probe the device through calls that fail
by design, and the suite judges kernels.

The tool writes its log straight into a folder that outlives the run, so that the path a failure
and the report's ``sanitize[].log`` name is there when the user looks, even after a crash or a
kill mid-test (:meth:`SanitizeCheck.log_path`): with ``--attnkit-report=DIR``, ``DIR/sanitize/``,
beside the report that names it, one file per test named ``<impl>-<case>-<tool>[-backward].log``
(characters a file name or a CI artifact cannot hold, such as the ``:`` of ``h4:2``, become ``_``);
without a report, a folder ``attnkit-sanitize-*`` of its own in the temporary directory, made by
the first test and never removed. Not the pool's folder of worker logs (``pool.log_dir``), which
the run removes as it ends.

The tool is ``--attnkit-sanitizer``, else ``compute-sanitizer`` on the PATH, in
``$CUDA_HOME/bin``, ``$CUDA_PATH/bin`` or ``/usr/local/cuda/bin`` (:func:`find_sanitizer`). Where
there is none, or no CUDA device, every test is skipped with the reason, and the header says so.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pytest_attnkit.contract import Case
from pytest_attnkit.controller.outcome import Outcomes
from pytest_attnkit.controller.pool import WorkerPool
from pytest_attnkit.records import Status

TOOLS: tuple[str, ...] = ("memcheck", "racecheck", "initcheck", "synccheck")
#: Each tool's own options beyond the common ones.
TOOL_OPTIONS = {"memcheck": [], "racecheck": ["--racecheck-report", "all"], "initcheck": [], "synccheck": []}
#: How long the worker may take to exit under the tool, which writes its report as it does.
SHUTDOWN_S = 120.0
#: Error blocks shown in a failure; the log holds them all.
SHOWN_ERRORS = 3
_PREFIX = "========="
#: What a log file's name keeps of the test's implementation, case and tool; the rest becomes "_".
_UNSAFE_IN_NAME = re.compile(r"[^A-Za-z0-9._+-]")
#: memcheck's, initcheck's and synccheck's summary: ``ERROR SUMMARY: 0 errors``, ``... 1 error``.
_ERROR_SUMMARY = re.compile(r"ERROR SUMMARY:\s*(\d+)\s+errors?", re.IGNORECASE)
#: racecheck's: ``RACECHECK SUMMARY: 1 hazard displayed (0 errors, 1 warning)``; the hazards are the
#: errors and warnings together, so without the counts in brackets every hazard counts as an error.
_RACECHECK_SUMMARY = re.compile(r"RACECHECK SUMMARY:\s*(\d+)\s+hazards?(?:\s+displayed)?"
                                r"(?:\s*\(\s*(\d+)\s+errors?,\s*(\d+)\s+warnings?\s*\))?", re.IGNORECASE)


def find_sanitizer(setting: str) -> str | None:
    """The compute-sanitizer to run: ``setting`` (a path), else the first one found."""
    if setting:
        return setting if (os.path.isfile(setting) or shutil.which(setting)) else None
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and os.path.isfile(os.path.join(root, "bin", "compute-sanitizer")):
            return os.path.join(root, "bin", "compute-sanitizer")
    return None


def command(sanitizer: str, tool: str, log: Path) -> list[str]:
    """The launcher a sanitized worker starts under."""
    return [sanitizer, "--tool", tool, "--log-file", str(log), "--print-limit", "20", "--report-api-errors", "no",
            "--error-exitcode", "97", *TOOL_OPTIONS[tool]]


@dataclass(frozen=True)
class SanitizerReport:
    """What the tool reported: its error count (None when it wrote no summary) and each error as
    the lines that describe it (the message, the kernel and place, the thread, the address); and
    apart from them the warnings, which do not fail a test: their count (racecheck's summary's,
    else the warning blocks in the log) and blocks."""

    errors: int | None
    blocks: tuple[tuple[str, ...], ...]
    warnings: int = 0
    warning_blocks: tuple[tuple[str, ...], ...] = ()

    def describe(self, shown: int = SHOWN_ERRORS, *, warnings: bool = False) -> str:
        """The first ``shown`` errors (or warnings), each block's lines under its message."""
        blocks = self.warning_blocks if warnings else self.blocks
        lines = []
        for block in blocks[:shown]:
            lines += [block[0], *(f"    {line}" for line in block[1:])]
        if len(blocks) > shown:
            lines.append(f"... and {len(blocks) - shown} more in the log")
        return "\n".join(lines)


def parse_report(text: str) -> SanitizerReport:
    """compute-sanitizer's log: every error and warning block and the summary's counts. A block
    starts with a message line (``========= Invalid __global__ read of size 4 bytes``) and goes on
    with the indented lines under it; host backtraces are left out. A message whose first word is
    racecheck's severity ``Warning`` (``WARNING:`` or ``WARN:`` in hazard reports) starts a warning;
    every other message an error. Errors are what the summary counts as such: ``ERROR SUMMARY``'s count,
    and of ``RACECHECK SUMMARY``'s hazards only the errors in its brackets."""
    errors: int | None = None
    summary_warnings: int | None = None
    blocks: list[list[str]] = []
    warning_blocks: list[list[str]] = []
    current: list[str] | None = None
    for raw in text.splitlines():
        if not raw.startswith(_PREFIX):
            continue
        body = raw[len(_PREFIX):]
        race, error_summary = _RACECHECK_SUMMARY.search(body), _ERROR_SUMMARY.search(body)
        if race or error_summary:
            if race and race.group(2) is not None:
                found, warned = int(race.group(2)), int(race.group(3))
                summary_warnings = (summary_warnings or 0) + warned
            else:
                found = int(race.group(1) if race else error_summary.group(1))  # type: ignore[union-attr]
            errors = found if errors is None else errors + found
            current = None
            continue
        stripped = body.strip()
        if not stripped or stripped.startswith("COMPUTE-SANITIZER"):
            current = None
            continue
        if not body.startswith("  "):  # a message: a new block
            current = [stripped]
            (warning_blocks if stripped.lower().startswith("warn") else blocks).append(current)
        elif current is not None and len(current) < 6 and not stripped.startswith(("Host Frame", "Saved host")):
            current.append(stripped)
    warnings = summary_warnings if summary_warnings is not None else len(warning_blocks)
    return SanitizerReport(errors, tuple(tuple(block) for block in blocks), warnings,
                           tuple(tuple(block) for block in warning_blocks))


@dataclass
class SanitizeCheck:
    pool: WorkerPool
    outcomes: Outcomes
    seed: int
    device: str
    sanitizer: str | None
    #: Where the tool's logs are kept: the report's ``sanitize/`` folder, or None for a temporary
    #: folder of their own, made by the first test (see the module docstring).
    log_dir: Path | None = None
    #: Every test's outcome under the tool, for the report.
    results: list[dict[str, Any]] = field(default_factory=list)
    _names: set[str] = field(default_factory=set)

    def skip_reason(self) -> str | None:
        if self.device != "cuda":
            return "compute-sanitizer checks CUDA kernels; this run is on the CPU"
        if self.sanitizer is None:
            return ("compute-sanitizer was not found (looked on the PATH, in $CUDA_HOME/bin, $CUDA_PATH/bin "
                    "and /usr/local/cuda/bin); it comes with the CUDA toolkit")
        return None

    def log_path(self, impl: str, tool: str, case: Case, *, backward: bool) -> Path:
        """Where the tool writes this test's log: a file that outlives the run (the module docstring
        says where), named after the test; a test that runs twice in one run gets ``-2``, ``-3``. A
        file of that name left by an earlier run into the same folder is removed first, so that a
        worker that never started under the tool cannot pass on the old run's summary."""
        if self.log_dir is None:
            self.log_dir = Path(tempfile.mkdtemp(prefix="attnkit-sanitize-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        stem = _UNSAFE_IN_NAME.sub("_", f"{impl}-{case.id}-{tool}{'-backward' if backward else ''}")
        name, again = f"{stem}.log", 1
        while name in self._names:
            again += 1
            name = f"{stem}-{again}.log"
        self._names.add(name)
        log = self.log_dir / name
        log.unlink(missing_ok=True)
        return log

    def check(self, impl: str, tool: str, case: Case, *, backward: bool,
              properties: list[tuple[str, object]] | None = None) -> dict[str, Any]:
        reason = self.skip_reason()
        if reason:
            pytest.skip(reason)
        assert self.sanitizer is not None
        info = self.pool.info(impl)
        if info.load_error:
            self.outcomes.settle(self.pool.broken_reply(impl), impl=impl, where=case.id, origin=info.origin)
        log = self.log_path(impl, tool, case, backward=backward)
        worker = self.pool.worker_under(impl, command(self.sanitizer, tool, log),
                                        env={"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"},
                                        label=f"{impl}.{tool}", shutdown_timeout=SHUTDOWN_S)
        try:
            reply = self.pool.request(impl, {"op": "warm", "case": case.to_dict(), "backward": backward,
                                             "seed": self.seed}, worker=worker, suite="sanitize")
        finally:
            worker.close()  # the tool writes its summary as the worker exits
        report = parse_report(log.read_text(errors="replace") if log.exists() else "")
        where = f"{case.id}{' (forward and backward)' if backward else ' (forward)'}"
        entry = {"impl": impl, "tool": tool, "case": case.id, "backward": backward, "errors": report.errors,
                 "reported": [list(block) for block in report.blocks[:SHOWN_ERRORS]], "warnings": report.warnings,
                 "warned": [list(block) for block in report.warning_blocks[:SHOWN_ERRORS]], "log": str(log)}
        self.results.append(entry)
        if properties is not None:
            properties.append((f"attnkit_{tool}_errors", report.errors))
            properties.append((f"attnkit_{tool}_warnings", report.warnings))
        if report.blocks or report.errors:
            count = report.errors if report.errors is not None else len(report.blocks)
            warned = (f"\nand {report.warnings} warning(s), which alone would not fail the test:\n"
                      f"{report.describe(warnings=True)}" if report.warnings else "")
            pytest.fail(f"{impl} on {where}: compute-sanitizer {tool} reported {count} error(s):\n"
                        f"{report.describe()}{warned}\n(the tool's whole log: {log})", pytrace=False)
        if reply.status is not Status.OK:
            self.outcomes.settle(reply, impl=impl, where=f"{where} under compute-sanitizer {tool}", origin=info.origin)
        if report.errors is None:
            pytest.fail(f"{impl} on {where}: compute-sanitizer {tool} wrote no summary (its log: {log}); the worker "
                        "may not have started under it", pytrace=False)
        return entry
