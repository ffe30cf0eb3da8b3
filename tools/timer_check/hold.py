"""What the timer's stream hold and the input rotation change, measured in fresh processes on the GPU.

For the speed suite's short cases (decode, the short-KV case, and the 1k and 4k forward and
backward), each child process times every implementation three times with the suite's own
measurement (`pytest_attnkit.worker.speed.measure_speed`): without the hold on one set of inputs (the
timer before both changes), with the hold on one set, and with the hold rotating over the input
copies the suite uses now. It also replays the forward call in a CUDA graph where it can be
captured (GPU work only, no host in it: `tools/flash_bench/overhead.py`). The report gives, per
case and implementation, the median over processes and their spread: the gate's false alarms
came from medians that moved between processes. Every timing uses its own fresh inputs, so
'plain' and 'held' also show how much one placement of the inputs in memory moves a call.

Usage (on the GPU machine): python3 tools/timer_check/hold.py --out DIR [--processes 4]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

IMPLS = ("triton_flash", "torch_sdpa", "cupy_naive")


def selected_cases() -> list[tuple[str, Any]]:
    from pytest_attnkit.cases import speed_cases

    chosen = []
    for mode, case in speed_cases("default"):
        short_dense = case.seqlen_q == 1024 or (case.seqlen_q == 4096 and case.head_dim == 128)
        if case.seqlen_q == 1 or (short_dense and not case.causal):
            chosen.append((mode, case))
    return chosen


def child() -> int:
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "flash_bench"))
    from overhead import graph_ms

    from pytest_attnkit.worker.inputs import make_inputs
    from pytest_attnkit.registry import discover, load_implementation
    from pytest_attnkit.worker.speed import measure_speed

    refs = {ref.name: ref for ref in discover()}
    for name in IMPLS:
        impl = load_implementation(name, refs[name].value)
        for mode, case in selected_cases():
            if name == "cupy_naive" and case.seqlen_q > 1:
                continue  # 0.1-0.6 s a call: no launch to hide
            row: dict[str, Any] = {"impl": name, "mode": mode, "case": case.id}
            for label, hold, sets in (("plain", False, 1), ("held", True, 1), ("rotated", True, None)):
                measured = measure_speed(impl, case, mode, device="cuda", seed=0, budget_ms=400, hold_stream=hold,
                                         input_sets=sets)
                row[label] = measured["timing"]["median_ms"]
                row["launch_ms"] = measured["timing"]["launch_ms"]
                row["input_sets"] = measured["input_sets"]
            if mode == "forward" and name != "cupy_naive":
                inputs = make_inputs(case, "cuda", 0)

                def call() -> Any:
                    with torch.no_grad():
                        return impl(inputs.q, inputs.k, inputs.v, causal=case.causal, scale=None)
                try:
                    row["graph"] = graph_ms(call)
                except Exception as error:  # not every implementation can be captured
                    row["graph_error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:120]}"
            print(json.dumps(row), flush=True)
    return 0


def spread(values: list[float]) -> str:
    center = statistics.median(values)
    return f"{center:.4f} ({100 * (max(values) - min(values)) / center:.0f}%)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child()
    if args.out is None:
        parser.error("--out is required")
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    for index in range(args.processes):
        started = time.time()
        done = subprocess.run([sys.executable, __file__, "--child"], capture_output=True, text=True)
        if done.returncode != 0:
            print(done.stdout, done.stderr, sep="\n", file=sys.stderr)
            return done.returncode
        for line in done.stdout.splitlines():
            if line.startswith("{"):
                rows.append({"process": index, **json.loads(line)})
        print(f"process {index}: {time.time() - started:.0f} s", flush=True)
    (args.out / "hold.json").write_text(json.dumps(rows, indent=1))
    import torch

    lines = [f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {args.processes} processes; "
             "each cell: the median over processes of the per-process median ms (and max-min across processes)", "",
             "| impl | mode | case | launch ms | plain events | held events | held, rotated | input sets | CUDA graph |",
             "|---|---|---|---|---|---|---|---|---|"]
    keys = sorted({(row["impl"], row["mode"], row["case"]) for row in rows})
    for key in keys:
        mine = [row for row in rows if (row["impl"], row["mode"], row["case"]) == key]
        graphs = [row["graph"] for row in mine if "graph" in row]
        lines.append(f"| {' | '.join(key)} | {statistics.median(row['launch_ms'] for row in mine):.4f} | "
                     f"{spread([row['plain'] for row in mine])} | {spread([row['held'] for row in mine])} | "
                     f"{spread([row['rotated'] for row in mine])} | {mine[0]['input_sets']} | "
                     f"{spread(graphs) if graphs else mine[0].get('graph_error', '-')} |")
    (args.out / "hold.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
