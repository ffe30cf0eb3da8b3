"""Where a short call's time goes: GPU work against host (launch) overhead.

For decode shapes a call moves a few MB and the GPU finishes in microseconds, so the time the
speed suite reports (CUDA events around one call, L2 flushed before it) also holds any wait for the
host to enqueue the work. This separates the two for triton_flash and SDPA's backends:

- events_ms: the suite's own figure (`pytest_attnkit.worker.timer.time_call`);
- graph_ms: the same call captured once in a CUDA graph and replayed (GPU work only: no Python,
  no launch path), L2 flushed before each replay;
- host_us: host time per call when 300 calls are enqueued back to back (the launch path's cost);
- a cProfile of triton_flash's host path for one shape.

``--paths plain,split`` times triton_flash once per decode path (the plain forward, or the split
decode kernel and its merge), forcing the choice that ``launch._DECODE_SPLIT_MIN_KEYS`` makes, to
see where one overtakes the other; ``--lengths`` and ``--batches`` pick the caches.

Usage (on the GPU machine): python3 tools/flash_bench/overhead.py --out DIR
       [--lengths 1024,4096] [--batches 1,4] [--dtypes bfloat16] [--paths plain,split]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import BACKENDS, attention_fn, make_inputs  # noqa: E402

from pytest_attnkit.contract import Case  # noqa: E402
from pytest_attnkit.counts import byte_count  # noqa: E402
from pytest_attnkit.implementations.triton_flash import launch  # noqa: E402
from pytest_attnkit.worker.timer import event_samples, l2_flush_buffer, time_call  # noqa: E402

IMPLS = ("triton_flash", *(f"sdpa_{name}" for name in BACKENDS if name != "EFFICIENT"))


def graph_ms(call: Callable[[], Any], reps: int = 30) -> float:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    return statistics.median(event_samples(graph.replay, reps, l2_flush_buffer()))


_DEFAULT_SPLIT_MIN_KEYS = launch._DECODE_SPLIT_MIN_KEYS


def decode_path(path: str | None) -> None:
    """Force triton_flash's decode onto the plain forward or the split kernel (None: its own rule)."""
    launch._DECODE_SPLIT_MIN_KEYS = {"plain": 1 << 62, "split": 0, None: _DEFAULT_SPLIT_MIN_KEYS}[path]
    launch._PLANS.clear()


def host_us(call: Callable[[], Any], count: int = 300) -> float:
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(count):
        call()
    elapsed = time.perf_counter() - started
    torch.cuda.synchronize()
    return elapsed / count * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--lengths", default="4096,32768", help="cache lengths, comma-separated")
    parser.add_argument("--batches", default="1,4")
    parser.add_argument("--dtypes", default="bfloat16,float16")
    parser.add_argument("--paths", default="", help="plain,split: time triton_flash on each decode path")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    cases = [Case(batch, 32, 8, 1, n, 128, dtype) for dtype in args.dtypes.split(",")
             for batch in map(int, args.batches.split(",")) for n in map(int, args.lengths.split(","))]
    impls = [*(f"triton_flash:{path}" for path in args.paths.split(",") if path), *IMPLS]
    rows = []
    lines = [f"{torch.cuda.get_device_name()}, torch {torch.__version__}", "",
             "| case | impl | events ms | graph ms | host us/call | events GB/s | graph GB/s |", "|---|---|---|---|---|---|---|"]
    for index, case in enumerate(cases):
        q, k, v, _ = make_inputs(case, index)
        for impl in impls:
            fn = attention_fn(impl.split(":")[0])
            if ":" in impl:
                decode_path(impl.split(":")[1])

            def call() -> Any:
                with torch.no_grad():
                    return fn(q, k, v, causal=False)
            try:
                call()
                events = time_call(call, "cuda", budget_ms=100, min_samples=10, max_samples=60).median_ms
                row = {"case": f"b{case.batch} k{case.seqlen_k} {case.dtype}", "impl": impl, "events_ms": events,
                       "graph_ms": graph_ms(call), "host_us": host_us(call)}
            except Exception as error:
                row = {"case": f"b{case.batch} k{case.seqlen_k} {case.dtype}", "impl": impl,
                       "error": f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"}
            decode_path(None)
            rows.append(row)
            if "error" in row:
                lines.append(f"| {row['case']} | {impl} | {row['error']} |")
                continue
            nbytes = byte_count(case, "forward")
            lines.append(f"| {row['case']} | {impl} | {row['events_ms']:.4f} | {row['graph_ms']:.4f} | {row['host_us']:.1f} | "
                         f"{nbytes / row['events_ms'] / 1e6:.0f} | {nbytes / row['graph_ms'] / 1e6:.0f} |")
            print(lines[-1], flush=True)
    case = cases[0]
    q, k, v, _ = make_inputs(case, 0)
    fn = attention_fn("triton_flash")
    profile = cProfile.Profile()
    with torch.no_grad():
        fn(q, k, v, causal=False)
        profile.enable()
        for _ in range(300):
            fn(q, k, v, causal=False)
        profile.disable()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(18)
    report = "\n".join(lines) + "\n\ncProfile of 300 triton_flash decode calls (b1 k4096 bf16), by own time:\n" + text.getvalue()
    (args.out / "overhead.md").write_text(report)
    (args.out / "overhead.json").write_text(json.dumps(rows, indent=1))
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
