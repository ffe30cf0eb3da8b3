"""A suite from another distribution, registered through the ``attnkit.suites`` entry points, runs
as a bundled one does: its tests are made from its Suite's TestSpecs under the bundled node-id
path, its requests are scheduled ahead in the implementations' workers and answered by its own
worker handler, a failure is worded by the harness and settled, the junit property and the report
entry are there, and the pytest process imports no torch. The suite is the real example,
examples/attnkit-example-suite, copied into a fake distribution (no install). A bad entry point is
a usage error naming it and its distribution.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import tomllib
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from helpers import fake, words
from pytest_attnkit.controller.discovery import BUNDLED, load_suite
from pytest_attnkit.registry import EntryPointRef

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "attnkit-example-suite" / "src" / "attnkit_example_suite"
HEAVY = ("torch", "triton", "cupy")
#: A kernel right everywhere but its last query row, which it fills with garbage (a tail tile).
PLANTED = """
from fake_kernels import good

def tail_garbage(q, k, v, *, causal=False, scale=None):
    out = good(q, k, v, causal=causal, scale=scale).clone()
    out[..., -1, :] = 100.0
    return out
"""
SUITE = "attnkit_example_suite.controller:BoundsSuite"
#: The example suite with every run hook of Suite given (docs/suites.md), each leaving a trace.
HOOKED = """
from attnkit_example_suite.controller import BoundsSuite

class HookedBounds(BoundsSuite):
    @classmethod
    def build(cls, context, parts):
        suite = cls(context)
        suite.jobs = parts.jobs
        return suite

    def header_lines(self):
        return [f"bounds: HOOKED HEADER, {self.context.profile} profile"]

    def report_sections(self, document):
        return {"bounds_summary": {"tests": len(document["tests"]), "jobs": self.jobs}}

    def finish(self, document, *, interrupted):
        return [f"bounds FINISHED: {document['bounds_summary']['tests']} test(s), interrupted {interrupted}"]

    def closing_lines(self, document):
        return ["bounds CLOSING LINE"]
