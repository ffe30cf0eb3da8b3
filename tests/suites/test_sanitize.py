"""The sanitize suite's plumbing, on the CPU (compute-sanitizer itself needs the GPU): the report
is parsed into errors that name the kernel and the access; a worker runs its case under the tool,
exits so that the tool writes its summary, and an error fails the test while a clean report passes;
a missing tool and a CPU run say so; the options add the suite."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from pytest_attnkit.contract import Case
from pytest_attnkit.controller.outcome import Outcomes
from pytest_attnkit.controller.pool import WorkerPool
from pytest_attnkit.controller.sanitize import SanitizeCheck, command, find_sanitizer, parse_report
from pytest_attnkit.registry import EntryPointRef

from helpers import fake, judged, run_attnkit

FAKE_SANITIZER = Path(__file__).parents[1] / "fakes" / "fake_sanitizer.py"

MEMCHECK_LOG = """\
========= COMPUTE-SANITIZER
========= Invalid __global__ read of size 4 bytes
=========     at attn_fwd_varlen+0x2b0 in /src/kernels.py:212
=========     by thread (64,0,0) in block (7,3,0)
=========     Address 0x7fa2c4a00400 is out of bounds
=========     and is 1 bytes after the nearest allocation at 0x7fa2c4a00000 of size 1023 bytes
=========     Saved host backtrace up to driver entry point at kernel launch time
=========         Host Frame: [0x2e4c1f] in libcuda.so.1
=========
========= ERROR SUMMARY: 1 error
"""

RACECHECK_LOG = """\
========= COMPUTE-SANITIZER
========= Error: Race reported between Write access at attn_bwd_dq+0x1c0 in kernels.py:801
=========     and Read access at attn_bwd_dq+0x2a0 in kernels.py:812 [64 hazards]
=========
========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)
"""


def test_the_report_names_the_kernel_and_the_access() -> None:
    report = parse_report(MEMCHECK_LOG)
    assert report.errors == 1
    [block] = report.blocks
    assert block[0] == "Invalid __global__ read of size 4 bytes"
    assert "attn_fwd_varlen+0x2b0 in /src/kernels.py:212" in block[1]
    assert any("out of bounds" in line for line in block)
    assert not any("Host Frame" in line for line in block)
    race = parse_report(RACECHECK_LOG)
    assert race.errors == 1 and race.blocks[0][0].startswith("Error: Race reported between Write access")
    clean = parse_report("========= COMPUTE-SANITIZER\n========= ERROR SUMMARY: 0 errors\n")
    assert clean.errors == 0 and clean.blocks == ()
    assert parse_report("").errors is None


def test_errors_past_the_print_limit_are_counted_once_and_not_taken_for_an_error() -> None:
    """Over ``--print-limit`` memcheck adds a line that starts like the summary (H200, 2026-11-26)."""
    log = MEMCHECK_LOG.replace("ERROR SUMMARY: 1 error", "ERROR SUMMARY: 8192 errors\n"
                               "========= ERROR SUMMARY: 8191 errors were not printed. Use --print-limit option to "
                               "adjust the number of printed errors")
    report = parse_report(log)
    assert report.errors == 8192
    assert [block[0] for block in report.blocks] == ["Invalid __global__ read of size 4 bytes"]


RACECHECK_WARNING_LOG = """\
========= COMPUTE-SANITIZER
========= Warning: Race reported between Read access at attn_fwd_split+0x7600 in kernels.py:418
=========     and Write access at attn_fwd_split+0x63d0 in kernels.py:416 [2048 hazards]
=========
========= RACECHECK SUMMARY: 1 hazard displayed (0 errors, 1 warning)
"""


def test_racecheck_s_warnings_are_counted_apart_from_its_errors() -> None:
    """racecheck's summary counts every hazard, warnings among them; only its errors are errors."""
    report = parse_report(RACECHECK_WARNING_LOG)
    assert (report.errors, report.warnings, report.blocks) == (0, 1, ())
    assert report.warning_blocks[0][0].startswith("Warning: Race reported between Read access")
    both = parse_report(RACECHECK_LOG.replace("(1 error, 0 warnings)", "(1 error, 2 warnings)")
                        .replace("1 hazard displayed", "3 hazards displayed"))
    assert (both.errors, both.warnings) == (1, 2)
    hazards = parse_report("========= ERROR: Potential WAW hazard detected at __shared__ 0x0 in block (0,0,0) :\n"
                           "=========     Write Thread (0,0,0) at WAW+0x2f0 in race.cu:20\n"
                           "========= WARNING: Potential RAW hazard detected at __shared__ 0x8 in block (0,0,0) :\n"
                           "=========     Write Thread (1,0,0) at RAW+0x2f0 in race.cu:20\n"
                           "========= RACECHECK SUMMARY: 2 hazards displayed (1 error, 1 warning)\n")
    assert (hazards.errors, len(hazards.blocks), hazards.warnings, len(hazards.warning_blocks)) == (1, 1, 1, 1)
    assert parse_report("========= RACECHECK SUMMARY: 2 hazards\n").errors == 2  # no brackets: every hazard


