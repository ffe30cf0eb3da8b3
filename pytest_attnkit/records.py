"""The records both processes share: the measurements a worker's reply carries.

A worker answers every request with a :class:`~pytest_attnkit.messages.Reply`: a
:class:`~pytest_attnkit.messages.Status` and, where something was measured, the data as a plain
dict that travels as JSON. The pytest process turns the data back into the frozen records below (never by parsing a
string), and turns the status into a pytest outcome in one place
(:meth:`pytest_attnkit.controller.outcome.Outcomes.from_reply`). Figures that follow from a record (TFLOP/s,
GB/s, the median) are properties, so they can never disagree with the samples they come from.
Nothing heavy is imported here: both processes read this module.
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import asdict, dataclass, field, fields
from enum import Enum
from typing import Any, NamedTuple

from pytest_attnkit.contract import Case
from pytest_attnkit.counts import byte_count, flop_count


class EntryKey(NamedTuple):
    """What one speed measurement is of; only the baseline files turn it into a string."""

    impl: str
    mode: str
    case_id: str


# -- correctness ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Comparison:
    """The outcome of comparing one tensor (``out``, ``dq``, ...) with the oracle.

    ``rule`` says what judged it: "exact" (FlashAttention's rule: ``allowed`` from the plain
    same-precision error), "fp8" (FA3's FP8 rule: the same with the plain reference's P rounded to
    e4m3) or "quantized" (an accuracy budget, described in ``budget``). Whatever the rule, every
    comparison carries the same figures: the max error, relative L1 ``sum|x - ref| / sum|ref|``,
    its worst row, cosine similarity, RMSE, and the headroom (the rule's measured / allowed; at
    most 1 passes), so accuracy drift shows long before a failure.
    """

    name: str
    passed: bool
    max_error: float
    allowed: float
    plain_error: float
    floor: float
    factor: float
    worst_index: tuple[int, ...]
    worst_actual: float
    worst_expected: float
    outside_fraction: float
    nonfinite: int
    first_nonfinite_index: tuple[int, ...] | None
    rule: str = "exact"
    headroom: float = 0.0
    rel_l1: float = 0.0
    row_rel_l1: float = 0.0
    cosine: float = 1.0
    rmse: float = 0.0
    #: The budget that judged a "quantized" comparison, in words; empty for the other rules.
    budget: str = ""

    def figures(self) -> str:
        return (f"headroom {self.headroom:.2f}, rel L1 {self.rel_l1:.2e} (worst row {self.row_rel_l1:.2e}), "
                f"cosine {self.cosine:.6f}, RMSE {self.rmse:.2e}")

    def describe(self) -> str:
        """One readable paragraph on what went wrong (or right)."""
        if self.nonfinite:
            return (
                f"{self.name}: {self.nonfinite} NaN/Inf values (first at index {list(self.first_nonfinite_index or ())}); "
                "NaN and Inf never pass"
            )
        verdict = "within" if self.passed else "exceeds"
        if self.rule == "quantized":
            return (
                f"{self.name}: {'within' if self.passed else 'outside'} the {self.budget}: {self.figures()}; "
                f"max error {self.max_error:.3e}, worst at index {list(self.worst_index)}: got {self.worst_actual:.6g}, "
                f"expected {self.worst_expected:.6g}"
            )
        plain = "plain same-precision error" if self.rule == "exact" else "FA3 FP8 reference's error (P in e4m3)"
        return (
            f"{self.name}: max error {self.max_error:.3e} {verdict} allowed {self.allowed:.3e} "
            f"(= {self.factor:g} x {plain} {self.plain_error:.3e} + floor {self.floor:.3e}); "
            f"worst at index {list(self.worst_index)}: got {self.worst_actual:.6g}, expected {self.worst_expected:.6g}; "
            f"{self.outside_fraction:.2%} of elements outside; {self.figures()}"
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "Comparison":
        values = dict(values)
        values["worst_index"] = tuple(values["worst_index"])
        if values.get("first_nonfinite_index") is not None:
            values["first_nonfinite_index"] = tuple(values["first_nonfinite_index"])
        return cls(**values)


@dataclass(frozen=True)
class CorrectnessResult:
    """The trials of one correctness check: the deciding seed and trial, and every comparison."""

    trials: int
    seed: int | None = None
    trial: int | None = None
    comparisons: tuple[Comparison, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"trials": self.trials, "seed": self.seed, "trial": self.trial,
                "comparisons": [comparison.to_dict() for comparison in self.comparisons]}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "CorrectnessResult":
        return cls(values["trials"], values.get("seed"), values.get("trial"),
                   tuple(Comparison.from_dict(c) for c in values.get("comparisons", ())))


# -- memory -----------------------------------------------------------------------------------


class PointStatus(str, Enum):
    """What became of one length of a memory sweep; its value is what the report writes."""

    __str__ = str.__str__  # f"{status}" and str(status) give the value, as the plain strings did

    MEASURED = "measured"
    OOM = "oom"  # the call ran out of device memory (the worker's meter): the sweep ends there
    ERROR = "error"  # the worker crashed or missed its deadline on it (set by the pytest process)
    NOT_RUN = "not run"  # not asked: its request was cancelled (the run stopped, or the sweep ended before it)


@dataclass(frozen=True)
class MemoryPoint:
    seqlen: int
    status: PointStatus
    extra_bytes: int = 0
    peak_bytes: int = 0
    retained_bytes: int = 0
    unmetered_bytes: int = 0
    expected_bytes: int | None = None
    message: str = ""
    #: The measured call's wall time, in milliseconds (0 where not measured).
    call_ms: float = 0.0
    #: Why the sweep ends after this point although it measured (a call over the profile's
    #: limit, ``pytest_attnkit.cases.MEMORY_CALL_LIMIT_MS``); empty when it goes on.
    stop: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "MemoryPoint":
        known = {f.name for f in fields(cls)}
        return cls(**{**{key: value for key, value in values.items() if key in known},
                      "status": PointStatus(values["status"])})


# -- speed ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Timing:
    samples_ms: tuple[float, ...]
    warmup_ms: float  # the first (compiling) call plus the rest of the warm-up
    timer: str  # "cuda-events" or "perf-counter"
    #: On CUDA: the median host time of a call bracketed by device-wide synchronizations.
    host_wall_ms: float | None = None
    #: The first call alone: compilation and autotuning show here (on CUDA, synchronized).
    first_call_ms: float | None = None
    #: On CUDA: the median host time to issue one call (Python, argument checks, the launch path),
    #: from the call to its return with the GPU idle. Not part of ``samples_ms``.
    launch_ms: float | None = None
    #: On CUDA: how long the stream was held before each timed call (0: no hold).
    hold_ms: float | None = None
    #: On CUDA: the median time the host waited for the whole device after issuing a call. It is
    #: at most the call's GPU time plus the synchronization's latency, unless work escapes the
    #: timed stream: that work shows here and not in the events.
    wait_ms: float | None = None
    #: On CUDA: the SM clock in MHz during each sample's hold, read from the spin's cycles and its
    #: events (empty where the hold was too short to read). The samples are not corrected by it:
    #: a kernel that draws more power does run slower under a power cap.
    clocks_mhz: tuple[float, ...] = ()

    @property
    def median_ms(self) -> float:
        return statistics.median(self.samples_ms)

    @property
    def iqr_ms(self) -> float:
        if len(self.samples_ms) < 4:
            return 0.0
        quartiles = statistics.quantiles(self.samples_ms, n=4)
        return quartiles[2] - quartiles[0]

    @property
    def clock_mhz_min(self) -> float | None:
        return min(self.clocks_mhz) if self.clocks_mhz else None

    @property
    def clock_mhz_median(self) -> float | None:
        return statistics.median(self.clocks_mhz) if self.clocks_mhz else None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "samples_ms": list(self.samples_ms), "clocks_mhz": list(self.clocks_mhz),
                "median_ms": self.median_ms, "iqr_ms": self.iqr_ms, "clock_mhz_min": self.clock_mhz_min,
                "clock_mhz_median": self.clock_mhz_median}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "Timing":
        """The Timing of a dictionary that :meth:`to_dict` wrote, this version or another: keys this
        version does not know (a newer worker's, or the derived figures) are left out."""
        known = {item.name for item in dataclasses.fields(cls)}
        fields = {key: value for key, value in values.items() if key in known}
        return cls(**{**fields, "samples_ms": tuple(fields["samples_ms"]),
                      "clocks_mhz": tuple(fields.get("clocks_mhz", ()))})


@dataclass(frozen=True)
class SpeedMeasurement:
    """One timed case: what was timed and how long it took; the figures follow from both."""

    impl: str
    mode: str
    case: Case
    timing: Timing
    input_sets: int = 1
    gpu_state: dict[str, Any] = field(default_factory=dict)
    #: The kernels one call launched, with their grids, blocks, shared memory and registers
    #: (worker/speed.py: kernel_program), where the worker read them; None elsewhere. Two
    #: processes that compiled the same source into other tile configurations show here.
    program: str | None = None
    #: torch's first warning that a call synchronized the host with the device (a ``.tolist()``,
    #: an ``.item()``), or None: such a call's time follows its process's host speed
    #: (worker/speed.py: synchronizes), and the gate holds it to a doubling.
    syncs: str | None = None
    #: Processes other than this run's that computed on the GPU while the case was timed (their
    #: pids, from NVML: worker/speed.py gpu_processes): its timings include their work, and a run
    #: with such a measurement saves no baseline.
    shared_with: tuple[int, ...] = ()
    #: Whether it was timed in the worker that warmed the case up (whose first call there is paid),
    #: not in one that met the case for the first time (controller/speed.py).
    warm_worker: bool = False

    @property
    def key(self) -> EntryKey:
        return EntryKey(self.impl, self.mode, self.case.id)

    @property
    def flops(self) -> int:
        return flop_count(self.case, self.mode)

    @property
    def bytes(self) -> int:
        return byte_count(self.case, self.mode)

    @property
    def tflops(self) -> float:
        return self.flops / (self.timing.median_ms / 1e3) / 1e12

    @property
    def gbps(self) -> float:
        return self.bytes / (self.timing.median_ms / 1e3) / 1e9

    def to_dict(self) -> dict[str, Any]:
        return {"impl": self.impl, "mode": self.mode, "case": self.case.id, "shape": self.case.to_dict(),
                "timing": self.timing.to_dict(), "input_sets": self.input_sets, "gpu_state": self.gpu_state,
                "flops": self.flops, "bytes": self.bytes, "tflops": self.tflops, "gbps": self.gbps,
                "program": self.program, "syncs": self.syncs, "shared_with": list(self.shared_with),
                "warm_worker": self.warm_worker}
