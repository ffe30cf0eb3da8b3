"""Command-line options, their ini and environment forms, and where each value came from.

Every setting resolves in one place, in this order: the command line, then the environment
(``ATTNKIT_...``), then the ini file (``attnkit_...``), then the default. A bad value is a usage
error that names where it came from (pytest exits with code 4).

Relative folders (baselines, reports) are resolved against the folder of the config file when
they come from it or by default, and against the current folder when they come from the command
line or the environment; never against pytest's rootdir. pytest picks its rootdir before it knows
this plugin's options, so a folder given as a separate value (``--attnkit-report /tmp/r``) can
become the rootdir, and a gate that looked for ``<rootdir>/baselines`` would then find nothing.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest

from pytest_attnkit.controller.baselines import key_string
from pytest_attnkit.controller.gate import DEFAULT_AGAINST_THRESHOLD, DEFAULT_THRESHOLD
from pytest_attnkit.contract import DEVICES
from pytest_attnkit.records import EntryKey

SUITES: tuple[str, ...] = ("correctness", "memory", "speed", "properties", "sanitize")
#: What a run without --attnkit-suite runs: every suite but sanitize (compute-sanitizer slows a
#: kernel tens of times; --attnkit-sanitize or --attnkit-suite adds it).
DEFAULT_SUITES: tuple[str, ...] = ("correctness", "memory", "speed", "properties")
#: compute-sanitizer's tools the sanitize suite can run (controller/sanitize.py).
SANITIZER_TOOLS: tuple[str, ...] = ("memcheck", "racecheck", "initcheck", "synccheck")
PROFILE_CHOICES: tuple[str, ...] = ("auto", "smoke", "default", "full")
DEVICE_CHOICES: tuple[str, ...] = ("auto", *DEVICES)


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


def known_suites() -> list[str]:
    """The bundled suites, then those other distributions register through the ``attnkit.suites``
    entry points (their metadata only: nothing is imported)."""
    from pytest_attnkit.registry import SUITE_GROUP, discover

    return [*SUITES, *sorted({ref.name for ref in discover(SUITE_GROUP)} - set(SUITES))]


def _suites(text: str) -> list[str]:
    names = _names(text)
    known = known_suites()
    if names == ["all"]:
        return known
    unknown = [name for name in names if name not in known]
    if unknown:
        raise ValueError(f"unknown suite {', '.join(map(repr, unknown))} (known: {', '.join(known)}, or all)")
    return names


def _tools(text: str) -> list[str]:
    names = _names(text)
    unknown = [name for name in names if name not in SANITIZER_TOOLS]
    if unknown:
        raise ValueError(f"unknown compute-sanitizer tool {', '.join(map(repr, unknown))} "
                         f"(known: {', '.join(SANITIZER_TOOLS)})")
    return names


def _executable(text: str) -> str:
    """A program to run: a path to an executable file, or a name on the PATH; empty for the default."""
    import shutil

    stripped = str(text).strip()
    if stripped and not (os.path.isfile(stripped) and os.access(stripped, os.X_OK)) and shutil.which(stripped) is None:
        raise ValueError(f"{stripped!r} is neither an executable file nor a program on the PATH")
    return stripped


def _percent(text: str) -> float:
    """A threshold in percent, as a share: "8%" and "8" are both 0.08. A bare number below 1
    ("0.08") is refused: it could be a share or a percentage, and a gate must not guess."""
    stripped = str(text).strip()
    number = stripped[:-1].strip() if stripped.endswith("%") else stripped
    try:
        value = float(number)
    except ValueError:
        raise ValueError(f"{text!r} is not a percentage such as 8% or 8") from None
    if not 0 < value <= 1000:
        raise ValueError(f"{text!r} must be a percentage above 0 and at most 1000, such as 8%")
    if not stripped.endswith("%") and value < 1:
        raise ValueError(f"{text!r} is ambiguous: write {value * 100:g}% for a share of {value:g}, or {value:g}% "
                         "for that many percent")
    return value / 100


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


def _jobs(text: str) -> int | str:
    value = str(text).strip()
    if value == "auto":
        return value
    try:
        jobs = int(value)
    except ValueError:
        raise ValueError(f"{text!r} is not a whole number or auto") from None
    if jobs < 1:
        raise ValueError(f"{text!r} must be at least 1 (1 runs one request at a time, as each test asks)")
    return jobs


def _revision(text: str) -> str:
    value = text.strip()
    if not value:
        raise ValueError("expected a git revision or a path to a checkout, a wheel or an sdist")
    return value


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
    Setting("suite", "NAMES", _suites, list(DEFAULT_SUITES),
            f"comma-separated suites to run: {', '.join(SUITES)}, a suite installed through the attnkit.suites "
            f"entry points, or all (default: {', '.join(DEFAULT_SUITES)})"),
    Setting("profile", "NAME", _choices(PROFILE_CHOICES), "auto",
            "case set: smoke (minutes on a CPU), default (one GPU), full; auto picks smoke on the CPU and default on a GPU (default: auto)"),
    Setting("device", "NAME", _choices(DEVICE_CHOICES), "auto", "device to test on: cpu, cuda, or auto (CUDA when present; default: auto)"),
    Setting("seed", "INT", _bounded(int, 0), 0, "base seed for the inputs; each trial derives its own from it (default: 0)"),
    Setting("trials", "N", _bounded(int, 1), 2, "trials per correctness case, each on fresh inputs (default: 2)"),
    Setting("jobs", "N", _jobs, "auto",
            "requests that run at once on a device, each in a worker process of its implementation: the "
            "correctness cases, and the compilation of the memory and speed cases ahead of them (memory sweeps "
            "and speed timing always have the device alone); 1 runs each test's request when the test asks; "
            "auto: one per CPU core this pytest process may use, shared among pytest-xdist workers (default: auto)"),
    Setting("cache_dir", "DIR", str, "",
            "folder for the compilers' caches that later runs reuse (Triton, TorchInductor, CuPy), unless their "
            "own variables are set; none leaves each compiler its default (default: $XDG_CACHE_HOME/pytest-attnkit, "
            "else ~/.cache/pytest-attnkit)"),
    Setting("sanitize", "TOOLS", _tools, [],
            f"also run the sanitize suite: each of its cases in a worker under compute-sanitizer with these tools "
            f"({', '.join(SANITIZER_TOOLS)}; comma-separated); --attnkit-suite=sanitize alone runs memcheck "
            "(default: off)"),
    Setting("sanitizer", "PATH", _executable, "",
            "the compute-sanitizer to run (default: the one on the PATH, in $CUDA_HOME/bin, $CUDA_PATH/bin or "
            "/usr/local/cuda/bin)"),
    Setting("timeout", "SECONDS", _bounded(float, 0.001), 300.0,
            "deadline for one test in its worker, not counting its compiling (which may take 4 times as long) "
            "nor starting the worker (at least 180); past it the worker is killed and replaced (default: 300)"),
    Setting("baseline_dir", "DIR", str, "baselines",
            "folder of per-GPU baseline files; relative to the config file's folder when set there or by default, "
            "else to the current folder (default: baselines)"),
    Setting("threshold", "PERCENT", _percent, DEFAULT_THRESHOLD,
            "slowdown past which a statistically clear change is a regression, in percent: 8%% or 8 "
            f"(default: {round(DEFAULT_THRESHOLD * 100)}%%; a doubling on the CPU)"),
    Setting("reference", "NAME", str, "torch_sdpa",
            "implementation whose in-run speed tells a slower machine from a slower kernel (default: torch_sdpa)"),
    Setting("report", "DIR", str, "",
            "write attnkit-report.json, attnkit-report.md and PNG plots into DIR (default: no report files)"),
    Setting("budget_ms", "MS", _bounded(float, 1.0), 400.0,
            "timing budget per speed case and implementation, in milliseconds (default: 400)"),
    Setting("against", "REV", _revision, "",
            "also time each implementation of REV (a git revision of this repository, a path to another "
            "checkout, a wheel or an sdist) as <impl>@<rev>, interleaved with the current one in the speed "
            "suite, and gate the current one on the paired ratio; write --attnkit-against=REV (default: off)"),
    Setting("against_threshold", "PERCENT", _percent, DEFAULT_AGAINST_THRESHOLD,
            "the A/B gate's threshold (--attnkit-against): slowdown of the paired new/old ratio past which a "
            f"statistically clear change is a regression (default: {round(DEFAULT_AGAINST_THRESHOLD * 100)}%%; "
            "a doubling on the CPU)"),
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
    jobs: int | str
    cache_dir: str
    sanitize: list[str]
    sanitizer: str
    timeout: float
    baseline_dir: str
    report: str
    threshold: float
    reference: str
    budget_ms: float
    against: str
    against_threshold: float
    inprocess: bool
    save_baseline: bool
    require_baseline: bool
    threshold_overrides: list[tuple[str, float]]
    sources: dict[str, str]
    #: The folders that relative paths from the config file, and from the command line or the
    #: environment, are resolved against (see the module docstring).
    config_dir: Path = field(default_factory=Path.cwd)
    invocation_dir: Path = field(default_factory=Path.cwd)

    def threshold_for(self, key: EntryKey) -> float:
        """The threshold for a measurement: the last matching ``attnkit_thresholds`` line, or the default."""
        value = self.threshold
        for pattern, override in self.threshold_overrides:
            if fnmatch.fnmatchcase(key_string(key), pattern):
                value = override
        return value

    def path(self, name: str) -> Path:
        """The folder setting ``name`` ("baseline_dir", "report") as an absolute path."""
        source = self.sources.get(name, "default")
        anchor = self.invocation_dir if source.startswith(("command line", "environment")) else self.config_dir
        return (anchor / getattr(self, name)).resolve()

    @property
    def threshold_is_default(self) -> bool:
        return self.sources.get("threshold") == "default" and not self.threshold_overrides


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
    invocation_dir = Path(config.invocation_params.dir)
    if values["sanitize"] and "sanitize" not in values["suite"]:
        values["suite"] = [*values["suite"], "sanitize"]
    elif "sanitize" in values["suite"] and not values["sanitize"]:
        values["sanitize"] = ["memcheck"]
    return Settings(inprocess=bool(config.getoption("attnkit_inprocess")),
                    save_baseline=bool(config.getoption("attnkit_save_baseline")),
                    require_baseline=bool(config.getoption("attnkit_require_baseline")),
                    threshold_overrides=overrides, sources=sources,
                    config_dir=config.inipath.parent if config.inipath else invocation_dir,
                    invocation_dir=invocation_dir, **values)


def moved_rootdir(config: pytest.Config, settings: Settings) -> str | None:
    """Say so when pytest took the value of one of these options for its rootdir.

    pytest chooses its rootdir and config file before it knows this plugin's options, so
    ``--attnkit-report /tmp/r`` (with a space) reads to it as a path to test: /tmp/r becomes
    the rootdir, and the project's config file is not read. The ``=`` form avoids it."""
    for name in ("report", "baseline_dir"):
        if settings.sources.get(name, "").startswith("command line") and settings.path(name) == Path(config.rootpath).resolve():
            flag = f"--attnkit-{name.replace('_', '-')}"
            return (f"pytest took {config.rootpath} (the value of {flag}) as its rootdir and read no config file "
                    f"from your project; write {flag}={getattr(settings, name)}")
    return None
