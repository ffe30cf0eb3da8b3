"""Time several versions of triton_flash side by side in one process, kernel by kernel.

Each version is a folder holding a copy of ``implementations/triton_flash``'s ``kernels.py``,
``launch.py`` and ``autograd.py`` (e.g. from ``git show REV:implementations/triton_flash/...``);
it is imported as its own package, so each version compiles its own kernels. For each case the
forward and the backward are timed with CUDA events (median of ``--reps`` calls, L2 flushed
before each), and one profiled backward splits the time by kernel. ``--sweep`` adds, for the last
version only, a few tile configurations per case (``launch.Tiles``) to see what the defaults leave.

Usage: python3 tools/flash_bench/versions.py --version old=DIR --version new=DIR [--cases A,B] [--sweep]
       --out FILE   (--sweep runs the SWEEP cases among --cases: every one by default)
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import torch

VARLEN = (8192, 4096, 2048, 1024, 512, 256, 128, 128)
CASES = {  # name: (batch, heads, seqlen, head_dim, head_dim_v, causal, variant keywords)
    "d128-16k": (1, 16, 16384, 128, 128, False, {}),
    "d128-16k-causal": (1, 16, 16384, 128, 128, True, {}),
    "d64-16k": (1, 32, 16384, 64, 64, False, {}),
    "d128-4k": (4, 16, 4096, 128, 128, False, {}),
    "d128-1k": (16, 16, 1024, 128, 128, False, {}),
    "d64-4k": (4, 32, 4096, 64, 64, False, {}),
    "d128-16k-alibi": (1, 16, 16384, 128, 128, False, {"alibi": True}),
    "d128-16k-causal-w4096": (1, 16, 16384, 128, 128, True, {"window_size": (4096, 0)}),
    "d192-dv128-4k-causal": (4, 16, 4096, 192, 128, True, {}),
    # The speed suite's packed sequences: 16k tokens in 8 sequences of 128 to 8k.
    "varlen-16k": (1, 16, 0, 128, 128, False, {"seqlens": VARLEN}),
    "varlen-16k-causal": (1, 16, 0, 128, 128, True, {"seqlens": VARLEN}),
}
SWEEP = {  # case: {kernel: [tiles...]}
    "d128-4k": {"fwd": [(64, 64, 4, 3), (128, 128, 8, 3)], "dkdv": [(64, 128, 8, 3), (64, 64, 4, 2)]},
    "d128-1k": {"fwd": [(64, 64, 4, 3), (128, 128, 8, 3)]},
    "d64-4k": {"fwd": [(64, 64, 4, 3), (64, 128, 4, 3), (128, 128, 8, 3), (64, 64, 4, 4)],
               "dkdv": [(32, 64, 4, 3), (64, 64, 4, 2)]},
    "d128-16k": {"fwd": [(64, 64, 4, 3), (128, 128, 8, 3)],
                 "dkdv": [(64, 128, 8, 3), (32, 128, 8, 3), (64, 64, 4, 2), (32, 64, 4, 2), (64, 128, 4, 2)],
                 "dq": [(128, 64, 8, 3), (128, 64, 8, 4), (128, 32, 8, 3), (64, 64, 4, 4)]},
    "d128-16k-causal": {"dkdv": [(32, 64, 4, 3), (32, 128, 8, 3), (64, 128, 8, 3), (64, 64, 4, 2)]},
    "d64-16k": {"dkdv": [(32, 64, 4, 3), (32, 128, 8, 3), (64, 64, 4, 2), (32, 64, 4, 2)],
                "dq": [(128, 64, 8, 3), (128, 128, 8, 3), (64, 64, 4, 3)]},
    "d128-16k-causal-w4096": {"fwd": [(64, 64, 4, 3), (128, 128, 8, 3)],
                              "dkdv": [(32, 64, 4, 3), (64, 128, 8, 3), (64, 64, 4, 2)]},
    "d128-16k-alibi": {"fwd": [(64, 64, 4, 3), (128, 128, 8, 3)],
                       "dkdv": [(64, 128, 8, 3), (32, 64, 4, 3), (64, 64, 4, 3), (64, 64, 4, 2), (32, 64, 4, 2)],
                       "dq": [(128, 64, 8, 3), (64, 64, 4, 3), (64, 32, 4, 3), (64, 64, 4, 2)]},
    # MLA: the 4-warp tiles v5 swept, then 8 warps (dK's [keys, 256-padded] float32 accumulator
    # over twice the threads: the 4-warp dK/dV kernel ran at 255 registers, session 18's ncu).
    "d192-dv128-4k-causal": {"dkdv": [(32, 64, 4, 2), (32, 32, 4, 2), (32, 64, 8, 2), (64, 64, 8, 2), (32, 32, 8, 2),
                                      (64, 32, 8, 2)],
                             "dq": [(64, 32, 4, 2), (64, 32, 8, 2), (128, 32, 8, 2), (64, 64, 8, 2)]},
}


def load(name: str, folder: Path, scratch: Path):
    package = scratch / f"tf_{name}"
    package.mkdir()
    # Every module of the version: launch.py imports the Gluon kernels' modules (gluon_forward.py
    # and the rest) where it has them; an older version's folder may hold only the first three.
    for file in ("kernels.py", "launch.py", "autograd.py",
                 *(path.name for path in folder.glob("gluon_*.py"))):
        shutil.copy(folder / file, package / file)
    (package / "__init__.py").write_text("")
    sys.path.insert(0, str(scratch))
    return importlib.import_module(f"tf_{name}.autograd"), importlib.import_module(f"tf_{name}.launch")


_FLUSH: list[torch.Tensor] = []  # one 256 MiB buffer for every timing, allocated on first use


def timed(fn, reps: int) -> float:
    if not _FLUSH:
        _FLUSH.append(torch.empty(256 << 20, dtype=torch.int8, device="cuda"))
    flush = _FLUSH[0]
    times = []
    for _ in range(reps):
        flush.zero_()
        # About 0.5 ms of GPU spin before the start event, so the host's launch path (80-115 us
        # for the forward) is queued ahead and the events time the GPU alone: without it a 1 ms
        # forward read up to 10% apart from one run to the next (NOTES v7).
        torch.cuda._sleep(1_000_000)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def kernel_times(fn, calls: int = 3, match: str = "attn") -> dict[str, float]:
    """GPU time per call of ``fn`` in ms of each kernel whose name holds ``match`` (the attention
    kernels by default), from the profiler over ``calls`` calls."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return {event.key: round(event.device_time_total / calls / 1000, 4) for event in prof.key_averages()
            if event.device_time_total > 0 and match in event.key}


