#!/usr/bin/env python3
"""How far past an allocation compute-sanitizer's memcheck sees a read, run as the sanitize suite
runs it, and what the suite's guarded inputs see instead.

A Triton kernel reads ``over`` bytes just past the end of a float32 tensor of ``size`` bytes (only
the bytes past it, summed and multiplied by zero into a one-element output: the numbers are right).
Each tensor is an allocation of its own (``PYTORCH_NO_CUDA_MEMORY_CACHING=1``, as the suite's worker
under the tool runs). The script runs itself under ``compute-sanitizer --tool memcheck`` with the
suite's options (``pytest_attnkit.controller.sanitize.command``, ``--padding`` included) and again
without ``--padding``, reads which reads the tool reported (by the allocation each error names),
and then, outside the tool, reads past guarded copies (``pytest_attnkit.worker.guards``) and
checks that NaN reaches the output. Each read under the tool runs in a child process of its own
(an error memcheck reports fails the launch and leaves the context unusable), up to ``--parallel``
at once: one child for all of them took over 400 s on an H100 and was cut off (2026-11-25).

Usage (GPU machine, repository root): ``python3 tools/sanitize_reach/reach.py OUT_DIR``. Writes
``OUT_DIR/reach.json`` and ``reach.md``, and the tool's logs; prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

#: Tensor sizes in bytes: odd ones (3616, 4000), one on a 4 KiB boundary, and larger ones.
SIZES = (3616, 4000, 4096, 65552, 1 << 20)
#: Bytes read past the end: from one float to a quarter of a MiB.
OVERS = (4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144)
PAIRS = [(size, over) for size in SIZES for over in OVERS]
#: ``... is 1 bytes after the nearest allocation at 0x7f0656800000 of size 3,616 bytes``: the tool
#: writes sizes with thousands separators (a ``\d+`` here read every report as none: 2026-11-26).
_ALLOCATION = re.compile(r"nearest allocation at (0x[0-9a-f]+) of size ([\d,]+) bytes", re.IGNORECASE)


def child(start: int, guarded: bool, only: bool = False) -> int:
    """Run the reads from pair ``start`` on (``only``: that one); print one JSON line per read."""
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def _read_past(SRC, OUT, N, OVER: tl.constexpr, BLOCK: tl.constexpr):
        offsets = N + tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        values = tl.load(SRC + offsets, mask=offsets < N + OVER)
        tl.atomic_add(OUT, tl.sum(values) * 0.0)

    from pytest_attnkit.worker.guards import guarded_copy

    for index in range(start, start + 1 if only else len(PAIRS)):
        size, over = PAIRS[index]
        elements, extra = size // 4, over // 4
        source = torch.randn(elements, device="cuda")
        if guarded:
            source, _ = guarded_copy("source", source)
        out = torch.zeros(1, device="cuda")
        block = min(1024, triton.next_power_of_2(extra))
        print(json.dumps({"index": index, "size": size, "over": over, "ptr": source.data_ptr()}), flush=True)
        try:
            _read_past[(triton.cdiv(extra, block),)](source, out, elements, OVER=extra, BLOCK=block)
            torch.cuda.synchronize()
            value = out.item()
        except Exception as error:  # the launch failed: the next child goes on after it
            print(json.dumps({"index": index, "failed": f"{type(error).__name__}: {str(error).splitlines()[0]}"}),
                  flush=True)
            return 3
        print(json.dumps({"index": index, "nan": value != value}), flush=True)
        del source, out
    return 0


def _memcheck(out: Path, label: str, padding: bool, parallel: int) -> dict[int, dict]:
    """Every read's outcome under memcheck: {index: {"reported": bool, "launch_failed": bool}}."""
    from concurrent.futures import ThreadPoolExecutor

    from pytest_attnkit.controller.sanitize import PADDING_BYTES, command, find_sanitizer

    sanitizer = find_sanitizer("")
    if sanitizer is None:
        raise SystemExit("compute-sanitizer not found")
    env = {**os.environ, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}

    def one(index: int) -> dict:
        log = out / f"memcheck-{label}-{index:02d}.log"
        launcher = command(sanitizer, "memcheck", log)
        if not padding:
            at = launcher.index("--padding")
            launcher = launcher[:at] + launcher[at + 2:]
        else:
            assert str(PADDING_BYTES) in launcher
        done = subprocess.run([*launcher, sys.executable, __file__, "--child", str(index), "--only"],
                              capture_output=True, text=True, env=env, timeout=300)
        lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        pointers = {line["ptr"] for line in lines if "ptr" in line}
        text = log.read_text(errors="replace") if log.exists() else ""
        if not pointers:
            return {"error": f"the child read nothing (exit {done.returncode}): {done.stderr[-500:]}"}
        return {"reported": any(int(address, 16) in pointers for address, _ in _ALLOCATION.findall(text)),
                "launch_failed": any("failed" in line for line in lines)}

    with ThreadPoolExecutor(max_workers=parallel) as threads:
        return dict(enumerate(threads.map(one, range(len(PAIRS)))))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?")
    parser.add_argument("--child", type=int, default=None)
    parser.add_argument("--guarded", action="store_true")
    parser.add_argument("--only", action="store_true")
    parser.add_argument("--parallel", type=int, default=8, help="children under the tool at once (default: 8)")
    args = parser.parse_args()
    if args.child is not None:
        return child(args.child, args.guarded, args.only)
    out = Path(args.out or tempfile.mkdtemp(prefix="reach-"))
    out.mkdir(parents=True, exist_ok=True)
    padded = _memcheck(out, "padding", True, args.parallel)
    bare = _memcheck(out, "no-padding", False, args.parallel)
    guarded_run = subprocess.run([sys.executable, __file__, "--child", "0", "--guarded"], capture_output=True,
                                 text=True, timeout=600)
    guarded = {line["index"]: line["nan"] for line in map(json.loads, guarded_run.stdout.splitlines())
               if line.get("nan") is not None}
    rows = []
    for index, (size, over) in enumerate(PAIRS):
        rows.append({"size": size, "over": over, "memcheck_padding": padded.get(index, {}).get("reported"),
                     "memcheck": bare.get(index, {}).get("reported"), "guards_nan": guarded.get(index)})
    (out / "reach.json").write_text(json.dumps(rows, indent=1) + "\n")
    mark = {True: "yes", False: "no", None: "?"}
    table = ["| tensor bytes | read past, bytes | memcheck, suite's options | memcheck, no padding | guards (NaN in result) |",
             "|---|---|---|---|---|"]
    table += [f"| {row['size']} | {row['over']} | {mark[row['memcheck_padding']]} | {mark[row['memcheck']]} | "
              f"{mark[row['guards_nan']]} |" for row in rows]
    (out / "reach.md").write_text("\n".join(table) + "\n")
    print("\n".join(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
