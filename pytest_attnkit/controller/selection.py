"""What a run's suites run, and what they judge it by: each case family's cases (after the
``pytest_attnkit_modify_cases`` hook), each implementation's (implementation, case) pairs with
its in-contract stand-ins (:mod:`pytest_attnkit.controller.coverage`), and the thresholds and
accuracy the conftest hooks choose for a case.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

import pytest

from pytest_attnkit import cases as case_sets
from pytest_attnkit.contract import AccuracyBudget, Case, accuracy_budget
from pytest_attnkit.controller import coverage
from pytest_attnkit.controller.speed import CPU_THRESHOLD
from pytest_attnkit.records import EntryKey

if TYPE_CHECKING:
    from pytest_attnkit.controller.options import Settings
    from pytest_attnkit.controller.pool import WorkerPool


class CaseSelection:
    """The cases, pairs, thresholds and accuracy of one run, on ``device`` with ``profile``'s case sets."""

    def __init__(self, settings: "Settings", config: pytest.Config, device: str, profile: str, pool: "WorkerPool",
                 counterparts: Iterable[str], stand_ins: dict[tuple[str, str], str]) -> None:
        self.settings, self.config, self.device, self.profile, self.pool = settings, config, device, profile, pool
        #: --attnkit-against's implementations of REV: they run the speed families only.
        self.counterparts = set(counterparts)
        #: (implementation, stand-in's case id) -> the id of the case the stand-in is for, as pairs() chose them.
        self.stand_ins = stand_ins

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
        """(implementation, case) pairs of a family: each implementation's in-contract stand-ins
        (:mod:`pytest_attnkit.controller.coverage`), recorded for the coverage line."""
        of_revision = self.counterparts if not family.startswith("speed") else set()
        capabilities = {name: info.capabilities for name, info in self.pool.impls.items() if name not in of_revision}
        chosen, stand_ins = coverage.pairs(capabilities, self.cases(family))
        self.stand_ins.update(stand_ins)
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
