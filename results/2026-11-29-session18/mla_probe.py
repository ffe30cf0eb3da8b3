import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention as sdpa
from torch.profiler import profile, ProfilerActivity
for causal in (True, False):
    q = torch.randn(4, 16, 4096, 192, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(4, 16, 4096, 192, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(4, 16, 4096, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    do = torch.randn(4, 16, 4096, 128, device="cuda", dtype=torch.bfloat16)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        for _ in range(3):
            o = sdpa(q, k, v, is_causal=causal); o.backward(do)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA], record_shapes=False) as prof:
            o = sdpa(q, k, v, is_causal=causal); o.backward(do); torch.cuda.synchronize()
    print(f"== causal={causal}")
    for e in prof.events():
        if e.device_type.name == "CUDA":
            print(f"{e.device_time_total:9.1f} us  {e.name[:200]}")
