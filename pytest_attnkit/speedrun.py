"""The speed suite's side of the pytest process: measurements, ceilings, baselines and verdicts.

Each speed test asks the implementation's worker to time one case (:mod:`pytest_attnkit.speed`,
:mod:`pytest_attnkit.timer`), turns the samples into figures (TFLOP/s, GB/s, shares of this
machine's measured ceilings, speed against the reference implementation), hands the samples to
pytest-benchmark when it is installed, and asks the gate (:mod:`pytest_attnkit.gate`) for a
verdict against this GPU's baseline (:mod:`pytest_attnkit.baselines`). A regression fails the
test with the numbers that decided it; the terminal summary shows every figure and verdict.
"""

from __future__ import annotations

import datetime
import math
import platform
import statistics
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_attnkit import baselines
from pytest_attnkit.contract import Case
from pytest_attnkit.gate import Decision, Pool, decide, machine_factor, noise_threshold, pool
from pytest_attnkit.supervisor import WorkerFailure

if TYPE_CHECKING:
    from pytest_attnkit.session import AttnkitSession


CONFIRMATION_ROUNDS = 2
#: A call is suspected of escaping the timed stream when, after issuing it, the host waits for the
#: device this many times longer than the events measured, plus this slack for the synchronization.
ESCAPE_FACTOR = 3.0
ESCAPE_SLACK_MS = 0.2
SUSPICIOUS_SPEEDUP = 10.0


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


