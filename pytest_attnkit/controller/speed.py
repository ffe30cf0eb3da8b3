"""The speed suite: time a case in the worker, judge the timing, gate it.

Each speed test asks the implementation's worker to time one case (:mod:`pytest_attnkit.worker.speed`,
:mod:`pytest_attnkit.worker.timer`) and gets a :class:`~pytest_attnkit.records.SpeedMeasurement`
back. The check compares it with the reference implementation timed on the same case, fails
timings that cannot be trusted (work that escapes the timed stream, a speedup too good to be
true), hands the samples to pytest-benchmark when it is installed, and asks the gate
(:mod:`pytest_attnkit.controller.gate`) for a verdict against this GPU's baseline
(:mod:`pytest_attnkit.controller.baselines`). A suspected regression is measured again in fresh
rounds and stands only if most rounds agree; the result keeps the round the verdict used.

With ``--attnkit-against=REV`` an implementation that has a counterpart from REV (``<impl>@<rev>``) is
timed together with it: the two workers are asked for blocks of a few samples in turn
(:meth:`SpeedCheck._measure_pair`), and the paired gate (:mod:`pytest_attnkit.controller.paired`)
decides on the pairs of blocks. The counterpart's own test reports its half of the same measurement.

On the CPU the numbers check the plumbing and give a rough figure, nothing more: CPU timings move
by tens of percent between processes (and by far more when the machine is busy), so there the
suspicious-speedup check is off and the gate's default threshold is a doubling
(:data:`CPU_THRESHOLD`), which only a real change crosses.

As a :class:`~pytest_attnkit.controller.suite.Suite`, a test's plan is a warm-up of its case,
compiled ahead while the GPU has other work (none for REV's counterparts); the test then times the case
with the GPU alone in the worker that warmed it up, asking the pool itself (the timing, the
reference's, the confirmation rounds and the A/B blocks are the judgement's own requests). It is
built only when selected, with this device's baseline file (:meth:`SpeedCheck.build`), gives the
header's gate line, fills the report's ``speed`` and ``ab`` sections, and as the run ends saves
the baseline that ``--attnkit-save-baseline`` asks for (:meth:`SpeedCheck.finish`).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Mapping, Sequence

import pytest

from pytest_attnkit import cases as case_sets
from pytest_attnkit.contract import Case, MemoryClass
from pytest_attnkit.controller import footprint, report, table
from pytest_attnkit.controller.baselines import BaselineError, BaselineStore
from pytest_attnkit.controller.gate import (MACHINE_FACTOR_LIMIT, Decision, GateVerdict, Pool, at_equal_clocks,
                                            decide, explained_by_clock, machine_factor, noise_threshold)
from pytest_attnkit.controller.impls import ImplStatus
from pytest_attnkit.controller.outcome import Judged, Judgement, Outcomes, failed, skipped
from pytest_attnkit.controller.paired import MIN_PAIRS, PairedDecision, SyncKind, decide_paired, sync_kind
from pytest_attnkit.controller.pool import WorkerPool
from pytest_attnkit.controller.process import WorkerFailure, worker_pids
from pytest_attnkit.controller.scheduler import Job
from pytest_attnkit.controller.suite import Planned, RunParts, Suite, SuiteContext, SuiteItem, TestSpec, verdict_of
from pytest_attnkit.messages import Op, Reply, Request, Status
from pytest_attnkit.programs import core, plain
from pytest_attnkit.records import EntryKey, SpeedMeasurement, Timing

if TYPE_CHECKING:
    from pytest_attnkit.controller.against import Revision

CONFIRMATION_ROUNDS = 2
#: A call is suspected of escaping the timed stream when, after issuing it, the host waits for the
#: device this many times longer than the events measured, plus this slack for the synchronization.
ESCAPE_FACTOR = 3.0
ESCAPE_SLACK_MS = 0.2
SUSPICIOUS_SPEEDUP = 10.0
#: Past these multiples of the measured ceilings a figure is impossible: the copy figure counts
#: bytes read and written, which a read-mostly kernel can pass up to twice.
CEILING_SLACK = 1.2
BANDWIDTH_SLACK = 2.5
#: An A/B run's block: samples asked of one version before the other's turn (one for calls past the
#: timer's long-call mark), and how many pairs of blocks a case gets at most: 80 samples a side, a
#: few fewer than a plain run's budget gives a short call. Each block is a request to a worker, and
#: 34 pairs of 3 made an A/B run 2.4x a plain one (issue 20 allows 2.2x); the paired intervals of
#: GPU-bound cases stay within a few tenths of a percent.
BLOCK_SAMPLES = 4
MAX_PAIRS = 20
#: The gate's threshold on the CPU unless one is set: only a doubling is a regression there.
CPU_THRESHOLD = 1.0
#: A case is over the profile's call limit on its first call alone when that call took this many
#: times the limit, where the implementation's first calls show no setup: its warm-ups were
#: dropped as pointless (controller/scheduling/pruning.py: three or more of them, of other shapes,
#: cost at most 50 ms or ten calls beyond their next call, and none more). The worker takes a
#: second call anyway where this is its process's first request (its first call also pays the
#: process's start). So a case is skipped wrongly only if a shape's own setup is over a fifth of a
#: call near the limit. Otherwise a second call decides. cupy_naive's four 16k cases (1.25-2.3 s a
#: call, the limit 1 s) spent 7 s of a fresh H200's GPU-alone phase on second calls
#: (results/2026-12-02-session27, cold39).
FIRST_CALL_MARGIN = 1.2
#: The gates' least threshold for a call that synchronizes the host with the device inside (a
#: ``.tolist()``, an ``.item()``): its time follows its process's host speed, which moves by more
#: than any smaller threshold between processes (torch_sdpa's paged decode, a Python loop over the
#: sequences: 5.2, 7.0 and 9.1 ms in three processes of one H200, results/2026-11-25-h200-main-job).
#: The stored-baseline gate applies it to such a call, the A/B gate where both versions' calls
#: synchronize (paired.py).
SYNC_THRESHOLD = 1.0
#: A reference case whose saved runs disagreed so much that they alone set its threshold above
#: this (:func:`~pytest_attnkit.controller.gate.noise_threshold` of the runs, 2.5 times their
#: largest distance from the median) is left out of the machine factor
#: (:meth:`SpeedCheck.factor_cases`), whatever threshold the run gates at. On an H200 the dense
#: cases' saved runs, from several machines, read 10-17% and stay in; the host-bound ones
#: (packed, paged, banded) read 31-259% and go (baselines/nvidia-h200.json, 2026-11-29).
FACTOR_NOISE_LIMIT = 0.20

Properties = list[tuple[str, object]]


class _ReplayClock:
    """A clock that advances by recorded GPU samples, so pytest-benchmark stores the GPU timings
    (CUDA events, L2 flushed) rather than host time around a message to the worker."""

    def __init__(self, samples_s: list[float]) -> None:
        self.now = 0.0
        self._samples = iter(samples_s)

    def __call__(self) -> float:
        return self.now

    def advance(self) -> None:
        self.now += next(self._samples)


def feed_benchmark(benchmark: Any, samples_ms: list[float], extra_info: dict[str, Any]) -> bool:
    """Record ``samples_ms`` as pytest-benchmark rounds; False when this version cannot take them."""
    if not hasattr(benchmark, "_timer") or not hasattr(benchmark, "pedantic"):
        return False
    clock = _ReplayClock([sample / 1e3 for sample in samples_ms])
    benchmark._timer = clock  # pytest-benchmark reads this attribute for every round
    benchmark.extra_info.update(extra_info)
    benchmark.pedantic(clock.advance, rounds=len(samples_ms), iterations=1, warmup_rounds=0)
    return True


@dataclass(frozen=True)
class SpeedResult:
    """A speed test's outcome: the measurement the verdict used, and the verdict."""

    measurement: SpeedMeasurement
    #: This implementation's median over the reference's on the same case (below 1 is faster).
    ratio_to_reference: float | None = None
    decision: Decision | None = None


