"""The attnkit session: it wires the parts of a run together and holds no suite logic.

One :class:`AttnkitSession` lives in ``config.stash`` for a run with ``--attnkit``. It probes the
environment in a worker (the pytest process itself never imports torch or touches CUDA), picks the
device and the case set, starts the worker pool (:mod:`pytest_attnkit.controller.pool`) and, unless
``--attnkit-jobs=1``, the scheduler that runs requests ahead of the tests
(:mod:`pytest_attnkit.controller.scheduler`), builds one suite per selected kind
(:class:`~pytest_attnkit.controller.suite.Suite`: :mod:`~pytest_attnkit.controller.correctness`,
:mod:`~pytest_attnkit.controller.memory`, :mod:`~pytest_attnkit.controller.speed`,
:mod:`~pytest_attnkit.controller.properties`, :mod:`~pytest_attnkit.controller.sanitize`) and the
runner that runs their tests (:mod:`pytest_attnkit.controller.runner`). At collection it works out
each test's :class:`~pytest_attnkit.controller.suite.SuiteItem` and asks each implementation once
what it refuses (:meth:`AttnkitSession.mark_refusals`); once pytest has selected the tests the
runner sends their plans ahead (:meth:`AttnkitSession.submit_ahead`). At the end it builds the
report document once (:mod:`pytest_attnkit.controller.report`), from which the terminal summary and
the report files are rendered.
"""

from __future__ import annotations

import json
import os
import platform
from collections import defaultdict
from typing import Any

import pytest

from pytest_attnkit import cases as case_sets
from pytest_attnkit.contract import AccuracyBudget, Case, accuracy_budget
from pytest_attnkit.controller import caches, coverage, footprint, report, xdist
from pytest_attnkit.controller.against import AgainstError, Revision, materialise, twins_of
from pytest_attnkit.controller.baselines import MIN_RUNS, BaselineError, BaselineStore
from pytest_attnkit.controller.correctness import CorrectnessCheck
from pytest_attnkit.controller.discovery import BUNDLED, load_selected
from pytest_attnkit.controller.impls import ImplStatus
from pytest_attnkit.controller.items import ITEM_KEY, mark_items
from pytest_attnkit.controller.memory import MemoryCheck
from pytest_attnkit.controller.options import Settings, moved_rootdir
from pytest_attnkit.controller.outcome import JUDGEMENT_KEY, Outcomes, Verdict, last_line, reason_of, skipped
from pytest_attnkit.controller.pool import WorkerPool
from pytest_attnkit.controller.process import WorkerFailure
from pytest_attnkit.controller.properties import PropertyCheck
from pytest_attnkit.controller.runner import Runner
from pytest_attnkit.controller.sanitize import SanitizeCheck, find_sanitizer
from pytest_attnkit.controller.scheduler import Scheduler
from pytest_attnkit.controller.speed import CPU_THRESHOLD, SpeedCheck, SpeedSettings
from pytest_attnkit.controller.suite import Suite, SuiteContext
from pytest_attnkit.controller.table import header_lines
from pytest_attnkit.controller.terminal import NO_BREAK
from pytest_attnkit.messages import Op, Request
from pytest_attnkit.records import EntryKey

SESSION_KEY = pytest.StashKey["AttnkitSession"]()


def asked_for_but_untested(document: dict[str, Any], asked: list[str]) -> list[str]:
    """What to say of each implementation that ``--attnkit-impl`` named or matched (``asked``, its
    patterns) and that ran no test because it is unavailable here; empty without ``--attnkit-impl``.

    A run that tested nothing of what it was asked to test must not be green. Without
    ``--attnkit-impl`` a run tests what is installed and can run here, and one that cannot (the
    bundled cupy_naive on a machine without a GPU) is only reported: CI's main job on the CPU
    stays green."""
    if not asked:
        return []
    ran = {test["impl"] for test in document["tests"] if test["outcome"] in (Verdict.PASSED, Verdict.FAILED)}
    return [f"{name} was asked for (--attnkit-impl={','.join(asked)}) and ran no test: it is unavailable here "
            f"({info.get('reason') or 'no reason given'}). Run it where it is available, or leave it out of "
            "--attnkit-impl."
            for name, info in document["implementations"].items()
            if info["status"] == ImplStatus.UNAVAILABLE and name not in ran]


