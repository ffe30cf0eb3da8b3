"""The sanitize suite: each case run on guarded inputs, then in a worker under compute-sanitizer.

A read past the end of a sequence, a page or a tensor that lands in memory the kernel may read
gives the right numbers and passes every comparison; a race between warps may lose only now and
then. NVIDIA's compute-sanitizer sees much of that: its memcheck tool checks every device access
against the allocations, racecheck the shared-memory hazards, initcheck reads of memory nothing
wrote, synccheck misused barriers. Each test runs in two steps:

1. Outside the tool, in an ordinary worker: memcheck's tests run the case on plain inputs and then
   on guarded copies of them, each input inside poison (:mod:`pytest_attnkit.worker.guards`), which
   shows reads and writes past an input's end without the tool (on the CPU too) and names the
   input; the other tools' tests warm the case up. Either way what the
   implementation compiles and autotunes is then in the disk caches, and the worker under the tool
   loads it instead of compiling and tuning under the tool (torch.compile's autotuning under
   memcheck found no valid choice for FlexAttention's decoding kernel).
2. Under the tool: a worker of the implementation started as ``compute-sanitizer --tool TOOL
   --log-file FILE ... python -m pytest_attnkit.worker`` runs the case once (forward, or forward
   and backward) and exits, so that the tool writes its summary, and the tool's report is read
   (:func:`parse_report`): an error fails the test with the kernel, the access and the case. A
   warning does not: racecheck grades each race ERROR (very likely to give wrong results) or
   WARNING (a programming-model hazard that may be meant, such as warp-synchronous code), and its
   summary counts them apart (``RACECHECK SUMMARY: 1 hazard displayed (0 errors, 1 warning)``);
   warnings go into the report entry, the junit properties and, beside an error, the failure. A
   case that ran outside the tool and fails under it with no error reported is "not checked": a
   skip that says why, neither a pass nor the kernel's failure.

The worker under the tool runs with ``PYTORCH_NO_CUDA_MEMORY_CACHING=1``: torch's caching allocator
hands out pieces of larger blocks, inside which a read past a tensor's end is not out of bounds for
the tool; without the cache each tensor is an allocation of its own, which memcheck pads with
:data:`PADDING_BYTES` it reports any access to (``--padding``): a read that leaves an allocation's
rounding lands there, not in the next allocation. API errors of the CUDA runtime
(``--report-api-errors no``) are left out: libraries probe the device through calls that fail by
design, and the suite judges kernels. Both steps are the test's plan (:meth:`SanitizeCheck.plan`),
which the runner submits to the scheduler like any suite's: the second starts once the first has
ended, only if it went well, in a worker the pool starts under the tool for it alone (a request's
:class:`~pytest_attnkit.controller.process.Launch`; up to ``parallel`` of them at once) and closes
before the reply is handed on; the verdict is the test's (:meth:`SanitizeCheck.judge`). With
``--attnkit-jobs=1`` the two steps run one after the other as the test reads their replies.

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
there is none, or no CUDA device, the tool's step is skipped with the reason, and the header says
so; memcheck's tests still run the case on guarded inputs, on the CPU too, and fail what they find.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Mapping, Sequence

from pytest_attnkit.contract import Case
from pytest_attnkit.controller import footprint, table
from pytest_attnkit.controller.outcome import Judged, Judgement, Outcomes, failed, skipped
from pytest_attnkit.controller.pool import WorkerPool
from pytest_attnkit.controller.process import Launch
from pytest_attnkit.controller.runner import Runner
from pytest_attnkit.controller.suite import Planned, RunParts, Suite, SuiteContext, SuiteItem, TestSpec, verdict_of
from pytest_attnkit.controller.terminal import NO_BREAK
from pytest_attnkit.messages import Op, Reply, Request, Status

TOOLS: tuple[str, ...] = ("memcheck", "racecheck", "initcheck", "synccheck")
#: Each tool's own options beyond the common ones.
#: memcheck pads every allocation with this many bytes it reports any access to: an access that
#: leaves an allocation's rounding lands in the padding rather than in the next allocation.
PADDING_BYTES = 1 << 20
TOOL_OPTIONS = {"memcheck": ["--padding", str(PADDING_BYTES)], "racecheck": ["--racecheck-report", "all"],
                "initcheck": [], "synccheck": []}
#: How long the worker may take to exit under the tool, which writes its report as it does.
SHUTDOWN_S = 120.0
#: Error blocks shown in a failure; the log holds them all.
SHOWN_ERRORS = 3
_PREFIX = "========="
#: What a log file's name keeps of the test's implementation, case and tool; the rest becomes "_".
_UNSAFE_IN_NAME = re.compile(r"[^A-Za-z0-9._+-]")
#: memcheck's, initcheck's and synccheck's summary: ``ERROR SUMMARY: 0 errors``, ``... 1 error``.
#: Beyond ``--print-limit`` it adds ``ERROR SUMMARY: 8172 errors were not printed ...``, which is
#: not a second count (seen on an H200, 2026-11-26).
_ERROR_SUMMARY = re.compile(r"ERROR SUMMARY:\s*(\d+)\s+errors?\s*$", re.IGNORECASE)
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
        if not stripped or stripped.startswith(("COMPUTE-SANITIZER", "ERROR SUMMARY")):
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


@dataclass(frozen=True)
class SanitizeRun:
    """What one sanitize test found, gathered ahead of the test or by it: the reply of the run on
    guarded inputs (memcheck's tests) or of the warm-up outside the tool (the others), and of the
    run under the tool with the tool's report; or why the tool was not run."""

    before: Reply | None = None
    reply: Reply | None = None
    report: SanitizerReport | None = None
    log: Path | None = None
    not_run: str | None = None


@dataclass
class SanitizeCheck(Suite):
    """The sanitize suite: per test, a run outside the tool, then one under it."""

    name: ClassVar[str] = "sanitize"
    handler: ClassVar[str] = "pytest_attnkit.worker.suites.sanitize:SanitizeHandler"
    tests: ClassVar[tuple[TestSpec, ...]] = (
        TestSpec("test_sanitize", "sanitize", per_tool=True),
        TestSpec("test_sanitize_backward", "sanitize", backward=True, per_tool=True))

    pool: WorkerPool
    outcomes: Outcomes
    seed: int
    device: str
    sanitizer: str | None
    #: Where the tool's logs are kept: the report's ``sanitize/`` folder, or None for a temporary
    #: folder of their own, made by the first test (see the module docstring).
    log_dir: Path | None = None
    #: Tests gathered ahead at once (each a worker under the tool beside the others).
    parallel: int = 1
    #: ``--attnkit-sanitize``'s tools, which the header names (memcheck when none).
    tools: tuple[str, ...] = ()
    #: Every test's outcome under the tool, for the report.
    results: list[dict[str, Any]] = field(default_factory=list)
    _names: set[str] = field(default_factory=set)
    #: Each planned test's log (:meth:`plan` names it, the verdict reads it).
    _logs: dict[SuiteItem, Path] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def build(cls, context: SuiteContext, parts: RunParts) -> SanitizeCheck | None:
        """Only when selected. The tool's logs go beside the report, else into a temporary folder
        that is kept."""
        settings = context.settings
        if cls.name not in settings.suite:
            return None
        return cls(parts.pool, context.outcomes, context.seed, context.device, find_sanitizer(settings.sanitizer),
                   log_dir=settings.path("report") / "sanitize" if settings.report else None,
                   parallel=max(1, parts.jobs // 2), tools=tuple(settings.sanitize))

    def header_lines(self) -> list[str]:
        return [self.header(list(self.tools))]

    def report_sections(self, document: Mapping[str, Any]) -> dict[str, Any]:
        return {"sanitize": list(self.results)}

    def closing_lines(self, document: Mapping[str, Any]) -> list[str]:
        return kept_logs(document)

    def skip_reason(self) -> str | None:
        if self.device != "cuda":
            return "compute-sanitizer checks CUDA kernels; this run is on the CPU"
        if self.sanitizer is None:
            return ("compute-sanitizer was not found (looked on the PATH, in $CUDA_HOME/bin, $CUDA_PATH/bin "
                    "and /usr/local/cuda/bin); it comes with the CUDA toolkit")
        return None

    def header(self, tools: list[str]) -> str:
        """The header's sanitize line for the ``--attnkit-sanitize`` tools (memcheck when none)."""
        return table.sanitize_header(str(self.sanitizer), tools or ["memcheck"], self.skip_reason())

    def log_path(self, impl: str, tool: str, case: Case, *, backward: bool) -> Path:
        """Where the tool writes this test's log: a file that outlives the run (the module docstring
        says where), named after the test; a test that runs twice in one run gets ``-2``, ``-3``. A
        file of that name left by an earlier run into the same folder is removed first, so that a
        worker that never started under the tool cannot pass on the old run's summary."""
        with self._lock:
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

    # -- the suite ---------------------------------------------------------------------------
    def _first_step(self, tool: str, case: Case, backward: bool) -> Request:
        """memcheck's tests run the case on guarded inputs (pytest_attnkit/worker/guards.py); the
        others warm it up. Either way what the implementation compiles and tunes is then in the
        disk caches, which the worker under the tool reads instead of compiling under it."""
        if tool == "memcheck":
            return Request(Op.RUN, case, backward, self.seed, suite=self.name)
        return Request(Op.WARM, case, backward, self.seed)

    def plan(self, item: SuiteItem) -> list[Planned]:
        """The run outside the tool, then, if it went well, the run under the tool in a worker the
        pool starts under it for that request alone (:class:`Launch`; up to ``parallel`` at once).
        Only the first where the tool's step is not run; nothing where there is nothing to guard
        either, nor for an implementation that could not be loaded."""
        assert item.case is not None
        tool, reason = item.tool or "memcheck", self.skip_reason()
        if self.pool.info(item.impl).load_error or (reason and tool != "memcheck"):
            return []
        estimate = footprint.request_bytes(item.case, backward=item.backward, references=False, linear_memory=False)
        first = Planned(self._first_step(tool, item.case, item.backward), 3 * estimate)
        if reason:
            return [first]
        assert self.sanitizer is not None
        log = self._logs[item] = self.log_path(item.impl, tool, item.case, backward=item.backward)
        launch = Launch(tuple(command(self.sanitizer, tool, log)), {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"},
                        label=f"{item.impl}.{tool}", shutdown_timeout=SHUTDOWN_S, at_once=max(1, self.parallel))
        return [first, Planned(Request(Op.WARM, item.case, item.backward, self.seed), 3 * estimate, after=0,
                               follows=_ran, launch=launch)]

    def judge(self, item: SuiteItem, replies: Sequence[Reply | None], **fixtures: Any) -> Judgement:
        """The test's verdict from the replies to its plan."""
        assert item.case is not None and item.tool is not None
        return verdict_of(lambda properties: self.check(item.impl, item.tool, item.case, backward=item.backward,
                                                        properties=properties, replies=replies))

    def _found(self, item: SuiteItem, replies: Sequence[Reply | None]) -> SanitizeRun:
        """What the two steps found (see :class:`SanitizeRun`)."""
        reason = self.skip_reason()
        if reason and item.tool != "memcheck":
            return SanitizeRun(not_run=reason)
        outside = replies[0] if replies else None
        if outside is None:
            return SanitizeRun(not_run="the run outside the tool was cancelled: the run is stopping")
        if outside.status is not Status.OK:
            return SanitizeRun(outside)
        if reason:
            return SanitizeRun(outside, not_run=reason)
        log, reply = self._logs.pop(item), replies[1]
        if reply is None:
            return SanitizeRun(outside, not_run="the run under the tool was cancelled: the run is stopping")
        return SanitizeRun(outside, reply, parse_report(log.read_text(errors="replace") if log.exists() else ""), log)

    # -- the verdict (the test's thread) ---------------------------------------------------------
    def check(self, impl: str, tool: str, case: Case, *, backward: bool,
              properties: list[tuple[str, object]] | None = None,
              replies: Sequence[Reply | None] | None = None) -> dict[str, Any] | None:
        """Judge one test from ``replies``, the replies to its plan; without them the plan runs
        now, on this thread (:class:`~pytest_attnkit.controller.inline.InlineScheduler`)."""
        item = SuiteItem(self.name, next(spec for spec in self.tests if spec.backward == backward), impl, case, tool)
        if replies is None:
            replies = Runner({self.name: self}, self.pool, self.outcomes).replies(item)
        info = self.pool.info(impl)
        if info.load_error:
            self.outcomes.check(self.pool.broken_reply(impl), impl=impl, where=case.id, origin=info.origin)
        where = f"{case.id}{' (forward and backward)' if backward else ' (forward)'}"
        run = self._found(item, replies)
        guarded = tool == "memcheck"
        if run.before is not None and run.before.status is not Status.OK:
            self.outcomes.check(run.before, impl=impl, where=f"{where} {'with guarded inputs' if guarded else ''}".strip(),
                                 origin=info.origin)
        if run.not_run is not None:
            found = ("its inputs were guarded and nothing read or wrote past them (pytest_attnkit/worker/guards.py); "
                     if guarded and run.before is not None else "")
            raise Judged(skipped(f"{found}compute-sanitizer not run: {run.not_run}"))
        assert run.reply is not None and run.report is not None and run.log is not None
        report, log, reply = run.report, run.log, run.reply
        entry = {"impl": impl, "tool": tool, "case": case.id, "backward": backward, "errors": report.errors,
                 "reported": [list(block) for block in report.blocks[:SHOWN_ERRORS]], "warnings": report.warnings,
                 "warned": [list(block) for block in report.warning_blocks[:SHOWN_ERRORS]], "log": str(log),
                 "guarded": bool(guarded and run.before is not None and run.before.ok)}
        self.results.append(entry)
        if properties is not None:
            properties.append((f"attnkit_{tool}_errors", report.errors))
            properties.append((f"attnkit_{tool}_warnings", report.warnings))
        if report.blocks or report.errors:
            count = report.errors if report.errors is not None else len(report.blocks)
            warned = (f"\nand {report.warnings} warning(s), which alone would not fail the test:\n"
                      f"{report.describe(warnings=True)}" if report.warnings else "")
            raise Judged(failed(f"{impl} on {where}: compute-sanitizer {tool} reported {count} error(s):\n"
                        f"{report.describe()}{warned}\n(the tool's whole log: {log})"))
        if reply.status is not Status.OK:
            # It ran outside the tool a moment ago: what failed is running under the tool, which
            # says nothing of the kernel. Neither a pass nor the kernel's failure.
            entry["not_checked"] = _last_line(reply.message)
            raise Judged(skipped(f"not checked: {impl} on {where} does not run under compute-sanitizer {tool}, though it ran "
                        f"outside it: {reply.status.value}: {_last_line(reply.message)} (the tool's log: {log})"))
        if report.errors is None:
            raise Judged(failed(f"{impl} on {where}: compute-sanitizer {tool} wrote no summary (its log: {log}); the worker "
                        "may not have started under it"))
        return entry


def kept_logs(document: dict[str, Any]) -> list[str]:
    """The summary's line saying where compute-sanitizer's logs were kept, if any were (several
    folders under pytest-xdist without a report)."""
    kept = sorted({os.path.dirname(entry["log"]) for entry in document.get("sanitize", []) if entry.get("log")})
    return [f"sanitize logs:{NO_BREAK}{', '.join(kept)}"] if kept else []


def _ran(reply: Reply) -> bool:
    """Whether the run outside the tool went well, so that the run under it is worth starting."""
    return reply.status is Status.OK


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "?"
