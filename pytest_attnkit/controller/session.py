"""The attnkit session: it wires the parts of a run together and holds no suite logic.

One :class:`AttnkitSession` lives in ``config.stash`` for a run with ``--attnkit``. It probes the
environment in a worker (the pytest process itself never imports torch or touches CUDA), picks the
device and the case set (:mod:`~pytest_attnkit.controller.selection`), starts the worker pool
(:mod:`pytest_attnkit.controller.pool`) and the scheduler: the one that runs requests ahead of the
tests (:mod:`pytest_attnkit.controller.scheduler`), or with ``--attnkit-jobs=1`` the inline one
(:mod:`pytest_attnkit.controller.inline`), and the runner that runs the suites' tests
(:mod:`pytest_attnkit.controller.runner`). It knows no suite by name: each one, bundled
(:mod:`pytest_attnkit.controller.discovery` lists them) or installed, is a
:class:`~pytest_attnkit.controller.suite.Suite` that builds itself for the run or stays out of it
(:meth:`~pytest_attnkit.controller.suite.Suite.build`), and gives its header lines, its sections
of the report and what it does as the run ends. At collection the session works out each test's
:class:`~pytest_attnkit.controller.suite.SuiteItem` and asks each implementation once what it
refuses (the runner's :meth:`~pytest_attnkit.controller.runner.Runner.mark_refusals`); once pytest
has selected the tests the runner sends their plans ahead (:meth:`AttnkitSession.submit_ahead`).
At the end it builds the report document once (:mod:`pytest_attnkit.controller.report`), from
which the terminal summary and the report files are rendered.
"""

from __future__ import annotations

import functools
import json
import os
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import pytest

from pytest_attnkit.controller import against, caches, footprint, report, xdist
from pytest_attnkit.controller.against import Revision
from pytest_attnkit.controller.baselines import device_slug
from pytest_attnkit.controller.discovery import BUILD_ORDER, BUNDLED, load_selected
from pytest_attnkit.controller.impls import ImplStatus
from pytest_attnkit.controller.inline import InlineScheduler
from pytest_attnkit.controller.items import ITEM_KEY
from pytest_attnkit.controller.options import Settings, moved_rootdir
from pytest_attnkit.controller.outcome import WIDTH, Outcomes, Verdict, fit
from pytest_attnkit.controller.pool import WorkerPool
from pytest_attnkit.controller.process import WorkerFailure
from pytest_attnkit.controller.runner import Runner
from pytest_attnkit.controller.selection import CaseSelection
from pytest_attnkit.controller.scheduler import Scheduler
from pytest_attnkit.controller.scheduling.durations import Durations, durations_path
from pytest_attnkit.controller.suite import RunParts, Suite, SuiteContext
from pytest_attnkit.controller.tally import Tally
from pytest_attnkit.controller import table
from pytest_attnkit.messages import Op, Request

if TYPE_CHECKING:
    from collections.abc import Iterable

    from pytest_attnkit.controller.process import Worker
    from pytest_attnkit.registry import EntryPointRef

SESSION_KEY = pytest.StashKey["AttnkitSession"]()


