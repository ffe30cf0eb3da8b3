"""Baseline files: per GPU, schema-versioned, atomic, with clear errors for bad files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_attnkit.controller import baselines
from pytest_attnkit.records import EntryKey

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


# -- malformed fields: the whole file is checked when it is read ------------------------------------

def _document(**entry_fields) -> dict:
    entry = {"impl": "good", "mode": "forward", "case": "c", "median_ms": 1.0, "samples_ms": [1.0] * 10,
             "history": [{"date": "2026-01-01T00:00:00+00:00", "median_ms": 1.0, "samples": 10, "host": "h"}]}
    entry.update(entry_fields)
    return {"schema": baselines.SCHEMA, "schema_version": 2, "device": {"name": "NVIDIA H200"},
            "entries": {"good::forward::c": {key: value for key, value in entry.items() if value is not MISSING}}}


MISSING = object()
KEY = 'entries["good::forward::c"]'


@pytest.mark.parametrize(
    ("change", "field", "expected"),
    [
        (lambda d: d.update(device="x86_64"), "device", 'a string ("x86_64"), expected an object'),
        (lambda d: d.update(device={}), "device.name", "missing"),
        (lambda d: d["device"].update(name=7), "device.name", "a number (7), expected a string"),
        (lambda d: d.update(entries=[]), "entries", "a list, expected an object"),
        (lambda d: d["entries"].update({"good::forward::c": 3}), KEY, "a number (3), expected an object"),
        (lambda d: d["entries"]["good::forward::c"].update(median_ms="1.0"), f"{KEY}.median_ms",
         'a string ("1.0"), expected a positive number'),
        (lambda d: d["entries"]["good::forward::c"].update(median_ms=None), f"{KEY}.median_ms", "null"),
        (lambda d: d["entries"]["good::forward::c"].update(median_ms=0), f"{KEY}.median_ms",
         "a number (0), expected a positive number"),
        (lambda d: d["entries"]["good::forward::c"].update(median_ms=True), f"{KEY}.median_ms", "a boolean"),
        (lambda d: d["entries"]["good::forward::c"].pop("median_ms"), f"{KEY}.median_ms", "missing"),
        (lambda d: d["entries"]["good::forward::c"].update(samples_ms=None), f"{KEY}.samples_ms",
         "null, expected a list"),
        (lambda d: d["entries"]["good::forward::c"].update(samples_ms=[1.0, "2"]), f"{KEY}.samples_ms[1]",
         "a string"),
        (lambda d: d["entries"]["good::forward::c"].update(history={"a": 1}), f"{KEY}.history", "an object"),
        (lambda d: d["entries"]["good::forward::c"].update(history=None), f"{KEY}.history", "null"),
        (lambda d: d["entries"]["good::forward::c"]["history"].append(2.0), f"{KEY}.history[1]", "a number"),
        (lambda d: d["entries"]["good::forward::c"]["history"][0].update(median_ms=None),
         f"{KEY}.history[0].median_ms", "null"),
        (lambda d: d["entries"]["good::forward::c"]["history"][0].update(program=5),
         f"{KEY}.history[0].program", "a number (5), expected a string or null"),
        (lambda d: d["entries"]["good::forward::c"]["history"][0].update(clock_mhz="1980"),
         f"{KEY}.history[0].clock_mhz", 'a string ("1980"), expected a positive number or null'),
        (lambda d: d["entries"]["good::forward::c"].update(impl=None), f"{KEY}.impl", "null, expected a string"),
        (lambda d: d["entries"]["good::forward::c"].update(gpu_state=[]), f"{KEY}.gpu_state", "a list"),
        (lambda d: d["entries"].update({"x": {"median_ms": 1.0, "samples_ms": [1.0]}}), 'entries["x"]',
         "has no impl, mode and case"),
    ],
)
def test_every_malformed_field_is_named(tmp_path: Path, change, field: str, expected: str) -> None:
    document = _document()
    change(document)
    path = tmp_path / "nvidia-h200.json"
    path.write_text(json.dumps(document))
    with pytest.raises(baselines.BaselineError) as raised:
        baselines.BaselineStore(tmp_path, "NVIDIA H200")
    message = str(raised.value)
    assert str(path) in message and f"{field} " in message and expected in message, message


def test_a_well_formed_file_of_either_version_is_read(tmp_path: Path) -> None:
    path = tmp_path / "nvidia-h200.json"
    path.write_text(json.dumps(_document()))
    assert baselines.BaselineStore(tmp_path, "NVIDIA H200").pooled(EntryKey("good", "forward", "c")) is not None
    version_1 = _document(history=MISSING, date="2025-01-01", samples=10)
    version_1["schema_version"] = 1
    path.write_text(json.dumps(version_1))
    assert baselines.BaselineStore(tmp_path, "NVIDIA H200").pooled(EntryKey("good", "forward", "c")).runs == 1


def _cpu_baseline(pytester: pytest.Pytester, document: dict) -> Path:
    """A baseline for this machine's CPU, for the implementation ``good`` on the smoke set's first
    speed case."""
    import platform

    name = platform.processor() or platform.machine()
    from pytest_attnkit import cases

    case = cases.speed_cases("smoke")[0][1].id
    entry = document["entries"].pop("good::forward::c")
    entry["case"] = case
    document["entries"][f"good::forward::{case}"] = entry
    document["device"]["name"] = name if isinstance(document["device"].get("name"), str) else document["device"]["name"]
    path = pytester.path / "baselines" / f"{baselines.device_slug(name)}.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(document))
    return path


@pytest.mark.parametrize(("change", "field"), [
    (lambda d: d.update(device="x86_64"), "device"),
    (lambda d: next(iter(d["entries"].values())).update(median_ms="fast"), ".median_ms"),
])
def test_a_malformed_field_is_a_usage_error_not_a_crash_or_a_kernel_failure(
        pytester: pytest.Pytester, fake_dist, change, field: str) -> None:
    fake_dist({"good": "fake_kernels:good"})
    document = _document()
    path = _cpu_baseline(pytester, document)
    stored = json.loads(path.read_text())
    change(stored)
    path.write_text(json.dumps(stored))
    result = pytester.runpytest("--attnkit", "-p", "no:cacheprovider", "--attnkit-suite=speed",
                                "--attnkit-impl=good", "--attnkit-device=cpu", "--benchmark-disable",
                                "-k", "speed_forward and not causal")
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    result.stderr.fnmatch_lines([f"ERROR: attnkit: baseline file {path} is malformed: *{field} is *"])
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()


# -- two runs at once, and saves killed mid-write -------------------------------------------------

def _measured(median_ms: float, case: str = "c"):
    from pytest_attnkit.contract import Case
    from pytest_attnkit.records import SpeedMeasurement, Timing

    shape = Case(batch=1, heads_q=2, heads_kv=2, seqlen_q=16, seqlen_k=16, head_dim=32, dtype="float32",
                 causal=False)
    timing = Timing(samples_ms=tuple([median_ms] * 10), warmup_ms=1.0, timer="perf-counter")
    return SpeedMeasurement("good", "forward", shape, timing)


def test_two_runs_that_save_at_once_keep_both_runs(tmp_path: Path) -> None:
    # Both stores read the file before either saves, as two concurrent runs do.
    baselines.BaselineStore(tmp_path, "NVIDIA H200").save([(_measured(1.0), None, None)], {}, {}, "h")
    first = baselines.BaselineStore(tmp_path, "NVIDIA H200")
    second = baselines.BaselineStore(tmp_path, "NVIDIA H200")
    first.save([(_measured(1.1), None, None)], {}, {}, "first")
    counts = second.save([(_measured(1.2), None, None)], {}, {}, "second")
    assert counts["pooled"] == 1
    [entry] = baselines.load(baselines.baseline_path(tmp_path, "NVIDIA H200"), "NVIDIA H200").values()
    assert [run["host"] for run in entry["history"]] == ["h", "first", "second"]


def test_saves_from_several_processes_at_once_lose_no_run(tmp_path: Path) -> None:
    # Real processes, started together, each saving one run: the folder's lock orders them.
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from pathlib import Path
        from pytest_attnkit.controller import baselines
        from test_baselines import _measured
        store = baselines.BaselineStore(Path({str(tmp_path)!r}), "NVIDIA H200")
        time.sleep(max(0.0, float(sys.argv[2]) - time.time()))  # all read, then all save
        store.save([(_measured(1.0), None, None)], {{}}, {{}}, sys.argv[1])
    """)
    start_at = f"{__import__('time').time() + 4:.3f}"
    runs = [subprocess.Popen([sys.executable, "-c", script, f"run{index}", start_at]) for index in range(4)]
    assert [run.wait(timeout=60) for run in runs] == [0] * 4
    [entry] = baselines.load(baselines.baseline_path(tmp_path, "NVIDIA H200"), "NVIDIA H200").values()
    assert sorted(run["host"] for run in entry["history"]) == [f"run{index}" for index in range(4)]


