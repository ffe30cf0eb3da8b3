"""The speed suite's ALiBi backward, sample by sample, with each sample's kernels (profiler)."""
import statistics, sys
import torch
from pytest_attnkit.cases import speed_cases
from pytest_attnkit.registry import discover, load_implementation
from pytest_attnkit.worker import speed, timer

case = next(c for m, c in speed_cases("default") if m == "backward" and c.alibi)
refs = {r.name: r for r in discover()}
for name in sys.argv[1].split(","):
    impl = load_implementation(name, refs[name].value)
    call, prepare, sets = speed._timed_call(impl, case, "backward", device="cuda", seed=0, input_sets=None)
    warmed = timer.warm_up(call, "cuda", prepare=prepare)
    print(name, "input sets", sets, "launch_ms %.3f hold %.3f wait %.3f" % (warmed.launch_ms, warmed.hold, warmed.wait_ms), flush=True)
    s = warmed.samples(31)
    print("  samples in order:", " ".join("%.2f" % x for x in s))
    print("  median %.3f min %.3f" % (statistics.median(s), min(s)))
    # the same, with no hold and no forward between samples (versions.py's way): same graph retained
    # per-kernel times over 12 samples, taken as the suite takes them
    rows = []
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        s2 = warmed.samples(12)
    ev = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    kern = {}
    for e in ev:
        kern.setdefault(e.name[:40], []).append(e.device_time_total / 1e3 if hasattr(e, "device_time_total") else e.cuda_time_total / 1e3)
    for k, v in kern.items():
        if max(v) > 0.2:
            print("  kernel %-40s n=%d ms: %s" % (k, len(v), " ".join("%.2f" % x for x in v)))
    print("  samples under profiler:", " ".join("%.2f" % x for x in s2), flush=True)
    # clocks
    try:
        import subprocess
        print("  ", subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.max.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active", "--format=csv,noheader"], capture_output=True, text=True).stdout.strip())
    except Exception as e:
        print(e)
