"""Probe: the check's do_bench against the harness's timer on the same backward calls (issue 42)."""
import sys

import torch
import triton

from pytest_attnkit.implementations.triton_flash import gluon_backward as gb
from pytest_attnkit.implementations.triton_flash import launch as tf
from pytest_attnkit.worker.timer import time_call

print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
for b, h, n, d in [(4, 16, 4096, 128), (16, 16, 1024, 128), (1, 16, 16384, 128)]:
    for causal in (False, True):
        g = torch.Generator(device="cuda").manual_seed(1)
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
        do = torch.randn_like(q)
        scale = d ** -0.5
        o, lse = tf.flash_fwd(q, k, v, causal, scale)
        flops = 2.5 * 4 * b * h * n * n * d * (0.5 if causal else 1.0)
        row = [f"b{b}-h{h}-q{n} d{d}{' causal' if causal else ''}"]
        for name, fn in (("triton", lambda: tf.flash_bwd(do, q, k, v, o, lse, causal, scale)),
                         ("gluon", lambda: gb.flash_bwd(do, q, k, v, o, lse, causal, scale))):
            for rnd in range(2):
                bench = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
                timer = time_call(fn, "cuda").median_ms
                row.append(f"{name}[{rnd}] do_bench {bench:.3f} ms ({flops / bench / 1e9:.0f}) timer {timer:.3f} ms ({flops / timer / 1e9:.0f})")
        print(" | ".join(row), flush=True)
