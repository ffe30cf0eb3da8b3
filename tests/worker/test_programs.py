"""Programs as the worker writes them (pytest_attnkit.worker.speed.program_of) and the controller
reads them (pytest_attnkit.programs): launches in order, a kernel launched several times in a row
once, the shortest launches that take at most 1% of the call's kernel time marked minor."""

from __future__ import annotations

from pytest_attnkit.programs import MINOR_MARK, core, describe, plain
from pytest_attnkit.worker.speed import program_of


def _kernel(name: str, ts: float, dur: float, grid: str = "[1,1,1]") -> dict:
    return {"cat": "kernel", "name": name, "ts": ts, "dur": dur,
            "args": {"grid": grid, "block": [128, 1, 1], "shared memory": 0, "registers per thread": 32}}


def test_the_trace_becomes_launches_in_time_order_with_the_small_ones_marked_minor() -> None:
    # FlexAttention's backward at 16k on an H200: Inductor's delta reduction (about 0.03 of 12 ms),
    # then the template (the reduction's grid is what its autotuner picked in that process).
    events = [_kernel("tem_bwd", 40.0, 12000.0, "[256,1,16]"), _kernel("per_delta", 0.0, 30.0, "[32768,1,1]"),
              {"cat": "cpu_op", "name": "aten::empty", "ts": 1.0, "dur": 5.0},
              _kernel("fill", 13000.0, 40.0), _kernel("fill", 13050.0, 40.0)]
    program = program_of(events)
    assert program == ("per_delta grid=[32768,1,1] block=[128,1,1] smem=0 regs=32" + MINOR_MARK
                       + " | tem_bwd grid=[256,1,16] block=[128,1,1] smem=0 regs=32"
                       + " | fill grid=[1,1,1] block=[128,1,1] smem=0 regs=32" + MINOR_MARK)
    assert core(program) == "tem_bwd grid=[256,1,16] block=[128,1,1] smem=0 regs=32"
    assert MINOR_MARK not in plain(program) and plain(program).count(" | ") == 2
    assert program_of([{"cat": "cpu_op", "name": "x"}]) is None


def test_minor_launches_take_at_most_one_percent_together_and_an_untimed_kernel_leaves_no_core() -> None:
    assert describe([("a", 494.0), ("b", 6.0), ("c", 6.0), ("d", 494.0)]) == "a | b ~minor | c | d"  # 6 + 6 > 10
    assert describe([("a", 99.0), ("b", 1.0)]) == "a | b ~minor"
    assert describe([("a", 98.0), ("b", 2.0)]) == "a | b"  # 2%: not minor, no core
    assert core(describe([("a", 50.0), ("b", 50.0)])) is None  # nothing minor: no mark, no core
    assert core("a | b") is None and plain("a | b ~minor") == "a | b"  # a program saved before the marks
    # A kernel the profiler gave no duration is of unknown time: no launch is marked, none is core.
    assert describe([("tem", 0.0), ("red", 0.3), ("x", 970.0)]) == "tem | red | x"
    assert describe([("a", None), ("b", 5.0)]) == "a | b"  # type: ignore[list-item]
    assert describe([]) is None
