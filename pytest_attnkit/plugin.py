"""The pytest plugin (``pytest11`` entry point): hooks and fixtures only.

State and logic live in :class:`pytest_attnkit.controller.session.AttnkitSession`, kept in
``config.stash``; like everything under ``pytest_attnkit/controller/``, this module runs in the
pytest process. Without ``--attnkit`` the plugin does nothing but add its options, so it can
stay installed in every project. This module imports nothing heavy: no torch, CuPy or Triton.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import os
import signal
import threading
import types
from pathlib import Path
from typing import Any

import pytest

from pytest_attnkit.controller import options, xdist
from pytest_attnkit.controller.items import ITEM_KEY
from pytest_attnkit.controller.outcome import FittedMessage
from pytest_attnkit.controller.report import ReportInUse, check_writable, claim
from pytest_attnkit.controller.session import SESSION_KEY, AttnkitSession
from pytest_attnkit.controller.table import summary_sections
from pytest_attnkit.controller.terminal import WIDTH, wrap

SUITES_PACKAGE = "pytest_attnkit.suites"
#: The installed suites' module files (what pytest collects their tests from) -> suite name.
INSTALLED_KEY = pytest.StashKey[dict]()
FINISH_KEY = pytest.StashKey[list]()
SIGTERM_KEY = pytest.StashKey[Any]()
REPORT_LOCK_KEY = pytest.StashKey[int]()


@functools.lru_cache(maxsize=1)
def _suite_files() -> dict[Path, str]:
    """The bundled suite modules: their files and their importable names (asked for every
    collected path, so computed once)."""
    package = importlib.import_module(SUITES_PACKAGE)
    directory = Path(package.__file__).resolve().parent
    return {directory / f"test_{name}.py": f"{SUITES_PACKAGE}.test_{name}" for name in options.SUITES}


class SuiteModule(pytest.Module):
    """A bundled suite, imported by its package name rather than by file path, so no generic
    module name (``suites``, ``test_correctness``) lands on ``sys.path`` or in ``sys.modules``."""

    def _getobj(self) -> Any:
        return importlib.import_module(_suite_files()[self.path.resolve()])


def node_path(name: str) -> str:
    """The path part of a suite's node ids, wherever it is installed (the bundled suites' files
    and the installed suites' made-up modules alike)."""
    return f"{SUITES_PACKAGE.replace('.', '/')}/test_{name}.py"


class InstalledSuiteModule(pytest.Module):
    """A suite installed through the ``attnkit.suites`` entry points: a test module made from its
    ``Suite.tests``, a function per TestSpec (named ``spec.function``, marked ``attnkit_<suite>``,
    ``attnkit_cases(spec.cases)`` and ``attnkit_backward`` as it says), whose body is the runner's,
    as every bundled suite test's. Collected from the file of the suite's class."""

    suite: Any = None

    def _getobj(self) -> Any:
        return tests_module(self.suite, self.path)


def tests_module(suite: Any, path: Path) -> types.ModuleType:
    """The made-up test module of an installed suite. Its functions' code says it starts at the
    suite class's line of ``path``, so that a report's location (a skip's ``-rs`` line, a
    failure's header) points at the suite, not at the file's first line."""
    module = types.ModuleType(f"{SUITES_PACKAGE}.test_{suite.name}")
    try:
        line = inspect.getsourcelines(suite if isinstance(suite, type) else type(suite))[1]
    except (OSError, TypeError):  # no source to read (a class made at run time)
        line = 1
    module.__file__ = str(path)
    module.pytestmark = [getattr(pytest.mark, f"attnkit_{suite.name}")]
    for spec in suite.tests:
        arguments = ["attnkit", "attnkit_impl", *(["attnkit_case"] if spec.cases else []),
                     *(["attnkit_tool"] if spec.per_tool else []), "request"]
        namespace: dict[str, Any] = {}
        source = ("\n" * (line - 1)  # the def on the class's line
                  + f"def {spec.function}({', '.join(arguments)}):\n    attnkit.runner.run(request.node)\n")
        exec(compile(source, str(path), "exec"), namespace)
        function = namespace[spec.function]
        function.attnkit_spec = (suite.name, spec)
        if spec.cases:
            function = pytest.mark.attnkit_cases(spec.cases)(function)
        if spec.backward:
            function = pytest.mark.attnkit_backward(function)
        setattr(module, spec.function, function)
    return module


def _installed_suite_files() -> dict[Path, str]:
    """The module file of each installed suite's class -> its name, from entry-point metadata
    (the modules are not imported)."""
    from pytest_attnkit.controller.discovery import installed_suites, suite_file

    files: dict[Path, str] = {}
    for ref in installed_suites():
        path = suite_file(ref)
        if path is not None:
            files.setdefault(path, ref.name)
    return files


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    from pytest_attnkit import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser: pytest.Parser) -> None:
    options.add_options(parser)


