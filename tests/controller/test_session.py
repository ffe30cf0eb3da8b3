"""The session (pytest_attnkit/controller/session.py), driven directly, as the plugin drives it: on
the CPU, with real worker processes. It builds the suites a run selects through their own
``Suite.build`` and knows none of them by name; it asks them for the header's lines and the
report's sections; a baseline file it cannot read is a usage error naming the file; and closing
it leaves no worker behind."""

from __future__ import annotations

import ast
import json
import time
from pathlib import Path

import pytest

from pytest_attnkit.controller import options, session as session_module
from pytest_attnkit.controller.discovery import BUNDLED
from pytest_attnkit.controller.pool import WorkerPool
from pytest_attnkit.controller.session import AttnkitSession
from pytest_attnkit.messages import Op, Request
from pytest_attnkit.registry import EntryPointRef

SMALL = ("--attnkit-impl=torch_sdpa", "--attnkit-jobs=2", "--attnkit-device=cpu")


def _session(pytester: pytest.Pytester, *args: str) -> AttnkitSession:
    config = pytester.parseconfig("--attnkit", *SMALL, *args)
    return AttnkitSession(options.resolve(config), config)


def _workers_alive(session: AttnkitSession) -> list:
    return _workers_alive_in(session.pool)


def test_the_session_names_no_suite_and_imports_none() -> None:
    """Issue 45: the session wires the suites and knows none of them by name."""
    tree = ast.parse(Path(session_module.__file__).read_text(encoding="utf-8"))
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    suite_modules = {BUNDLED[name].__module__ for name in BUNDLED}
    assert not imported & suite_modules, imported & suite_modules
    names = [node.value for node in ast.walk(tree)
             if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in BUNDLED]
    assert names == [], names


def test_it_builds_the_selected_suites_asks_them_for_the_header_and_the_report_and_closes_its_workers(
        pytester: pytest.Pytester, tmp_path: Path) -> None:
    session = _session(pytester, "--attnkit-suite=correctness,speed", f"--attnkit-baseline-dir={tmp_path}",
                       f"--attnkit-report={tmp_path / 'report'}")
    try:
        session.start()
        # Speed and sanitize take part only when selected; the others always (in this order).
        assert list(session.suites) == ["correctness", "memory", "properties", "speed"]
        assert all(session.suites[name].name == name for name in session.suites)
        header = "\n".join(session.header_lines())
        assert "attnkit: gate: " in header and "sanitize" not in header, header
        assert _workers_alive(session)
        lines = session.finish(0)
    finally:
        session.close()
    assert not _workers_alive(session)
    document = json.loads((tmp_path / "report" / "attnkit-report.json").read_text())
    # Every section is there, filled by its suite or empty: the report's shape is fixed.
    for key in ("tests", "memory", "properties", "sanitize", "speed", "ab", "time"):
        assert key in document, key
    assert document["speed"]["baseline_file"].startswith(str(tmp_path)), document["speed"]
    assert any("attnkit-report.json" in line for line in lines), lines


def test_once_the_tests_end_the_workers_end_while_the_report_is_written(pytester: pytest.Pytester,
                                                                       tmp_path: Path) -> None:
    """Their CUDA contexts take a second or two to tear down: the last 2.8 s of a fresh H200's run
    came after its last line (results/2026-12-02-session28). The report still has each first
    worker's start-up, read before they went."""
    session = _session(pytester, "--attnkit-suite=correctness", f"--attnkit-report={tmp_path / 'report'}")
    try:
        session.start()
        assert _workers_alive(session)
        session.release_workers()
        deadline = time.monotonic() + 60
        while _workers_alive(session) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _workers_alive(session)  # ended without close(), before the report is built
        session.finish(0)
        startups = json.loads((tmp_path / "report" / "attnkit-report.json").read_text())["time"]["startup_s"]
        assert set(startups) == {"torch_sdpa"} and startups["torch_sdpa"] > 0, startups
    finally:
        session.close()
    assert not _workers_alive(session)


def test_without_speed_there_is_no_gate_line_and_an_empty_speed_section(pytester: pytest.Pytester) -> None:
    session = _session(pytester, "--attnkit-suite=correctness")
    try:
        session.start()
        assert "speed" not in session.suites and "sanitize" not in session.suites
        assert not any("gate:" in line for line in session.header_lines())
        session.finish(0)
        assert session.document is not None
        assert session.document["speed"]["measurements"] == [] and session.document["ab"] == []
    finally:
        session.close()


