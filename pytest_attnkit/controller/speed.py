"""The speed suite's check: time a case in the worker, judge the timing, gate it.

Each speed test asks the implementation's worker to time one case (:mod:`pytest_attnkit.worker.speed`,
:mod:`pytest_attnkit.worker.timer`) and gets a :class:`~pytest_attnkit.records.SpeedMeasurement`
back. The check compares it with the reference implementation timed on the same case, fails
timings that cannot be trusted (work that escapes the timed stream, a speedup too good to be
true), hands the samples to pytest-benchmark when it is installed, and asks the gate
(:mod:`pytest_attnkit.controller.gate`) for a verdict against this GPU's baseline
(:mod:`pytest_attnkit.controller.baselines`). A suspected regression is measured again in fresh
rounds and stands only if most rounds agree; the result keeps the round the verdict used.

On the CPU the numbers check the plumbing and give a rough figure, nothing more: CPU timings move
by tens of percent between processes (and by far more when the machine is busy), so there the
suspicious-speedup check is off and the gate's default threshold is a doubling
(:data:`CPU_THRESHOLD`), which only a real change crosses.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import pytest

from pytest_attnkit.contract import Case
from pytest_attnkit.controller.baselines import BaselineStore
from pytest_attnkit.controller.gate import Decision, decide, machine_factor, noise_threshold
from pytest_attnkit.controller.outcome import Outcomes
from pytest_attnkit.controller.pool import WorkerPool
from pytest_attnkit.records import EntryKey, SpeedMeasurement, Timing
from pytest_attnkit.controller.process import WorkerFailure

CONFIRMATION_ROUNDS = 2
#: A call is suspected of escaping the timed stream when, after issuing it, the host waits for the
#: device this many times longer than the events measured, plus this slack for the synchronization.
ESCAPE_FACTOR = 3.0
ESCAPE_SLACK_MS = 0.2
SUSPICIOUS_SPEEDUP = 10.0
#: The gate's threshold on the CPU unless one is set: only a doubling is a regression there.
CPU_THRESHOLD = 1.0

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


@dataclass
class SpeedSettings:
    reference: str
    seed: int
    budget_ms: float
    require_baseline: bool


@dataclass
class SpeedCheck:
    """Times and gates every speed test of a run; ``threshold`` gives a case's practical threshold."""

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
    _measured: dict[EntryKey, SpeedMeasurement] = field(default_factory=dict)
    _ceilings_asked: bool = False

    # -- measuring ---------------------------------------------------------------------------
    def _measure_ceilings(self) -> None:
        if self._ceilings_asked or self.device != "cuda":
            return
        self._ceilings_asked = True
        try:
            reply = self.pool.run_once("ceilings", {"op": "ceilings"})
            self.ceilings, self.gpu_state = reply["ceilings"], reply["gpu_state"]
        except WorkerFailure as failure:
            self.notes["ceilings"] = f"the machine's ceilings could not be measured: {failure}"

    def _measure(self, impl: str, mode: str, case: Case) -> SpeedMeasurement:
        """Time one case in ``impl``'s worker; a reply other than OK skips or fails the test."""
        reply = self.pool.request(impl, {"op": "speed", "case": case.to_dict(), "mode": mode,
                                         "seed": self.settings.seed, "budget_ms": self.settings.budget_ms})
        self.outcomes.settle(reply, impl=impl, where=f"{case.id} ({mode})", origin=self.pool.info(impl).origin)
        return SpeedMeasurement(impl, mode, case, Timing.from_dict(reply.data["timing"]),
                                reply.data.get("input_sets", 1), reply.data.get("gpu_state", {}))

    def _first_measurement(self, impl: str, mode: str, case: Case) -> SpeedMeasurement:
        key = EntryKey(impl, mode, case.id)
        if key not in self._measured:
            self._measured[key] = self._measure(impl, mode, case)
        return self._measured[key]

    def _reference_median(self, mode: str, case: Case) -> float | None:
        """The reference's median on this case (timed now if its own test has not run), or None."""
        reference = self.settings.reference
        if reference not in self.pool.impls or self.pool.info(reference).status != "available":
            return None
        try:
            return self._first_measurement(reference, mode, case).timing.median_ms
        except (pytest.skip.Exception, pytest.fail.Exception):
            return None  # the reference's own test reports why

    def check(self, impl: str, mode: str, case: Case, *, properties: Properties | None = None,
              benchmark: Any = None) -> SpeedResult:
        self._measure_ceilings()
        measurement = self._first_measurement(impl, mode, case)
        reference_ms = self._reference_median(mode, case)
        ratio = measurement.timing.median_ms / reference_ms if reference_ms else None
        self._suspect(measurement, ratio)
        decision = None
        if self.store.found and measurement.key in self.store.entries:
            decision, measurement = self._gate(measurement)
            ratio = measurement.timing.median_ms / reference_ms if reference_ms else None
        elif self.settings.require_baseline:
            where = "no baseline file for this device" if not self.store.found else "no baseline entry"
            pytest.fail(f"{impl} on {case.id} ({mode}): {where} ({self.store.path}) and a baseline is required "
                        "(--attnkit-require-baseline)", pytrace=False)
        result = SpeedResult(measurement, ratio, decision)
        self.results[measurement.key] = result
        if properties is not None:
            properties.extend(self._properties(result))
        if benchmark is not None:
            self._feed_benchmark(benchmark, measurement)
        if decision is not None and decision.verdict == "regression":
            pytest.fail(f"{impl} regressed on {case.id} ({mode}): {format_decision(decision)}", pytrace=False)
        return result

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
        GPU only: CPU timings are not evidence of either."""
        if self.device != "cuda":
            return
        impl, mode, case_id = measurement.key
        timing = measurement.timing
        if timing.wait_ms is not None and timing.wait_ms > ESCAPE_FACTOR * timing.median_ms + ESCAPE_SLACK_MS:
            pytest.fail(f"{impl} on {case_id} ({mode}): its work escapes the timed stream: CUDA events on the "
                        f"current stream saw {timing.median_ms:.4f} ms per call, but after issuing a call the "
                        f"host waited {timing.wait_ms:.4f} ms for the device (a kernel launched on another stream, "
                        "not joined back?)", pytrace=False)
        if impl != self.settings.reference and ratio is not None and ratio * SUSPICIOUS_SPEEDUP < 1:
            pytest.fail(f"{impl} on {case_id} ({mode}) is suspiciously fast: {1 / ratio:.0f}x faster than "
                        f"{self.settings.reference} on the same inputs (KernelBench flags speedups beyond "
                        f"{SUSPICIOUS_SPEEDUP:g}x: cached results, skipped work, timing on another stream)",
                        pytrace=False)

    def _feed_benchmark(self, benchmark: Any, measurement: SpeedMeasurement) -> None:
        info = {"timer": measurement.timing.timer, "flops": measurement.flops, "bytes": measurement.bytes,
                "tflops": measurement.tflops, "gbps": measurement.gbps, "device": self.store.device_name}
        if not feed_benchmark(benchmark, list(measurement.timing.samples_ms), info):
            self.notes["benchmark"] = "this pytest-benchmark version cannot take recorded samples; its tables are empty"

    # -- gating ------------------------------------------------------------------------------
    def _gate(self, measurement: SpeedMeasurement) -> tuple[Decision, SpeedMeasurement]:
        """The verdict against the stored baseline, and the measurement of the round it used."""
        key = measurement.key
        baseline = self.store.pooled(key)
        assert baseline is not None
        factor = 1.0 if key.impl == self.settings.reference else self.machine_factor()
        threshold = noise_threshold(self.threshold(key), baseline)
        decision = decide(baseline.samples_ms, list(measurement.timing.samples_ms), threshold=threshold,
                          machine_factor=factor)
        if decision.verdict == "regression":
            decision, measurement = self._confirm(measurement, baseline.samples_ms, decision, threshold, factor)
        return replace(decision, baseline_runs=baseline.runs), measurement

    def _confirm(self, first_measurement: SpeedMeasurement, baseline_ms: list[float], first: Decision,
                 threshold: float, factor: float) -> tuple[Decision, SpeedMeasurement]:
        """Re-measure a suspected regression in fresh rounds; it stands only if most rounds agree.

        On a GPU a whole run can shift by several percent (new allocations, clock state), which
        the samples of one round cannot show; independent rounds can. A real slowdown shows in
        every round, a one-off shift in one. The median round decides, and is the one kept."""
        impl, mode, _ = first_measurement.key
        rounds = [(first, first_measurement)]
        for _ in range(CONFIRMATION_ROUNDS):
            measurement = self._measure(impl, mode, first_measurement.case)
            rounds.append((decide(baseline_ms, list(measurement.timing.samples_ms), threshold=threshold,
                                  machine_factor=factor), measurement))
        flagged = sum(decision.verdict == "regression" for decision, _ in rounds)
        chosen, measurement = sorted(rounds, key=lambda pair: pair[0].ratio)[len(rounds) // 2]
        verdict = "regression" if flagged * 2 > len(rounds) else "unchanged"
        return replace(chosen, verdict=verdict, rounds=len(rounds), rounds_flagged=flagged), measurement

    def machine_factor(self) -> float:
        """How much slower this machine runs the reference than when the baselines were saved:
        the median over every case of the reference's now/baseline ratio. One number for the run,
        so the noise of one reference case cannot move another implementation's verdict. The
        suite times the reference first (the plugin orders its tests), so every case counts."""
        ratios = []
        for key, result in self.results.items():
            baseline = self.store.pooled(key) if key.impl == self.settings.reference else None
            if baseline is not None:
                ratios.append(machine_factor(baseline.samples_ms, list(result.measurement.timing.samples_ms)))
        return statistics.median(ratios) if ratios else 1.0


def format_decision(decision: Decision) -> str:
    rounds = (f"; flagged in {decision.rounds_flagged} of {decision.rounds} independent rounds"
              if decision.rounds > 1 else "")
    return (f"median {decision.baseline_median_ms:.4f} ms -> {decision.now_median_ms:.4f} ms, "
            f"{100 * (decision.ratio - 1):+.1f}% after a machine factor of {decision.machine_factor:.3f} "
            f"(threshold {100 * decision.threshold:.1f}%, one-sided Mann-Whitney p = {decision.p_slower:.2g}{rounds})")
