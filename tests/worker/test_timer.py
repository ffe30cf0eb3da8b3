"""The timer's CPU path and the arithmetic of its GPU hold (the hold itself runs on the GPU machine)."""

from __future__ import annotations

import contextlib
import time

import pytest

from pytest_attnkit.controller import gate
from pytest_attnkit.worker import timer


def test_hold_covers_the_host_part_and_is_bounded() -> None:
    assert timer.hold_ms(0.0) == timer.HOLD_SLACK_MS
    assert timer.hold_ms(0.1) == pytest.approx(timer.HOLD_FACTOR * 0.1 + timer.HOLD_SLACK_MS)
    assert timer.hold_ms(0.1) > 0.1  # longer than the host takes to issue the call
    assert timer.hold_ms(1e6) == timer.HOLD_LIMIT_MS


@pytest.mark.parametrize("bad", [-0.1, float("nan")])
def test_hold_rejects_a_launch_time_that_is_not_one(bad: float) -> None:
    with pytest.raises(ValueError, match="launch time"):
        timer.hold_ms(bad)


@pytest.mark.timing
def test_cpu_samples_time_the_call() -> None:
    calls = []

    def call() -> None:
        calls.append(None)
        time.sleep(0.002)

    timing = timer.time_call(call, "cpu", budget_ms=60, min_samples=9, max_samples=100)
    assert timing.timer == "perf-counter" and timing.launch_ms is None and timing.hold_ms is None
    assert 9 <= len(timing.samples_ms) <= 40
    assert all(sample >= 2.0 for sample in timing.samples_ms)
    assert len(calls) == 3 + 1 + len(timing.samples_ms)  # warm-up, the estimate, the samples


@pytest.mark.timing
def test_long_calls_get_one_warmup_and_fewer_samples() -> None:
    calls = []

    def call() -> None:
        calls.append(None)
        time.sleep(0.03)

    timing = timer.time_call(call, "cpu", budget_ms=10, min_samples=15, long_call_ms=20)
    assert len(timing.samples_ms) == gate.MIN_SAMPLES  # the default floor for long calls is the gate's minimum
    assert len(calls) == 2 + gate.MIN_SAMPLES  # the first call, one warm call found it long, then the samples
    assert timing.first_call_ms is not None and timing.first_call_ms >= 30


@pytest.mark.timing
def test_prepare_runs_before_every_call_and_is_not_timed() -> None:
    events = []

    def prepare() -> None:
        events.append("prepare")
        time.sleep(0.02)

    def call() -> None:
        assert events[-1] == "prepare", "every call must have its own prepare"
        events.append("call")
        time.sleep(0.002)

    timing = timer.time_call(call, "cpu", budget_ms=40, min_samples=6, max_samples=20, prepare=prepare)
    assert events == ["prepare", "call"] * (3 + 1 + len(timing.samples_ms))
    assert all(2.0 <= sample < 20.0 for sample in timing.samples_ms)
    assert timing.first_call_ms is not None and timing.first_call_ms < 20.0


def test_the_hold_reads_the_clock() -> None:
    assert timer.clock_mhz(1_980_000, 1.0) == pytest.approx(1980.0)  # torch.cuda._sleep counts SM cycles
    assert timer.clock_mhz(1_980_000, 1.0 / 0.94) == pytest.approx(1980.0 * 0.94)  # 6% slower
    assert timer.clock_mhz(1000, 0.0) != timer.clock_mhz(1000, 0.0)  # NaN: no reading


def test_timing_carries_the_samples_clocks() -> None:
    warmed = timer.WarmedCall(lambda: None, "cuda", None, warmup_ms=1.0, first_call_ms=1.0, long_call=False,
                              last_ms=None)
    warmed._clocks = [1980.0, 1861.2, float("nan"), 1960.0]  # a NaN (no reading) is left out
    timing = warmed.timing([5.0, 5.1, 5.2, 5.3])
    assert timing.clocks_mhz == (1980.0, 1861.2, 1960.0)
    assert timing.clock_mhz_min == 1861.2 and timing.clock_mhz_median == 1960.0
    assert type(timing).from_dict(timing.to_dict()) == timing
    assert warmed.timing([5.0, 5.1]).clocks_mhz == ()  # clocks of other samples are not these
    # a document from an older worker (no clocks) or a newer one (keys this version lacks) loads
    old = {key: value for key, value in timing.to_dict().items() if "clock" not in key}
    assert type(timing).from_dict({**old, "a_newer_field": 1}).clocks_mhz == ()