#: The bundled suites by name.
SUITE_TYPES: dict[str, type[Suite]] = BUNDLED


class AttnkitSession:
    def __init__(self, settings: Settings, config: pytest.Config) -> None:
        self.settings = settings
        self.config = config
        self.environment: dict[str, Any] = {}
        self.device = "cpu"
        self.profile = "smoke"
        self.pool = WorkerPool(device="cpu", timeout=settings.timeout, inprocess=settings.inprocess)
        self.outcomes = Outcomes()
        #: The suites of this run, by name (built by start()).
        self.suites: dict[str, Suite] = {}
        #: Every suite a collected test may belong to: the bundled ones and the installed ones
        #: selected (imported by start()).
        self.suite_types: dict[str, type[Suite]] = dict(BUNDLED)
        #: Runs every suite test (built by start()).
        self.runner: Runner | None = None
        #: Runs requests ahead of the tests, several at a time (None with ``--attnkit-jobs=1``).
        self.scheduler: Scheduler | None = None
        #: Per test: implementation, suite, outcome and the failure or skip text, for the report.
        self.test_outcomes: list[dict[str, Any]] = []
        #: implementation -> suite -> how many of its tests were collected.
        self.collected: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.document: dict[str, Any] | None = None
        #: The documents of pytest-xdist's workers (on the controller).
        self.worker_documents: list[dict[str, Any]] = []
        #: (implementation, twin's case id) -> the id of the case the twin stands for.
        self.twins: dict[tuple[str, str], str] = {}
        self.rootdir_warning = moved_rootdir(config, settings)
        #: --attnkit-against: the other version, materialised out of place (removed at close).
        self.revision: Revision | None = None
        self.cache_root = caches.cache_root(settings.cache_dir, settings.invocation_dir
                                            if settings.sources.get("cache_dir", "default").startswith(
                                                ("command line", "environment")) else settings.config_dir)
        self.cache_env = caches.cache_environment(self.cache_root)
        #: Requests that may run at once (1: each test sends its own, when it runs).
        self.jobs = 1
        #: Implementations --attnkit-impl asked for that ran nothing, in words (set by finish()).
        self.untested: list[str] = []

    # -- start-up ---------------------------------------------------------------------------
    def start(self, only: list[str] | None = None) -> None:
        """Discover and select implementations, probe the device, start the pool, build the checks.

        ``only``: the parametrization ids of the node ids given on the command line; with no
        ``--attnkit-impl``, only the implementations they name are started."""
        from pytest_attnkit.registry import discover, select

        try:
            refs = select(discover(), self.settings.impl)
        except LookupError as error:
            raise pytest.UsageError(f"attnkit: {error} ({self.settings.sources['impl']})") from None
        if only and self.settings.sources.get("impl") == "default":
            names = sorted((ref.name for ref in refs), key=len, reverse=True)
            named = {next((name for name in names if param == name or param.startswith(f"{name}-")), None)
                     for param in only}
            if None not in named:
                refs = [ref for ref in refs if ref.name in named]
        self._probe_environment()
        self.profile = self.settings.profile if self.settings.profile != "auto" else (
            "smoke" if self.device == "cpu" else "default")
        self.pool.device = self.device
        self.jobs = self._jobs()
        # With requests side by side, TorchInductor compiles in each worker itself instead of
        # starting a pool of compile processes per worker (one per core, each).
        compile_threads = {"TORCHINDUCTOR_COMPILE_THREADS": "1"} if self.jobs > 1 and not os.environ.get(
            "TORCHINDUCTOR_COMPILE_THREADS") else {}
        self.pool.env = {**self._worker_env(), **self.cache_env, **compile_threads}
        twins = self._materialise_against([ref.name for ref in refs])
        setups = {ref.name: self.revision.worker_setup() for ref in twins} if self.revision else {}
        installed = load_selected(self.settings.suite)  # a bad entry point is a usage error, before any worker
        self.suite_types = {**BUNDLED, **installed}
        # Every bundled suite's handler (the few this run does not build cost a worker the import
        # of a light module) and the selected installed suites'.
        self.pool.start(refs + twins, setups, handlers={name: suite.handler for name, suite in self.suite_types.items()})
        self._check_twins_loaded(twins)
        if xdist.is_controller(self.config):
            self.pool.close()  # the xdist workers run the tests; the descriptions stay for the header
        else:
            self._start_scheduler()
        settings = self.settings
        self.runner = Runner(self.suites, self.pool, self.outcomes, self.scheduler)
        self.suites["correctness"] = CorrectnessCheck(self.pool, self.outcomes, settings.seed, settings.trials,
                                                      accuracy=self.accuracy)
        self.suites["memory"] = MemoryCheck(self.pool, self.outcomes, self.device, settings.seed, profile=self.profile,
                                            meter=str(self.environment.get("memory_meter") or "device"))
        self.suites["properties"] = PropertyCheck(self.pool, self.outcomes, settings.seed, self.device)
        if "sanitize" in settings.suite:
            # The tool's logs go beside the report, else into a temporary folder that is kept.
            self.suites["sanitize"] = SanitizeCheck(
                self.pool, self.outcomes, settings.seed, self.device, find_sanitizer(settings.sanitizer),
                log_dir=settings.path("report") / "sanitize" if settings.report else None,
                parallel=max(1, self.jobs // 2))
        if "speed" in settings.suite:
            device_name = str(self.environment.get("device_name", "unknown"))
            try:
                store = BaselineStore(settings.path("baseline_dir"), device_name)
            except BaselineError as error:
                raise pytest.UsageError(f"attnkit: {error}") from None
            self.suites["speed"] = SpeedCheck(
                self.pool, self.outcomes, SpeedSettings(settings.reference, settings.seed, settings.budget_ms,
                                                        settings.require_baseline,
                                                        case_sets.CALL_LIMIT_MS.get(self.profile)),
                store, self.threshold, self.device, twins=dict(self.revision.twins) if self.revision else {},
                ab_threshold=self.ab_threshold, sent=self.runner.sent,
                parallel_problem=xdist.parallel_timing_problem(self.config, self.device, self._cuda_device_count()))
        context = SuiteContext(settings, self.device, self.profile, self.outcomes, self.pool.info, self.config)
        for name, suite_type in installed.items():
            self.suites[name] = suite_type(context)

    def _usable_cores(self) -> int:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        placed = xdist.xdist_worker(self.config)
        return max(1, cores // placed[1]) if placed is not None else cores

    def _jobs(self) -> int:
        """``--attnkit-jobs``, with auto resolved: one per usable core (1 in-process or under the
        xdist controller, which runs no tests)."""
        if self.settings.inprocess or xdist.is_controller(self.config):
            return 1
        setting = self.settings.jobs
        return self._usable_cores() if setting == "auto" else int(setting)

    def _start_scheduler(self) -> None:
        """Run requests ahead of the tests, ``jobs`` at a time (see the scheduler's docstring)."""
        if self.jobs <= 1:
            return
        # Each extra worker gets its share of the cores for its CPU threads (the primaries keep
        # torch's default: on the CPU they time the speed suite).
        threads = max(1, self._usable_cores() // self.jobs)
        self.pool.extra_env = {} if os.environ.get("OMP_NUM_THREADS") else {"OMP_NUM_THREADS": str(threads)}
        budget = None
        if self.device == "cuda":
            budget = footprint.budget_bytes(self.environment.get("device_memory_bytes"),
                                            self.jobs + len(self.pool.impls))
        self.scheduler = Scheduler(self.pool, jobs=self.jobs, budget_bytes=budget, ledger=self.pool.ledger)
        self.pool.share(extras=self.jobs, alone=self.scheduler.exclusive)

    def _against_error(self, problem: str) -> pytest.UsageError:
        return pytest.UsageError(f"attnkit: {problem} ({self.settings.sources.get('against')}); "
                                 "nothing was gated against it")

    def _materialise_against(self, selected: list[str]) -> list:
        """Materialise --attnkit-against's REV and return its twins of the selected implementations."""
        if not self.settings.against:
            return []
        given = self.settings.against
        if "speed" not in self.settings.suite:
            raise self._against_error(f"--attnkit-against={given} compares speed, and the speed suite is not selected")
        if self.settings.inprocess:
            raise self._against_error(f"--attnkit-against={given} loads another version's kernels in workers of "
                                      "their own; it cannot run with --attnkit-inprocess")
        try:
            self.revision = materialise(given, self.settings.config_dir, self.settings.invocation_dir)
        except AgainstError as error:
            raise self._against_error(f"--attnkit-against={given}: the other version could not be materialised: "
                                      f"{error}") from None
        twins = twins_of(self.revision, selected)
        if not twins:
            raise self._against_error(
                f"--attnkit-against={given}: none of the selected implementations ({', '.join(selected) or 'none'}) "
                f"exists in {self.revision.description} (it registers "
                f"{', '.join(ref.name for ref in self.revision.refs)})")
        return twins

    def _check_twins_loaded(self, twins: list) -> None:
        broken = [self.pool.info(ref.name) for ref in twins if self.pool.info(ref.name).load_error]
        if broken:
            details = "; ".join(f"{info.name} ({info.origin}): "
                                f"{((info.load_error or '').strip().splitlines() or ['?'])[-1]}" for info in broken)
            raise self._against_error(f"--attnkit-against={self.settings.against}: the other version's "
                                      f"implementations could not be loaded: {details}")

    def _cuda_device_count(self) -> int:
        return int(self.environment.get("cuda_device_count") or 0)

    def _worker_env(self) -> dict[str, str]:
        # On the CPU, Triton kernels run in Triton's interpreter; the variable must be set before
        # triton is imported, which is why each worker gets it from the start.
        if self.device == "cpu":
            # An A/B run alternates two workers on the same cores: OpenMP threads that spin after
            # their work (its default) would starve the other worker's next block.
            return {"TRITON_INTERPRET": "1", **({"OMP_WAIT_POLICY": "PASSIVE"} if self.settings.against else {})}
        gpu = xdist.pinned_gpu(self.config, self._cuda_device_count())
        return {"CUDA_VISIBLE_DEVICES": gpu} if gpu is not None else {}

    def _probe_environment(self) -> None:
        requested = self.settings.device
        probe = WorkerPool(device=requested, timeout=self.settings.timeout, env={"TRITON_INTERPRET": "1"},
                           inprocess=self.settings.inprocess)
        try:
            self.environment = probe.run_once("environment", Request(Op.ENVIRONMENT))
        except WorkerFailure as failure:
            raise pytest.UsageError(f"attnkit: could not probe the environment: {failure}") from None
        finally:
            probe.close()
        self.device = ("cuda" if self.environment.get("cuda_available") else "cpu") if requested == "auto" else requested
        if self.device == "cuda" and not self.environment.get("cuda_available"):
            raise pytest.UsageError(
                f"attnkit: device cuda was asked for ({self.settings.sources['device']}) but torch sees no CUDA device "
                f"(torch {self.environment.get('torch')})"
            )

    def stop_ahead(self) -> None:
        """No test will wait for the requests run ahead any more (``-x`` stops, the run ends or is
        interrupted): drop those not started and kill the workers of those running."""
        if self.scheduler is not None:
            self.scheduler.close()

    def close(self) -> None:
        for suite in self.suites.values():
            suite.close()
        self.stop_ahead()  # the scheduler stops lending workers before the pool ends them
        self.pool.close()
        if self.revision is not None:
            self.revision.close()

    # -- what the suites ask for ------------------------------------------------------------
    @property
    def twin_names(self) -> set[str]:
        return set(self.revision.twins.values()) if self.revision else set()

    @property
    def impl_names(self) -> list[str]:
        """The implementations the suites run: REV's twins only take part in the speed suite."""
        return [name for name in self.pool.names if name not in self.twin_names]

    def cases(self, family: str) -> list[Case]:
        if family == "correctness":
            cases = case_sets.correctness_cases(self.profile)
        elif family == "properties":
            cases = case_sets.property_cases(self.profile)
        elif family == "sanitize":
            cases = case_sets.sanitize_cases(self.profile)
        elif family in ("speed-forward", "speed-backward"):
            mode = family.split("-", 1)[1]
            cases = [case for case_mode, case in case_sets.speed_cases(self.profile) if case_mode == mode]
        else:
            raise ValueError(f"unknown case family {family!r}")
        self.config.hook.pytest_attnkit_modify_cases(config=self.config, family=family, cases=cases)
        return cases

    def pairs(self, family: str) -> list[tuple[str, Case]]:
        """(implementation, case) pairs of a family: each implementation's in-contract twins
        (:mod:`pytest_attnkit.controller.coverage`), recorded for the coverage line."""
        of_revision = self.twin_names if not family.startswith("speed") else set()
        capabilities = {name: info.capabilities for name, info in self.pool.impls.items() if name not in of_revision}
        chosen, twins = coverage.pairs(capabilities, self.cases(family))
        self.twins.update(twins)
        return chosen

    def threshold(self, key: EntryKey) -> float:
        """The gate's threshold: a conftest hook first, then the settings (ini overrides, option).
        On the CPU, where timings move by tens of percent, the default is a doubling."""
        default = self.settings.threshold_for(key)
        if self.device != "cuda" and self.settings.threshold_is_default:
            default = CPU_THRESHOLD
        chosen = self.config.hook.pytest_attnkit_threshold(config=self.config, impl=key.impl, mode=key.mode,
                                                           case_id=key.case_id, default=default)
        if chosen is None:
            return default
        if not 0 < float(chosen) < float("inf"):
            raise pytest.UsageError(f"attnkit: hook pytest_attnkit_threshold returned {chosen!r} for {key.impl} "
                                    f"{key.mode} {key.case_id}: it returns a share, such as 0.08 for 8%")
        return float(chosen)

    def ab_threshold(self, key: EntryKey) -> float:
        """The A/B gate's threshold (``--attnkit-against-threshold``); a doubling on the CPU unless set.
        Neither the stored gate's per-case lines nor its hook apply: they size that gate's noise."""
        if self.device != "cuda" and self.settings.sources.get("against_threshold") == "default":
            return CPU_THRESHOLD
        return self.settings.against_threshold

    def accuracy(self, impl: str, case: Case) -> "str | AccuracyBudget | None":
        """The accuracy the hook ``pytest_attnkit_accuracy`` chooses for one case, or None."""
        chosen = self.config.hook.pytest_attnkit_accuracy(config=self.config, impl=impl, case=case)
        if chosen is None:
            return None
        try:
            accuracy_budget(chosen)
        except (TypeError, ValueError) as error:
            raise pytest.UsageError(f"attnkit: hook pytest_attnkit_accuracy returned {chosen!r} for {impl} "
                                    f"{case.id}: {error}") from None
        return chosen

    def mark_refusals(self, items: list[pytest.Item]) -> None:
        """Work out each suite test's SuiteItem, then mark the items skipped that their suite
        refuses (:meth:`Suite.refusal`) or the implementation does (unavailable, or an unsupported
        case: :meth:`Suite.support_query`), with the reasons in words. One question per
        implementation, at collection.

        The reason leaves the case out (the test id has it), so pytest's summary groups the
        skips that share a reason."""
        questions: dict[str, list[tuple[pytest.Item, Case, bool]]] = {}
        for node, item in mark_items(items, self.suite_types):
            suite = self.suites.get(item.suite)
            if suite is None:
                continue  # a suite not selected: its tests say so when they run
            refusal = suite.refusal(item)
            if refusal is not None:
                self.outcomes.skip_at_collection(node, refusal)
                continue
            query = suite.support_query(item)
            if query is not None:
                questions.setdefault(item.impl, []).append((node, *query))
        for name, asked in questions.items():
            info = self.pool.info(name)
            if info.load_error:
                # One import error, one failure: the first test fails with it, the rest point there.
                first = asked[0][0]
                reason = (f"{name} could not be loaded ({last_line(info.load_error)}); "
                          f"{first.nodeid} fails with the traceback")
                for item, _, _ in asked[1:]:
                    self.outcomes.skip_at_collection(item, skipped(reason))
                continue
            if info.unavailable:
                for item, _, _ in asked:
                    self.outcomes.skip_at_collection(item, skipped(f"{name} is unavailable: {info.unavailable}"))
                continue
            refusals = self.pool.support(name, [{"case": case.to_dict(), "backward": backward} for _, case, backward in asked])
            for (item, case, backward), refusal in zip(asked, refusals or []):
                if refusal:
                    self.outcomes.skip_at_collection(item, skipped(f"{name} does not support it: {refusal}"))
                elif self.runner is not None:
                    self.runner.accept(item.stash[ITEM_KEY], case, backward)  # its worker need not ask again

    def items_to_run(self, items: list[pytest.Item]) -> list[pytest.Item]:
        """The tests this process runs: all of them, or under pytest-xdist this worker's share."""
        return xdist.share_of_this_worker(self.config, items)

    def submit_ahead(self, items: list[pytest.Item]) -> None:
        """Send the selected tests' plans ahead of them, in their suites' order (the runner; nothing
        without a scheduler). A test skipped at collection sends nothing."""
        if self.runner is not None:
            self.runner.submit_all(item.stash[ITEM_KEY] for item in items
                                   if ITEM_KEY in item.stash and item.get_closest_marker("skip") is None)

    # -- the run's record -------------------------------------------------------------------
    def count_collected(self, items: list[pytest.Item]) -> None:
        """How many tests each implementation has in each suite, after selection (-k, -m)."""
        for node in items:
            item = node.stash.get(ITEM_KEY, None)
            if item is not None:
                self.collected[item.impl][item.suite] += 1

    def record(self, item: pytest.Item, test_report: pytest.TestReport) -> None:
        """Keep the outcome of an attnkit test for the summary and the report files."""
        suite_item = item.stash.get(ITEM_KEY, None)
        if suite_item is None:
            return
        impl, case = suite_item.impl, suite_item.case
        judgement = item.stash.get(JUDGEMENT_KEY, None)
        reason = None
        if judgement is not None and judgement.verdict == test_report.outcome:
            # The judgement the test was settled (or skipped at collection) with: no text parsed.
            if judgement.verdict is Verdict.SKIPPED:
                text, reason = f"Skipped: {judgement.message}", judgement.reason
            else:
                text = judgement.message
            text = text.replace(NO_BREAK, " ")
        else:
            # A skip pytest made itself, or an outcome no judgement made (an error in the test's code).
            skipped = test_report.skipped and isinstance(test_report.longrepr, tuple)
            text = (test_report.longrepr[2] if skipped else str(test_report.longrepr or "")).replace(NO_BREAK, " ")
            if skipped:
                reason = reason_of(text)
        self.test_outcomes.append({"test": item.nodeid, "impl": impl, "suite": suite_item.suite,
                                   "case": case.id if case is not None else None, "function": item.originalname,
                                   "twin_of": self.twins.get((impl, case.id)) if case is not None else None,
                                   "outcome": Verdict(test_report.outcome), "reason": reason, "message": text[:4000]})
        if judgement is not None and judgement.record:
            self.test_outcomes[-1].update(judgement.record)

    def baseline_state(self) -> dict[str, Any]:
        speed = self.suites.get("speed")
        if not isinstance(speed, SpeedCheck):
            return {"baseline_file": None, "baseline_found": False}
        return {"baseline_file": str(speed.store.path), "baseline_found": speed.store.found}

    def against_state(self) -> dict[str, Any] | None:
        if self.revision is None:
            return None
        return {"given": self.revision.given, "label": self.revision.label, "kind": self.revision.kind,
                "description": self.revision.description, "twins": dict(self.revision.twins)}

    def finish(self, exitstatus: int) -> list[str]:
        """Build the report document, save the baseline, write the report files; returns lines
        for the terminal summary.

        An interrupted run (Ctrl-C, or SIGTERM from a CI timeout) saves no baseline, so the stored
        one stays whole, but still writes the report of what it gathered. Under pytest-xdist each
        worker hands its document to the controller (:meth:`add_worker_document`), which saves
        and reports for the whole run."""
        interrupted = exitstatus == pytest.ExitCode.INTERRUPTED
        speed = self.suites.get("speed")
        self.document = report.build(
            environment=self.environment, device=self.device, profile=self.profile,
            impls=list(self.pool.impls.values()), outcomes=self.test_outcomes,
            memory=self.suites["memory"].results if "memory" in self.suites else [], speed=speed, interrupted=interrupted,
            baseline=self.baseline_state(), against=self.against_state(),
            properties=self.suites["properties"].results if "properties" in self.suites else [],
            sanitize=self.suites["sanitize"].results if "sanitize" in self.suites else [])
        self.document["collected"] = {name: dict(suites) for name, suites in self.collected.items()}
        self.document["time"] = {**self.pool.ledger.to_dict(self.pool.primary_startups()), "jobs": self.jobs}
        report.merge(self.document, self.worker_documents)
        if xdist.xdist_worker(self.config) is not None:
            self.config.workeroutput["attnkit"] = json.dumps(self.document, default=str)  # type: ignore[attr-defined]
            return []
        self.untested = asked_for_but_untested(self.document, self.settings.impl)
        lines = []
        if isinstance(speed, SpeedCheck) and self.settings.save_baseline:
            records = report.speed_records(self.document)
            counts = None
            shared = report.shared_gpu(self.document)
            if interrupted:
                lines.append(f"baseline NOT saved: the run was interrupted ({speed.store.path}{NO_BREAK}is unchanged)")
            elif shared:
                lines.append(f"baseline NOT saved: {shared} ({speed.store.path}{NO_BREAK}is unchanged)")
            elif not records:
                lines.append("baseline not saved: no speed measurements in this run")
            else:
                try:
                    counts = speed.store.save(records, self.environment, self.document["speed"]["ceilings"],
                                                   platform.node())
                except BaselineError as error:
                    counts = None
                    lines.append(f"baseline NOT saved: {error}")
            if counts is not None:
                lines.append(f"baseline{NO_BREAK}saved:{NO_BREAK}{speed.store.path}")
                lines.append(f"  {counts['pooled']} entries pooled with their earlier runs, {counts['restarted']} "
                             f"started afresh (changed beyond noise), {counts['new']} new")
                if counts["thin"]:
                    lines.append(f"  {counts['thin']} entries have fewer than {MIN_RUNS} runs: until they do, their "
                                 "thresholds cannot know how much runs disagree; save again, each time from a fresh "
                                 "process (better: another machine of the same GPU)")
        if self.settings.report:
            lines.extend(report.write(self.document, self.settings.path("report")))
        # Where compute-sanitizer's logs were kept (several folders under pytest-xdist without a report).
        kept = sorted({os.path.dirname(entry["log"]) for entry in self.document.get("sanitize", [])
                       if entry.get("log")})
        if kept:
            lines.append(f"sanitize logs:{NO_BREAK}{', '.join(kept)}")
        return lines

    def add_worker_document(self, text: str) -> None:
        """A pytest-xdist worker's report document, folded in at the end (on the controller)."""
        self.worker_documents.append(json.loads(text))

    # -- the header -------------------------------------------------------------------------
    def header_lines(self) -> list[str]:
        gate = None
        speed = self.suites.get("speed")
        if isinstance(speed, SpeedCheck):
            store = speed.store
            gate = (f"speed is gated against {store.path} ({len(store.entries)} entries)" if store.found else
                    f"NOTHING WILL BE GATED: no baseline for {store.device_name} ({store.path} does not exist)"
                    + ("; required, so every speed test fails" if self.settings.require_baseline else ""))
            if self.revision is not None:
                stored = (f"{store.path} ({len(store.entries)} entries)" if store.found else
                          f"none for {store.device_name}")
                gate = (f"A/B against {self.revision.description}, interleaved and paired "
                        f"({', '.join(sorted(self.revision.twins.values()))}); stored baseline: {stored}")
            if store.removed:
                gate += (f"; removed {len(store.removed)} temporary file(s) that a killed save left in "
                         f"{store.path.parent}")
        if self.settings.inprocess:
            workers = "in-process"
        elif xdist.is_controller(self.config):
            workers = "pytest-xdist workers, each with workers of its own"
        elif self.jobs > 1:
            workers = f"up to {self.jobs} requests at once (--attnkit-jobs), memory and speed alone"
        else:
            workers = "one request at a time (--attnkit-jobs=1)"
        sanitize = None
        sanitizer = self.suites.get("sanitize")
        if isinstance(sanitizer, SanitizeCheck):
            reason = sanitizer.skip_reason()
            tools = self.settings.sanitize or ["memcheck"]
            guarded = "memcheck's tests run on guarded inputs; " if "memcheck" in tools else ""
            sanitize = (f"sanitize: {sanitizer.sanitizer} ({', '.join(tools)})" if reason is None
                        else f"sanitize: {guarded}compute-sanitizer NOT RUN: {reason}")
        return header_lines(environment=self.environment, device=self.device, profile=self.profile,
                            suites=self.settings.suite, seed=self.settings.seed, workers=workers,
                            caches=caches.describe(self.cache_root, self.cache_env),
                            impls=self.pool.impls.values(), gate=gate, warning=self.rootdir_warning,
                            sanitize=sanitize)
