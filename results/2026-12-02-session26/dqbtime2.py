"""The Gluon backward kernel alone (CUDA events, back to back) for a few configurations, with the
SM clock and power read after each loop: where ncu (locked base clock) and the timed check
disagree (NOTES v36). usage: python3 _lab/dqbtime2.py [CONFIG ...]"""
import sys

import torch

from pytest_attnkit.implementations.triton_flash import gluon_backward as gb, launch as L

DIM = int(sys.argv.pop(1)[2:]) if len(sys.argv) > 1 and sys.argv[1].startswith("-d") else 128
CONFIGS = sys.argv[1:] or ["m64s2-tmar-sw-ld-lt-rl-dqp", "m64s2-tmar-dqb-ld-lt-rl-dqp",
                           "m64s2-tmar-sw-dqb-ld-lt-rl-dqp", "m64s2-rot-tmar-dqb-ld-lt-rl-dqp"]


def state():
    try:
        return f"{torch.cuda.clock_rate()} MHz, {torch.cuda.power_draw() / 1000:.0f} W"
    except Exception as error:  # no pynvml
        return f"(no NVML: {type(error).__name__})"


def timed(f, n=50):
    for _ in range(5):
        f()
    start, end = torch.cuda.Event(True), torch.cuda.Event(True)
    start.record()
    for _ in range(n):
        f()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / n


CASES = [(4, 16, 4096, False), (4, 16, 4096, True), (1, 16, 16384, False), (8, 16, 1024, False)] if DIM == 128 else \
    [(4, 32, 4096, False), (4, 32, 4096, True), (1, 32, 16384, True), (8, 32, 1024, True)]
for batch, heads, n, causal in CASES:
    q, k, v = [torch.randn(batch, heads, n, DIM, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    o, lse = L.flash_fwd(q, k, v, causal, 0.088)
    do = torch.randn_like(o)
    for _round in range(2):
        for text in CONFIGS:
            config = gb.Config.parse(text)
            dq_acc = gb.dq_workspace(q, config)
            dk, dv = torch.empty_like(k), torch.empty_like(v)
            delta = torch.zeros(batch, heads, n, device="cuda")
            args, kwargs, grid = gb.launch_arguments(do, q, k, v, lse.contiguous(), delta, dq_acc, dk, dv, causal,
                                                     0.088, config)
            ms = timed(lambda: gb._attn_bwd_sm90[grid](*args, **kwargs))
            print(f"d{DIM} b{batch}-h{heads}-q{n} causal={int(causal)} round {_round} {text}: {ms:.3f} ms; after: {state()}",
                  flush=True)
