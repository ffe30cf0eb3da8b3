"""Where torch_sdpa's first calls go: warm_call's two calls, then the speed suite's timing of the
same case in the same process, then the timing in a process that never warmed it."""
import sys, time
from pytest_attnkit.contract import Case
from pytest_attnkit.registry import load_implementation
from pytest_attnkit.worker.calls import warm_call
from pytest_attnkit.worker.speed import measure_speed

impl = load_implementation("torch_sdpa", "pytest_attnkit.implementations.torch_sdpa:TorchSDPA")
cases = [(Case(16, 16, 16, 1024, 1024, 128, "bfloat16"), False),
         (Case(1, 16, 16, 16384, 16384, 128, "bfloat16"), False),
         (Case(4, 32, 32, 4096, 4096, 64, "bfloat16", causal=True), False),
         (Case(4, 16, 16, 4096, 4096, 128, "bfloat16"), True),
         (Case(1, 16, 16, 16384, 16384, 128, "bfloat16", causal=True), True)]
warm = sys.argv[1] == "warm"
for case, backward in cases:
    mode = "backward" if backward else "forward"
    if warm:
        first, later = warm_call(impl, case, device="cuda", seed=0, backward=backward, again=True)
        print(f"warm  {mode:8} {case.id:44} first {first*1e3:8.1f} ms next {later*1e3 if later else -1:8.2f} ms", flush=True)
    t = measure_speed(impl, case, mode, device="cuda", seed=0, budget_ms=200)["timing"]
    print(f"timed {mode:8} {case.id:44} first_call {t['first_call_ms']:8.1f} ms median {sorted(t['samples_ms'])[len(t['samples_ms'])//2]:.3f}", flush=True)