def test_the_command_runs_the_worker_under_the_tool(tmp_path: Path) -> None:
    line = command("/opt/cuda/bin/compute-sanitizer", "racecheck", tmp_path / "log")
    assert line[:3] == ["/opt/cuda/bin/compute-sanitizer", "--tool", "racecheck"]
    assert ["--report-api-errors", "no"] == line[line.index("--report-api-errors"):line.index("--report-api-errors") + 2]
    assert "--racecheck-report" in line


def test_a_missing_tool_and_a_cpu_run_say_so(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    monkeypatch.delenv("CUDA_PATH", raising=False)
    assert find_sanitizer("") in (None, "/usr/local/cuda/bin/compute-sanitizer")
    assert find_sanitizer(str(tmp_path / "nothing-here")) is None
    missing = SanitizeCheck(None, Outcomes(), 0, "cuda", None)  # type: ignore[arg-type]
    assert "compute-sanitizer was not found" in (missing.skip_reason() or "")
    on_cpu = SanitizeCheck(None, Outcomes(), 0, "cpu", "/usr/bin/true")  # type: ignore[arg-type]
    assert "on the CPU" in (on_cpu.skip_reason() or "")


@pytest.fixture
def fake_site(pytester: pytest.Pytester, fake_dist) -> Path:
    return fake_dist({"good": fake("good")})


def _sanitized(fake_site: Path, monkeypatch: pytest.MonkeyPatch, errors: int,
               log_dir: Path | None = None) -> tuple[SanitizeCheck, WorkerPool]:
    monkeypatch.setenv("FAKE_SANITIZER_ERRORS", str(errors))
    monkeypatch.syspath_prepend(str(fake_site))  # the workers see this process's sys.path
    # The temporary folders the check keeps its logs in, without a report, are the test's, not left in /tmp.
    (fake_site.parent / "tmp").mkdir(exist_ok=True)
    monkeypatch.setattr(tempfile, "tempdir", str(fake_site.parent / "tmp"))
    pool = WorkerPool(device="cpu", timeout=120)
    pool.start([EntryPointRef("good", "fake_kernels:good", "fake-kernels")], handlers={"sanitize": SanitizeCheck.handler})
    # device "cuda" for the check's own gate only: the fake tool runs the worker on the CPU.
    return SanitizeCheck(pool, Outcomes(), 0, "cuda", str(FAKE_SANITIZER), log_dir=log_dir), pool


def test_an_error_the_tool_reports_fails_the_test_with_the_kernel_and_the_case(
        fake_site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    check, pool = _sanitized(fake_site, monkeypatch, errors=2)
    case = Case(1, 2, 2, 17, 17, 32, "float16", causal=True)
    try:
        with judged("failed") as failure:
            check.check("good", "memcheck", case, backward=False)
    finally:
        pool.close()
    text = str(failure.value)
    assert "good on b1-h2-q17-k17-d32-fp16-causal (forward): compute-sanitizer memcheck reported 2 error(s)" in text
    assert "Invalid __global__ read of size 2 bytes" in text and "attn_fwd+0x1f0 in kernels.py:120" in text
    assert check.results[0]["errors"] == 2


def test_a_clean_report_passes(fake_site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    check, pool = _sanitized(fake_site, monkeypatch, errors=0)
    try:
        entry = check.check("good", "memcheck", Case(1, 2, 2, 17, 17, 32, "float16"), backward=False)
    finally:
        pool.close()
    assert entry["errors"] == 0 and entry["reported"] == [] and entry["guarded"]
    # The guarded run outside the tool and the run under it ("warm" in the worker): the time table
    # counts both as the suite's own.
    assert [(row["suite"], row["requests"]) for row in pool.ledger.to_dict()["rows"]] == [("sanitize", 2)]


def test_a_racecheck_warning_alone_passes_and_is_reported(fake_site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_SANITIZER_WARNINGS", "1")
    check, pool = _sanitized(fake_site, monkeypatch, errors=0)
    case = Case(1, 2, 2, 17, 17, 32, "float16")
    properties: list[tuple[str, object]] = []
    try:
        entry = check.check("good", "racecheck", case, backward=False, properties=properties)
        monkeypatch.setenv("FAKE_SANITIZER_ERRORS", "1")
        with judged("failed") as failure:
            check.check("good", "racecheck", case, backward=False)
    finally:
        pool.close()
    assert (entry["errors"], entry["reported"], entry["warnings"]) == (0, [], 1)
    assert entry["warned"][0][0].startswith("Warning: Race reported between Write access")
    assert ("attnkit_racecheck_warnings", 1) in properties
    text = str(failure.value)
    assert "compute-sanitizer racecheck reported 1 error(s):\nError: Race reported" in text
    assert "and 1 warning(s), which alone would not fail the test:\nWarning: Race reported" in text


def test_the_tool_s_log_outlives_the_run(fake_site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a report folder the log is kept in a temporary folder of its own: the pool's folder
    of worker logs is removed when the run ends, and with it a log the failure pointed at."""
    check, pool = _sanitized(fake_site, monkeypatch, errors=1)
    try:
        with judged("failed") as failure:
            check.check("good", "memcheck", Case(1, 2, 2, 17, 17, 32, "float16"), backward=False)
    finally:
        pool.close()
    log = Path(check.results[0]["log"])
    assert f"(the tool's whole log: {log})" in str(failure.value)
    assert log.is_file() and "ERROR SUMMARY: 1 error" in log.read_text()
    assert log.parent.parent == Path(tempfile.gettempdir()) and log.parent.name.startswith("attnkit-sanitize-")
    assert not pool.log_dir.exists()


def test_with_a_report_the_logs_go_beside_it_named_after_the_test(fake_site: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path) -> None:
    kept = tmp_path / "out" / "sanitize"
    check, pool = _sanitized(fake_site, monkeypatch, errors=0, log_dir=kept)
    case = Case(1, 4, 2, 17, 17, 32, "float16")
    try:
        for _ in range(2):
            check.check("good", "memcheck", case, backward=False)
    finally:
        pool.close()
    # The ":" of h4:2 would not do in a file name on Windows or in a CI artifact.
    assert [entry["log"] for entry in check.results] == [str(kept / "good-b1-h4_2-q17-k17-d32-fp16-memcheck.log"),
                                                         str(kept / "good-b1-h4_2-q17-k17-d32-fp16-memcheck-2.log")]
    assert all(Path(entry["log"]).is_file() for entry in check.results)


def test_a_log_left_by_an_earlier_run_is_removed_before_the_tool_starts(tmp_path: Path) -> None:
    """Else a worker that never started under the tool would pass on the old run's clean summary."""
    stale = tmp_path / "good-b1-h2-q17-k17-d32-fp16-memcheck-backward.log"
    stale.write_text("========= ERROR SUMMARY: 0 errors\n")
    check = SanitizeCheck(None, Outcomes(), 0, "cuda", "/usr/bin/true", log_dir=tmp_path)  # type: ignore[arg-type]
    assert check.log_path("good", "memcheck", Case(1, 2, 2, 17, 17, 32, "float16"), backward=True) == stale
    assert not stale.exists()


def test_the_session_keeps_the_logs_in_the_report_folder(pytester: pytest.Pytester) -> None:
    from pytest_attnkit.controller.session import SESSION_KEY

    recorder = pytester.inline_run("--attnkit", "-p", "no:cacheprovider", "--attnkit-suite=sanitize",
                                   "--attnkit-impl=torch_sdpa", "--attnkit-report=out", "--collect-only")
    [call] = recorder.getcalls("pytest_sessionfinish")
    assert call.session.config.stash[SESSION_KEY].suites["sanitize"].log_dir == pytester.path / "out" / "sanitize"


def test_the_options_add_the_suite_with_its_tools(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--attnkit", "-p", "no:cacheprovider", "--attnkit-sanitize=memcheck,initcheck",
                                "--attnkit-impl=torch_sdpa", "--collect-only", "-q", "-k", "sanitize")
    result.stdout.fnmatch_lines(["*test_sanitize[[]torch_sdpa-*-memcheck[]]*", "*test_sanitize[[]torch_sdpa-*-initcheck[]]*"])
    bad = pytester.runpytest("--attnkit", "--attnkit-sanitize=valgrind")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*unknown compute-sanitizer tool 'valgrind'*"])


def _gpu_and_tool() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available() and find_sanitizer("") is not None


@pytest.mark.skipif(not _gpu_and_tool(), reason="needs a CUDA device and compute-sanitizer (a GPU machine)")
def test_planted_reads_past_an_input_and_past_a_kernel_s_own_buffer_are_caught_on_the_gpu(
        pytester: pytest.Pytester, fake_dist, monkeypatch: pytest.MonkeyPatch) -> None:
    """The planted kernels of tests/fakes/sanitize_kernels.py, each right on the sanitize suite's
    case: one row past k and v (the guarded inputs catch it first), a tile past k (only into
    masked scores: memcheck catches it, with the suite's padding), a tile past a copy of k the
    kernel allocates itself (memcheck again); the honest kernel passes. (On an H100 one_row_past
    also failed one correctness case: its row past v landed in memory the harness had filled
    with NaN, 2026-11-26.)"""
    source = (Path(__file__).parents[1] / "fakes" / "sanitize_kernels.py").read_text()
    names = {"honest_varlen": "HonestVarlen", "one_row_past": "OneRowPast", "tile_past_k": "TilePastK",
             "tile_past_own_k": "TilePastOwnK"}
    site = fake_dist({name: f"sanitize_kernels:{cls}" for name, cls in names.items()},
                     extra_modules={"sanitize_kernels": source})
    # The inner run is a subprocess of its own (the GPU's python3 may be another interpreter than
    # the one the workers start from): the fake distribution must be on its path too.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))
    result = pytester.runpytest_subprocess("--attnkit", "-p", "no:cacheprovider", "--attnkit-suite=correctness,sanitize",
                                           f"--attnkit-impl={','.join(names)}", "-k", "varlen and test_forward "
                                           "or varlen and test_sanitize", "-rA")
    result.stdout.fnmatch_lines(["*PASSED*test_forward[[]one_row_past-*varlen*",  # right numbers on the day
                                 "*PASSED*test_forward[[]tile_past_k-*varlen*",
                                 "*PASSED*test_forward[[]tile_past_own_k-*varlen*"])
    result.stdout.fnmatch_lines(["*PASSED*test_sanitize[[]honest_varlen-*varlen*"])
    for name in ("one_row_past", "tile_past_k", "tile_past_own_k"):
        result.stdout.fnmatch_lines([f"*FAILED*test_sanitize[[]{name}-*varlen*"])
    # Each failure's section, in the tests' order, says what caught it.
    # (The message wraps at 100 columns where the name is long: "compute-sanitizer" may end a line.)
    result.stdout.fnmatch_lines(["*_ test_sanitize[[]one_row_past-*", "*reads past the end (or before the start) of v*",
                                 "*_ test_sanitize[[]tile_past_k-*", "*memcheck reported * error(s):",
                                 "*_ test_sanitize[[]tile_past_own_k-*", "*memcheck reported * error(s):"])
    result.stdout.fnmatch_lines(["*sanitize logs:*attnkit-sanitize-*"])  # kept after the run: no report folder


def test_guarded_inputs_catch_a_read_and_a_write_past_an_input_on_the_cpu(pytester: pytest.Pytester,
                                                                          fake_dist) -> None:
    """memcheck's tests run each case on guarded inputs first (pytest_attnkit/worker/guards.py), on
    the CPU too: a kernel whose numbers are right but that reads one row past the end of v, or
    writes past the end of q, fails, naming the input; an honest one is skipped only for the tool."""
    fake_dist({name: fake(name) for name in ("good", "reads_past_v", "writes_past_q")})
    outcomes, _ = run_attnkit(pytester, "--attnkit-suite=sanitize,correctness", "--attnkit-impl=good,reads_past_v,writes_past_q",
                              "-k", "q113-k203 and not backward")
    by_impl = {name.split("[")[1].split("-")[0]: outcome for name, outcome in outcomes.items() if "sanitize" in name}
    assert by_impl["good"].outcome == "skipped", by_impl["good"].text
    assert "its inputs were guarded and nothing read or wrote past them" in by_impl["good"].text
    assert by_impl["reads_past_v"].outcome == "failed"
    assert "reads past the end (or before the start) of v" in by_impl["reads_past_v"].text
    assert by_impl["writes_past_q"].outcome == "failed"
    assert "writes past the end (or before the start) of its input q" in by_impl["writes_past_q"].text
    # ... while their numbers are right
    correct = {name: outcome.outcome for name, outcome in outcomes.items() if name.startswith("test_forward[")}
    assert "passed" in correct.values() and set(correct.values()) <= {"passed", "skipped"}, correct