#: pytest-benchmark's warning for a test that requested its fixture and never timed with it.
BENCHMARK_UNUSED = "Benchmark fixture was not used at all in this test!"
BENCHMARK_WARNING = "pytest_benchmark.logger.PytestBenchmarkWarning"


class BenchmarkHeaderWidth:
    """Wraps pytest-benchmark's header line (176 columns: its every default) to the width of the
    attnkit header below it. Registered only in runs with ``--attnkit``."""

    NAME = "attnkit-benchmark-header"

    @pytest.hookimpl(wrapper=True)
    def pytest_report_header(self, config: pytest.Config) -> Any:
        results = yield
        return [self._fit(result) for result in results]

    @staticmethod
    def _fit(result: Any) -> Any:
        lines = [result] if isinstance(result, str) else result
        if not isinstance(lines, list) or not any(isinstance(line, str) and line.startswith("benchmark: ")
                                                  and len(line) > WIDTH for line in lines):
            return result
        return [part for line in lines for part in (wrap(line, "benchmark:   ")
                                                    if line.startswith("benchmark: ") else [line])]


def _suite_node_ids(config: pytest.Config) -> list[str] | None:
    """Let a bundled suite's node id be pasted back as pytest printed it.

    pytest prints ``pytest_attnkit/suites/test_correctness.py::test_forward[impl-case]`` wherever
    the package is installed; such an argument is pointed at the installed file. Returns the
    parametrization ids when every argument is such a node id, so that only the implementations
    they name are started."""
    suite_files = {module.replace(".", "/") + ".py": path for path, module in _suite_files().items()}
    suite_files.update({node_path(name): path for path, name in config.stash.get(INSTALLED_KEY, {}).items()})
    params: list[str] = []
    every_one_a_node_id = True
    for index, arg in enumerate(config.args):
        path, separator, rest = arg.partition("::")
        normalized = path.replace("\\", "/")
        target = next((real for known, real in suite_files.items() if normalized.endswith(known)), None)
        if target is not None and not Path(config.invocation_params.dir, path).exists():
            config.args[index] = str(target) + separator + rest
        if target is not None and "[" in rest and rest.endswith("]"):
            params.append(rest[rest.index("[") + 1:-1])
        else:
            every_one_a_node_id = False
    return params if every_one_a_node_id and params else None


def _interrupt_on_sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"attnkit: received {signal.Signals(signum).name}")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "attnkit_cases(family): parametrize attnkit_case with that family's case set")
    config.addinivalue_line("markers", "attnkit_backward: the test runs the implementation's backward pass")
    for suite in options.known_suites():
        config.addinivalue_line("markers", f"attnkit_{suite}: a test of the attnkit {suite} suite")
    if not config.getoption("attnkit"):
        return
    settings = options.resolve(config)
    config.stash[INSTALLED_KEY] = _installed_suite_files()
    if settings.report:
        try:
            check_writable(settings.path("report"))
        except OSError as error:
            raise pytest.UsageError(f"attnkit: the report directory cannot be written ({settings.sources['report']}): {error}") from None
        if xdist.xdist_worker(config) is None:  # the process that writes the report holds its folder
            try:
                handle = claim(settings.path("report"))
            except ReportInUse as error:
                raise pytest.UsageError(f"attnkit: {error} ({settings.sources['report']})") from None
            if handle is not None:
                config.stash[REPORT_LOCK_KEY] = handle
    reference = config.hook.pytest_attnkit_reference(config=config)
    if reference:
        settings = dataclasses.replace(settings, reference=reference,
                                       sources={**settings.sources, "reference": "hook pytest_attnkit_reference"})
    if config.pluginmanager.hasplugin("benchmark"):
        # A speed test that fails or skips before its timings reach pytest-benchmark leaves the
        # fixture unused; the failure already says why, the warning only repeats it per test.
        config.addinivalue_line("filterwarnings", f"ignore:{BENCHMARK_UNUSED}:{BENCHMARK_WARNING}")
        config.pluginmanager.register(BenchmarkHeaderWidth(), BenchmarkHeaderWidth.NAME)
    if hasattr(config.option, "benchmark_quiet") and _benchmark_table_unasked(config):
        # pytest-benchmark's own table repeats the attnkit speed table; asking for its columns
        # (--benchmark-columns=...) brings it back.
        config.option.benchmark_quiet = True
    if threading.current_thread() is threading.main_thread():
        # A CI timeout sends SIGTERM: end the run as Ctrl-C does, so the report is written, the
        # baseline stays whole and every worker is stopped.
        config.stash[SIGTERM_KEY] = signal.signal(signal.SIGTERM, _interrupt_on_sigterm)
    session = AttnkitSession(settings, config)
    config.stash[SESSION_KEY] = session
    try:
        session.start(only=_suite_node_ids(config))
    except BaseException:
        session.close()
        raise
    if not config.option.file_or_dir:
        # `pytest --attnkit` with no paths runs the bundled suites, not the project's own tests.
        suite_files = _suite_files()
        config.args[:] = [str(path) for path, module in suite_files.items()
                          if module.rsplit("_", 1)[-1] in settings.suite]
        config.args += [str(path) for path, name in config.stash[INSTALLED_KEY].items()
                         if name in settings.suite and name in session.suite_types]


