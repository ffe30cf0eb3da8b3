"""Programs as the worker writes them (pytest_attnkit.worker.speed.program_of) and the controller
reads them (pytest_attnkit.programs): launches in order, a kernel launched several times in a row
once, the shortest launches that take at most 5% of the call marked minor."""

from __future__ import annotations

from pytest_attnkit.programs import MINOR_MARK, core, describe, plain
from pytest_attnkit.worker.speed import program_of


def _kernel(name: str, ts: float, dur: float, grid: str = "[1,1,1]") -> dict:
    return {"cat": "kernel", "name": name, "ts": ts, "dur": dur,
            "args": {"grid": grid, "block": [128, 1, 1], "shared memory": 0, "registers per thread": 32}}


def test_the_trace_becomes_launches_in_time_order_with_the_small_ones_marked_minor() -> None:
    # FlexAttention's backward on an H200: Inductor's delta reduction, then the template (the
    # reduction's grid is what its autotuner picked in that process).
    events = [_kernel("tem_bwd", 20.0, 970.0, "[256,1,16]"), _kernel("per_delta", 0.0, 12.0, "[32768,1,1]"),
              {"cat": "cpu_op", "name": "aten::empty", "ts": 1.0, "dur": 5.0},
              _kernel("fill", 1000.0, 8.0), _kernel("fill", 1010.0, 8.0)]
    program = program_of(events)
    assert program == ("per_delta grid=[32768,1,1] block=[128,1,1] smem=0 regs=32" + MINOR_MARK
                       + " | tem_bwd grid=[256,1,16] block=[128,1,1] smem=0 regs=32"
                       + " | fill grid=[1,1,1] block=[128,1,1] smem=0 regs=32" + MINOR_MARK)
    assert core(program) == "tem_bwd grid=[256,1,16] block=[128,1,1] smem=0 regs=32"
    assert MINOR_MARK not in plain(program) and plain(program).count(" | ") == 2
    assert program_of([{"cat": "cpu_op", "name": "x"}]) is None


def test_minor_launches_take_at_most_five_percent_together_and_a_program_of_equals_has_no_core() -> None:
    assert describe([("a", 50.0), ("b", 3.0), ("c", 3.0), ("d", 44.0)]) == "a | b ~minor | c | d"  # 3 + 3 > 5
    assert describe([("a", 97.0), ("b", 3.0)]) == "a | b ~minor"
    assert core(describe([("a", 50.0), ("b", 50.0)])) is None  # nothing minor: no mark, no core
    assert core("a | b") is None and plain("a | b ~minor") == "a | b"  # a program saved before the marks
    assert describe([("a", 0.0), ("b", 0.0)]) == "a | b"  # no durations (a profiler that gave none)
    assert describe([]) is None