def asked_for_but_untested(document: dict[str, Any], asked: list[str]) -> list[str]:
    """What to say of each implementation that ``--attnkit-impl`` named or matched (``asked``, its
    patterns) and that ran no test: it is unavailable here, or every test this run selected for it
    was skipped (``head_dims = (96,)`` on a case set of d64 and d128); empty without
    ``--attnkit-impl``.

    A run that tested nothing of what it was asked to test must not be green, whatever skipped the
    tests: the implementation's declarations (each such skip is marked ``refused``), or the suites
    chosen (the memory and sanitize suites without a GPU); the words say which. Without
    ``--attnkit-impl`` a run tests what is installed and can run here, and one that cannot (the
    bundled cupy_naive on a machine without a GPU) is only reported: CI's main job on the CPU
    stays green. An implementation whose tests were all deselected (``-k``) is not said to have
    run none."""
    if not asked:
        return []
    ran = {test["impl"] for test in document["tests"] if test["outcome"] in (Verdict.PASSED, Verdict.FAILED)}
    said = []
    for name, info in document["implementations"].items():
        if name in ran:
            continue
        patterns = ",".join(asked)
        if info["status"] == ImplStatus.UNAVAILABLE:
            said.append(f"{name} was asked for (--attnkit-impl={patterns}) and ran no test: it is unavailable here "
                        f"({info.get('reason') or 'no reason given'}). Run it where it is available, or leave it "
                        "out of --attnkit-impl.")
            continue
        tests = [test for test in document["tests"] if test["impl"] == name]
        if not tests or any(test["outcome"] != Verdict.SKIPPED for test in tests):
            continue  # deselected (-k), or it errored: the run says so already
        refused = [test for test in tests if test.get("refused")]
        others = [test for test in tests if not test.get("refused")]
        if not others:
            said.append(f"{name} was asked for (--attnkit-impl={patterns}) and ran no test: its declarations refuse "
                        f"all {len(tests)} selected here (most often: {_commonest(refused)}). Declare what it runs "
                        "(docs/contract.md), or choose cases it takes (--attnkit-profile, -k).")
            continue
        also = (f"; its declarations refuse {len(refused)} of them (most often: {_commonest(refused)})"
                if refused else "")
        said.append(f"{name} was asked for (--attnkit-impl={patterns}) and ran no test: all {len(tests)} selected "
                    f"here were skipped (most often: {_commonest(others)}){also}. Run it where its suites can "
                    "run, or choose suites and cases it takes (--attnkit-suite, --attnkit-profile, -k).")
    return said


def _commonest(tests: list[dict[str, Any]]) -> str:
    """The commonest skip reason among ``tests``."""
    return Counter(test.get("reason") or test.get("message") or "no reason given" for test in tests).most_common(1)[0][0]