class SpeedRun:
    def __init__(self, session: "AttnkitSession", rootdir: Path) -> None:
        self.session = session
        self.settings = session.settings
        self.results: dict[str, dict[str, Any]] = {}
        self.decisions: dict[str, Decision] = {}
        self.notes: dict[str, str] = {}
        self.ceilings: dict[str, Any] | None = None
        self.gpu_state: dict[str, Any] = {}
        self.save_counts: dict[str, int] = {}
        self.directory = (rootdir / self.settings.baseline_dir).resolve()
        self.device_name = str(session.environment.get("device_name", "unknown"))
        self.path = baselines.baseline_path(self.directory, self.device_name)
        try:
            self.baseline = baselines.load(self.path, self.device_name)
        except baselines.BaselineError as error:
            raise pytest.UsageError(f"attnkit: {error}") from None

    # -- measuring ---------------------------------------------------------------------------
    def _measure_ceilings(self) -> None:
        if self.ceilings is not None:
            return
        self.ceilings = {}
        if self.session.device != "cuda":
            return
        worker = self.session._make_worker("ceilings", {"device": self.session.device})
        try:
            reply = worker.request({"op": "ceilings"}, self.settings.timeout)
            self.ceilings, self.gpu_state = reply["ceilings"], reply["gpu_state"]
        except WorkerFailure as failure:
            self.notes["ceilings"] = f"the machine's ceilings could not be measured: {failure}"
        finally:
            worker.close()

    def _measure(self, name: str, mode: str, case: Case) -> dict[str, Any]:
        key = baselines.entry_key(name, mode, case.id)
        if key in self.results:
            return self.results[key]
        worker = self.session._usable_worker(name)
        message = {"op": "speed", "case": case.to_dict(), "mode": mode, "seed": self.settings.seed,
                   "budget_ms": self.settings.budget_ms}
        try:
            reply = worker.request(message, self.settings.timeout)
        except WorkerFailure as failure:
            pytest.fail(f"{name} on {case.id} ({mode}): {failure}", pytrace=False)
        if reply["status"] in ("unsupported", "unavailable"):
            pytest.skip(f"{name} does not support it: {reply['message']}")
        if reply["status"] != "measured":
            pytest.fail(f"{name} on {case.id} ({mode}): {reply['message']}", pytrace=False)
        measurement = reply["measurement"]
        timing = measurement["timing"]
        seconds = timing["median_ms"] / 1e3
        measurement["tflops"] = measurement["flops"] / seconds / 1e12
        measurement["gbps"] = measurement["bytes"] / seconds / 1e9
        measurement.update(impl=name, mode=mode, case=case.id)
        self.results[key] = measurement
        return measurement

    def _reference_samples(self, mode: str, case: Case) -> list[float] | None:
        reference = self.settings.reference
        info = self.session.impls.get(reference)
        if info is None or info.status != "available":
            return None
        key = baselines.entry_key(reference, mode, case.id)
        if key not in self.results:
            try:
                self._measure(reference, mode, case)
            except (pytest.skip.Exception, pytest.fail.Exception):
                return None  # the reference's own test reports why
        return self.results[key]["timing"]["samples_ms"]

    def check(self, name: str, mode: str, case: Case, request: pytest.FixtureRequest) -> None:
        self._measure_ceilings()
        measurement = self._measure(name, mode, case)
        key = baselines.entry_key(name, mode, case.id)
        reference_now = self._reference_samples(mode, case)
        if reference_now is not None:
            measurement["ratio_to_reference"] = statistics.median(measurement["timing"]["samples_ms"]) / statistics.median(reference_now)
        ceilings = self.ceilings or {}
        if ceilings:
            measurement["share_of_matmul"] = measurement["tflops"] / ceilings["matmul_bf16_tflops"]
            measurement["share_of_copy"] = measurement["gbps"] / ceilings["copy_gbps"]
        for prop in ("tflops", "gbps", "ratio_to_reference", "share_of_matmul", "share_of_copy"):
            if prop in measurement:
                request.node.user_properties.append((f"attnkit_{prop}", round(measurement[prop], 4)))
        request.node.user_properties.append(("attnkit_median_ms", measurement["timing"]["median_ms"]))
        self._feed_benchmark(request, measurement)
        self._suspect(name, mode, case, measurement)
        self._gate(name, mode, case, key, measurement)

    def _suspect(self, name: str, mode: str, case: Case, measurement: dict[str, Any]) -> None:
        """Fail timings that cannot be trusted: work the events did not see, or a speedup too good."""
        timing = measurement["timing"]
        wait = timing.get("wait_ms")
        if wait is not None and wait > ESCAPE_FACTOR * timing["median_ms"] + ESCAPE_SLACK_MS:
            pytest.fail(f"{name} on {case.id} ({mode}): its work escapes the timed stream: CUDA events on the "
                        f"current stream saw {timing['median_ms']:.4f} ms per call, but after issuing a call the "
                        f"host waited {wait:.4f} ms for the device (a kernel launched on another stream, not "
                        "joined back?)", pytrace=False)
        ratio = measurement.get("ratio_to_reference")
        if name != self.settings.reference and ratio is not None and ratio * SUSPICIOUS_SPEEDUP < 1:
            pytest.fail(f"{name} on {case.id} ({mode}) is suspiciously fast: {1 / ratio:.0f}x faster than "
                        f"{self.settings.reference} on the same inputs (KernelBench flags speedups beyond "
                        f"{SUSPICIOUS_SPEEDUP:g}x: cached results, skipped work, timing on another stream)",
                        pytrace=False)

    def _feed_benchmark(self, request: pytest.FixtureRequest, measurement: dict[str, Any]) -> None:
        try:
            benchmark = request.getfixturevalue("benchmark")
        except pytest.FixtureLookupError:
            return  # pytest-benchmark is not installed
        info = {"timer": measurement["timing"]["timer"], "flops": measurement["flops"], "bytes": measurement["bytes"],
                "tflops": measurement["tflops"], "gbps": measurement["gbps"], "device": self.device_name}
        if not feed_benchmark(benchmark, measurement["timing"]["samples_ms"], info):
            self.notes["benchmark"] = "this pytest-benchmark version cannot take recorded samples; its tables are empty"

    # -- gating ------------------------------------------------------------------------------
    def _gate(self, name: str, mode: str, case: Case, key: str, measurement: dict[str, Any]) -> None:
        if self.baseline is None or key not in self.baseline:
            where = "no baseline file for this device" if self.baseline is None else "no baseline entry"
            if self.settings.require_baseline:
                pytest.fail(f"{name} on {case.id} ({mode}): {where} ({self.path}) and a baseline is required "
                            "(--attnkit-require-baseline)", pytrace=False)
            return
        baseline = self.pooled(key)
        factor = 1.0 if name == self.settings.reference else self.machine_factor()
        threshold = noise_threshold(self.session.threshold(name, mode, case.id), baseline)
        decision = decide(baseline.samples_ms, measurement["timing"]["samples_ms"], threshold=threshold,
                          machine_factor=factor)
        if decision.verdict == "regression":
            decision = self._confirm(name, mode, case, baseline.samples_ms, decision, threshold, factor)
        decision = replace(decision, baseline_runs=baseline.runs)
        self.decisions[key] = decision
        if decision.verdict == "regression":
            pytest.fail(f"{name} regressed on {case.id} ({mode}): {format_decision(decision)}", pytrace=False)

    def _confirm(self, name: str, mode: str, case: Case, baseline_ms: list[float], first: Decision,
                 threshold: float, factor: float) -> Decision:
        """Re-measure a suspected regression in fresh rounds; it stands only if most rounds agree.

        On the GPU a whole run can shift by several percent (new allocations, clock state): the
        same call measured in ten runs spread 11%. Within one round the samples cannot show that;
        independent rounds can. A real slowdown shows in every round, a one-off shift in one."""
        decisions = [first]
        for _ in range(CONFIRMATION_ROUNDS):
            key = baselines.entry_key(name, mode, case.id)
            del self.results[key]
            measurement = self._measure(name, mode, case)
            decisions.append(decide(baseline_ms, measurement["timing"]["samples_ms"], threshold=threshold,
                                    machine_factor=factor))
        flagged = [decision for decision in decisions if decision.verdict == "regression"]
        chosen = sorted(decisions, key=lambda decision: decision.ratio)[len(decisions) // 2]  # the median round
        verdict = "regression" if len(flagged) * 2 > len(decisions) else "unchanged"
        return replace(chosen, verdict=verdict, rounds=len(decisions), rounds_flagged=len(flagged))

    def pooled(self, key: str) -> Pool:
        """The stored entry's saved runs, pooled (:func:`pytest_attnkit.gate.pool`)."""
        assert self.baseline is not None
        stored = self.baseline[key]
        return pool([run["median_ms"] for run in baselines.history(stored)], stored["samples_ms"])

    def machine_factor(self) -> float:
        """How much slower this machine runs the reference than when the baselines were saved:
        the median over every case of the reference's now/baseline ratio. One number for the run,
        so the noise of one reference case cannot move another implementation's verdict. The
        suite times the reference first (the plugin orders its tests), so every case counts."""
        ratios = []
        for key, measurement in self.results.items():
            if measurement["impl"] == self.settings.reference and self.baseline and key in self.baseline:
                ratios.append(machine_factor(self.pooled(key).samples_ms, measurement["timing"]["samples_ms"]))
        return statistics.median(ratios) if ratios else 1.0

    # -- saving and reporting ----------------------------------------------------------------
    def save(self) -> Path | None:
        """Write this run into the baseline file. Each entry keeps the runs saved before it (its
        history, pooled by the gate) unless this run's gate found it changed far beyond noise
        (:func:`changed_beyond_noise`): then the earlier runs describe another implementation, and
        its history starts again from this run."""
        if not self.results:
            return None
        date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        env = self.session.environment
        versions = {lib: env.get(lib) for lib in ("torch", "triton", "cupy", "python")}
        entries = {}
        counts = {"pooled": 0, "restarted": 0, "new": 0}
        for key, measurement in self.results.items():
            timing = measurement["timing"]
            run = {"date": date, "median_ms": timing["median_ms"], "samples": len(timing["samples_ms"]),
                   "host": platform.node()}
            old = (self.baseline or {}).get(key)
            decision = self.decisions.get(key)
            if old is None:
                history, outcome = [run], "new"
            elif decision is not None and changed_beyond_noise(decision):
                history, outcome = [run], "restarted"
            else:
                history, outcome = (baselines.history(old) + [run])[-baselines.HISTORY_LIMIT:], "pooled"
            counts[outcome] += 1
            entries[key] = {
                "impl": measurement["impl"], "mode": measurement["mode"], "case": measurement["case"],
                "median_ms": timing["median_ms"], "iqr_ms": timing["iqr_ms"], "samples": len(timing["samples_ms"]),
                "samples_ms": timing["samples_ms"], "timer": timing["timer"], "tflops": measurement["tflops"],
                "gbps": measurement["gbps"], "ratio_to_reference": measurement.get("ratio_to_reference"),
                "versions": versions, "date": date, "gpu_state": measurement.get("gpu_state", {}),
                "history": history,
            }
        device = {"name": self.device_name, "compute_capability": env.get("compute_capability"),
                  "ceilings": self.ceilings or {}}
        baselines.save(self.path, device, entries)
        self.save_counts = counts
        return self.path

    def summary_lines(self) -> list[str]:
        if not self.results:
            return []
        lines = []
        ceilings = self.ceilings or {}
        cpu = self.session.device != "cuda"
        if cpu:
            lines.append("CPU numbers: perf_counter around each call on this machine's CPU; not GPU figures")
        if ceilings:
            lines.append(f"ceilings measured in this run: bf16 matmul {ceilings['matmul_bf16_tflops']:.0f} TFLOP/s, "
                         f"device copy {ceilings['copy_gbps']:.0f} GB/s (read + write); GPU state {self.gpu_state}")
        header = (f"{'implementation':<14} {'mode':<8} {'case':<36} {'median ms':>10} {'IQR ms':>8} {'launch ms':>9} "
                  f"{'TFLOP/s':>8} {'%mm':>5} {'GB/s':>7} {'%copy':>6} {'x ref':>6}")
        lines.append(header)
        for measurement in sorted(self.results.values(), key=lambda m: (m["mode"], m["case"], m["impl"])):
            timing = measurement["timing"]
            share_mm = f"{100 * measurement['share_of_matmul']:.0f}" if "share_of_matmul" in measurement else "-"
            share_copy = f"{100 * measurement['share_of_copy']:.0f}" if "share_of_copy" in measurement else "-"
            vs_ref = f"{1 / measurement['ratio_to_reference']:.2f}" if measurement.get("ratio_to_reference") else "-"
            launch = f"{timing['launch_ms']:.4f}" if timing.get("launch_ms") is not None else "-"
            lines.append(f"{measurement['impl']:<14} {measurement['mode']:<8} {measurement['case']:<36} "
                         f"{timing['median_ms']:>10.4f} {timing['iqr_ms']:>8.4f} {launch:>9} {measurement['tflops']:>8.2f} {share_mm:>5} "
                         f"{measurement['gbps']:>7.1f} {share_copy:>6} {vs_ref:>6}")
        lines.append("(x ref: speed relative to the reference implementation in this run; above 1 is faster)")
        if not cpu:
            lines.append("(median and IQR: GPU time per call, the stream held until the host had issued the call; "
                         "launch ms: the host's time to issue it, from an idle GPU, not included in the GPU figures)")
        first_calls: dict[str, float] = {}
        for measurement in self.results.values():
            first = measurement["timing"].get("first_call_ms")
            if first is not None:
                first_calls[measurement["impl"]] = first_calls.get(measurement["impl"], 0.0) + first / 1e3
        if first_calls:
            lines.append("first calls, summed per implementation (compilation and autotuning show here, outside "
                         "the timings): " + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in sorted(first_calls.items())))
        lines.append("")
        if self.baseline is None:
            lines.append(f"gate: no baseline for this device ({self.device_name}: {self.path} does not exist); nothing gated")
        elif self.decisions:
            lines.append(f"gate against {self.path} (Mann-Whitney U, alpha 0.01, plus the practical threshold, "
                         "raised where saved runs disagreed); "
                         f"machine factor {self.machine_factor():.3f} from {self.settings.reference} "
                         "(the reference itself is gated without it):")
            lines.append(f"{'implementation':<14} {'mode':<8} {'case':<36} {'baseline ms':>11} {'runs':>4} {'now ms':>9} {'change':>8} "
                         f"{'machine':>8} {'thresh':>7}  verdict")
            for key, decision in sorted(self.decisions.items()):
                impl, mode, case_id = key.split("::")
                lines.append(f"{impl:<14} {mode:<8} {case_id:<36} {decision.baseline_median_ms:>11.4f} {decision.baseline_runs:>4} "
                             f"{decision.now_median_ms:>9.4f} "
                             f"{100 * (decision.ratio - 1):>+7.1f}% {decision.machine_factor:>8.3f} {100 * decision.threshold:>6.1f}%  "
                             f"{decision.verdict.upper() if decision.verdict == 'regression' else decision.verdict}"
                             + (f" ({decision.rounds_flagged}/{decision.rounds} rounds)" if decision.rounds > 1 else ""))
        lines.extend(self.notes.values())
        return lines


#: A saved run restarts an entry's history when it moved this many thresholds (in log space) from
#: the pooled baseline. One threshold is not enough: on the H200 the reference's forward at 4k
#: moved -5%, +11% and -9% in three sessions; restarting on each of those would keep its history
#: at one run, and the pool would never form. A rewritten kernel (decode: 4x) clears it easily.
RESTART_FACTOR = 3.0


def changed_beyond_noise(decision: Decision) -> bool:
    if decision.verdict not in ("regression", "improvement") or not decision.ratio > 0:
        return False
    return abs(math.log(decision.ratio)) > RESTART_FACTOR * math.log1p(decision.threshold)


def format_decision(decision: Decision) -> str:
    rounds = (f"; flagged in {decision.rounds_flagged} of {decision.rounds} independent rounds"
              if decision.rounds > 1 else "")
    return (f"median {decision.baseline_median_ms:.4f} ms -> {decision.now_median_ms:.4f} ms, "
            f"{100 * (decision.ratio - 1):+.1f}% after a machine factor of {decision.machine_factor:.3f} "
            f"(threshold {100 * decision.threshold:.1f}%, one-sided Mann-Whitney p = {decision.p_slower:.2g}{rounds})")