def test_a_restarted_history_keeps_the_runs_saved_meanwhile(tmp_path: Path) -> None:
    from pytest_attnkit.controller.gate import Decision

    baselines.BaselineStore(tmp_path, "NVIDIA H200").save([(_measured(1.0), None, None)], {}, {}, "old")
    mine = baselines.BaselineStore(tmp_path, "NVIDIA H200")
    baselines.BaselineStore(tmp_path, "NVIDIA H200").save([(_measured(3.0), None, None)], {}, {}, "other")
    rewritten = Decision("improvement", 0.3, 0.3, 1.0, 1.0, 0.0, 0.08, 1.0, 0.3)
    counts = mine.save([(_measured(0.3), rewritten, None)], {}, {}, "mine")
    assert counts["restarted"] == 1
    [entry] = baselines.load(baselines.baseline_path(tmp_path, "NVIDIA H200"), "NVIDIA H200").values()
    assert [run["host"] for run in entry["history"]] == ["other", "mine"]


def test_a_temporary_file_left_by_a_killed_save_is_removed_at_the_next_start(tmp_path: Path) -> None:
    path = baselines.baseline_path(tmp_path, "NVIDIA H200")
    baselines.save(path, DEVICE, {"a::forward::x": ENTRY})
    stale = tmp_path / f".{path.name}.k1ll3d.tmp"
    stale.write_bytes(b'{"schema": "pytest-attnkit/baseline", "entr')  # a save killed mid-write
    other = tmp_path / "notes.tmp"
    other.write_text("not ours")
    store = baselines.BaselineStore(tmp_path, "NVIDIA H200")
    assert store.removed == [stale] and not stale.exists() and other.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([path.name, "notes.tmp"])


def test_a_temporary_file_is_kept_while_another_run_saves(tmp_path: Path) -> None:
    path = baselines.baseline_path(tmp_path, "NVIDIA H200")
    baselines.save(path, DEVICE, {"a::forward::x": ENTRY})
    writing = tmp_path / f".{path.name}.w0rk1ng.tmp"
    writing.write_text("")
    with baselines.locked(tmp_path):  # as another run's save holds it
        import subprocess
        import sys

        code = ("from pathlib import Path; from pytest_attnkit.controller import baselines; "
                f"print(len(baselines.remove_stale_temporaries(Path({str(tmp_path)!r}))))")
        removed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert removed.stdout.strip() == "0" and writing.exists()


def test_a_file_changed_into_garbage_meanwhile_is_not_replaced(tmp_path: Path) -> None:
    store = baselines.BaselineStore(tmp_path, "NVIDIA H200")
    store.path.write_text("{ half")
    with pytest.raises(baselines.BaselineError, match="cannot be read"):
        store.save([(_measured(1.0), None, None)], {}, {}, "h")
    assert store.path.read_text() == "{ half"
    assert baselines.temporaries(tmp_path) == []
