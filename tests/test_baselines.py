"""Baseline files: per GPU, schema-versioned, atomic, with clear errors for bad files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_attnkit.controller import baselines

DEVICE = {"name": "NVIDIA H200", "compute_capability": "9.0"}
ENTRY = {"median_ms": 1.0, "samples_ms": [1.0] * 10}


def test_device_slug() -> None:
    assert baselines.device_slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"


def test_save_then_load_and_merge(tmp_path: Path) -> None:
    path = baselines.baseline_path(tmp_path, "NVIDIA H200")
    baselines.save(path, DEVICE, {"a::forward::x": ENTRY})
    baselines.save(path, DEVICE, {"b::forward::x": ENTRY})
    entries = baselines.load(path, "NVIDIA H200")
    assert set(entries) == {"a::forward::x", "b::forward::x"}
    assert json.loads(path.read_text())["schema_version"] == baselines.SCHEMA_VERSION


def test_no_file_means_no_baseline(tmp_path: Path) -> None:
    assert baselines.load(tmp_path / "nvidia-h200.json", "NVIDIA H200") is None


def test_crash_mid_write_leaves_the_old_file_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = baselines.baseline_path(tmp_path, "NVIDIA H200")
    baselines.save(path, DEVICE, {"a::forward::x": ENTRY})
    before = path.read_bytes()

    def crash(*args, **kwargs):
        raise KeyboardInterrupt  # as if the run were interrupted while writing

    monkeypatch.setattr(baselines.json, "dump", crash)
    with pytest.raises(KeyboardInterrupt):
        baselines.save(path, DEVICE, {"b::forward::x": ENTRY})
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left behind


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"schema": "pytest-attnkit/baseline", "schema_vers', "cannot be read"),
        ('{"something": "else"}', "is not a pytest-attnkit baseline"),
        ('{"schema": "pytest-attnkit/baseline", "schema_version": 99, "device": {"name": "NVIDIA H200"}, "entries": {}}',
         "has schema version 99; this pytest-attnkit reads versions 1, 2"),
        ('{"schema": "pytest-attnkit/baseline", "schema_version": 1, "device": {"name": "NVIDIA H100"}, "entries": {}}',
         "was measured on 'NVIDIA H100', not on 'NVIDIA H200'"),
    ],
)
def test_bad_files_are_refused_clearly(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "nvidia-h200.json"
    path.write_text(content)
    with pytest.raises(baselines.BaselineError, match=message):
        baselines.load(path, "NVIDIA H200")


def test_corrupt_baseline_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.mkdir("baselines")
    import platform

    name = platform.processor() or platform.machine()
    (pytester.path / "baselines" / f"{baselines.device_slug(name)}.json").write_text("{ truncated")
    result = pytester.runpytest("--attnkit", "--attnkit-suite", "speed", "--attnkit-device", "cpu",
                                "--attnkit-impl", "torch_sdpa")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: attnkit: baseline file * cannot be read: *"])
