"""Causal forwards: GPU time (CUDA graph replay) vs do_bench (host included) vs host time per
call, cuDNN beside the Gluon forward's default, -p and -p-g (session 6; session 5's
graph_vs_host.py with the grouped persistent grid). Run from the repository root on the GPU:
python3 results/2026-11-26-session6/gluon-fwd-grouped/graph_vs_host.py [d64]
(``d64``: the 1k d64 cases, causal and not, over more configurations)."""
import statistics as st
import sys
import time

import torch
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention as sdpa

sys.path.insert(0, '.')
from implementations.triton_flash import gluon_forward as gf  # noqa: E402


def graph_ms(fn, reps=50):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    times = []
    for _ in range(7):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / reps)
    return st.median(times)


def host_ms(fn, n=200):
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    h = (time.perf_counter() - t) / n * 1e3
    torch.cuda.synchronize()
    return h


CASES = [(8, 16, 1024, 128), (16, 16, 1024, 128), (8, 32, 1024, 64), (4, 16, 2048, 128), (4, 16, 4096, 128),
         (4, 32, 4096, 64)]
# ``d64``: the 1k d64 cases, causal and not, over more configurations (d64_1k.txt).
D64 = len(sys.argv) > 1 and sys.argv[1] == 'd64'
D64_CONFIGS = ('n128s3-eager-p', 'n128s3-eager-p-g', 'n128s3-eager-c3-p', 'n128s3-eager-c3-p-g', 'n64s3-eager-p-g',
               'n128s2-eager-p-g', 'n64s4-eager')
for (b, h, n, d), causal in ([((8, 32, 1024, 64), c) for c in (True, False)] + [((16, 32, 1024, 64), c) for c in (True, False)]
                             if D64 else [(case, True) for case in CASES]):
    for dtype in ((torch.bfloat16, ) if D64 else (torch.bfloat16, torch.float16)):
        q, k, v = (torch.randn(b, h, n, d, device='cuda', dtype=dtype) for _ in range(3))
        scale = d ** -0.5
        flops = 4 * b * h * d * (n * (n + 1) // 2 if causal else n * n)
        stages = 's2' if d == 128 else 's3'
        cands = {'cudnn': None, 'default': gf.default_config(d, causal, n),
                 '-p': gf.Config.parse(f'n128{stages}-eager-p'), '-p-g': gf.Config.parse(f'n128{stages}-eager-p-g')}
        if D64:
            cands = {'cudnn': None, 'default': gf.default_config(d, causal, n),
                     **{text: gf.Config.parse(text) for text in D64_CONFIGS
                        if causal or not text.endswith('-g')}}
        out = []
        for name, cfg in cands.items():
            if name == 'cudnn':
                def fn():
                    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                        return sdpa(q, k, v, is_causal=causal, scale=scale)
            else:
                def fn(c=cfg):
                    return gf.flash_fwd(q, k, v, causal, scale, c)
            try:
                g = graph_ms(fn)
                db = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode='median')
                hm = host_ms(fn)
                out.append(f"{name} {flops / g / 1e9:.0f}/{flops / db / 1e9:.0f}/h{hm * 1e3:.0f}us")
            except Exception as e:
                out.append(f"{name} ERR {type(e).__name__}: {str(e)[:80]}")
        print(f"b{b}-h{h}-q{n} d{d} {str(dtype)[6:]} {'causal' if causal else 'full'}: TFLOP/s graph/do_bench/host per call: "
              + "; ".join(out), flush=True)
