import sys, time, torch
import torch._dynamo
from torch._dynamo.utils import counters
sys.path.insert(0, ".")
from implementations import torch_flex as tf
mode = sys.argv[1]
if mode != "False":
    import torch
    from torch.nn.attention.flex_attention import flex_attention
    tf.compiled_flex_attention()  # sets limits
    tf._compiled_flex = torch.compile(flex_attention, dynamic=None if mode == "None" else True)
cases = [(1, 2, 256, 256, False), (1, 2, 320, 320, False), (1, 2, 384, 384, False),
         (1, 2, 256, 256, True), (1, 2, 320, 320, True), (1, 2, 200, 328, True)]
for b, h, nq, nk, causal in cases:
    q = torch.randn(b, h, nq, 64); k = torch.randn(b, h, nk, 64); v = torch.randn(b, h, nk, 64)
    t = time.time()
    with torch.no_grad():
        tf.flex_attention_contract(q, k, v, causal=causal)
    print(f"{mode} q{nq} k{nk} causal={causal}: {time.time()-t:.1f} s; frames compiled so far {counters['stats']['unique_graphs']}", flush=True)
