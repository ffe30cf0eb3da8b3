"""Lab: compile triton_flash's Triton kernels (not Gluon) for a GPU arch without a GPU, under this
machine's triton: every kernel a forced-tile forward and backward launch would run, launches turned
into warmups (compile only)."""
import os, sys, re, itertools, traceback
os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, "tools/flash_bench")
import torch, triton
from triton.runtime.jit import JITFunction
from sm90_compile import _TargetOnly
from triton.runtime import driver
arch = int(sys.argv[1]) if len(sys.argv) > 1 else 90
driver.set_active(_TargetOnly(arch))
os.environ["ATTNKIT_TRITON_FLASH_GLUON"] = "0"
from gluon_compile import ensure_package
ensure_package()
from pytest_attnkit.implementations.triton_flash import kernels, launch
compiled = []
for name in dir(kernels):
    obj = getattr(kernels, name)
    fn = getattr(obj, "fn", obj)  # autotuned/heuristics wrappers
    for o in ([obj] if fn is obj else [obj, fn]):
        if isinstance(o, JITFunction):
            orig = o.run
            def run(*args, grid, warmup=False, _orig=orig, _name=name, **kw):
                k = _orig(*args, grid=grid, warmup=True, **kw)
                from gluon_compile import _ptxas_report, serialized
                regs, spills, warns = _ptxas_report(k.asm["ptx"])
                compiled.append(f"{_name}[regs {regs} spills {spills}{serialized(warns)}]")
                return k
            o.run = run
launch._sm_count = lambda device: 132
fails = 0
print(f"triton {triton.__version__}, sm_{arch}")
for dtype, d, causal in itertools.product((torch.bfloat16, torch.float16), (64, 128), (False, True)):
    b, h, n = 1, 2, 1024
    q = torch.zeros(b, h, n, d, dtype=dtype); k = torch.zeros_like(q); v = torch.zeros_like(q)
    block_d = d
    tag = f"{str(dtype).split('.')[-1]} d{d} {'causal' if causal else 'full'}"
    for t in launch.tile_candidates("fwd", block_d, dtype):
        compiled.clear()
        try:
            launch.flash_fwd(q, k, v, causal, d ** -0.5, tiles=t)
            print(f"fwd {tag} {t}: compiled {compiled}")
        except Exception as e:
            fails += 1; print(f"fwd {tag} {t}: FAILED {type(e).__name__}: {str(e).splitlines()[-1][:200]}")
    o, lse = torch.zeros_like(q), torch.zeros(b, h, n)
    for tk, tq in zip(launch.tile_candidates("dkdv", block_d, dtype), launch.tile_candidates("dq", block_d, dtype)):
        compiled.clear()
        try:
            launch.flash_bwd(q, q, k, v, o, lse, causal, d ** -0.5, tiles={"dkdv": tk, "dq": tq}, gluon=False)
            print(f"bwd {tag} {tk} / {tq}: compiled {compiled}")
        except Exception as e:
            fails += 1; print(f"bwd {tag} {tk} / {tq}: FAILED {type(e).__name__}: {str(e).splitlines()[-1][:200]}")
print("failures", fails)
