# one probe launch, staged, printing each stage: python3 -u diag/one.py fwd|bwd WS(0/1) D N BM BN S
import faulthandler, sys, time, math
faulthandler.dump_traceback_later(20, repeat=True)
sys.path.insert(0, "tools/flash_bench")
import torch
t0 = time.time()
def say(*a): print(f"[{time.time()-t0:6.1f}s]", *a, flush=True)
import ws_probe
from ws_kernel import ws_fwd
from ws_bwd_kernel import ws_bwd_dkdv
from pytest_attnkit.implementations.triton_flash import launch
kind, ws, d, n, bm, bn, st = sys.argv[1], sys.argv[2] == "1", *map(int, sys.argv[3:8])
b, h = 16384 // n, 2048 // d
q, k, v, do = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
scale = d ** -0.5
say("inputs", q.shape, "ws", ws)
if kind == "fwd":
    o = torch.full_like(q, float("nan"))
    dq, dk, dv = (ws_probe.descriptor(x, [1, 1, blk, d]) for x, blk in ((q, bm), (k, bn), (v, bn)))
    args = (dq, dk, dv, o, o, o, o, o.stride(0), o.stride(1), o.stride(2), h, h, 1, n, n, scale * ws_probe.LOG2E)
    kw = dict(HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=False, MASKED=False, FP8=False, WS=ws, num_warps=4, num_stages=st)
    kern = ws_fwd.warmup(*args, **kw, grid=(n // bm, b * h))
    say("compiled", "smem", kern.metadata.shared, "warps", kern.metadata.num_warps)
    ws_fwd[(n // bm, b * h)](*args, **kw); say("launched")
    torch.cuda.synchronize(); say("synced")
    ref = launch.flash_fwd(q, k, v, False, scale, variants=launch.Variants(causal=False))[0]
    say("diff", float((o.float() - ref.float()).abs().max()), "nan", int(o.isnan().sum()))
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    ev[0].record()
    for _ in range(10): ws_fwd[(n // bm, b * h)](*args, **kw)
    ev[1].record(); torch.cuda.synchronize()
    ms = ev[0].elapsed_time(ev[1]) / 10
    say(f"ms {ms:.3f} TF/s {4*b*h*n*n*d/ms/1e9:.0f}")
else:
    o, lse = launch.flash_fwd(q, k, v, False, scale, variants=launch.Variants(causal=False))
    delta = (o.float() * do.float()).sum(-1).contiguous()
    dk, dv = torch.full_like(k, float("nan")), torch.full_like(v, float("nan"))
    say("lse", lse.shape, lse.dtype, lse.stride())
    D = ws_probe.descriptor
    kw = dict(HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=False, ALIBI=False, WS=ws, num_warps=4, num_stages=st)
    args = (D(q, [1, 1, bm, d]), D(k, [1, 1, bn, d]), D(v, [1, 1, bn, d]), D(do, [1, 1, bm, d]), D(lse, [1, 1, bm]),
            D(delta, [1, 1, bm]), dk, dv, dk, dk.stride(0), dk.stride(1), dk.stride(2), h, n, scale, scale * ws_probe.LOG2E)
    kern = ws_bwd_dkdv.warmup(*args, **kw, grid=(n // bn, b * h))
    say("compiled", "smem", kern.metadata.shared, "warps", kern.metadata.num_warps)
    ws_bwd_dkdv[(n // bn, b * h)](*args, **kw); say("launched")
    torch.cuda.synchronize(); say("synced", "nan", int(dk.isnan().sum()))
