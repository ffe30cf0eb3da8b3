"""The speed suite's ALiBi backward, sample by sample, with each sample's kernels and the GPU clock.

For each implementation named (in order; a name may repeat, to see a second pass), it times the
default profile's ALiBi backward case as the suite does (``worker.speed._timed_call``,
``timer.warm_up``, ``samples``: the forward untimed before each sample, then the stream hold, the
L2 flush and the timed backward) and prints the 31 samples in order; then 12 more under the
profiler, with every kernel's time per sample, the hold's spin kernel (``torch.cuda._sleep``)
among them. The spin runs a fixed number of cycles, so its time tracks the SM clock; nvidia-smi's
clock, power and throttle reasons follow each pass.

On an H200 (results/2026-11-23-h200-clock): the spin slowed 6% and 11% within one case under the
power cap (680 W, throttle reason 0x4), and dK/dV and dQ slowed with it; that is why the timer
now reads each sample's clock (``Timing.clocks_mhz``).

Usage (on the GPU machine, after tools/install_offline.sh):
    python3 -u tools/timer_check/clock_spread.py triton_flash,torch_flex,triton_flash
"""

from __future__ import annotations

import statistics
import subprocess
import sys

import torch

from pytest_attnkit.cases import speed_cases
from pytest_attnkit.registry import discover, load_implementation
from pytest_attnkit.worker import speed, timer

SMI = ["nvidia-smi", "--query-gpu=clocks.sm,clocks.max.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active",
       "--format=csv,noheader"]


def main(names: list[str]) -> int:
    case = next(c for mode, c in speed_cases("default") if mode == "backward" and c.alibi)
    refs = {ref.name: ref for ref in discover()}
    for name in names:
        impl = load_implementation(name, refs[name].value)
        call, prepare, sets = speed._timed_call(impl, case, "backward", device="cuda", seed=0, input_sets=None)
        warmed = timer.warm_up(call, "cuda", prepare=prepare)
        print(name, "input sets", sets, "launch_ms %.3f hold %.3f wait %.3f"
              % (warmed.launch_ms, warmed.hold, warmed.wait_ms), flush=True)
        samples = warmed.samples(31)
        print("  samples in order:", " ".join("%.2f" % x for x in samples))
        print("  median %.3f min %.3f" % (statistics.median(samples), min(samples)))
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            profiled = warmed.samples(12)
        kernels: dict[str, list[float]] = {}
        for event in prof.events():
            if event.device_type == torch.autograd.DeviceType.CUDA:
                kernels.setdefault(event.name[:40], []).append(event.device_time_total / 1e3)
        for kernel, times in kernels.items():
            if max(times) > 0.2:
                print("  kernel %-40s n=%d ms: %s" % (kernel, len(times), " ".join("%.2f" % x for x in times)))
        print("  samples under profiler:", " ".join("%.2f" % x for x in profiled), flush=True)
        try:
            print("  ", subprocess.run(SMI, capture_output=True, text=True).stdout.strip(), flush=True)
        except OSError as error:
            print("  nvidia-smi:", error, flush=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python3 -u tools/timer_check/clock_spread.py IMPL[,IMPL...]")
    sys.exit(main(sys.argv[1].split(",")))
