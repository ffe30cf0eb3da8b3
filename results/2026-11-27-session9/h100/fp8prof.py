"""Per-kernel CUDA time of one triton_flash forward call, FP8 (Gluon or Triton path) and bf16 (lab)."""
import os, sys
import torch
from torch.profiler import profile, ProfilerActivity
from pytest_attnkit.implementations.triton_flash import flash_attention

def run(label, dtype, n, d, env):
    os.environ["ATTNKIT_TRITON_FLASH_GLUON_FP8"] = env
    b, h = 16384 // n, 2048 // d
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(b, h, n, d, device="cuda", generator=g).to(dtype) for _ in range(3))
    for _ in range(5):
        flash_attention(q, k, v)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(50):
        flash_attention(q, k, v)
    end.record(); torch.cuda.synchronize()
    per_call = start.elapsed_time(end) / 50
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            flash_attention(q, k, v)
        torch.cuda.synchronize()
    flops = 4 * b * h * n * n * d
    print(f"== {label} n={n} d={d}: back-to-back {per_call*1e3:.1f} us/call, {flops/per_call/1e9:.0f} TFLOP/s")
    rows = sorted(((e.key, e.device_time_total / 20, e.count // 20) for e in prof.key_averages() if e.device_time_total > 0),
                  key=lambda r: -r[1])
    for key, us, count in rows[:6]:
        print(f"   {us:9.1f} us x{count}  {key[:90]}")

for n, d in ((4096, 128), (16384, 128), (4096, 64)):
    run("fp8 gluon", torch.float8_e4m3fn, n, d, "1")
    run("fp8 triton", torch.float8_e4m3fn, n, d, "0")
    run("bf16", torch.bfloat16, n, d, "0")
