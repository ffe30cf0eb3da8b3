#!/usr/bin/env python3
"""What the GPU machine tells a worker about the processes on its GPU, and what an idle worker holds.

Two harness features depend on it, and neither has been seen working on the device machines:
- making room for an out-of-memory alone (controller/pool.py ``WorkerPool.evict``) stops the
  idle workers that hold the most, by NVML's per-process figures; without them it stops every
  worker (a fresh H100 stopped 19 of them twice in one run, 2026-11-25, and every primary then
  started again: results/2026-11-25-h100-session3);
- a speed run shares its GPU with another process: it says so and is not saved (worker/speed.py
  ``other_processes``), also through NVML, and only where NVML's process ids are this
  container's.

Usage, on the GPU machine from the repository root (about 30 s):
``python3 tools/gpu_processes_probe.py [--idle-workers 3]``. Prints, as JSON lines:
1. whether ``pynvml`` imports, and NVML's compute processes as this process sees them (do the
   ids match ``os.getpid()`` of the processes that use the GPU?);
2. ``nvidia-smi --query-compute-apps`` (another source of the same list, with the same question);
3. the device memory ``--idle-workers`` child processes hold, each after a step a worker takes:
   CUDA initialised; a bf16 matmul (cuBLAS workspace); a Triton kernel; torch.compile of a small
   function; the caching allocator emptied. Read by ``torch.cuda.mem_get_info`` in the parent
   (device-wide) and NVML per process where it works: what an idle worker costs the GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

CHILD = r"""
import json, os, sys, time
import torch
step = sys.argv[1]
torch.cuda.init(); torch.zeros(1, device="cuda")
if step in ("matmul", "triton", "compile", "emptied"):
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16); (a @ a).sum().item(); del a
if step in ("triton", "compile", "emptied"):
    import triton, triton.language as tl
    @triton.jit
    def _copy(x, y, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y + offs, tl.load(x + offs, mask=offs < n), mask=offs < n)
    x = torch.randn(1 << 20, device="cuda"); y = torch.empty_like(x)
    _copy[(1 << 10,)](x, y, x.numel(), BLOCK=1024); torch.cuda.synchronize(); del x, y
if step in ("compile", "emptied"):
    f = torch.compile(lambda t: torch.softmax(t * 2, -1))
    f(torch.randn(256, 256, device="cuda")).sum().item()
if step == "emptied":
    import gc; gc.collect(); torch.cuda.empty_cache()
print(json.dumps({"pid": os.getpid(), "step": step, "reserved": torch.cuda.memory_reserved()}), flush=True)
time.sleep(float(sys.argv[2]))
"""

STEPS = ("init", "matmul", "triton", "compile", "emptied")


def nvml_processes() -> dict:
    try:
        import pynvml
    except ImportError as error:
        return {"pynvml": f"not importable: {error}"}
    try:
        import torch

        pynvml.nvmlInit()
        uuid = str(torch.cuda.get_device_properties(0).uuid)
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
        listed = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        return {"pynvml": "ok", "processes": {int(p.pid): int(p.usedGpuMemory or 0) for p in listed}}
    except Exception as error:  # noqa: BLE001 - the probe reports whatever fails
        return {"pynvml": f"failed: {type(error).__name__}: {error}"}


def smi_processes() -> dict:
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=gpu_uuid,pid,used_memory",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=30)
        return {"nvidia-smi": out.stdout.strip().splitlines(), "rc": out.returncode, "stderr": out.stderr.strip()}
    except Exception as error:  # noqa: BLE001
        return {"nvidia-smi": f"failed: {error}"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--idle-workers", type=int, default=3)
    args = parser.parse_args()
    import torch

    torch.zeros(1, device="cuda")
    free0, total = torch.cuda.mem_get_info()
    print(json.dumps({"me": os.getpid(), "free_bytes": free0, "total_bytes": total, **nvml_processes()}))
    print(json.dumps(smi_processes()))
    # Triton's @jit reads its function's source: the child must be a file, not ``-c`` (2026-11-26).
    import tempfile

    script = os.path.join(tempfile.mkdtemp(prefix="probe-"), "child.py")
    with open(script, "w") as handle:
        handle.write(CHILD)
    for step in STEPS:
        children = [subprocess.Popen([sys.executable, script, step, "20"], stdout=subprocess.PIPE, text=True)
                    for _ in range(args.idle_workers)]
        said = [json.loads(child.stdout.readline()) for child in children]
        time.sleep(1.0)
        free, _ = torch.cuda.mem_get_info()
        print(json.dumps({"step": step, "children": [s["pid"] for s in said],
                          "torch_reserved_each": [s["reserved"] for s in said],
                          "device_bytes_per_child": (free0 - free) // max(1, args.idle_workers),
                          **nvml_processes(), **smi_processes()}))
        for child in children:
            child.kill()
            child.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
