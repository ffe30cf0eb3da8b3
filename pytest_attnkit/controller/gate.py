"""The gate: did an implementation get slower than its baseline, beyond noise?

A case is a regression only when both hold: the slowdown is statistically clear (a one-sided
Mann-Whitney U test on the repeated samples, p below ``alpha``) and practically large (the ratio
of medians above ``1 + threshold``). Before deciding, the samples are divided by the machine
factor: how much slower the in-run reference implementation (torch_sdpa) got on the same case
against its own baseline, so a slower machine is not mistaken for a slower kernel. Fewer than
``MIN_SAMPLES`` samples on either side is its own verdict, "insufficient", shown and never failed.
This mirrors asv and Google Benchmark's compare.py. The speed check adds confirmation rounds on
top (:mod:`pytest_attnkit.controller.speed`): a suspected regression is re-measured and must recur.

The p-value is exact (the permutation distribution of the rank sum, ties included) when one side
has fewer than ``EXACT_BELOW`` samples, as scipy's ``mannwhitneyu`` chooses, and from the normal
approximation otherwise. The exact test is what lets a call of seconds (a materializing kernel at
16k tokens) be gated on six samples a side: six against six, fully separated, is p = 1/924.

Runs differ more than samples within a run: a few cases move by several percent between
sessions and machines of the same model, which no within-run statistic can see. So a
baseline keeps the medians of its last saved runs (:func:`pool`): the gate compares against their
median (the latest run's samples, moved there) and raises the practical threshold of a case to
``NOISE_MULTIPLIER`` times the largest distance of a saved run from that center
(:func:`noise_threshold`). A case whose runs agree keeps the configured threshold; a case that is
noisy between runs says so in the gate table, with the threshold it really gets.

A GPU that runs hot or under a power cap lowers its SM clock, and a compute-bound call slows with
it: on an H100 at 80-85 C (2026-11-26) backward cases at 16k tokens ran at 1700-1800 MHz against
their baselines' 1940-1970 and were 8-11% slower, though nothing had changed. Each sample's clock
is measured (``Timing.clocks_mhz``) and each saved run keeps its median, so a suspected regression
whose clock fell explains it: when the slowdown at equal clocks would be within half the
threshold, the verdict is "slower clock", shown and never failed (:func:`explained_by_clock`). The clock can only
excuse, never accuse, and only what it explains: a kernel 10% slower at its baseline's clock is a
regression on a hot GPU too.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, replace
from enum import Enum
from typing import Any

import numpy as np

#: The fewest samples a side the gate decides on. With the exact test, six against six can reach
#: p = 0.0011 (alpha is 0.01); five against five could reach only 0.004, with no room for one
#: sample out of order.
MIN_SAMPLES = 6
#: Below this many samples on either side the p-value is exact (scipy's rule for its "auto" method).
EXACT_BELOW = 8
DEFAULT_ALPHA = 0.01
#: Above the few percent single cases move from one process to the next on a GPU, and below the
#: slowdown of 10% more work, which it catches (docs/speed.md: the gate's threshold).
DEFAULT_THRESHOLD = 0.08
#: The A/B gate's (``--attnkit-against``): old and new are timed in one process, block by block, so
#: the drift between processes and machines that the 8% absorbs is not there; the paired ratio's
#: 99% interval on an H200 spanned 0.996-1.003 (results/2026-11-23-h200-final).
DEFAULT_AGAINST_THRESHOLD = 0.02
NOISE_MULTIPLIER = 2.5


class GateVerdict(str, Enum):
    """A speed case's verdict, from the stored-baseline gate or the A/B gate (controller/paired.py).
    Its value is what the report, the baseline files and the tables write."""

    __str__ = str.__str__  # f"{verdict}" and str(verdict) give the value, as the plain strings did

    REGRESSION = "regression"  # slower beyond noise: the test fails
    IMPROVEMENT = "improvement"
    UNCHANGED = "unchanged"
    INSUFFICIENT = "insufficient"  # too few samples (or pairs) to decide: shown, never failed
    #: The measurement ran a program (the kernels a call launched) that no saved run of its entry
    #: timed: shown, never failed (controller/speed.py: SpeedCheck._gate).
    OTHER_PROGRAM = "other program"
    #: An A/B case one of whose versions was not timed (controller/speed.py: ABResult).
    NOT_COMPARED = "not compared"
    #: The reference ran more than ``MACHINE_FACTOR_LIMIT`` times faster or slower than when the
    #: baselines were saved: they do not describe this machine as it runs now, and dividing by that
    #: factor would make any verdict up (:func:`decide`). Shown, never failed.
    OTHER_MACHINE = "other machine"
    #: A slowdown past the threshold that the SM clock explains: the case ran at a clock this much
    #: lower than its saved runs did, and at equal clocks it would be within the threshold
    #: (:func:`explained_by_clock`). Shown, never failed.
    SLOWER_CLOCK = "slower clock"


@dataclass(frozen=True)
class Pool:
    """A baseline's saved runs, pooled: what a case's timing was, and how much runs disagreed."""

    center_ms: float  # the median of the saved runs' medians
    spread: float | None  # the largest |run median / center - 1|; None with a single run
    runs: int
    samples_ms: list[float]  # the latest run's samples, scaled so that their median is the center
    #: The median SM clock (MHz) of the saved runs that recorded one; None where none did.
    clock_mhz: float | None = None


def pool(run_medians_ms: list[float], latest_samples_ms: list[float],
         run_clocks_mhz: list[float | None] | None = None) -> Pool:
    """Pool saved runs (their medians, oldest first) with the latest run's samples, and the SM
    clocks the runs recorded (None for a run that did not)."""
    if not run_medians_ms:
        raise ValueError("a baseline needs at least one saved run")
    center = statistics.median(run_medians_ms)
    spread = max(abs(m / center - 1) for m in run_medians_ms) if len(run_medians_ms) > 1 else None
    latest = statistics.median(latest_samples_ms) if latest_samples_ms else center
    samples = [value * center / latest for value in latest_samples_ms]
    clocks = [clock for clock in run_clocks_mhz or () if clock]
    return Pool(center, spread, len(run_medians_ms), samples, statistics.median(clocks) if clocks else None)


def noise_threshold(threshold: float, baseline: Pool) -> float:
    """The practical threshold a case gets: the configured one, or more where saved runs disagreed."""
    if baseline.spread is None:
        return threshold
    return max(threshold, NOISE_MULTIPLIER * baseline.spread)


@dataclass(frozen=True)
class Decision:
    verdict: GateVerdict  # any but NOT_COMPARED (OTHER_PROGRAM and SLOWER_CLOCK: the speed check's)
    ratio: float  # median now / median baseline, after the machine factor
    raw_ratio: float
    machine_factor: float
    p_slower: float
    p_faster: float
    threshold: float
    baseline_median_ms: float
    now_median_ms: float
    #: Independent measurement rounds behind the verdict, and how many of them flagged a regression.
    rounds: int = 1
    rounds_flagged: int = 0
    #: Saved runs pooled into the baseline (see :func:`pool`).
    baseline_runs: int = 1
    #: The median SM clock (MHz) of the round the verdict used, and of the baseline's saved runs;
    #: None where either was not measured (see :func:`explained_by_clock`).
    clock_mhz: float | None = None
    baseline_clock_mhz: float | None = None
    #: Which saved runs the speed check judged against: "program", the runs of the measured
    #: program (every run where it or the entry recorded none); "core", the runs whose programs
    #: share its core kernels (it differs from them only in kernels of at most 1% of a call);
    #: "other", none (the verdict is OTHER_PROGRAM). The A/B gate's decisions say "program".
    judged_by: str = "program"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def mann_whitney_p(slower: list[float], faster: list[float]) -> float:
    """One-sided p-value that ``slower`` tends to be larger than ``faster``: exact when either side
    has fewer than ``EXACT_BELOW`` samples, else the normal approximation with tie and continuity
    corrections (adequate from about eight samples a side)."""
    n1, n2 = len(slower), len(faster)
    if n1 == 0 or n2 == 0:
        raise ValueError("the Mann-Whitney test needs samples on both sides")
    ranks = midranks(list(slower) + list(faster))
    if min(n1, n2) < EXACT_BELOW:
        return _exact_p(ranks, n1)
    tie_term = sum(count**3 - count for count in _tie_counts(list(slower) + list(faster)))
    u = sum(ranks[:n1]) - n1 * (n1 + 1) / 2
    mean = n1 * n2 / 2
    variance = n1 * n2 / 12 * ((n1 + n2 + 1) - tie_term / ((n1 + n2) * (n1 + n2 - 1)))
    if variance <= 0:
        return 0.5
    z = (u - mean - 0.5) / math.sqrt(variance)
    return 0.5 * math.erfc(z / math.sqrt(2))


def midranks(values: list[float]) -> list[float]:
    """The rank of each value among ``values`` (1-based), tied values sharing their mean rank."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for position in range(i, j + 1):
            ranks[order[position]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def _tie_counts(values: list[float]) -> list[int]:
    counts: dict[float, int] = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return list(counts.values())


def _exact_p(ranks: list[float], n1: int) -> float:
    """P(the rank sum of ``n1`` positions drawn at random >= that of the first ``n1``): the
    permutation distribution, counted over every way to choose the smaller side's positions.
    Midranks are halves, so twice each rank is an integer and the sums index a table."""
    doubled = [round(2 * rank) for rank in ranks]
    size = min(n1, len(ranks) - n1)
    if size == n1:
        chosen, upper = sum(doubled[:n1]), True  # P(sum >= observed)
    else:  # count the other side: its sum is the total less this side's, so the tail flips
        chosen, upper = sum(doubled[n1:]), False  # P(other sum <= observed other sum)
    top = sum(sorted(doubled)[-size:])
    # ways[k, s]: how many ways to choose k of the ranks seen so far with doubled sum s (as floats:
    # the counts reach C(N, k), and only their ratio to the total matters)
    ways = np.zeros((size + 1, top + 1))
    ways[0, 0] = 1.0
    for seen, rank in enumerate(doubled, start=1):
        for k in range(min(seen, size), 0, -1):
            ways[k, rank:] += ways[k - 1, :top + 1 - rank]
    tail = ways[size, chosen:].sum() if upper else ways[size, :chosen + 1].sum()
    return float(tail / math.comb(len(ranks), size))


def verdict_of(ratio: float, p_slower: float, p_faster: float, *, threshold: float, alpha: float) -> GateVerdict:
    """The gate's rule, whatever test gave the p-values: a change is a regression (or an
    improvement) only when it is both statistically clear and past the practical threshold."""
    if p_slower < alpha and ratio > 1 + threshold:
        return GateVerdict.REGRESSION
    if p_faster < alpha and ratio < 1 / (1 + threshold):
        return GateVerdict.IMPROVEMENT
    return GateVerdict.UNCHANGED


#: Past this factor either way, the machine is not the one the baselines describe
#: (``GateVerdict.OTHER_MACHINE``). A GPU's clocks and neighbours move a run by percents; a factor
#: of 0.004 came from a reference saved while the CPU was crowded (2026-11-26, CI beside a test run).
MACHINE_FACTOR_LIMIT = 4.0


def decide(baseline_ms: list[float], now_ms: list[float], *, threshold: float = DEFAULT_THRESHOLD,
           alpha: float = DEFAULT_ALPHA, machine_factor: float = 1.0) -> Decision:
    """Compare ``now_ms`` with ``baseline_ms`` (timings of the same case); see the module docstring."""
    baseline_median = statistics.median(baseline_ms) if baseline_ms else float("nan")
    now_median = statistics.median(now_ms) if now_ms else float("nan")
    raw_ratio = now_median / baseline_median if baseline_ms and now_ms else float("nan")
    adjusted = [value / machine_factor for value in now_ms]
    ratio = raw_ratio / machine_factor
    if not 1 / MACHINE_FACTOR_LIMIT <= machine_factor <= MACHINE_FACTOR_LIMIT:
        return Decision(GateVerdict.OTHER_MACHINE, ratio, raw_ratio, machine_factor, float("nan"), float("nan"),
                        threshold, baseline_median, now_median)
    if len(baseline_ms) < MIN_SAMPLES or len(now_ms) < MIN_SAMPLES:
        return Decision(GateVerdict.INSUFFICIENT, ratio, raw_ratio, machine_factor, float("nan"), float("nan"),
                        threshold, baseline_median, now_median)
    p_slower = mann_whitney_p(adjusted, baseline_ms)
    p_faster = mann_whitney_p(baseline_ms, adjusted)
    verdict = verdict_of(ratio, p_slower, p_faster, threshold=threshold, alpha=alpha)
    return Decision(verdict, ratio, raw_ratio, machine_factor, p_slower, p_faster, threshold, baseline_median, now_median)


def machine_factor(reference_baseline_ms: list[float] | None, reference_now_ms: list[float] | None) -> float:
    """How much slower the machine runs the reference now than when its baseline was saved."""
    if not reference_baseline_ms or not reference_now_ms:
        return 1.0
    return statistics.median(reference_now_ms) / statistics.median(reference_baseline_ms)


#: The least clock drop that can excuse a slowdown. The same case's clock moved by up to about 3%
#: either way between runs and H100s that held their clocks (torch_flex's backward at 16k d64:
#: 1907-2026 MHz over six runs on four machines, results/2026-11-26-session4); a throttled H100 read
#: 5.6-9% low.
CLOCK_MIN_DROP = 0.05
#: What may be left of a slowdown at equal clocks for the clock to excuse it, as a share of the
#: threshold. Half, not all of it: a GPU 2-3% hotter than when the baselines were saved is common,
#: and with the whole threshold it would excuse a real 10% slowdown (1.10 x 0.975 < 1.08); with
#: half, a 10% slowdown is excused only behind a clock at least 5.5% low.
CLOCK_LEFT = 0.5


def explained_by_clock(decision: Decision, clock_mhz: float | None, baseline_clock_mhz: float | None) -> Decision:
    """``decision`` with the clocks it was made at; a regression becomes ``SLOWER_CLOCK`` when the
    case ran at a clock at least :data:`CLOCK_MIN_DROP` below its baseline's and the slowdown at
    equal clocks (the ratio times now's clock over the baseline's) is within half the threshold
    (:data:`CLOCK_LEFT`). Other verdicts only gain the clocks.

    What it cannot tell apart: the clock is read between the kernel's own calls, so a change that
    makes a kernel draw more power lowers its own reading, as heat does; and time goes as 1 / clock
    only for compute-bound calls (a memory-bound call slows less, so its excused ratio comes out
    lower than the truth). Either way the case is shown as "slower clock", never as "unchanged".
    The limits above keep the window small: at the default 8% threshold, a slowdown of 10% is
    excused only behind a clock at least 5.5% low, one of 15% behind one 9.6% low."""
    decision = replace(decision, clock_mhz=clock_mhz, baseline_clock_mhz=baseline_clock_mhz)
    if decision.verdict != GateVerdict.REGRESSION or not clock_mhz or not baseline_clock_mhz:
        return decision
    if clock_mhz > baseline_clock_mhz * (1 - CLOCK_MIN_DROP):
        return decision
    if at_equal_clocks(decision) > 1 + CLOCK_LEFT * decision.threshold:
        return decision
    return replace(decision, verdict=GateVerdict.SLOWER_CLOCK)


def at_equal_clocks(decision: Decision) -> float:
    """The slowdown left when the clocks are made equal (``decision`` must carry both). It scales
    the larger of the ratio before and after the machine factor: where the whole GPU runs at a
    lower clock, the reference slowed too and the factor has already divided that out, so scaling
    the divided ratio again would count the clock twice."""
    assert decision.clock_mhz and decision.baseline_clock_mhz
    return max(decision.ratio, decision.raw_ratio) * decision.clock_mhz / decision.baseline_clock_mhz


#: A saved run restarts an entry's history when it moved this many thresholds (in log space) from
#: the pooled baseline: one threshold would restart the history of a noisy case on every save, so
#: its pool would never form, while a rewritten kernel clears three easily.
RESTART_FACTOR = 3.0


def changed_beyond_noise(decision: Decision) -> bool:
    if decision.verdict not in (GateVerdict.REGRESSION, GateVerdict.IMPROVEMENT) or not decision.ratio > 0:
        return False
    return abs(math.log(decision.ratio)) > RESTART_FACTOR * math.log1p(decision.threshold)