def test_a_baseline_file_it_cannot_read_stops_the_run_naming_it(pytester: pytest.Pytester, tmp_path: Path) -> None:
    # The CPU's baseline file: the environment probe names the device; any name's file is read the same way.
    session = _session(pytester, "--attnkit-suite=speed", f"--attnkit-baseline-dir={tmp_path}")
    try:
        session._probe_environment()
        device = str(session.environment.get("device_name", "unknown"))
    finally:
        session.close()
    from pytest_attnkit.controller.baselines import baseline_path

    broken = baseline_path(tmp_path, device)
    broken.write_text("{not json", encoding="utf-8")
    session = _session(pytester, "--attnkit-suite=speed", f"--attnkit-baseline-dir={tmp_path}")
    try:
        with pytest.raises(pytest.UsageError, match=f"attnkit: baseline file {broken} cannot be read"):
            session.start()
    finally:
        session.close()
    assert not _workers_alive(session)


@pytest.mark.parametrize("guess", ["cpu", "cuda"])
def test_the_first_workers_start_beside_the_probe_and_again_when_the_guess_was_wrong(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, guess: str) -> None:
    """The implementations' first workers start while the probe runs, for the device the session
    guesses (session 12's H100s: 6-8 s of probe, then 12 s until they were ready). Guessed right
    (here the CPU), each starts once and the probe is done by the time they are ready or soon
    after; guessed wrong (a GPU that torch does not see), they are stopped and started again with
    the probe's device and its settings (Triton's interpreter on the CPU), and none is left alive."""
    monkeypatch.setattr(AttnkitSession, "_likely_device", lambda self: guess)
    config = pytester.parseconfig("--attnkit", "--attnkit-impl=torch_sdpa", "--attnkit-jobs=2")  # device auto
    session = AttnkitSession(options.resolve(config), config)
    first_pool = session.pool
    try:
        session.start()
        assert session.device == "cpu" and session.pool.device == "cpu"
        assert session.pool.env.get("TRITON_INTERPRET") == "1"
        primary = session.pool.primary("torch_sdpa")
        assert primary.alive and primary.init["device"] == "cpu"
        marks = session.pool.ledger.marks
        assert {"probed", "started"} <= set(marks)
        if guess == "cpu":
            assert session.pool is first_pool and primary.starts == 1
        else:
            assert session.pool is not first_pool and not _workers_alive_in(first_pool)
            assert marks["started"] >= marks["probed"]  # the second start's, after the probe
        assert session.pool.info("torch_sdpa").load_error is None
    finally:
        session.close()
    assert not _workers_alive(session)


def _workers_alive_in(pool) -> list:
    every = {id(worker): worker for worker in [*pool._workers.values(), *pool._all]}
    return [worker for worker in every.values() if worker.alive]


