"""ncu target: MLA b4-h16-q4096 d192/dv128 causal, fwd+bwd: cuDNN (--by cudnn) or triton_flash (--by triton), 3 calls."""
import sys
import torch
by = sys.argv[1]
q = torch.randn(4, 16, 4096, 192, device="cuda", dtype=torch.bfloat16, requires_grad=True)
k = torch.randn(4, 16, 4096, 192, device="cuda", dtype=torch.bfloat16, requires_grad=True)
v = torch.randn(4, 16, 4096, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
do = torch.randn(4, 16, 4096, 128, device="cuda", dtype=torch.bfloat16)
if by == "cudnn":
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        for _ in range(3):
            torch.autograd.grad(sdpa(q, k, v, is_causal=True), (q, k, v), do)
else:
    from pytest_attnkit.implementations.triton_flash.autograd import flash_attention
    for _ in range(3):
        torch.autograd.grad(flash_attention(q, k, v, causal=True), (q, k, v), do)
torch.cuda.synchronize()
print("done", by)