#: Device files whose presence says the probe will likely find a GPU (NVIDIA's driver; ROCm's,
#: whose GPUs torch also calls "cuda"): see :meth:`AttnkitSession._likely_device`.
GPU_DEVICE_NODES = ("/dev/nvidiactl", "/dev/kfd")

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
        #: The tests collected and their outcomes, for the report.
        self.tally = Tally()
        #: Runs the tests' requests: ahead of them, several at a time, or inline with ``--attnkit-jobs=1``.
        self.scheduler: Scheduler | InlineScheduler | None = None
        self.document: dict[str, Any] | None = None
        #: The documents of pytest-xdist's workers (on the controller).
        self.worker_documents: list[dict[str, Any]] = []
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
        #: The workers being ended while the run reports (:meth:`release_workers`), and each
        #: primary's start-up seconds read before.
        self._releasing: threading.Thread | None = None
        self._startups: dict[str, float] | None = None

    # -- start-up ---------------------------------------------------------------------------
    def start(self, only: list[str] | None = None) -> None:
        """Discover and select implementations, probe the device, start the pool, build the checks.

        ``only``: the parametrization ids of the node ids given on the command line; with no
        ``--attnkit-impl``, only the implementations they name are started."""
        from pytest_attnkit.registry import discover, select

        try:
            refs = select(discover(), self.settings.impl)
        except LookupError as error:
            # The known names on a line of their own, every line kept to the terminal's 100 columns
            # with pytest's "ERROR: " before the first.
            first, *rest = str(error).splitlines()
            text = "\n".join([f"attnkit: {first} ({self.settings.sources['impl']})", *(f"  {line}" for line in rest)])
            raise pytest.UsageError(fit(text, WIDTH - len("ERROR: "))) from None
        if only and self.settings.sources.get("impl") == "default":
            named = {xdist.implementation_of(param, [ref.name for ref in refs]) for param in only}
            if None not in named:
                refs = [ref for ref in refs if ref.name in named]
        # Built before the probe, so that the implementations' first workers can start beside it.
        self.revision, counterparts = against.materialise_for(self.settings, [ref.name for ref in refs])
        setups = {ref.name: self.revision.worker_setup() for ref in counterparts} if self.revision else {}
        installed = load_selected(self.settings.suite)  # a bad entry point is a usage error, before any worker
        self.suite_types = {**BUNDLED, **installed}
        self.jobs = self._jobs()
        # Every bundled suite's handler (the few this run does not build cost a worker the import
        # of a light module) and the selected installed suites'.
        start = functools.partial(self._start_pool, refs + counterparts, setups,
                                  {name: suite.handler for name, suite in self.suite_types.items()})
        guess = self._likely_device()
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="attnkit-start") as beside:
            early = beside.submit(start, guess) if guess is not None else None
            try:
                if guess == "cpu":  # the first workers say it (see _probe_environment)
                    early.result()
                    self._probe_environment(self.pool.described_workers())
                else:
                    self._probe_environment()
            except BaseException:  # a usage error, Ctrl-C: the workers starting beside it end first
                self.pool.close()
                raise
        self.profile = self.settings.profile if self.settings.profile != "auto" else (
            "smoke" if self.device == "cpu" else "default")
        if early is None or guess != self.device:
            if early is not None:  # guessed wrong: those workers have the other device's settings
                ledger = self.pool.ledger
                ledger.marks.pop("started", None)
                self.pool.close()
                self.pool = WorkerPool(device=self.device, timeout=self.settings.timeout,
                                       inprocess=self.settings.inprocess)
                self.pool.ledger = ledger
            start(self.device)
        else:
            early.result()
        self.selection = CaseSelection(self.settings, self.config, self.device, self.profile, self.pool,
                                       against.counterpart_names(self.revision), self.tally.stand_ins)
        against.check_loaded(self.settings, (self.pool.info(ref.name) for ref in counterparts))
        if xdist.is_controller(self.config):
            self.pool.close()  # the xdist workers run the tests; the descriptions stay for the header
        else:
            self._start_scheduler()
        self.runner = Runner(self.suites, self.pool, self.outcomes, self.scheduler)
        self._build_suites([*BUILD_ORDER, *installed.values()], self.runner)

    def _likely_device(self) -> str | None:
        """The device the probe will name, as far as it can be told without importing torch, so
        that the implementations' first workers start beside the probe (each start is mostly
        ``import torch``, as the probe is: 5-6 s on session 12's H100 hosts, where the first
        request waited 12 s after the probe's 6-8 s; results/2026-11-27-session12). A wrong guess
        costs those workers: they are stopped and started again with the probe's device. None
        where the workers must wait for the probe: in-process, and in a pytest-xdist worker, whose
        GPU comes from the probe's device count."""
        if self.settings.inprocess or xdist.xdist_worker(self.config) is not None:
            return None
        if self.settings.device != "auto":
            return self.settings.device
        if os.environ.get("CUDA_VISIBLE_DEVICES", "unset").strip().lower() in ("", "-1", "nodevfiles"):
            return "cpu"  # torch sees no GPU (Slurm writes NoDevFiles where it gave none)
        return "cuda" if any(os.path.exists(node) for node in GPU_DEVICE_NODES) else "cpu"

    def _start_pool(self, refs: list[EntryPointRef], setups: dict[str, dict[str, Any]], handlers: dict[str, str],
                    device: str) -> None:
        """The implementations' first workers, started and described, for ``device``."""
        self.pool.device = device
        # With requests side by side, TorchInductor compiles in each worker itself instead of
        # starting a pool of compile processes per worker (one per core, each).
        compile_threads = {"TORCHINDUCTOR_COMPILE_THREADS": "1"} if self.jobs > 1 and not os.environ.get(
            "TORCHINDUCTOR_COMPILE_THREADS") else {}
        self.pool.env = {**self._worker_env(device), **self.cache_env, **compile_threads}
        if self.jobs > 1 and not xdist.is_controller(self.config):
            # Each extra worker gets its share of the cores for its CPU threads (the primaries keep
            # torch's default: on the CPU they time the speed suite). Their interpreters start now,
            # beside the first workers': the first requests start a dozen of them at once.
            cores = self._usable_cores()
            threads = max(1, cores // self.jobs)
            self.pool.extra_env = {} if os.environ.get("OMP_NUM_THREADS") else {"OMP_NUM_THREADS": str(threads)}
            # Only on the cores that the first workers and this process leave (it collects the
            # tests meanwhile; on a GPU the probe runs beside them too): each start is mostly
            # ``import torch``, and on a machine of two cores a spare beside theirs delays the first
            # requests and, in a short run that never lends it, is all cost (the project's tests
            # that run attnkit took 7% less time without spares on two cores, 2026-11-28).
            self.pool.start_spares(max(0, min(self.jobs, cores - 1) - len(refs)))
        self.pool.start(refs, setups, handlers=handlers)
        self.pool.ledger.mark("started")

    def _build_suites(self, suite_types: list[type[Suite]], runner: Runner) -> None:
        """Each suite that takes part in this run (:meth:`Suite.build`), in ``suite_types``' order."""
        context = SuiteContext(self.settings, self.device, self.profile, self.outcomes, self.pool.info, self.config)
        selection = self.selection
        parts = RunParts(pool=self.pool, environment=self.environment, accuracy=selection.accuracy,
                         threshold=selection.threshold, ab_threshold=selection.ab_threshold, jobs=self.jobs,
                         revision=self.revision, sent=runner.sent,
                         parallel_problem=xdist.parallel_timing_problem(self.config, self.device,
                                                                       self._cuda_device_count()))
        for suite_type in suite_types:
            suite = suite_type.build(context, parts)
            if suite is not None:
                self.suites[suite.name] = suite

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
        """Run requests ahead of the tests, ``jobs`` at a time (see the scheduler's docstring), or
        each when its test waits for it (``jobs`` 1)."""
        if self.jobs <= 1:
            self.scheduler = InlineScheduler(self.pool)
            return
        budget = None
        if self.device == "cuda":
            budget = footprint.budget_bytes(self.environment.get("device_memory_bytes"),
                                            self.jobs + len(self.pool.impls))
        slug = device_slug(str(self.environment.get("device_name") or self.device))
        placed = xdist.xdist_worker(self.config)  # each xdist worker runs its own share: its own file
        durations = Durations(durations_path(self.cache_root, slug if placed is None else f"{slug}.gw{placed[0]}"))
        self.scheduler = Scheduler(self.pool, jobs=self.jobs, budget_bytes=budget, ledger=self.pool.ledger,
                                   durations=durations, first_calls=self.device == "cuda")
        self.pool.share(extras=self.jobs, alone=self.scheduler.exclusive)

    def _cuda_device_count(self) -> int:
        return int(self.environment.get("cuda_device_count") or 0)

    def _worker_env(self, device: str) -> dict[str, str]:
        # On the CPU, Triton kernels run in Triton's interpreter; the variable must be set before
        # triton is imported, which is why each worker gets it from the start.
        if device == "cpu":
            # An A/B run alternates two workers on the same cores: OpenMP threads that spin after
            # their work (its default) would starve the other worker's next block.
            return {"TRITON_INTERPRET": "1", **({"OMP_WAIT_POLICY": "PASSIVE"} if self.settings.against else {})}
        gpu = xdist.pinned_gpu(self.config, self._cuda_device_count())
        return {"CUDA_VISIBLE_DEVICES": gpu} if gpu is not None else {}

    def _probe_environment(self, workers: Iterable[Worker] = ()) -> None:
        """The versions and the device (:attr:`environment`, :attr:`device`): from the first of
        ``workers`` that answers, else from a probe, a worker of its own. On the CPU the first
        workers (started for the CPU, as the probe is: TRITON_INTERPRET set) answer it once they
        have loaded, as quickly as the probe would have, since the run waits for them as well: one
        ``import torch`` fewer a run (1.5 s of a core; a run of one small test on two cores took
        7.3 core-seconds with the probe and a spare, 2.9 without). Asked for the CPU on a GPU host,
        that worker then has the CUDA driver loaded (the probe did before). Where a GPU may be
        asked for, the probe runs beside the first workers, so that its usage error (CUDA asked
        for where torch sees none) comes at once."""
        requested = self.settings.device
        request = Request(Op.ENVIRONMENT, options={"device": requested})
        for worker in workers:
            try:
                self.environment = worker.request(request, self.pool.start_timeout).data
                break
            except WorkerFailure:
                continue  # the next, or the probe
        else:
            probe = WorkerPool(device=requested, timeout=self.settings.timeout, env={"TRITON_INTERPRET": "1"},
                               inprocess=self.settings.inprocess)
            try:
                self.environment = probe.run_once("environment", request)
            except WorkerFailure as failure:
                raise pytest.UsageError(f"attnkit: could not probe the environment: {failure}") from None
            finally:
                probe.close()
        self.pool.ledger.mark("probed")
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

    def release_workers(self) -> None:
        """Every test has ended: end the workers beside the report's writing (each takes a second or
        two to tear down its CUDA context: the last 2.8 s of a fresh H200's run, after its last
        line, results/2026-12-02-session28). Nothing after the tests asks a worker; :meth:`close`
        waits for them."""
        if self._releasing is not None:
            return
        self.stop_ahead()  # the scheduler stops lending workers before the pool ends them
        self._startups = self.pool.primary_startups()
        self._releasing = threading.Thread(target=self.pool.close, name="attnkit-release", daemon=True)
        self._releasing.start()

    def close(self) -> None:
        for suite in self.suites.values():
            suite.close()
        self.stop_ahead()  # the scheduler stops lending workers before the pool ends them
        if self._releasing is not None:
            self._releasing.join()
        self.pool.close()
        if self.revision is not None:
            self.revision.close()

    # -- what the suites ask for ------------------------------------------------------------
    @property
    def impl_names(self) -> list[str]:
        """The implementations the suites run: REV's counterparts only take part in the speed suite."""
        return [name for name in self.pool.names if name not in against.counterpart_names(self.revision)]

    def items_to_run(self, items: list[pytest.Item]) -> list[pytest.Item]:
        """The tests this process runs: all of them, or under pytest-xdist this worker's share."""
        return xdist.share_of_this_worker(self.config, items, self.pool.names)

    def submit_ahead(self, items: list[pytest.Item]) -> None:
        """Submit the selected tests' plans, in their suites' order (the runner; the inline
        scheduler runs each when its test reads the reply). A test skipped at collection sends nothing."""
        self.pool.ledger.mark("collected")
        if self.runner is not None:
            self.runner.submit_all(item.stash[ITEM_KEY] for item in items
                                   if ITEM_KEY in item.stash and item.get_closest_marker("skip") is None)

    def finish(self, exitstatus: int) -> list[str]:
        """Build the report document (each suite its sections), let each suite finish
        (:meth:`Suite.finish`: the speed suite saves a baseline), write the report files; returns
        lines for the terminal summary, the suites' closing lines last (:meth:`Suite.closing_lines`).

        An interrupted run (Ctrl-C, or SIGTERM from a CI timeout) saves no baseline, so the stored
        one stays whole, but still writes the report of what it gathered. Under pytest-xdist each
        worker hands its document to the controller (:meth:`add_worker_document`), which saves
        and reports for the whole run."""
        interrupted = exitstatus == pytest.ExitCode.INTERRUPTED
        self.document = report.build(
            environment=self.environment, device=self.device, profile=self.profile,
            impls=list(self.pool.impls.values()), outcomes=self.tally.tests, interrupted=interrupted,
            against=against.report_state(self.revision), suites=self.suites.values())
        self.document["collected"] = {name: dict(suites) for name, suites in self.tally.collected.items()}
        startups = self.pool.primary_startups() if self._startups is None else self._startups
        self.document["time"] = {**self.pool.ledger.to_dict(startups), "jobs": self.jobs}
        report.merge(self.document, self.worker_documents)
        if xdist.xdist_worker(self.config) is not None:
            self.config.workeroutput["attnkit"] = json.dumps(self.document, default=str)  # type: ignore[attr-defined]
            return []
        self.untested = asked_for_but_untested(self.document, self.settings.impl)
        document = self.document
        lines = [line for suite in self.suites.values() for line in suite.finish(document, interrupted=interrupted)]
        if self.settings.report:
            lines.extend(report.write(document, self.settings.path("report")))
        return lines + [line for suite in self.suites.values() for line in suite.closing_lines(document)]

    def add_worker_document(self, text: str) -> None:
        """A pytest-xdist worker's report document, folded in at the end (on the controller)."""
        self.worker_documents.append(json.loads(text))

    # -- the header -------------------------------------------------------------------------
    def header_lines(self) -> list[str]:
        """The run's header: the suites' own lines (:meth:`Suite.header_lines`) in the order of
        --attnkit-suite's list (the speed suite's gate before the sanitize suite's tool)."""
        workers = table.workers_header(inprocess=self.settings.inprocess, jobs=self.jobs,
                                       xdist_controller=xdist.is_controller(self.config))
        suite_lines = [line for name in self.suite_types if name in self.suites
                       for line in self.suites[name].header_lines()]
        return table.header_lines(environment=self.environment, device=self.device, profile=self.profile,
                                  suites=self.settings.suite, seed=self.settings.seed, workers=workers,
                                  caches=caches.describe(self.cache_root, self.cache_env)
                                  + (f"; {self.scheduler.durations.describe()}" if isinstance(self.scheduler, Scheduler)
                                     else ""),
                                  impls=self.pool.impls.values(), suite_lines=suite_lines,
                                  warning=self.rootdir_warning)