def inputs(case: tuple, seed: int = 0):
    """(q, k, v, call): ``call(autograd, q, k, v)`` runs the case's attention on those tensors."""
    batch, heads, n, d, dv, causal, variants = case
    gen = torch.Generator(device="cuda").manual_seed(seed)
    keywords = dict(variants)
    seqlens = keywords.pop("seqlens", None)
    shape = (sum(seqlens), heads) if seqlens else (batch, heads, n)  # packed: [total, H, D]
    q, k = (torch.randn(*shape, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
    v = torch.randn(*shape, dv, device="cuda", dtype=torch.bfloat16, generator=gen)
    if keywords.pop("alibi", False):
        keywords["alibi_slopes"] = torch.rand(heads, device="cuda", generator=gen) * 0.3
    if seqlens:
        cu = torch.tensor([0, *itertools.accumulate(seqlens)], device="cuda", dtype=torch.int32)

        def call(autograd, q, k, v):
            return autograd.flash_attention_varlen(q, k, v, cu, cu, max(seqlens), max(seqlens), causal=causal,
                                                   **keywords)
    else:
        def call(autograd, q, k, v):
            return autograd.flash_attention(q, k, v, causal=causal, **keywords)
    return q, k, v, call


def measure(autograd, case: tuple, reps: int) -> dict:
    q, k, v, call = inputs(case)
    try:
        with torch.no_grad():
            call(autograd, q, k, v)
    except (TypeError, ValueError, AttributeError) as error:  # a version without this variant or layout
        return {"skipped": f"{type(error).__name__}: {error}"}
    with torch.no_grad():
        fwd = timed(lambda: call(autograd, q, k, v), reps)
        fwd_kernels = kernel_times(lambda: call(autograd, q, k, v))
    q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
    o = call(autograd, q, k, v)
    do = torch.randn(o.shape, device="cuda", dtype=o.dtype, generator=torch.Generator(device="cuda").manual_seed(1))
    bwd = timed(lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True), reps)
    kernels = kernel_times(lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True))
    grads = torch.autograd.grad(o, (q, k, v), do)
    return {"fwd_ms": round(fwd, 4), "fwd_kernels_ms": fwd_kernels, "bwd_ms": round(bwd, 4), "bwd_kernels_ms": kernels,
            "grads": [g.float().cpu() for g in (o.detach(), *grads)]}