@dataclass(frozen=True)
class ABResult:
    """A case timed in both versions, interleaved: the paired verdict, or why there is none."""

    impl: str
    counterpart: str
    mode: str
    case: Case
    decision: PairedDecision | None
    problem: str | None = None  # why the case could not be compared (one side skipped or failed)
    #: Which versions' calls synchronize with the device inside (controller/paired.py), or None:
    #: both (the case is gated at SYNC_THRESHOLD), or only the new one.
    syncs: SyncKind | None = None
    #: The new version's sync as its worker saw it (torch's first sync warning), where ``syncs`` is set.
    sync_detail: str | None = None

    @property
    def sync_note(self) -> str | None:
        """:attr:`syncs` in words, as the report and the A/B table show it."""
        if self.syncs == SyncKind.BOTH:
            return f"both versions' calls synchronize with the device ({self.sync_detail})"
        if self.syncs == SyncKind.NEW_ONLY:
            return ("the new version's call synchronizes with the device and the old one's does not "
                    f"({self.sync_detail})")
        return None

    def to_dict(self, revision: str) -> dict[str, Any]:
        return {"impl": self.impl, "against": self.counterpart, "revision": revision, "mode": self.mode,
                "case": self.case.id, "shape": self.case.to_dict(), "problem": self.problem,
                "syncs": self.sync_note, "sync_kind": self.syncs,
                **(self.decision.to_dict() if self.decision else {"verdict": GateVerdict.NOT_COMPARED})}


@dataclass
class SpeedSettings:
    reference: str
    seed: int
    budget_ms: float
    require_baseline: bool
    #: The longest call this profile times (``pytest_attnkit.cases.CALL_LIMIT_MS``), or None.
    call_limit_ms: float | None = None
    #: Read each timed case's program in its timing request where its warm-up did not (a warm-up
    #: that would compile nothing is dropped unrun): on for a run that saves baselines, so that
    #: every saved run has its program; off otherwise (a profiled call per case in the GPU-alone phase).
    read_programs: bool = False


