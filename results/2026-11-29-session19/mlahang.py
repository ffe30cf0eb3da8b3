"""Where does the Gluon MLA backward hang in the harness? phase A: the check's calls (one o/lse,
many backwards); B: autograd through the adapter, a forward before each backward; C: B under the
harness timer (hold + flush + prepare). Each phase: one process; a watchdog dumps the stack."""
import faulthandler, os, sys, time
os.environ["ATTNKIT_TRITON_FLASH_GLUON_BWD"] = "1"
import torch
sys.path.insert(0, ".")
phase, causal, n = sys.argv[1], sys.argv[2] == "causal", int(sys.argv[3])
faulthandler.dump_traceback_later(float(sys.argv[4]) if len(sys.argv) > 4 else 40, exit=True)
from implementations.triton_flash import launch, gluon_backward as gb
from implementations.triton_flash.autograd import flash_attention
g = torch.Generator(device="cuda").manual_seed(0)
def mk(*s): return torch.randn(*s, device="cuda", dtype=torch.bfloat16, generator=g)
D = int(sys.argv[5]) if len(sys.argv) > 5 else 192
DV = 128 if D == 192 else D
q, k, v, do = mk(4, 16, 4096, D), mk(4, 16, 4096, D), mk(4, 16, 4096, DV), mk(4, 16, 4096, DV)
scale = D ** -0.5
CONFIG = gb.Config.parse(sys.argv[6]) if len(sys.argv) > 6 else None
print("config", CONFIG, flush=True)
print("unsupported:", gb.unsupported_reason(q, k, v, causal, scale), flush=True)
t0 = time.perf_counter(); done = 0
def report(tag):
    torch.cuda.synchronize(); print(f"{tag}: {done} calls ok, {time.perf_counter()-t0:.1f} s", flush=True)
if phase == "A":
    o, lse = launch.flash_fwd(q, k, v, causal, scale)
    for i in range(n):
        gb.flash_bwd(do, q, k, v, o, lse, causal, scale, CONFIG); done += 1
        if i % 25 == 24: report("A")
elif phase == "F":
    for i in range(n):
        launch.flash_fwd(q, k, v, causal, scale); done += 1
        if i % 100 == 99: report("F")
elif phase == "B":
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    for i in range(n):
        out = flash_attention(*leaves, causal=causal, scale=scale)
        torch.autograd.grad(out, leaves, do); done += 1
        if i % 25 == 24: report("B")
elif phase == "C":
    from pytest_attnkit.worker.timer import time_call
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    state = {}
    def prep(): state["o"] = flash_attention(*leaves, causal=causal, scale=scale)
    def bwd(): return torch.autograd.grad(state.pop("o"), leaves, do)
    for r in range(n):
        t = time_call(bwd, "cuda", prepare=prep); done += 1
        print(f"C round {r}: median {t.median_ms:.3f} ms over {len(t.samples)}", flush=True)
report(phase + " end")
