"""Where a speed timing request's seconds go, in the worker: the main job's GPU-alone phase.

The speed suite times each case in a request of its own with the GPU to itself (on an H200, 141
requests took 105 s of a 183 s warm main job, results/2026-11-27-session9), and only part of that
is the timed samples (42 s there). This runs the worker's own handler for the speed suite
(``pytest_attnkit.worker.suites.speed.SpeedHandler``: the code a worker runs for such a request,
with the suite's options) on the profile's speed cases, in this process and under cProfile, each
case warmed up first as the main job's warm-up requests do, and says what each request took and
where its time went: making the inputs, the warm-up (first calls), the synchronizing-call check,
the sample count's estimate, the timed samples, NVML's questions, the rest.

Usage (on the GPU machine, after tools/install_offline.sh), one implementation at a time:

    python3 tools/speed_request_profile.py --impl torch_sdpa [--profile default] [--mode forward]
        [--limit N] [--no-warm] [--top 25]

``--no-warm`` times each case in a process that has not run it (a pruned warm-up's case). On the
CPU (``--profile smoke``, the default without CUDA) it checks that the tool runs.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

#: The phases of a timing request, as (name, the functions whose cumulative time is that phase),
#: each function as (its file's name, its name): ``worker/speed.py`` wraps the timer's ``warm_up``
#: in one of its own, and counting both counted the warm-up twice (session 10's first profiles).
#: A function listed under two phases would be counted twice: each appears once.
PHASES = (
    ("inputs", (("inputs.py", "make_inputs"),)),
    ("warm-up (first calls)", (("timer.py", "warm_up"),)),
    ("sync check", (("speed.py", "synchronizes"),)),
    ("sample-count estimate", (("timer.py", "sample_count"),)),
    ("timed samples", (("timer.py", "samples"),)),
    ("NVML (state, processes)", (("speed.py", "gpu_state"), ("speed.py", "gpu_processes"))),
    ("program read", (("speed.py", "kernel_program"),)),
)


def phase_seconds(stats: pstats.Stats, handled: float) -> list[tuple[str, float]]:
    """Each phase's cumulative seconds (the first frame of each named function that is not its
    own caller), and the rest of ``handled``."""
    totals: dict[str, float] = {}
    for (path, _, function), (_, _, _, cumulative, _) in stats.stats.items():  # type: ignore[attr-defined]
        if "pytest_attnkit" not in path:
            continue
        for name, functions in PHASES:
            if (Path(path).name, function) in functions:
                totals[name] = totals.get(name, 0.0) + cumulative
    rows = [(name, totals.get(name, 0.0)) for name, _ in PHASES]
    return rows + [("the rest", max(0.0, handled - sum(seconds for _, seconds in rows)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impl", required=True, help="an implementation's entry-point name")
    parser.add_argument("--profile", default=None, help="the case set (default: default on CUDA, else smoke)")
    parser.add_argument("--mode", choices=("forward", "backward"), default=None, help="only this direction")
    parser.add_argument("--limit", type=int, default=0, help="only the first N cases")
    parser.add_argument("--no-warm", action="store_true", help="no warm call before each timing request")
    parser.add_argument("--top", type=int, default=25, help="functions listed by cumulative time")
    parser.add_argument("--budget-ms", type=float, default=None,
                        help="timing budget per case (default: --attnkit-budget-ms's default)")
    args = parser.parse_args()

    import torch

    from pytest_attnkit import cases, registry
    from pytest_attnkit.controller.options import SETTINGS
    from pytest_attnkit.messages import Op, Request
    from pytest_attnkit.worker.calls import warm_call
    from pytest_attnkit.worker.suite import WorkerContext
    from pytest_attnkit.worker.suites.speed import SpeedHandler

    device = "cuda" if torch.cuda.is_available() else "cpu"
    profile = args.profile or ("default" if device == "cuda" else "smoke")
    refs = registry.select(registry.discover(), [args.impl])
    if not refs:
        print(f"no implementation named {args.impl!r} is registered", file=sys.stderr)
        return 4
    impl = registry.load_implementation(refs[0].name, refs[0].value)
    unavailable = impl.unavailable_reason(device)
    if unavailable:
        print(f"{args.impl} is unavailable here: {unavailable}", file=sys.stderr)
        return 4
    pairs = [(mode, case) for mode, case in cases.speed_cases(profile) if args.mode in (None, mode)]
    pairs = [(mode, case) for mode, case in pairs
             if not impl.not_supported_reasons(case, device, backward=mode == "backward")]
    if args.limit:
        pairs = pairs[:args.limit]
    handler, context = SpeedHandler(), WorkerContext(device, impl)
    budget_ms = args.budget_ms or next(setting.default for setting in SETTINGS if setting.dest == "budget_ms")
    options = {"budget_ms": budget_ms, "call_limit_ms": cases.CALL_LIMIT_MS.get(profile)}
    print(f"{args.impl} on {device} ({torch.cuda.get_device_name() if device == 'cuda' else 'CPU'}), "
          f"profile {profile}: {len(pairs)} timing requests, {'no warm-up' if args.no_warm else 'each warmed up first'}")
    profiler, handled, rows = cProfile.Profile(), 0.0, []
    for mode, case in pairs:
        if not args.no_warm:
            warm_call(impl, case, device=device, seed=0, backward=mode == "backward")
        request = Request(Op.RUN, case, mode == "backward", 0, dict(options), suite="speed")
        started = time.perf_counter()
        profiler.enable()
        reply = handler.handle(context, request)
        profiler.disable()
        took = time.perf_counter() - started
        handled += took
        timing = reply.data.get("timing") or {}
        samples = timing.get("samples_ms") or []
        rows.append((took, mode, case.id, len(samples), sum(samples) / 1e3, reply.data.get("over_limit_ms")))
    print(f"\n{'request s':>9} {'samples':>7} {'sampled s':>9}  mode      case")
    for took, mode, case_id, count, sampled, over in sorted(rows, reverse=True):
        note = f"  over the call limit ({over:.0f} ms)" if over else ""
        print(f"{took:9.3f} {count:7d} {sampled:9.3f}  {mode:8}  {case_id}{note}")
    stats = pstats.Stats(profiler)
    print(f"\nin all {handled:.2f} s in {len(rows)} requests; by phase:")
    for name, seconds in phase_seconds(stats, handled):
        print(f"  {name:26} {seconds:8.2f} s  {100 * seconds / handled if handled else 0:5.1f}%")
    print(f"\nfunctions by cumulative time (top {args.top}):")
    stats.sort_stats("cumulative").print_stats(args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