"""


@pytest.fixture
def installed(fake_dist, monkeypatch: pytest.MonkeyPatch):
    """A fake distribution with the kernels good and tail_garbage and the suite ``bounds`` at
    ``target``; the inner pytest (a separate process) finds it through PYTHONPATH."""

    def install(target: str = SUITE) -> Path:
        try:
            importlib.metadata.distribution("attnkit-example-suite")
        except importlib.metadata.PackageNotFoundError:
            pass
        else:  # its suite is named bounds too: the run would stop at the name registered twice
            pytest.skip("the example suite (examples/attnkit-example-suite) is installed here, and this test "
                        "installs a suite of the same name; run it where the example is not installed (CI does)")
        root = fake_dist({"good": fake("good"), "tail_garbage": "planted:tail_garbage"},
                         extra_modules={"planted": PLANTED, "hooked": HOOKED},
                         groups={"attnkit.suites": {"bounds": target}})
        shutil.copytree(EXAMPLE, root / "attnkit_example_suite", dirs_exist_ok=True)
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))
        return root

    return install


def test_an_installed_suite_runs_scheduled_judged_and_reported_like_a_bundled_one(
        pytester: pytest.Pytester, installed) -> None:
    installed()
    pytester.makeconftest(f"""
        import sys
        def pytest_sessionfinish(session):
            print("\\nHEAVY MODULES IN PYTEST PROCESS:", sorted(m for m in {HEAVY!r} if m in sys.modules))
    """)
    junit, report = pytester.path / "junit.xml", pytester.path / "report"
    result = pytester.runpytest_subprocess(
        "--attnkit", "--attnkit-suite=bounds", "--attnkit-impl=good,tail_garbage", "--attnkit-jobs=2", "-k", "q17-k17",
        f"--junitxml={junit}", f"--attnkit-report={report}", "-p", "no:cacheprovider", "-s", "-rfs")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["HEAVY MODULES IN PYTEST PROCESS: []",
                                 "FAILED pytest_attnkit/suites/test_bounds.py::test_bounds[[]tail_garbage-*"])
    document = json.loads((report / "attnkit-report.json").read_text())
    tests = {test["impl"]: test for test in document["tests"]}
    assert {test["suite"] for test in tests.values()} == {"bounds"} and len(tests) == 2
    good, planted = tests["good"], tests["tail_garbage"]
    assert good["test"].startswith("pytest_attnkit/suites/test_bounds.py::test_bounds[good-")
    assert good["outcome"] == "passed" and good["bounds"]["outside"] == 0
    # The failure: the handler's WRONG reply, worded by the harness (Outcomes.from_reply), settled.
    assert planted["outcome"] == "failed" and planted["bounds"]["outside"] > 0
    case = planted["case"]
    assert words(planted["message"]).startswith(f"tail_garbage is wrong on {case}, seed ")
    assert "output elements lie outside the smallest and largest value of V over the keys" in planted["message"]
    assert said_failure(result.stdout.str(), case)
    # Each test's junit property.
    cases = ElementTree.parse(junit).getroot().iter("testcase")
    figures = {case.get("name"): {prop.get("name"): prop.get("value") for prop in case.iter("property")}
               for case in cases}
    assert len(figures) == 2 and all("attnkit_bounds_worst_excess" in props for props in figures.values()), figures
    # Its requests went through the scheduler and the ledger like any suite's.
    rows = {(row["suite"], row["impl"]): row for row in document["time"]["rows"]}
    assert rows[("bounds", "good")]["requests"] == 1 and rows[("bounds", "tail_garbage")]["requests"] == 1
    assert document["time"]["jobs"] == 2
    # A line of its own in each implementation's summary block and a column in the Markdown report.
    summary = words(result.stdout.str())
    assert "bounds pass: 1 of 1 tests run (1 passed, 0 failed), 0 skipped" in summary
    assert "bounds FAIL: 1 of 1 tests run (0 passed, 1 failed), 0 skipped" in summary
    markdown = (report / "attnkit-report.md").read_text()
    assert "| gate | bounds |" in markdown and "| FAIL: 1 of 1 tests run (0 passed, 1 failed), 0 skipped |" in markdown


def test_an_installed_suite_s_run_hooks_build_it_and_add_to_the_header_report_and_summary(
        pytester: pytest.Pytester, installed) -> None:
    """The session asks an installed suite what it asks the bundled ones (Suite.build,
    header_lines, report_sections, finish, closing_lines), and in the summary the finish lines
    come before the report's, the closing lines after."""
    installed("hooked:HookedBounds")
    report = pytester.path / "report"
    result = pytester.runpytest_subprocess(
        "--attnkit", "--attnkit-suite=bounds", "--attnkit-impl=good", "--attnkit-jobs=2", "-k", "q17-k17",
        f"--attnkit-report={report}", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    lines = result.stdout.lines
    assert "attnkit: bounds: HOOKED HEADER, smoke profile" in lines
    document = json.loads((report / "attnkit-report.json").read_text())
    assert document["bounds_summary"] == {"tests": 1, "jobs": 2}
    finished, written, closing = (lines.index(line) for line in (
        "bounds FINISHED: 1 test(s), interrupted False", f"report: {report}{os.sep}", "bounds CLOSING LINE"))
    assert finished < written < closing


def said_failure(output: str, case: str) -> bool:
    return f"tail_garbage is wrong on {case}" in words(output)


def test_an_installed_suites_tests_are_its_family_s_cases_it_accepts_and_a_pasted_id_reruns_one(
        pytester: pytest.Pytester, installed) -> None:
    installed()
    listed = pytester.runpytest_subprocess("--attnkit", "--attnkit-suite=correctness,bounds", "--attnkit-impl=good",
                                           "--collect-only", "-q", "-p", "no:cacheprovider")
    ids = [line for line in listed.stdout.lines if line.startswith("pytest_attnkit/suites/test_bounds.py::")]
    forward = {line.partition("[")[2] for line in listed.stdout.lines
               if line.startswith("pytest_attnkit/suites/test_correctness.py::test_forward[")}
    assert ids, listed.stdout.str()
    # The correctness family's cases, but the ones BoundsSuite.accepts leaves out (sinks, FP8, varlen...).
    assert {line.partition("[")[2] for line in ids} < forward
    result = pytester.runpytest_subprocess("--attnkit", "--attnkit-suite=bounds", ids[0], "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


@pytest.mark.parametrize(("target", "said"), [
    ("attnkit_no_such_suite:BoundsSuite",
     "could not be imported: ModuleNotFoundError: No module named 'attnkit_no_such_suite'"),
    ("planted:tail_garbage", "names <function tail_garbage at *>, which is not a subclass of pytest_attnkit.Suite"),
    ("attnkit_example_suite.worker:BoundsHandler",
     "names <class 'attnkit_example_suite.worker.BoundsHandler'>, which is not a subclass of pytest_attnkit.Suite"),
])
def test_a_bad_suite_entry_point_is_a_usage_error_naming_it_and_its_distribution(
        pytester: pytest.Pytester, installed, target: str, said: str) -> None:
    installed(target)
    result = pytester.runpytest_subprocess("--attnkit", "--attnkit-suite=bounds", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*attnkit: the attnkit.suites entry point bounds = {target} "
                                 f"(distribution fake-kernels) {said}*"])


def test_a_bad_suite_entry_point_breaks_only_the_runs_that_select_it(pytester: pytest.Pytester, installed) -> None:
    installed("attnkit_no_such_suite:BoundsSuite")
    result = pytester.runpytest_subprocess("--attnkit", "--attnkit-suite=correctness", "--attnkit-impl=good",
                                           "-k", "test_forward and q17-k17", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_an_unknown_suite_name_lists_the_installed_ones(pytester: pytest.Pytester, installed) -> None:
    installed()
    result = pytester.runpytest_subprocess("--attnkit", "--attnkit-suite=bound", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unknown suite 'bound' (known: correctness, memory, speed, properties, "
                                 "sanitize, bounds, or all)*"])


def ref(name: str, value: str, distribution: str = "other-dist", problem: str | None = None) -> EntryPointRef:
    return EntryPointRef(name, value, distribution, problem)


def test_load_suite_takes_a_suite_class_named_as_its_entry_point_and_nothing_else() -> None:
    class_path = "pytest_attnkit.controller.correctness:CorrectnessCheck"
    with pytest.raises(pytest.UsageError, match=r"names CorrectnessCheck, whose name is 'correctness': the entry "
                                                r"point's name and the suite's must be the same"):
        load_suite(ref("bounds", class_path))
    with pytest.raises(pytest.UsageError, match=r"\(distribution other-dist\): the name 'correctness' is a "
                                                r"bundled suite's"):
        load_suite(ref("correctness", class_path))
    with pytest.raises(pytest.UsageError, match="registered twice"):
        load_suite(ref("bounds", SUITE, problem="the name 'bounds' is registered twice: by a and by b"))
    with pytest.raises(pytest.UsageError, match=r"names Suite, which does not set name, handler, tests"):
        load_suite(ref("bounds", "pytest_attnkit.controller.suite:Suite"))


def test_the_bundled_suites_are_registered_in_the_group_as_the_session_builds_them() -> None:
    groups = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"]
    assert groups["attnkit.suites"] == {name: f"{suite.__module__}:{suite.__name__}" for name, suite in BUNDLED.items()}


@pytest.mark.filterwarnings("ignore::pytest.PytestUnknownMarkWarning")  # its mark: registered in --attnkit runs
def test_an_installed_suite_s_tests_are_located_at_its_class(monkeypatch: pytest.MonkeyPatch) -> None:
    """A report's location of an installed suite's test (a skip's -rs line, a failure's header)
    is the suite class's line in its file, not the file's first line."""
    import importlib
    import inspect
    import sys

    from pytest_attnkit.plugin import tests_module

    monkeypatch.syspath_prepend(str(EXAMPLE.parent))
    for name in [name for name in sys.modules if name.startswith("attnkit_example_suite")]:
        monkeypatch.delitem(sys.modules, name)
    module = importlib.import_module("attnkit_example_suite.controller")
    line = inspect.getsourcelines(module.BoundsSuite)[1]
    assert line > 1
    made = tests_module(module.BoundsSuite, Path(module.__file__))
    for spec in module.BoundsSuite.tests:
        code = getattr(made, spec.function).__code__
        assert (code.co_filename, code.co_firstlineno) == (module.__file__, line)
