"""How long a fresh process takes for each step a worker's start makes (device machine)."""
import subprocess, sys, time
STEPS = ["pass", "import torch", "import torch; torch.cuda.init(); torch.zeros(1, device='cuda')",
         "import torch; torch.cuda.is_available(); torch.cuda.device_count()",
         "import torch, triton", "import torch, triton; import triton.experimental.gluon", "import cupy",
         "import torch; from torch.nn.attention.flex_attention import flex_attention",
         "import pytest_attnkit.implementations.triton_flash", "import pytest_attnkit.implementations.torch_flex",
         "import pytest_attnkit.implementations.cupy_naive", "import pytest_attnkit.worker.server"]
for code in STEPS:
    times = []
    for _ in range(2):
        s = time.time(); subprocess.run([sys.executable, "-c", code], check=False); times.append(time.time() - s)
    print(f"{min(times):6.2f} s  {code}")