def test_the_guess_follows_the_device_asked_for_and_what_torch_could_see(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    def guess(*args: str) -> str | None:
        config = pytester.parseconfig("--attnkit", *args)
        return AttnkitSession(options.resolve(config), config)._likely_device()

    monkeypatch.setattr(session_module, "GPU_DEVICE_NODES", (str(pytester.path),))  # a path that exists
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert guess() == "cuda" and guess("--attnkit-device=cpu") == "cpu"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert guess() == "cpu" and guess("--attnkit-device=cuda") == "cuda"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.setattr(session_module, "GPU_DEVICE_NODES", (str(pytester.path / "no-such-node"),))
    assert guess() == "cpu"
    assert guess("--attnkit-inprocess") is None  # the probe decides first


@pytest.mark.parametrize("omp", [None, "1"])
def test_the_extra_workers_interpreters_start_with_the_first_workers(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, omp: str | None) -> None:
    """With requests side by side, the extra workers' interpreters (spares) start beside the
    first workers, one for each job the implementations' first workers leave, with the extra
    workers' environment; only an extra worker takes one (with OMP_NUM_THREADS set outside, the
    primaries' environment is the extras' too); closing the session ends those not taken."""
    if omp is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", omp)
    monkeypatch.setattr(AttnkitSession, "_usable_cores", lambda self: 8)  # cores to spare for them
    config = pytester.parseconfig("--attnkit", "--attnkit-impl=torch_sdpa", "--attnkit-jobs=4", "--attnkit-device=cpu")
    session = AttnkitSession(options.resolve(config), config)
    try:
        session.start()
        spares = session.pool.spares
        assert spares.waiting == 3  # the primary did not take one
        env = {**session.pool.env, **session.pool.extra_env}
        assert ("OMP_NUM_THREADS" in session.pool.extra_env) is (omp is None)
        assert all(their == env for their, _ in spares._waiting)
        pids = {spawned.process.pid for _, spawned in spares._waiting}
        extra = session.pool.new_worker("torch_sdpa")
        assert "capabilities" in extra.request(Request(Op.DESCRIBE), 120).data  # its implementation loaded
        assert extra.process.pid in pids and spares.waiting == 2
        extra.close()  # made here, not lent by the pool: the pool's close does not know it
    finally:
        session.close()
    assert spares.waiting == 0 and not _workers_alive(session)


@pytest.mark.parametrize(("loads", "device"), [(True, "cpu"), (True, "auto"), (False, "cpu")],
                         ids=["a-first-worker-answers", "auto-guessed-cpu", "none-loaded"])
def test_on_the_cpu_a_first_worker_answers_for_the_probe(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                                                        loads: bool, device: str) -> None:
    """On the CPU the environment comes from a first worker that loaded its implementation: no
    probe process (one import of torch fewer a run), and the device recorded is the one asked for
    ("auto" where none was). Where none loaded, the probe still answers."""
    import pytest_attnkit.registry as registry

    probes: list[str] = []
    run_once = WorkerPool.run_once
    monkeypatch.setattr(WorkerPool, "run_once", lambda self, label, request, **kw: (
        probes.append(label), run_once(self, label, request, **kw))[1])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # the guess: the CPU, whatever this machine has
    if not loads:  # an entry point whose module is missing: its worker describes a load error
        broken = EntryPointRef("no_such_module_here", "no_such_module_here:Impl", None)
        monkeypatch.setattr(registry, "discover", lambda *args, **kwargs: [broken])
        monkeypatch.setattr(registry, "select", lambda refs, pattern: refs)
    config = pytester.parseconfig("--attnkit", "--attnkit-impl=torch_sdpa", f"--attnkit-device={device}",
                                  "--attnkit-suite=correctness")
    session = AttnkitSession(options.resolve(config), config)
    try:
        session.start()
        assert session.environment["torch"] and session.environment["device"] == device
        assert probes == ([] if loads else ["environment"])
    finally:
        session.close()


@pytest.mark.parametrize(("cores", "jobs", "spares"), [(2, 4, 0), (3, 4, 1), (16, 16, 14), (8, 2, 1)])
def test_spares_start_only_on_the_cores_the_first_workers_and_the_pytest_process_leave(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, cores: int, jobs: int, spares: int) -> None:
    """One core for the pytest process and one for each implementation's first worker; the spares
    take at most what is left, and no more than the jobs beyond the first workers."""
    monkeypatch.setattr(AttnkitSession, "_usable_cores", lambda self: cores)
    started: list[int] = []
    monkeypatch.setattr(WorkerPool, "start_spares", lambda self, count: started.append(count))
    monkeypatch.setattr(WorkerPool, "start", lambda self, refs, setups, handlers: None)
    config = pytester.parseconfig("--attnkit", "--attnkit-impl=torch_sdpa", f"--attnkit-jobs={jobs}",
                                  "--attnkit-device=cpu")
    session = AttnkitSession(options.resolve(config), config)
    try:
        session.jobs = jobs
        session._start_pool([EntryPointRef("torch_sdpa", "x:y", None)], {}, {}, "cpu")
    finally:
        session.close()
    assert started == [spares]


def test_a_probe_that_fails_ends_the_first_workers_starting_beside_it(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """CUDA asked for where torch sees none: the probe's usage error ends the workers and spares
    started beside it, and comes at once, not after they have loaded (a hung one would hold it
    up to the start-up deadline)."""
    monkeypatch.setattr(session_module.AttnkitSession, "_probe_environment", _failing_probe)
    config = pytester.parseconfig("--attnkit", "--attnkit-impl=torch_sdpa", "--attnkit-jobs=4", "--attnkit-device=cuda")
    session = AttnkitSession(options.resolve(config), config)
    started = time.monotonic()
    with pytest.raises(pytest.UsageError, match="no CUDA device here"):
        session.start()
    assert time.monotonic() - started < 30
    session.close()
    assert session.pool.closed and session.pool.spares.waiting == 0 and not _workers_alive(session)


def _failing_probe(self) -> None:
    time.sleep(0.5)  # the first workers are starting meanwhile
    raise pytest.UsageError("attnkit: no CUDA device here")