def test_a_case_timed_under_a_lower_clock_is_named() -> None:
    from pytest_attnkit.controller.table import clock_lines

    from pytest_attnkit.records import Timing

    def measurement(impl: str, clocks: list[float], mode: str = "backward") -> dict:  # as the report holds it
        timing = Timing((5.0,) * len(clocks) or (5.0,), 1.0, "cuda-events", clocks_mhz=tuple(clocks))
        return {"impl": impl, "mode": mode, "case": "b1-h16-q16384-k16384-d128-bf16-alibi",
                "timing": timing.to_dict()}

    lines = clock_lines([measurement("cool_kernel", [1980.0, 1975.0, 1970.0]),
                         measurement("hot_kernel", [1960.0, 1900.0, 1840.0]), measurement("cpu_kernel", [])])
    text = " ".join(" ".join(lines).split())  # the wrapped lines as one
    assert "1 case(s)" in text and "against 1975 MHz" in text
    assert "hot_kernel bwd b1-h16-q16384-k16384-d128-bf16-alibi 1840" in text
    assert "cool_kernel" not in text and all(len(line) <= 100 for line in lines)
    assert clock_lines([measurement("cool_kernel", [1980.0, 1960.0])]) == []
    assert clock_lines([measurement("cpu_kernel", [])]) == []
    # one case's forward and backward at the same lowest clock (an H100 run's report crashed here)
    lines = clock_lines([measurement("cool_kernel", [1980.0, 1980.0]), measurement("hot_kernel", [1980.0, 1800.0]),
                         measurement("hot_kernel", [1980.0, 1800.0], mode="forward")])
    text = " ".join(" ".join(lines).split())
    assert "2 case(s)" in text and text.index("hot_kernel bwd") < text.index("hot_kernel fwd")


def test_the_watch_holds_every_warm_call_after_the_first_and_no_prepare() -> None:
    """The speed suite looks for calls that synchronize the host inside the warm-up's later calls
    (worker/speed.py: SyncWatch), so it needs no call of its own; the first call compiles, and may
    synchronize for that alone."""
    events: list[str] = []

    @contextlib.contextmanager
    def watch():
        events.append("watch")
        yield
        events.append("end")

    timer.warm_up(lambda: events.append("call"), "cpu", warmup=3, prepare=lambda: events.append("prepare"),
                  watch=watch)
    assert events == ["prepare", "call"] + ["prepare", "watch", "call", "end"] * 2


def test_a_call_that_synchronizes_is_found_without_a_call_of_its_own() -> None:
    """On the GPU: torch's sync debug mode sees the ``.item()`` inside the warm-up's later calls,
    and a call without one is clean; no call is made beyond the warm-up's."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU: the sync debug mode watches CUDA synchronizations")
    from pytest_attnkit.worker.speed import SyncWatch

    x = torch.ones(1024, device="cuda")
    for syncing, expected in ((True, "synchroniz"), (False, None)):
        calls = []

        def call() -> None:
            calls.append(None)
            y = x * 2
            if syncing:
                y.sum().item()

        watch = SyncWatch("cuda")
        timer.warm_up(call, "cuda", warmup=3, watch=watch)
        made = len(calls)  # the warm-up's three, and the host-time readings' five (timer._time_synchronized)
        found = watch.found(call, None)
        assert (found is None) if expected is None else (expected in found.lower()), found
        assert len(calls) == made and watch.watched == 2


def test_a_first_call_over_the_stop_ends_the_warm_up_there() -> None:
    calls: list[float] = []

    def call() -> None:
        calls.append(time.perf_counter())
        time.sleep(0.02)

    warmed = timer.warm_up(call, "cpu", warmup=3, stop_over_ms=10.0)
    assert warmed.stopped and warmed.long_call and len(calls) == 1 and warmed.last_ms == warmed.first_call_ms
    calls.clear()
    warmed = timer.warm_up(call, "cpu", warmup=3, stop_over_ms=1000.0)
    assert not warmed.stopped and len(calls) == 3