@dataclass
class SpeedCheck(Suite):
    """Times and gates every speed test of a run; ``threshold`` gives a case's practical threshold."""

    name: ClassVar[str] = "speed"
    handler: ClassVar[str] = "pytest_attnkit.worker.suites.speed:SpeedHandler"
    tests: ClassVar[tuple[TestSpec, ...]] = (TestSpec("test_speed_forward", "speed-forward"),
                                             TestSpec("test_speed_backward", "speed-backward", backward=True))

    pool: WorkerPool
    outcomes: Outcomes
    settings: SpeedSettings
    store: BaselineStore
    threshold: Callable[[EntryKey], float]
    device: str
    results: dict[EntryKey, SpeedResult] = field(default_factory=dict)
    ceilings: dict[str, float] = field(default_factory=dict)
    gpu_state: dict[str, Any] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)
    #: --attnkit-against: each current implementation's counterpart from REV, and the paired results.
    counterparts: dict[str, str] = field(default_factory=dict)
    ab: dict[EntryKey, ABResult] = field(default_factory=dict)
    #: The A/B gate's threshold per case (None: ``threshold``'s).
    ab_threshold: Callable[[EntryKey], float] | None = None
    #: The jobs the runner sent ahead for a speed test's plan (:meth:`Runner.sent`): a case's
    #: warm-up, whose worker then times it, its kernels compiled and loaded there already.
    sent: Callable[[SuiteItem], Sequence[Job | None]] = lambda item: ()
    #: Why speed tests cannot run here (timing beside another pytest-xdist worker on one device), or None.
    parallel_problem: str | None = None
    #: --attnkit-against's REV, which the header's gate line names.
    revision: Revision | None = None
    #: --attnkit-save-baseline: save this run's timings into ``store`` as it ends (:meth:`finish`).
    save_baseline: bool = False
    _measured: dict[EntryKey, SpeedMeasurement] = field(default_factory=dict)
    _refused: dict[EntryKey, Reply] = field(default_factory=dict)
    #: Cases whose call took longer than the profile times (settings.call_limit_ms), and how long.
    over_limit: dict[EntryKey, float] = field(default_factory=dict)
    _ceilings_asked: bool = False

    # -- the suite ---------------------------------------------------------------------------
    def refusal(self, item: SuiteItem) -> Judgement | None:
        return skipped(self.parallel_problem) if self.parallel_problem else None

    def order(self, item: SuiteItem) -> int:
        """After the requests tests wait for: a warm-up only saves its test's compile time."""
        return 1

    def plan(self, item: SuiteItem) -> list[Planned]:
        """A warm-up of the case, which also reads the kernels its calls launch (the gate's
        program); none for REV's counterparts (their current implementation's test times the pair). The
        worker that measures the ceilings starts now, so that the GPU-alone phase does not wait
        for its start-up."""
        if item.case is None or self.base_of(item.impl) != item.impl:
            return []
        if self.device == "cuda" and not self._ceilings_asked:
            self.pool.start_once("ceilings")  # its start-up then runs beside other work
        linear = self.pool.info(item.impl).capabilities.get("memory_class") == MemoryClass.LINEAR
        return [Planned(Request(Op.WARM, item.case, item.backward, self.settings.seed,
                                {"program": True, "next_call": True}),
                        footprint.request_bytes(item.case, backward=item.backward, references=False,
                                                linear_memory=linear), warm=True)]

    def judge(self, item: SuiteItem, replies: Sequence[Reply | None], **fixtures: Any) -> Judgement:
        """Time and gate the case (:meth:`check`); ``fixtures`` may hold pytest-benchmark's ``benchmark``."""
        assert item.case is not None
        mode = "backward" if item.backward else "forward"
        return verdict_of(lambda properties: self.check(item.impl, mode, item.case, properties=properties,
                                                        benchmark=fixtures.get("benchmark")))

    # -- the run -----------------------------------------------------------------------------
    @classmethod
    def build(cls, context: SuiteContext, parts: RunParts) -> SpeedCheck | None:
        """Only when selected, with this device's baseline file (one that cannot be read is a
        usage error)."""
        settings = context.settings
        if cls.name not in settings.suite:
            return None
        try:
            store = BaselineStore(settings.path("baseline_dir"), str(parts.environment.get("device_name", "unknown")))
        except BaselineError as error:
            raise pytest.UsageError(f"attnkit: {error}") from None
        speed_settings = SpeedSettings(settings.reference, settings.seed, settings.budget_ms, settings.require_baseline,
                                       case_sets.CALL_LIMIT_MS.get(context.profile),
                                       read_programs=settings.save_baseline)
        revision = parts.revision
        return cls(parts.pool, context.outcomes, speed_settings, store, parts.threshold, context.device,
                   counterparts=dict(revision.counterparts) if revision else {}, ab_threshold=parts.ab_threshold,
                   sent=parts.sent, parallel_problem=parts.parallel_problem, revision=revision,
                   save_baseline=settings.save_baseline)

    def test_order(self, item: SuiteItem) -> int:
        """The reference's tests first: the gate divides every other implementation's timings by
        how much slower the machine runs the reference (gate.py: machine_factor). Then those of
        implementations that declare linear memory, and last those that do not: their big cases
        may need the whole GPU, and the room made for them stops the idle workers, the warm ones
        too, whose cases would then pay their first calls again with the GPU alone. On a fresh
        H100 (results/2026-11-27-session11, h100-cold3) cupy_naive's 16k case stopped all 18
        other workers before torch_flex's timings, whose first calls then took 12.3 s (0.5 s on an
        H200, where nothing was stopped)."""
        if item.impl == self.settings.reference:
            return 0
        linear = self.pool.info(item.impl).capabilities.get("memory_class") == MemoryClass.LINEAR
        return 1 if linear else 2

    def header_lines(self) -> list[str]:
        """The gate: the baseline file, or that nothing will be gated; the A/B against REV."""
        gate = table.gate_header(self.store, require_baseline=self.settings.require_baseline, revision=self.revision)
        return [f"gate: {gate}"]

    def report_sections(self, document: Mapping[str, Any]) -> dict[str, Any]:
        """The ``speed`` section (every measurement with its gate decision, the ceilings, the
        notes, the baseline file) and the ``ab`` list of --attnkit-against's paired verdicts."""
        against = document.get("against")
        measurements, gate = [], []
        for result in self.results.values():
            entry = result.measurement.to_dict()
            entry["ratio_to_reference"] = result.ratio_to_reference
            if self.ceilings:
                entry["share_of_matmul"] = result.measurement.tflops / self.ceilings["matmul_bf16_tflops"]
                entry["share_of_copy"] = result.measurement.gbps / self.ceilings["copy_gbps"]
            if against and result.measurement.impl in against["twins"].values():
                entry["of_revision"] = against["label"]  # never saved into a baseline
            measurements.append(entry)
            if result.decision is not None:
                gate.append({"impl": result.measurement.impl, "mode": result.measurement.mode,
                             "case": result.measurement.case.id, **asdict(result.decision)})
        return {
            "ab": [result.to_dict(against["label"]) for result in self.ab.values()] if against else [],
            "speed": {
                "ceilings": self.ceilings,
                "gpu_state": self.gpu_state,
                "measurements": measurements,
                "gate": gate,
                "machine_factor": self.machine_factor() if gate else None,
                # [cases the factor was taken over, the reference's cases with a baseline]
                "machine_factor_cases": self._factor_counts() if gate else None,
                "reference": self.settings.reference,
                "notes": list(self.notes.values()),
                # Cases not timed: one call took longer than the profile times (cases.CALL_LIMIT_MS).
                "over_limit": [{"impl": key.impl, "mode": key.mode, "case": key.case_id, "call_ms": took,
                                "limit_ms": self.settings.call_limit_ms} for key, took in self.over_limit.items()],
                **report.baseline_state(self.store),
            },
        }

    def finish(self, document: Mapping[str, Any], *, interrupted: bool) -> list[str]:
        """With --attnkit-save-baseline, save the document's timings (not an interrupted run's:
        the stored baseline stays whole)."""
        if not self.save_baseline:
            return []
        return report.save_baseline(self.store, document, document["environment"], interrupted=interrupted)

    # -- measuring ---------------------------------------------------------------------------
    def _measure_ceilings(self) -> None:
        if self._ceilings_asked or self.device != "cuda":
            return
        self._ceilings_asked = True
        try:
            reply = self.pool.run_once("ceilings", Request(Op.CEILINGS))
            self.ceilings, self.gpu_state = reply["ceilings"], reply["gpu_state"]
        except WorkerFailure as failure:
            self.notes["ceilings"] = f"the machine's ceilings could not be measured: {failure}"

    def _measure(self, impl: str, mode: str, case: Case) -> SpeedMeasurement:
        """Time one case in ``impl``'s worker; a reply other than OK skips or fails the test."""
        reply = self._request(impl, mode, case)
        self.outcomes.check(reply, impl=impl, where=f"{case.id} ({mode})", origin=self.pool.info(impl).origin)
        if self._record_over_limit(EntryKey(impl, mode, case.id), reply):
            self._skip_over_limit(impl, mode, case)
        return self._to_measurement(impl, mode, case, reply)

    def _record_over_limit(self, key: EntryKey, reply: Reply) -> bool:
        """Whether the worker did not time the case because its call was over the profile's limit
        (then :attr:`over_limit` keeps how long it took)."""
        if reply.status is not Status.OK or "over_limit_ms" not in reply.data:
            return False
        self.over_limit[key] = float(reply.data["over_limit_ms"])
        return True

    def _skip_over_limit(self, impl: str, mode: str, case: Case) -> None:
        took = self.over_limit[EntryKey(impl, mode, case.id)]
        raise Judged(skipped(f"{impl} on {case.id} ({mode}): one call took {took:.0f} ms, longer than this "
                             f"profile times ({self.settings.call_limit_ms:.0f} ms: eight such calls with the GPU "
                             "alone); --attnkit-profile=full times it"))

    def _warm_up(self, impl: str, mode: str, case: Case) -> Job | None:
        """The warm-up the runner sent ahead for this case's test, run or not; None where none was."""
        spec = next(spec for spec in self.tests if spec.backward == (mode == "backward"))
        return next(iter(self.sent(SuiteItem(self.name, spec, impl, case))), None)

    def _warmed(self, impl: str, mode: str, case: Case) -> Job | None:
        """The warm-up of this case, where it ran and its worker is still there (not closed, its
        process running)."""
        job = self._warm_up(impl, mode, case)
        if job is None or not job.future.done() or job.future.cancelled() or job.worker is None:
            return None
        if not job.future.result().ok or getattr(job.worker, "closed", False):
            return None
        return job if getattr(job.worker, "alive", True) else None

    def _where(self, impl: str, mode: str, case: Case) -> dict[str, Any]:
        """The worker that warmed this case up, where it did and its process still runs; else the
        primary. A worker stopped to make room for an out-of-memory would start again for this one
        case (about 11 s for torch_flex on an H100, 2026-11-25, results/2026-11-25-h100-session3):
        the primary, started again once if it was stopped too, loads the kernels from the cache."""
        job = self._warmed(impl, mode, case)
        return {} if job is None else {"worker": job.worker}

    def _program(self, impl: str, mode: str, case: Case) -> str | None:
        """The kernels the case's calls launch in the worker that times it (:meth:`_where`), where
        its warm-up read them there."""
        job = self._warmed(impl, mode, case)  # None: timed in the primary, whose program may differ
        return None if job is None else job.future.result().data.get("program")

    def _programs_matter(self, impl: str, mode: str, case: Case) -> bool:
        """Whether the case's baseline entry holds runs of more than one program: compared with all
        of them, as a run of no known program is, the gate's threshold would widen by how far the
        programs differ (an H200 entry holding the Triton and the Gluon kernels' runs: 48%)."""
        return len(self.store.programs(EntryKey(impl, mode, case.id))) > 1

    def _request(self, impl: str, mode: str, case: Case) -> Reply:
        options: dict[str, Any] = {"budget_ms": self.settings.budget_ms, "call_limit_ms": self.settings.call_limit_ms}
        warm_up = self._warm_up(impl, mode, case)
        # A warm-up dropped because the implementation's first calls show no setup: the case's
        # first call then tells how long a call takes (FIRST_CALL_MARGIN).
        if self.settings.call_limit_ms is not None and warm_up is not None and warm_up.pointless:
            options["first_call_limit_ms"] = FIRST_CALL_MARGIN * self.settings.call_limit_ms
        if self._program(impl, mode, case) is None and (self.settings.read_programs
                                                         or self._programs_matter(impl, mode, case)):
            options["program"] = True  # its warm-up read none here (dropped unrun, none sent, its worker gone)
        return self.pool.request_alone(impl, Request(Op.RUN, case, mode == "backward", self.settings.seed, options,
                                                     suite=self.name),
                                       **self._where(impl, mode, case))

    def _to_measurement(self, impl: str, mode: str, case: Case, reply: Reply) -> SpeedMeasurement:
        return SpeedMeasurement(impl, mode, case, Timing.from_dict(reply.data["timing"]),
                                reply.data.get("input_sets", 1), reply.data.get("gpu_state", {}),
                                self._program(impl, mode, case) or reply.data.get("program"),
                                reply.data.get("syncs"), shared_with(reply), bool(self._where(impl, mode, case)))

    def _first_measurement(self, impl: str, mode: str, case: Case) -> SpeedMeasurement:
        key = EntryKey(impl, mode, case.id)
        if key in self.over_limit:
            self._skip_over_limit(impl, mode, case)
        if key not in self._measured and key not in self._refused:
            base = self.base_of(impl)
            if base in self.counterparts:
                self._measure_pair(base, self.counterparts[base], mode, case)
            else:
                self._measured[key] = self._measure(impl, mode, case)
        if key in self._refused:
            self.outcomes.check(self._refused[key], impl=impl, where=f"{case.id} ({mode})",
                                 origin=self.pool.info(impl).origin)
        return self._measured[key]

    def base_of(self, impl: str) -> str:
        """The current implementation that ``impl`` is (itself, or the one it is REV's counterpart of)."""
        return next((base for base, counterpart in self.counterparts.items() if counterpart == impl), impl)

    def _block(self, impl: str, mode: str, case: Case, samples: int) -> Reply:
        return self.pool.request_alone(impl, Request(Op.RUN, case, mode == "backward", self.settings.seed,
                                                     {"samples": samples,
                                                      "budget_ms": self.settings.budget_ms}, suite=self.name),
                                       **self._where(impl, mode, case))

    def _measure_pair(self, impl: str, counterpart: str, mode: str, case: Case) -> None:
        """Time ``impl`` and REV's ``counterpart`` on one case in alternating blocks (see the module docstring).

        Each worker first warms the case up and takes one sample, which says how many samples the
        budget allows and whether calls are long (then a block is one sample); the pairs follow,
        the order flipping every pair (new-old, old-new, ...). A side whose reply is not OK
        (unsupported, raised, crashed) leaves the case uncompared: its own test reports the
        reply, and the other side is timed alone as without REV."""
        key = EntryKey(impl, mode, case.id)
        names = (impl, counterpart)
        probes: dict[str, Reply] = {}
        for name in names:
            probes[name] = self._block(name, mode, case, 1)
            if probes[name].status is not Status.OK:
                self._refused[EntryKey(name, mode, case.id)] = probes[name]
        blocks: dict[str, list[list[float]]] = {name: [] for name in names}
        replies: dict[str, list[Reply]] = {name: [] for name in names}
        problem = next((f"{name}: {probes[name].status.value}: {(probes[name].message.strip().splitlines() or [''])[-1]}"
                        for name in names if probes[name].status is not Status.OK), None)
        if problem is None:
            planned = max(int(probes[name].data.get("planned_samples", 15)) for name in names)
            long_call = any(probes[name].data.get("long_call") for name in names)
            block = 1 if long_call else BLOCK_SAMPLES
            pairs = min(MAX_PAIRS, max(MIN_PAIRS, math.ceil(planned / block)))
            for index in range(pairs):
                for name in (names if index % 2 == 0 else names[::-1]):
                    reply = self._block(name, mode, case, block)
                    if reply.status is not Status.OK:
                        self._refused[EntryKey(name, mode, case.id)] = reply
                        problem = f"{name}: {reply.status.value} after {index} pairs"
                        break
                    blocks[name].append(list(reply.data["timing"]["samples_ms"]))
                    replies[name].append(reply)
                if problem is not None:
                    break
        for name in names:
            name_key = EntryKey(name, mode, case.id)
            if name_key in self._refused:
                continue
            if problem is not None:  # timed alone, as without REV
                reply = self._request(name, mode, case)
                if reply.status is not Status.OK:
                    self._refused[name_key] = reply
                elif not self._record_over_limit(name_key, reply):  # over the limit: its test says so
                    self._measured[name_key] = self._to_measurement(name, mode, case, reply)
                continue
            first = Timing.from_dict(probes[name].data["timing"])
            samples = tuple(sample for samples in blocks[name] for sample in samples)
            clocks = tuple(clock for reply in replies[name] for clock in reply.data["timing"].get("clocks_mhz", ()))
            last = replies[name][-1].data
            self._measured[name_key] = SpeedMeasurement(name, mode, case,
                                                        replace(first, samples_ms=samples, clocks_mhz=clocks),
                                                        last.get("input_sets", 1), last.get("gpu_state", {}),
                                                        shared_with=shared_with(probes[name], *replies[name]))
        threshold = (self.ab_threshold or self.threshold)(key)
        syncs = {name: probes[name].data.get("syncs") for name in names} if problem is None else {}
        kind = sync_kind(syncs.get(impl), syncs.get(counterpart))
        if kind == SyncKind.BOTH:
            # Both versions' times follow their processes' host speed (controller/paired.py):
            # only a doubling stands out of that noise.
            threshold = max(threshold, SYNC_THRESHOLD)
        decision = None if problem is not None else decide_paired(blocks[impl], blocks[counterpart], threshold=threshold)
        self.ab[key] = ABResult(impl, counterpart, mode, case, decision, problem, kind, syncs.get(impl) if kind else None)

    def _reference_median(self, mode: str, case: Case) -> float | None:
        """The reference's median on this case (timed now if its own test has not run), or None."""
        reference = self.settings.reference
        if reference not in self.pool.impls or self.pool.info(reference).status is not ImplStatus.AVAILABLE:
            return None
        try:
            return self._first_measurement(reference, mode, case).timing.median_ms
        except Judged:
            return None  # the reference's own test reports why

    def check(self, impl: str, mode: str, case: Case, *, properties: Properties | None = None,
              benchmark: Any = None) -> SpeedResult:
        self._measure_ceilings()
        measurement = self._first_measurement(impl, mode, case)
        reference_ms = self._reference_median(mode, case)
        ratio = measurement.timing.median_ms / reference_ms if reference_ms else None
        self._suspect(measurement, ratio)
        decision = None
        is_counterpart = self.base_of(impl) != impl
        if is_counterpart:
            pass  # REV's half of an A/B pair: the current implementation's test gates the pair
        elif self.store.found and measurement.key in self.store.entries:
            decision, measurement = self._gate(measurement)
            ratio = measurement.timing.median_ms / reference_ms if reference_ms else None
            if decision.verdict == GateVerdict.OTHER_PROGRAM:
                self.notes[f"program:{measurement.key}"] = (
                    f"{impl} on {case.id} ({mode}) ran another program than every saved run of its baseline entry "
                    f"(now: {plain(measurement.program)}; saved: {'; '.join(sorted(self.store.programs(measurement.key)))}): "
                    "not gated. The same source compiled to other kernels in this process (autotuning, or heuristics "
                    "that read the device); save a baseline from this run to add this program to the entry.")
        elif self.settings.require_baseline:
            where = "no baseline file for this device" if not self.store.found else "no baseline entry"
            raise Judged(failed(f"{impl} on {case.id} ({mode}): {where} ({self.store.path}) and a baseline is required "
                        "(--attnkit-require-baseline)"))
        result = SpeedResult(measurement, ratio, decision)
        self.results[measurement.key] = result
        self._note_shared()
        if properties is not None:
            properties.extend(self._properties(result))
        if benchmark is not None:
            self._feed_benchmark(benchmark, measurement)
        failures = []
        if decision is not None and decision.verdict == GateVerdict.REGRESSION:
            failures.append(f"{impl} regressed on {case.id} ({mode}): {format_decision(decision)}"
                            + (f"; the GPU was shared with pid {', '.join(map(str, measurement.shared_with))} "
                               "while it was timed" if measurement.shared_with else ""))
        paired = self.ab.get(measurement.key)
        if paired is not None and paired.decision is not None and paired.decision.verdict == GateVerdict.REGRESSION:
            failures.append(f"{impl} regressed against {paired.counterpart} on {case.id} ({mode}): "
                            f"{format_paired(paired.decision)}")
        if failures:
            raise Judged(failed("\n".join(failures)))
        return result

    def _note_shared(self) -> None:
        """Say once, for the whole run, that other processes computed on the GPU during timings."""
        shared = [result.measurement for result in self.results.values() if result.measurement.shared_with]
        if shared:
            pids = sorted({pid for measurement in shared for pid in measurement.shared_with})
            first = shared[0]
            self.notes["shared"] = (
                f"the GPU was shared with other processes (pid {', '.join(map(str, pids))}) while {len(shared)} "
                f"case(s) were timed (first: {first.impl} on {first.case.id}, {first.mode}): their timings include "
                "that work, a regression on them may be its doing, and this run saves no baseline")

    def _properties(self, result: SpeedResult) -> Properties:
        measurement = result.measurement
        figures: dict[str, float | None] = {"tflops": measurement.tflops, "gbps": measurement.gbps,
                                            "ratio_to_reference": result.ratio_to_reference}
        if self.ceilings:
            figures["share_of_matmul"] = measurement.tflops / self.ceilings["matmul_bf16_tflops"]
            figures["share_of_copy"] = measurement.gbps / self.ceilings["copy_gbps"]
        properties: Properties = [(f"attnkit_{name}", round(value, 4)) for name, value in figures.items()
                                  if value is not None]
        properties.append(("attnkit_median_ms", measurement.timing.median_ms))
        return properties

    def _suspect(self, measurement: SpeedMeasurement, ratio: float | None) -> None:
        """Fail timings that cannot be trusted: work the events did not see, or a speedup too good.
        GPU only: CPU timings are not evidence of either. Work the events did not see, on a GPU
        shared with another process, is a skip: that process's kernels also make the host wait."""
        if self.device != "cuda":
            return
        impl, mode, case_id = measurement.key
        timing = measurement.timing
        if timing.wait_ms is not None and timing.wait_ms > ESCAPE_FACTOR * timing.median_ms + ESCAPE_SLACK_MS:
            if measurement.shared_with:
                # Another process's kernels take turns on the GPU with this call's: the host waits
                # for them too. Seen on an H200 beside a matmul loop, with torch_sdpa (2026-11-26).
                raise Judged(skipped(
                    f"{impl} on {case_id} ({mode}): not judged: after issuing a call the host waited "
                    f"{timing.wait_ms:.4f} ms for the device where CUDA events saw {timing.median_ms:.4f} ms, "
                    f"and the GPU was shared with pid {', '.join(map(str, measurement.shared_with))}, whose "
                    "work may be that wait; time it on a GPU of its own"))
            raise Judged(failed(f"{impl} on {case_id} ({mode}): its work escapes the timed stream: CUDA events on the "
                        f"current stream saw {timing.median_ms:.4f} ms per call, but after issuing a call the "
                        f"host waited {timing.wait_ms:.4f} ms for the device (a kernel launched on another stream, "
                        "not joined back?)"))
        if impl != self.settings.reference and ratio is not None and ratio * SUSPICIOUS_SPEEDUP < 1 \
                and self._beyond_the_machine(measurement):
            raise Judged(failed(f"{impl} on {case_id} ({mode}) is suspiciously fast: {1 / ratio:.0f}x faster than "
                        f"{self.settings.reference} on the same inputs, at {measurement.tflops:.0f} TFLOP/s and "
                        f"{measurement.gbps:.0f} GB/s (KernelBench flags speedups beyond {SUSPICIOUS_SPEEDUP:g}x: "
                        "cached results, skipped work, timing on another stream)"))

    def _beyond_the_machine(self, measurement: SpeedMeasurement) -> bool:
        """Whether a figure passes what this machine can do (always, when its ceilings are not
        known). A reference that runs a slow path (an additive ALiBi mask through SDPA's math
        backend) can honestly be beaten tenfold; work done at more than the machine's matmul rate,
        or bytes moved far faster than its copy bandwidth, cannot have been done."""
        if not self.ceilings:
            return True
        return (measurement.tflops > CEILING_SLACK * self.ceilings["matmul_bf16_tflops"]
                or measurement.gbps > BANDWIDTH_SLACK * self.ceilings["copy_gbps"])

    def _feed_benchmark(self, benchmark: Any, measurement: SpeedMeasurement) -> None:
        info = {"timer": measurement.timing.timer, "flops": measurement.flops, "bytes": measurement.bytes,
                "tflops": measurement.tflops, "gbps": measurement.gbps, "device": self.store.device_name}
        if not feed_benchmark(benchmark, list(measurement.timing.samples_ms), info):
            self.notes["benchmark"] = "this pytest-benchmark version cannot take recorded samples; its tables are empty"

    # -- gating ------------------------------------------------------------------------------
    def _baseline(self, measurement: SpeedMeasurement) -> tuple[Pool, str]:
        """The saved runs a measurement is judged against, and which they are: "program", the runs
        of its program (every run where it or the entry recorded none); "core", where no saved run
        timed its program, the runs whose programs have its core (:func:`pytest_attnkit.programs.core`:
        they differ from it only in kernels that took at most 1% of a call's kernel time, such as a
        reduction TorchInductor autotuned otherwise in this process); "other", neither (every run:
        the verdict is ``GateVerdict.OTHER_PROGRAM``)."""
        key, program = measurement.key, measurement.program
        known = self.store.programs(key)
        which = "program"
        if program and known and plain(program) not in known:
            kernels = core(program)
            shared = self.store.pooled_by_core(key, kernels) if kernels else None
            if shared is not None:
                return shared, "core"
            which = "other"
        baseline = self.store.pooled(key, program)
        assert baseline is not None
        return baseline, which

    def _gate(self, measurement: SpeedMeasurement) -> tuple[Decision, SpeedMeasurement]:
        """The verdict against the stored baseline, and the measurement of the round it used. A
        measurement of a program no saved run timed, and whose core kernels none timed either, gets
        the verdict ``GateVerdict.OTHER_PROGRAM``: its time says how the compiler chose in this
        process, not what the code's change did."""
        key = measurement.key
        baseline, which = self._baseline(measurement)
        factor = 1.0 if key.impl == self.settings.reference else self.machine_factor()
        threshold = noise_threshold(self.threshold(key), baseline)
        if measurement.syncs:
            threshold = max(threshold, SYNC_THRESHOLD)
            self.notes[f"syncs:{key}"] = (
                f"{key.impl} on {key.case_id} ({key.mode}) synchronizes with the device inside the call "
                f"({measurement.syncs}): its time follows this process's host speed, so it is gated at "
                f"{SYNC_THRESHOLD:.0%} (a doubling).")
        decision = decide(baseline.samples_ms, list(measurement.timing.samples_ms), threshold=threshold,
                          machine_factor=factor)
        if decision.verdict == GateVerdict.OTHER_MACHINE:
            self.notes["machine"] = (
                f"the reference ({self.settings.reference}) ran {factor:.3g}x its saved time: the baselines do not "
                f"describe this machine as it runs now (past {MACHINE_FACTOR_LIMIT:g}x either way), so no case was "
                "judged against them. Is the GPU shared, throttled or another one? Save baselines again on this "
                "machine once it runs as it should.")
            return replace(decision, baseline_runs=baseline.runs, judged_by=which), measurement
        if which == "other":
            return (replace(decision, verdict=GateVerdict.OTHER_PROGRAM, baseline_runs=baseline.runs, judged_by=which),
                    measurement)
        if which == "core":
            self.notes[f"core:{key}"] = (
                f"{key.impl} on {key.case_id} ({key.mode}) ran a program no saved run timed, with the core kernels "
                f"of {baseline.runs} saved run(s) (those that take 99% of a call's kernel time; the others took at "
                f"most 1% of it in each): judged against those runs. Now: {measurement.program}.")
        decision = explained_by_clock(decision, measurement.timing.clock_mhz_median, baseline.clock_mhz)
        if decision.verdict in (GateVerdict.REGRESSION, GateVerdict.SLOWER_CLOCK):
            decision, measurement = self._confirm(measurement, baseline, decision, threshold, factor)
        if decision.verdict == GateVerdict.SLOWER_CLOCK:
            self.notes[f"clock:{key}"] = (
                f"{key.impl} on {key.case_id} ({key.mode}) ran {100 * (decision.ratio - 1):+.1f}% against its "
                f"baseline with the SM clock at {decision.clock_mhz:.0f} MHz, "
                f"{100 * (1 - decision.clock_mhz / decision.baseline_clock_mhz):.1f}% below its saved runs' "
                f"{decision.baseline_clock_mhz:.0f} MHz: at equal clocks that is "
                f"{100 * (at_equal_clocks(decision) - 1):+.1f}%, within half "
                f"the {100 * threshold:.1f}% threshold, so it is not judged. A GPU that runs hot or under a power cap "
                "lowers its clock; a kernel that draws more power can lower it too. Time it again on a GPU that "
                "holds its clock to judge it.")
        return replace(decision, baseline_runs=baseline.runs, judged_by=which), measurement

    def _confirm(self, first_measurement: SpeedMeasurement, baseline: Pool, first: Decision,
                 threshold: float, factor: float) -> tuple[Decision, SpeedMeasurement]:
        """Re-measure a suspected regression in fresh rounds; it stands only if most rounds agree.

        On a GPU a whole run can shift by several percent (new allocations, clock state), which
        the samples of one round cannot show; independent rounds can. A real slowdown shows in
        every round, a one-off shift in one. Each round's own clock may excuse that round only
        (:func:`~pytest_attnkit.controller.gate.explained_by_clock`): a regression in most rounds
        stands, one slower in most rounds where the clock excused some is "slower clock". The
        median round is the one kept (of the excused rounds, for "slower clock")."""
        impl, mode, _ = first_measurement.key
        rounds = [(first, first_measurement)]
        for _ in range(CONFIRMATION_ROUNDS):
            measurement = self._measure(impl, mode, first_measurement.case)
            decision = decide(baseline.samples_ms, list(measurement.timing.samples_ms), threshold=threshold,
                              machine_factor=factor)
            rounds.append((explained_by_clock(decision, measurement.timing.clock_mhz_median, baseline.clock_mhz),
                           measurement))
        flagged = sum(decision.verdict == GateVerdict.REGRESSION for decision, _ in rounds)
        excused = sum(decision.verdict == GateVerdict.SLOWER_CLOCK for decision, _ in rounds)
        verdict = (GateVerdict.REGRESSION if flagged * 2 > len(rounds) else
                   GateVerdict.SLOWER_CLOCK if (flagged + excused) * 2 > len(rounds) else GateVerdict.UNCHANGED)
        kept = [pair for pair in rounds if pair[0].verdict == verdict] if verdict == GateVerdict.SLOWER_CLOCK else rounds
        chosen, measurement = sorted(kept, key=lambda pair: pair[0].ratio)[len(kept) // 2]
        return replace(chosen, verdict=verdict, rounds=len(rounds), rounds_flagged=flagged), measurement

    def machine_factor(self) -> float:
        """How much slower this machine runs the reference than when the baselines were saved:
        the median over the reference's steady cases (:meth:`factor_cases`) of its now/baseline
        ratio, 1.0 where it has none. One number for the run, so the noise of one reference case
        cannot move another implementation's verdict. The suite times the reference first (the
        plugin orders its tests), so every case counts."""
        ratios, cases = self.factor_cases()
        if not ratios and cases:
            self.notes["machine_factor"] = (
                f"none of the reference's ({self.settings.reference}) {cases} case(s) with a baseline is steady "
                "(each synchronizes inside the call or its saved runs disagree too much): the gate divides by no "
                "machine factor in this run, so a machine slower or faster than when the baselines were saved "
                "reads as the kernels' own change.")
        return statistics.median(ratios) if ratios else 1.0

    def _factor_counts(self) -> list[int]:
        ratios, cases = self.factor_cases()
        return [len(ratios), cases]

    def factor_cases(self) -> tuple[list[float], int]:
        """(the now/baseline ratios the machine factor is taken over, how many of the reference's
        cases had a baseline). Left out: a case that synchronizes with the device inside the call
        (its time follows this process's host, as torch_sdpa's banded, packed and paged paths do:
        its banded forward read 7.25 to 10.30 ms from run to run on an H200,
        results/2026-11-29-session18), and one whose saved runs disagreed beyond
        :data:`FACTOR_NOISE_LIMIT`. In a run of few cases (``-k``) such a case weighs on the factor:
        there the median of its ratio (1.37) and its steady backward's (1.00) made 1.18, which
        moved an unchanged kernel to "-15%", and could as well hide a slowdown."""
        ratios, cases = [], 0
        for key, result in self.results.items():
            baseline = self.store.pooled(key) if key.impl == self.settings.reference else None
            if baseline is None:
                continue
            cases += 1
            if result.measurement.syncs or noise_threshold(0.0, baseline) > FACTOR_NOISE_LIMIT:
                continue
            ratios.append(machine_factor(baseline.samples_ms, list(result.measurement.timing.samples_ms)))
        return ratios, cases


def shared_with(*replies: Reply) -> tuple[int, ...]:
    """The processes not of this run that computed on the GPU during these speed replies' timings
    (what the worker saw through NVML, less this run's own workers)."""
    others = {pid for reply in replies for pid in ((reply.data.get("gpu_processes") or {}).get("others") or ())}
    return tuple(sorted(others - worker_pids()))


def format_decision(decision: Decision) -> str:
    rounds = (f"; flagged in {decision.rounds_flagged} of {decision.rounds} independent rounds"
              if decision.rounds > 1 else "")
    return (f"median {decision.baseline_median_ms:.4f} ms -> {decision.now_median_ms:.4f} ms, "
            f"{100 * (decision.ratio - 1):+.1f}% after a machine factor of {decision.machine_factor:.3f} "
            f"(threshold {100 * decision.threshold:.1f}%, one-sided Mann-Whitney p = {decision.p_slower:.2g}{rounds})"
            + (f"; SM clock {decision.clock_mhz:.0f} MHz, its saved runs' {decision.baseline_clock_mhz:.0f} MHz"
               if decision.clock_mhz and decision.baseline_clock_mhz else ""))


def format_paired(decision: PairedDecision) -> str:
    return (f"median {decision.old_median_ms:.4f} ms -> {decision.new_median_ms:.4f} ms, new/old "
            f"{decision.ratio:.3f} ({100 * decision.confidence:.0f}% interval {decision.low:.3f}-{decision.high:.3f}) "
            f"from {decision.pairs} interleaved pairs of blocks (threshold {100 * decision.threshold:.1f}%, "
            f"one-sided Wilcoxon signed-rank p = {decision.p_slower:.2g})")