def pytest_unconfigure(config: pytest.Config) -> None:
    session = config.stash.get(SESSION_KEY, None)
    if session is not None:
        session.close()
    lock = config.stash.get(REPORT_LOCK_KEY, None)
    if lock is not None:
        os.close(lock)
        del config.stash[REPORT_LOCK_KEY]
    previous = config.stash.get(SIGTERM_KEY, None)
    if previous is not None:
        signal.signal(signal.SIGTERM, previous)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    # The bundled suites only make sense with --attnkit; a plain `pytest` never collects them.
    if SESSION_KEY not in config.stash and collection_path.resolve() in _suite_files():
        return True
    return None


def pytest_pycollect_makemodule(module_path: Path, parent: pytest.Collector) -> pytest.Module | None:
    suite_files = _suite_files()
    module = suite_files.get(module_path.resolve())
    if module is not None:
        # A stable node id wherever the package is installed: pytest_attnkit/suites/test_x.py.
        nodeid = module.replace(".", "/") + ".py"
        return SuiteModule.from_parent(parent, path=module_path, nodeid=nodeid)
    name = parent.config.stash.get(INSTALLED_KEY, {}).get(module_path.resolve())
    session = parent.config.stash.get(SESSION_KEY, None)
    if name is not None and session is not None and name in session.suite_types:
        collector = InstalledSuiteModule.from_parent(parent, path=module_path, nodeid=node_path(name))
        collector.suite = session.suite_types[name]
        return collector
    return None


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    session = metafunc.config.stash.get(SESSION_KEY, None)
    if session is None:
        return
    if "attnkit_case" in metafunc.fixturenames:
        marker = metafunc.definition.get_closest_marker("attnkit_cases")
        if marker is None:
            raise pytest.UsageError(f"{metafunc.definition.nodeid} uses attnkit_case without @pytest.mark.attnkit_cases(family)")
        if "attnkit_impl" in metafunc.fixturenames:
            pairs = session.selection.pairs(marker.args[0])
            installed = getattr(metafunc.function, "attnkit_spec", None)
            suite = session.suites.get(installed[0]) if installed else None
            if suite is not None:  # an installed suite's test: the cases of the family it accepts
                pairs = [(name, case) for name, case in pairs if suite.accepts(installed[1], case)]
            metafunc.parametrize(("attnkit_impl", "attnkit_case"), pairs,
                                 ids=[f"{name}-{case.id}" for name, case in pairs])
        else:
            cases = session.selection.cases(marker.args[0])
            metafunc.parametrize("attnkit_case", cases, ids=[case.id for case in cases])
    elif "attnkit_impl" in metafunc.fixturenames:
        metafunc.parametrize("attnkit_impl", session.impl_names, ids=session.impl_names)
    if "attnkit_tool" in metafunc.fixturenames:
        tools = session.settings.sanitize or ["memcheck"]
        metafunc.parametrize("attnkit_tool", tools, ids=tools)


@pytest.hookimpl(trylast=True)  # after -k and -m have deselected what they deselect
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    session = config.stash.get(SESSION_KEY, None)
    if session is not None and session.runner is not None:
        session.runner.mark_refusals(items, session.suite_types)
        # Each suite says where its tests run (the speed suite: its reference's first).
        suites = session.suites

        def test_order(item: pytest.Item) -> int:
            key = item.stash.get(ITEM_KEY, None)
            suite = suites.get(key.suite) if key is not None else None
            return suite.test_order(key) if suite is not None else 0

        items.sort(key=test_order)