def compare(first: list, other: list) -> list[float]:
    """Largest |difference| of (o, dq, dk, dv) between two versions, each over the largest |value|."""
    return [round(((a - b).abs().max() / a.abs().max().clamp_min(1e-30)).item(), 6)
            for a, b in zip(first, other)]


def sweep(autograd, launch, case: tuple, choices: dict, reps: int) -> dict:
    q, k, v, call = inputs(case)
    results = {}
    original = launch.default_tiles
    for kernel, options in choices.items():
        for option in options:
            tiles = launch.Tiles(*option)

            def chooser(name, *args, _kernel=kernel, _tiles=tiles):
                return _tiles if name == _kernel else original(name, *args)

            launch.default_tiles = chooser
            launch._PLANS.clear()
            try:
                if kernel == "fwd":
                    with torch.no_grad():
                        ms = timed(lambda: call(autograd, q, k, v), reps)
                else:
                    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
                    o = call(autograd, qg, kg, vg)
                    do = torch.randn_like(o)
                    ms = timed(lambda: torch.autograd.grad(o, (qg, kg, vg), do, retain_graph=True), reps)
                results[f"{kernel} {tiles}"] = round(ms, 4)
            except Exception as error:  # a tile that does not fit: say so and go on
                results[f"{kernel} {tiles}"] = f"{type(error).__name__}: {str(error)[:120]}"
            finally:
                launch.default_tiles = original
                launch._PLANS.clear()
            print(f"  sweep {kernel} {tiles}: {results[f'{kernel} {tiles}']}", flush=True)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="append", required=True, help="NAME=DIR")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--sweep-kernels", default="fwd,dkdv,dq", help="which kernels' SWEEP rows to run")
    parser.add_argument("--cases", default=",".join(CASES), help="which CASES to run (comma-separated)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp())
    versions = [(spec.split("=", 1)[0], Path(spec.split("=", 1)[1])) for spec in args.version]
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "results": {}}
    loaded = {name: load(name, folder, scratch) for name, folder in versions}
    wanted = [name for name in args.cases.split(",") if name]
    cases = set(wanted)
    unknown = set(wanted) - set(CASES)
    if unknown:
        parser.error(f"unknown cases {sorted(unknown)} (known: {', '.join(CASES)})")
    for case_name, case in CASES.items():
        if case_name not in wanted:
            continue
        first = None  # the first version's output and gradients, the others are compared with
        for name, (autograd, _) in loaded.items():
            result = measure(autograd, case, args.reps)
            grads = result.pop("grads", None)
            if grads is not None:
                first = first or grads
                result["diff_vs_first"] = compare(first, grads)
            report["results"].setdefault(case_name, {})[name] = result
            print(f"{case_name:24s} {name:6s} {json.dumps(result)}", flush=True)
    if args.sweep:
        name, (autograd, launch) = list(loaded.items())[-1]
        for case_name, choices in SWEEP.items():
            if case_name not in cases:
                continue
            wanted = {kernel: tiles for kernel, tiles in choices.items() if kernel in args.sweep_kernels.split(",")}
            if wanted:
                print(f"sweep {case_name} ({name})", flush=True)
                report.setdefault("sweep", {})[case_name] = sweep(autograd, launch, CASES[case_name], wanted, args.reps)
    Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
