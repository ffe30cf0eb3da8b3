"""Where a short call's time goes: GPU work against host (launch) overhead.

For decode shapes a call moves a few MB and the GPU finishes in microseconds, so the time the
speed suite reports (CUDA events around one call, L2 flushed before it) also holds any wait for the
host to enqueue the work. This separates the two for triton_flash and SDPA's backends:

- events_ms: the suite's own figure (`pytest_attnkit.worker.timer.time_call`);
- graph_ms: the same call captured once in a CUDA graph and replayed (GPU work only: no Python,
  no launch path), L2 flushed before each replay;
- host_us: host time per call when 300 calls are enqueued back to back (the launch path's cost);
- a cProfile of triton_flash's host path for one shape.

Usage (on the GPU machine): python3 tools/flash_bench/overhead.py --out DIR
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
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    cases = [Case(batch, 32, 8, 1, n, 128, dtype) for dtype in ("bfloat16", "float16")
             for batch in (1, 4) for n in (4096, 32768)]
    rows = []
    lines = [f"{torch.cuda.get_device_name()}, torch {torch.__version__}", "",
             "| case | impl | events ms | graph ms | host us/call | events GB/s | graph GB/s |", "|---|---|---|---|---|---|---|"]
    for index, case in enumerate(cases):
        q, k, v, _ = make_inputs(case, index)
        for impl in IMPLS:
            fn = attention_fn(impl)

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