def pytest_collection_finish(session: pytest.Session) -> None:
    attnkit = session.config.stash.get(SESSION_KEY, None)
    if attnkit is not None:
        attnkit.tally.count(session.items)
        attnkit.submit_ahead(attnkit.items_to_run(session.items))


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    session = config.stash.get(SESSION_KEY, None)
    return session.header_lines() if session is not None else None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    session = item.config.stash.get(SESSION_KEY, None)
    failure = call.excinfo.value if call.excinfo is not None else None
    report = yield
    if (session is not None and report.failed and isinstance(failure, pytest.fail.Exception) and not failure.pytrace
            and isinstance(failure.msg, str) and "attnkit_impl" in getattr(getattr(item, "callspec", None), "params", {})):
        # Shown within 100 columns; read (str(), the report files, JUnit XML) as it was written.
        report.longrepr = FittedMessage(failure.msg)
    if session is not None and (report.when == "call" or (report.when == "setup" and not report.passed)):
        session.tally.record(item, report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_report_from_serializable(config: pytest.Config, data: dict[str, Any]) -> Any:
    """pytest-xdist: a worker's attnkit failure reaches the controller as its text; shown wrapped there too."""
    report = yield
    if (SESSION_KEY in config.stash and isinstance(report, pytest.TestReport) and report.failed
            and isinstance(report.longrepr, str) and "[" in report.nodeid
            and report.nodeid.split("::", 1)[0] in _suite_node_paths(config)):
        report.longrepr = FittedMessage(report.longrepr)
    return report


def _suite_node_paths(config: pytest.Config) -> set[str]:
    installed = {node_path(name) for name in config.stash.get(INSTALLED_KEY, {}).values()}
    return {module.replace(".", "/") + ".py" for module in _suite_files().values()} | installed


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    result = yield
    attnkit = item.config.stash.get(SESSION_KEY, None)
    if attnkit is not None and (item.session.shouldfail or item.session.shouldstop):
        # -x (or --maxfail) stops after this test: the requests run ahead for later tests are dropped
        # and the running ones' workers killed now, not when the run has been reported.
        attnkit.stop_ahead()
    return result


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    attnkit = session.config.stash.get(SESSION_KEY, None)
    if attnkit is not None:
        # No test is left to wait for a request (Ctrl-C and SIGTERM come here at once): the
        # requests run ahead stop, and the workers end while the report is written.
        attnkit.release_workers()
        session.config.stash[FINISH_KEY] = attnkit.finish(exitstatus)
        if attnkit.untested and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED  # all skipped is not green for what was asked


def _deals(config: pytest.Config) -> bool:
    """Whether the xdist controller deals the tests out itself (controller/xdist.py)."""
    return bool(config.getoption("attnkit")) and getattr(config.option, "dist", "no") == "load"


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """pytest-xdist: under --attnkit, every xdist worker gets all its tests at the start, so that
    it can run their requests ahead of them."""
    if not _deals(config):
        return None
    # Every implementation by name (described, though the controller runs none) deals by its name.
    return xdist.make_dealt_scheduling(config, log, config.stash[SESSION_KEY].pool.names)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """pytest-xdist: tell each xdist worker that the controller deals its tests out."""
    if _deals(node.config):
        node.workerinput["attnkit_dealt"] = True


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """pytest-xdist: a worker finished; keep its report document for the controller's summary."""
    session = node.config.stash.get(SESSION_KEY, None)
    output = getattr(node, "workeroutput", {}) or {}
    if session is not None and "attnkit" in output:
        session.add_worker_document(output["attnkit"])


def _benchmark_table_unasked(config: pytest.Config) -> bool:
    """Whether the user left pytest-benchmark's own table and comparisons alone."""
    return all(config.getoption(name, None) in (None, False, [])
               for name in ("benchmark_columns", "benchmark_compare", "benchmark_compare_fail"))


@pytest.hookimpl(tryfirst=True)
def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    benchmarks = getattr(config, "_benchmarksession", None)
    if (SESSION_KEY in config.stash and benchmarks is not None and not hasattr(config.option, "benchmark_quiet")
            and _benchmark_table_unasked(config)):
        # pytest-benchmark before 5.3 has no --benchmark-quiet: with no groups its display is empty
        # (its JSON and saved runs come from its benchmark list, which stays).
        benchmarks.groups = []
    _attnkit_summary(terminalreporter, config)


def _attnkit_summary(terminalreporter: Any, config: pytest.Config) -> None:
    session = config.stash.get(SESSION_KEY, None)
    if session is None or session.document is None:
        return
    sections = summary_sections(session.document, verbose=config.getoption("verbose") > 0)
    sections.append(("attnkit baselines and reports",
                     [part for line in config.stash.get(FINISH_KEY, []) for part in wrap(line, "  ")]))
    sections.append(("attnkit: NOTHING TESTED of what was asked for (the run fails)",
                     [part for line in session.untested for part in wrap(line, "  ")]))
    for title, lines in sections:
        if any(lines):
            terminalreporter.section(title)
            for line in lines:
                terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def attnkit(request: pytest.FixtureRequest) -> AttnkitSession:
    """The attnkit session: implementations, workers, and the checks the suites assert."""
    session = request.config.stash.get(SESSION_KEY, None)
    if session is None:
        pytest.skip("attnkit suites run with --attnkit")
    return session
