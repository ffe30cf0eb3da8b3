"""Lab (issue 42 / NOTES v29): the Triton backward's dK/dV kernel at d64 without causal, its default
32x64 w4 s3 (compiled with serialized wgmma under triton 3.6) against 32x64 w4 s2 and 64x64 w4 s2
(not serialized), on the speed suite's d64 shapes; the harness's timer; gradients compared."""
import torch
from pytest_attnkit.implementations.triton_flash import launch
from pytest_attnkit.implementations.triton_flash.launch import Tiles
from pytest_attnkit.worker.timer import time_call

for b, h, n in ((4, 32, 4096), (1, 32, 16384)):
    d = 64
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    o, lse = launch.flash_fwd(q, k, v, False, d ** -0.5)
    do = torch.randn_like(q)
    flops = 2.5 * 4 * b * h * n * n * d
    ref = None
    for dkdv in (Tiles(32, 64, 4, 3), Tiles(32, 64, 4, 2), Tiles(64, 64, 4, 2)):
        tiles = {"dkdv": dkdv, "dq": launch.default_tiles("dq", 64, torch.bfloat16, False, n)}
        call = lambda: launch.flash_bwd(do, q, k, v, o, lse, False, d ** -0.5, tiles=tiles, gluon=False)
        grads = call()
        if ref is None:
            ref = grads
        same = all(torch.equal(a, r) for a, r in zip(grads[1:3], ref[1:3]))  # dK, dV (dQ's kernel is the same)
        t = time_call(call, "cuda")
        print(f"b{b}-h{h}-q{n} d64 bwd, dK/dV {dkdv}: median {t.median_ms:.4f} ms, {flops / t.median_ms / 1e9:.0f} TFLOP/s"
              f" (IQR {t.iqr_ms:.4f}); dK, dV the same bits as the default's: {same}", flush=True)
