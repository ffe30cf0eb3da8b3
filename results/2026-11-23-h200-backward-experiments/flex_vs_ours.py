"""Diagnostic: FlexAttention's backward against triton_flash's, same shape, one process.
Prints each kernel's time (profiler) and its registers/spills, and saves flex's generated source.
Run from a checkout's root on the GPU machine, the project installed: python3 flex_vs_ours.py OUTDIR"""
import glob, os, sys, json, statistics, subprocess
import torch
sys.path.insert(0, os.getcwd())
from torch.nn.attention.flex_attention import flex_attention
import implementations.triton_flash.autograd as tfa
import implementations.triton_flash.kernels as tfk

out = sys.argv[1]
B, H, N, D = 1, 16, 16384, 128
gen = torch.Generator(device="cuda").manual_seed(0)
q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_() for _ in range(3))
do = torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=gen)
slopes = torch.rand(H, device="cuda", generator=gen) * 0.3
def alibi(score, b, h, i, j):
    return score + slopes[h] * (j - i)
flex = torch.compile(flex_attention, dynamic=False)
flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
def timed(fn, reps=15):
    ts = []
    for _ in range(reps):
        flush.zero_()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); fn(); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e))
    return statistics.median(ts)
def profile(fn):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
    return {e.key[:60]: round(e.device_time_total / 3000, 4) for e in prof.key_averages() if e.device_time_total > 0}
report = {}
for name, fwd in [("flex-dense", lambda: flex(q, k, v)), ("flex-alibi", lambda: flex(q, k, v, score_mod=alibi)),
                  ("ours-dense", lambda: tfa.flash_attention(q, k, v)),
                  ("ours-alibi", lambda: tfa.flash_attention(q, k, v, alibi_slopes=slopes))]:
    o = fwd()
    bwd = lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
    bwd(); torch.cuda.synchronize()
    report[name] = {"bwd_ms": round(timed(bwd), 4), "kernels": profile(bwd)}
    print(name, json.dumps(report[name]), flush=True)
for fn in (tfk.attn_bwd_dkdv, tfk.attn_bwd_dq, tfk.attn_fwd):
    for cache in fn.device_caches.values():
        for kern in cache[0].values():
            print("ours", fn.fn.__name__, "regs", kern.n_regs, "spills", kern.n_spills, "warps", kern.metadata.num_warps,
                  "stages", kern.metadata.num_stages, "smem", kern.metadata.shared, flush=True)
for src in glob.glob("/tmp/torchinductor_*/**/*.py", recursive=True):
    text = open(src).read()
    if "flex_attention_backward" in text and "def triton" in text:
        open(os.path.join(out, "flex_src_" + os.path.basename(src)), "w").write(text)
import triton
cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
for cubin in glob.glob("/tmp/torchinductor_*/**/*.cubin", recursive=True):
    r = subprocess.run([cuobjdump, "-res-usage", cubin], capture_output=True, text=True)
    print("inductor cubin", os.path.basename(cubin), " ".join(l.strip() for l in r.stdout.splitlines() if "REG" in l)[:300], flush=True)
json.dump(report, open(os.path.join(out, "flex_vs_ours.json"), "w"), indent=1)
# (The run also timed decode b4 hq32 hkv8 k4096 eagerly, by graph replay and by host time per call,
#  with a few lines after this point: see flex_vs_ours.log; tools/flash_bench/overhead.py does it fully.)
