"""Runtime tile tuning for triton_flash: times each kernel's tile candidates on first use.

The shipped kernel runs fixed tiles (``launch.default_tiles``) so that every run of a suite times
the same code; this tuner is for finding better tiles on a GPU those defaults were not measured
on. It plugs into the kernel through ``launch.set_tile_chooser``.

How to tune:

- ``python3 tools/flash_bench/bench.py --out DIR --tune`` runs the benchmark with the tuner
  installed and writes its choices (``tuning.records`` in ``DIR/bench.json``, one line in
  ``DIR/bench.md``); carry the winners into ``default_tiles`` by hand.
- From Python (with ``tools/flash_bench`` on ``sys.path``)::

      import tuner
      t = tuner.install()          # a fresh Tuner; returns it
      ...                          # calls of flash_attention now time their candidates
      print(t.records, t.seconds())
      tuner.uninstall()            # back to the fixed defaults

Timing uses the speed suite's timer (``pytest_attnkit.worker.timer``): CUDA events, L2 flushed
before each call, median. Under Triton's interpreter, or with one candidate, nothing is timed.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable

from pytest_attnkit.implementations.triton_flash import launch
from pytest_attnkit.implementations.triton_flash.launch import Tiles
from pytest_attnkit.worker.timer import event_samples, l2_flush_buffer


def _out_of_resources() -> type[BaseException]:
    import triton

    errors = getattr(triton.runtime, "errors", None)
    return getattr(errors, "OutOfResources", None) or getattr(triton.runtime, "OutOfResources")


class Tuner:
    """Chooses a kernel's tiles the first time a kind of problem is seen, by timing the candidates.

    The key is the kernel, dtype, head dim, causal flag and the problem's size class; the choice is
    kept for the life of the process (Triton keeps the compiled kernels on disk across
    processes). Small problems (under ``min_work``, counted in FLOPs, or bytes for decode) take the
    first candidate untimed: there the choice matters little and compiling the others would cost
    more than it saves. Each tuning is recorded (candidates' times, choice, seconds spent,
    compilation included) so that a benchmark can report what tuning costs.
    """

    def __init__(self, *, min_flops: float = 2.0**36, min_bytes: float = 2.0**25, reps: int = 5) -> None:
        self.min_flops, self.min_bytes, self.reps = min_flops, min_bytes, reps
        self.choices: dict[tuple, Tiles] = {}
        self.records: list[dict[str, Any]] = []

    def pick(self, key: tuple, candidates: tuple[Tiles, ...], run: Callable[[Tiles], Any], *, work: float,
             memory_bound: bool = False) -> Tiles:
        if len(candidates) == 1 or launch.interpreting() or work < (self.min_bytes if memory_bound else self.min_flops):
            return candidates[0]
        chosen = self.choices.get(key)
        if chosen is not None:
            return chosen
        started = time.perf_counter()
        timings: dict[Tiles, float] = {}
        for tiles in candidates:
            try:
                timings[tiles] = self._time(lambda: run(tiles))
            except _out_of_resources() as error:  # this shape does not fit this GPU's shared memory
                timings[tiles] = math.inf
                last_error = error
        chosen = min(timings, key=timings.__getitem__)
        if math.isinf(timings[chosen]):
            raise last_error
        self.choices[key] = chosen
        self.records.append({"key": [str(part) for part in key], "chosen": str(chosen),
                             "seconds": time.perf_counter() - started,
                             "ms": {str(tiles): ms for tiles, ms in timings.items()}})
        return chosen

    def _time(self, call: Callable[[], Any]) -> float:
        call()  # compiles, and catches a configuration that does not fit before timing it
        samples = event_samples(call, self.reps, l2_flush_buffer())
        return sorted(samples)[len(samples) // 2]

    def seconds(self) -> float:
        return sum(record["seconds"] for record in self.records)


def install(tuner: Tuner | None = None) -> Tuner:
    """Make ``tuner`` (a fresh :class:`Tuner` by default) choose triton_flash's tiles from now on,
    in this process; returns it."""
    tuner = tuner or Tuner()
    launch.set_tile_chooser(tuner.pick)
    return tuner


def uninstall() -> None:
    """Back to the fixed ``default_tiles``."""
    launch.set_tile_chooser(None)
