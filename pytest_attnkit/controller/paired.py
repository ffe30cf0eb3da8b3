"""The A/B gate (``--attnkit-against``): did the new version get slower than the old, on paired data?

The speed check times a case in the two versions' workers in alternating blocks of a few samples
(new, old, old, new, new, old, ...: the order alternates too, so a drift of the machine within
the case weighs on both sides alike). Block ``i`` of the new version is paired with block ``i``
of the old; each pair gives the log of the ratio of the blocks' medians. Pairing is what makes a
small change visible: both blocks of a pair ran within milliseconds of each other, on the same
inputs, with the same timer, so what moves the machine between processes and runs cancels out.

A case is a regression only when both hold, as in the stored-baseline gate
(:mod:`pytest_attnkit.controller.gate`): a one-sided Wilcoxon signed-rank test on the log ratios
says new is slower (p below ``alpha``), and the ratio (the exponential of the median log ratio)
passes the practical threshold. The interval shown beside it is a seeded bootstrap interval of
the median ratio, so a rerun prints the same interval for the same samples. Fewer than
``MIN_PAIRS`` pairs is "insufficient", shown and never failed.

The Wilcoxon p-value is exact: the distribution of the signed-rank sum over all 2^n sign
patterns, counted on doubled midranks (ties) with zero differences dropped (Wilcoxon's own
treatment). With eight pairs all one way, p = 1/256.

What pairing cannot cancel is the process. A call that synchronizes the host with the device
inside itself (a ``.tolist()``, an ``.item()``, a Python loop that reads lengths back) is timed at
its process's host speed and against the timer's stream hold, which each worker sizes for itself.
On an H200, torch_sdpa's per-sequence loops over varlen and paged cases read new/old from 0.58 to
1.26 in HEAD-against-HEAD runs, while every other case stayed within 0.99-1.03
(results/2026-11-23-h200-against-proof). The worker reports such a call (torch's sync debug
mode). Where both versions' calls sync, the case is gated at a doubling
(``speed.SYNC_THRESHOLD``): no smaller threshold separates a change from that noise. Where only
the new version's call syncs, the change added the sync: the case is gated as any other, and
its verdict says so.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any

import numpy as np

from pytest_attnkit.controller.gate import DEFAULT_ALPHA, GateVerdict, midranks, verdict_of

#: The fewest pairs the A/B gate decides on: with fewer, no result can reach alpha = 0.01.
MIN_PAIRS = 8
CONFIDENCE = 0.99
BOOTSTRAP_RESAMPLES = 4000
BOOTSTRAP_SEED = 20


class SyncKind(str, Enum):
    """Which versions' calls synchronize the host with the device inside (see the module docstring)."""

    __str__ = str.__str__  # f"{kind}" and str(kind) give the value

    BOTH = "both"  # the case is gated at a doubling (speed.SYNC_THRESHOLD)
    NEW_ONLY = "new only"  # the change added the sync: the case is gated as any other


def sync_kind(new: str | None, old: str | None) -> SyncKind | None:
    """What the two versions' workers said of syncs inside their calls (``new``, ``old``: the first
    sync torch saw, or None), as a :class:`SyncKind`; None where the new version's call does not sync."""
    if new and old:
        return SyncKind.BOTH
    if new:
        return SyncKind.NEW_ONLY
    return None


@dataclass(frozen=True)
class PairedDecision:
    verdict: GateVerdict  # REGRESSION, IMPROVEMENT, UNCHANGED or INSUFFICIENT
    ratio: float  # new / old: exp(median of the pairs' log ratios)
    low: float  # the bootstrap interval of the median ratio, at ``confidence``
    high: float
    confidence: float
    p_slower: float  # one-sided Wilcoxon signed-rank: new is slower
    p_faster: float
    pairs: int
    threshold: float
    new_median_ms: float
    old_median_ms: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def wilcoxon_p(differences: list[float]) -> tuple[float, float]:
    """One-sided exact p-values that ``differences`` tend above zero, and below zero."""
    nonzero = [d for d in differences if d != 0]
    if not nonzero:
        return 1.0, 1.0
    doubled = [round(2 * rank) for rank in midranks([abs(d) for d in nonzero])]
    total = sum(doubled)
    # ways[s]: sign patterns whose positive ranks sum (doubled) to s, as a share of all patterns
    ways = np.zeros(total + 1)
    ways[0] = 1.0
    for rank in doubled:
        shifted = np.zeros_like(ways)
        shifted[rank:] = ways[:total + 1 - rank]
        ways = (ways + shifted) / 2
    positive = sum(rank for rank, d in zip(doubled, nonzero) if d > 0)
    return float(ways[positive:].sum()), float(ways[:positive + 1].sum())


def bootstrap_interval(log_ratios: list[float], confidence: float = CONFIDENCE,
                       seed: int = BOOTSTRAP_SEED) -> tuple[float, float]:
    """A percentile bootstrap interval of the median ratio (seeded: the same data, the same interval)."""
    values = np.asarray(log_ratios, dtype=float)
    rng = np.random.default_rng(seed)
    medians = np.median(values[rng.integers(0, len(values), size=(BOOTSTRAP_RESAMPLES, len(values)))], axis=1)
    tail = (1 - confidence) / 2
    low, high = np.quantile(medians, [tail, 1 - tail])
    return math.exp(float(low)), math.exp(float(high))


def decide_paired(new_blocks_ms: list[list[float]], old_blocks_ms: list[list[float]], *, threshold: float,
                  alpha: float = DEFAULT_ALPHA) -> PairedDecision:
    """The verdict on blocks of samples, block ``i`` of each side paired; see the module docstring."""
    if len(new_blocks_ms) != len(old_blocks_ms):
        raise ValueError(f"paired blocks must come in pairs: {len(new_blocks_ms)} new, {len(old_blocks_ms)} old")
    log_ratios = [math.log(statistics.median(new) / statistics.median(old))
                  for new, old in zip(new_blocks_ms, old_blocks_ms) if new and old]
    new_median = statistics.median([s for block in new_blocks_ms for s in block]) if new_blocks_ms else float("nan")
    old_median = statistics.median([s for block in old_blocks_ms for s in block]) if old_blocks_ms else float("nan")
    if not log_ratios:
        nan = float("nan")
        return PairedDecision(GateVerdict.INSUFFICIENT, nan, nan, nan, CONFIDENCE, nan, nan, 0, threshold, new_median,
                              old_median)
    ratio = math.exp(statistics.median(log_ratios))
    low, high = bootstrap_interval(log_ratios)
    p_slower, p_faster = wilcoxon_p(log_ratios)
    if len(log_ratios) < MIN_PAIRS:
        verdict = GateVerdict.INSUFFICIENT
    else:
        verdict = verdict_of(ratio, p_slower, p_faster, threshold=threshold, alpha=alpha)
    return PairedDecision(verdict, ratio, low, high, CONFIDENCE, p_slower, p_faster, len(log_ratios), threshold,
                          new_median, old_median)
