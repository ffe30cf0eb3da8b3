import torch, triton
from pytest_attnkit.implementations.triton_flash import gluon_backward as gb, launch as L
from pytest_attnkit.implementations.triton_flash.kernels import dq_unblock
def t(f, n=20):
    for _ in range(3): f()
    s=torch.cuda.Event(True); e=torch.cuda.Event(True); s.record()
    for _ in range(n): f()
    e.record(); torch.cuda.synchronize(); return s.elapsed_time(e)/n
for (B,H,N,causal) in [(4,16,4096,False),(4,16,4096,True),(1,16,16384,False)]:
    q,k,v=[torch.randn(B,H,N,128,device="cuda",dtype=torch.bfloat16) for _ in range(3)]
    o,lse=L.flash_fwd(q,k,v,causal,0.088)
    do=torch.randn_like(o)
    for c in ["m64s2-tmar-sw-ld-lt-rl-dqp","m64s2-tmar-dqb-ld-lt-rl-dqp"]:
        cfg=gb.Config.parse(c)
        dq_acc=gb.dq_workspace(q,cfg); dk=torch.empty_like(k); dv=torch.empty_like(v)
        delta=torch.zeros(B,H,N,device="cuda")
        args,kw,grid=gb.launch_arguments(do,q,k,v,lse.contiguous(),delta,dq_acc,dk,dv,causal,0.088,cfg)
        kern=t(lambda: gb._attn_bwd_sm90[grid](*args,**kw))
        full=t(lambda: gb.flash_bwd(do,q,k,v,o,lse,causal,0.088,cfg))
        conv=t(lambda: gb.dq_result(dq_acc,q))
        zero=t(lambda: gb.dq_workspace(q,cfg))
        print(f"B{B} H{H} N{N} causal={causal} {c}: kernel {kern:.3f} ms, flash_bwd {full:.3f} ms, conversion {conv:.3f}, zeros {zero:.3f}", flush=True)
