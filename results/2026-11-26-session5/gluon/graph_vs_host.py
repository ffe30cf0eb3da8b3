"""1k cases: GPU time (CUDA graph replay) vs do_bench (host included) vs host time per call."""
import sys, time, statistics as st, torch, triton
sys.path.insert(0, '.')
from implementations.triton_flash import gluon_forward as gf
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention as sdpa

def graph_ms(fn, reps=50):
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn(); fn()
    torch.cuda.current_stream().wait_stream(s); torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps): fn()
    times = []
    for _ in range(7):
        a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
        a.record(); g.replay(); b.record(); torch.cuda.synchronize(); times.append(a.elapsed_time(b) / reps)
    return st.median(times)

def host_ms(fn, n=200):
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(n): fn()
    h = (time.perf_counter() - t) / n * 1e3; torch.cuda.synchronize(); return h

for (b, h, n, d) in [(8, 16, 1024, 128), (16, 16, 1024, 128), (4, 32, 4096, 64)]:
  for dtype in (torch.bfloat16, torch.float16):
    for causal in (False, True):
        q, k, v = (torch.randn(b, h, n, d, device='cuda', dtype=dtype) for _ in range(3))
        scale = d ** -0.5
        flops = 4 * b * h * d * (n * (n + 1) // 2 if causal else n * n)
        cands = {'cudnn': None, 'default': gf.default_config(d, causal)}
        for t in (['n128s2-eager-p', 'n128s2-eager-hf', 'n128s3-eager'] if d == 128 else ['n128s3-eager', 'n128s3-eager-p', 'n128s3-eager-c3', 'n128s3-eager-c3-p']):
            cands[t] = gf.Config.parse(t)
        out = []
        for name, cfg in cands.items():
            if name == 'cudnn':
                def fn():
                    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                        return sdpa(q, k, v, is_causal=causal, scale=scale)
            else:
                if not causal and name.endswith('-hf'): continue
                fn = (lambda c=cfg: gf.flash_fwd(q, k, v, causal, scale, c))
            try:
                g = graph_ms(fn); db = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode='median'); hm = host_ms(fn)
                out.append(f"{name} {flops/g/1e9:.0f}/{flops/db/1e9:.0f}/h{hm*1e3:.0f}us")
            except Exception as e:
                out.append(f"{name} ERR {type(e).__name__}: {str(e)[:80]}")
        print(f"b{b}-h{h}-q{n} d{d} {str(dtype)[6:]} {'causal' if causal else ''}: TFLOP/s graph/do_bench/host per call: " + "; ".join(out), flush=True)
