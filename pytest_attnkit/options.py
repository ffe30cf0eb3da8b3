"""Command-line options, their ini and environment twins, and where each value came from.

Every setting resolves in one place, in this order: the command line, then the environment
(``ATTNKIT_...``), then the ini file (``attnkit_...``), then the default. A bad value is a usage
error that names where it came from (pytest exits with code 4).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import Any, Callable

import pytest

from pytest_attnkit.gate import DEFAULT_THRESHOLD

SUITES: tuple[str, ...] = ("correctness", "memory", "speed")
PROFILE_CHOICES: tuple[str, ...] = ("auto", "smoke", "default", "full")
DEVICE_CHOICES: tuple[str, ...] = ("auto", "cpu", "cuda")


def _names(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        raise ValueError("expected one or more comma-separated names")
    return names


def _choices(allowed: tuple[str, ...]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = text.strip()
        if value not in allowed:
            raise ValueError(f"{text!r} is not one of: {', '.join(allowed)}")
        return value

    return parse


def _suites(text: str) -> list[str]:
    names = _names(text)
    if names == ["all"]:
        return list(SUITES)
    unknown = [name for name in names if name not in SUITES]
    if unknown:
        raise ValueError(f"unknown suite {', '.join(map(repr, unknown))} (known: {', '.join(SUITES)}, or all)")
    return names


def _percent(text: str) -> float:
    stripped = text.strip()
    try:
        value = float(stripped[:-1]) / 100 if stripped.endswith("%") else float(stripped)
    except ValueError:
        raise ValueError(f"{text!r} is not a percentage such as 5% or 0.05") from None
    if not 0 < value < 10:
        raise ValueError(f"{text!r} must be a positive share such as 5% or 0.05")
    return value


def _bounded(kind: type, minimum: float) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except (TypeError, ValueError):
            raise ValueError(f"{text!r} is not a {'whole number' if kind is int else 'number'}") from None
        if not value >= minimum:
            raise ValueError(f"{text!r} must be at least {minimum:g}")
        return value

    return parse


@dataclass(frozen=True)
class Setting:
    dest: str
    metavar: str
    parse: Callable[[str], Any]
    default: Any
    help: str

    @property
    def flag(self) -> str:
        return "--attnkit-" + self.dest.replace("_", "-")

    @property
    def ini(self) -> str:
        return "attnkit_" + self.dest

    @property
    def env(self) -> str:
        return "ATTNKIT_" + self.dest.upper()


SETTINGS: tuple[Setting, ...] = (
    Setting("impl", "NAMES", _names, [],
            "comma-separated implementation names or glob patterns to run (default: every one discovered)"),
    Setting("suite", "NAMES", _suites, list(SUITES), f"comma-separated suites to run: {', '.join(SUITES)} or all (default: all)"),
    Setting("profile", "NAME", _choices(PROFILE_CHOICES), "auto",
            "case set: smoke (minutes on a CPU), default (one GPU), full; auto picks smoke on the CPU and default on a GPU (default: auto)"),
    Setting("device", "NAME", _choices(DEVICE_CHOICES), "auto", "device to test on: cpu, cuda, or auto (CUDA when present; default: auto)"),
    Setting("seed", "INT", _bounded(int, 0), 0, "base seed for the inputs; each trial derives its own from it (default: 0)"),
    Setting("trials", "N", _bounded(int, 1), 2, "trials per correctness case, each on fresh inputs (default: 2)"),
    Setting("timeout", "SECONDS", _bounded(float, 0.001), 300.0,
            "deadline for one test in its worker; past it the worker is killed and replaced (default: 300)"),
    Setting("baseline_dir", "DIR", str, "baselines",
            "folder of per-GPU baseline files, relative to the rootdir (default: baselines)"),
    Setting("threshold", "PERCENT", _percent, DEFAULT_THRESHOLD,
            "slowdown past which a statistically clear change is a regression, e.g. 5%% or 0.05 "
            f"(default: {round(DEFAULT_THRESHOLD * 100)} percent)"),
    Setting("reference", "NAME", str, "torch_sdpa",
            "implementation whose in-run speed tells a slower machine from a slower kernel (default: torch_sdpa)"),
    Setting("report", "DIR", str, "",
            "write attnkit-report.json, attnkit-report.md and PNG plots into DIR (default: no report files)"),
    Setting("budget_ms", "MS", _bounded(float, 1.0), 400.0,
            "timing budget per speed case and implementation, in milliseconds (default: 400)"),
)


def _argparse_type(setting: Setting) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            return setting.parse(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    parse.__name__ = setting.dest  # argparse names the type in its messages
    return parse


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("attnkit", "attention kernels (pytest-attnkit)")
    group.addoption("--attnkit", action="store_true", default=False,
                    help="run the attnkit suites against every discovered attention implementation")
    for setting in SETTINGS:
        group.addoption(setting.flag, dest=f"attnkit_{setting.dest}", metavar=setting.metavar,
                        type=_argparse_type(setting), default=None,
                        help=f"{setting.help}; env {setting.env}, ini {setting.ini}")
        parser.addini(setting.ini, help=setting.help, default=None)
    group.addoption("--attnkit-inprocess", action="store_true", default=False,
                    help="run implementations inside the pytest process (no isolation or deadline; for pdb)")
    group.addoption("--attnkit-save-baseline", action="store_true", default=False,
                    help="write this run's speed measurements into the baseline file for this GPU (atomically)")
    group.addoption("--attnkit-require-baseline", action="store_true", default=False,
                    help="fail speed tests that have no baseline for this GPU instead of gating nothing")
    parser.addini("attnkit_thresholds", type="linelist", default=[],
                  help="per implementation or case thresholds, one 'PATTERN = PERCENT' a line; PATTERN is a glob "
                       "over 'implementation::mode::case', e.g. 'triton_flash::backward::* = 8%'")


@dataclass(frozen=True)
class Settings:
    impl: list[str]
    suite: list[str]
    profile: str
    device: str
    seed: int
    trials: int
    timeout: float
    baseline_dir: str
    report: str
    threshold: float
    reference: str
    budget_ms: float
    inprocess: bool
    save_baseline: bool
    require_baseline: bool
    threshold_overrides: list[tuple[str, float]]
    sources: dict[str, str]

    def threshold_for(self, key: str) -> float:
        """The threshold for ``implementation::mode::case``: the last matching override, or the default."""
        import fnmatch

        value = self.threshold
        for pattern, override in self.threshold_overrides:
            if fnmatch.fnmatchcase(key, pattern):
                value = override
        return value


def resolve(config: pytest.Config) -> Settings:
    """Every setting's value and where it came from; a bad value raises ``pytest.UsageError``."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for setting in SETTINGS:
        cli_value = config.getoption(f"attnkit_{setting.dest}")
        if cli_value is not None:
            values[setting.dest], sources[setting.dest] = cli_value, f"command line {setting.flag}"
            continue
        for source, raw in ((f"environment variable {setting.env}", os.environ.get(setting.env)),
                            (f"ini option {setting.ini}", config.getini(setting.ini))):
            if raw not in (None, ""):
                try:
                    values[setting.dest] = setting.parse(str(raw))
                except ValueError as error:
                    raise pytest.UsageError(f"attnkit: bad value in {source}: {error}") from None
                sources[setting.dest] = source
                break
        else:
            values[setting.dest], sources[setting.dest] = setting.default, "default"
    overrides = []
    for line in config.getini("attnkit_thresholds"):
        pattern, separator, percent = line.rpartition("=")
        try:
            if not separator or not pattern.strip():
                raise ValueError(f"{line!r} is not 'PATTERN = PERCENT'")
            overrides.append((pattern.strip(), _percent(percent)))
        except ValueError as error:
            raise pytest.UsageError(f"attnkit: bad line in ini option attnkit_thresholds: {error}") from None
    return Settings(inprocess=bool(config.getoption("attnkit_inprocess")),
                    save_baseline=bool(config.getoption("attnkit_save_baseline")),
                    require_baseline=bool(config.getoption("attnkit_require_baseline")),
                    threshold_overrides=overrides, sources=sources, **values)
