"""FlexAttention's backward against triton_flash's, same shape, one process: where a gap comes from.

For b1 h16 N=16384 d128 bf16, dense and with ALiBi, it times each backward with versions.py's
timer (CUDA events, L2 flushed, the GPU spun ahead of the start event, median of 15; the H200 run
below had no spin) and splits it by kernel with the profiler; it prints the registers, spills,
warps, stages and shared memory of triton_flash's compiled kernels and of the kernels torch
compiled for FlexAttention (cuobjdump on Inductor's cubins), and copies the Triton source that
Inductor generated for FlexAttention's backward into OUT, to be read beside ours.

On an H200 (results/2026-11-23-h200-backward-experiments, flex_vs_ours.*): FlexAttention's
backward is one kernel of 12.81 ms (ALiBi 13.18) with our tiles and registers and no spills,
against our dK/dV + dQ of 9.56 + 4.75 ms; its generated source showed that its loads carry no
masks when the length is a multiple of the tiles, which became triton_flash's EVEN_Q (NOTES.md,
v6). (The run there also timed a decode call; tools/flash_bench/overhead.py does that in full.)

Usage (on the GPU machine, after tools/install_offline.sh):
    python3 tools/flash_bench/flex_vs_ours.py OUT
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from pathlib import Path

import torch
import triton
from torch.nn.attention.flex_attention import flex_attention

from pytest_attnkit.implementations.triton_flash import autograd, kernels

sys.path.insert(0, str(Path(__file__).resolve().parent))
from versions import kernel_times, timed  # noqa: E402

B, H, N, D = 1, 16, 16384, 128


def main(out: str) -> int:
    os.makedirs(out, exist_ok=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
               for _ in range(3))
    do = torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    slopes = torch.rand(H, device="cuda", generator=gen) * 0.3

    def alibi(score, b, h, i, j):
        return score + slopes[h] * (j - i)

    flex = torch.compile(flex_attention, dynamic=False)
    report = {}
    for name, forward in [("flex-dense", lambda: flex(q, k, v)),
                          ("flex-alibi", lambda: flex(q, k, v, score_mod=alibi)),
                          ("ours-dense", lambda: autograd.flash_attention(q, k, v)),
                          ("ours-alibi", lambda: autograd.flash_attention(q, k, v, alibi_slopes=slopes))]:
        o = forward()

        def backward(o=o):
            return torch.autograd.grad(o, (q, k, v), do, retain_graph=True)

        backward()
        torch.cuda.synchronize()
        report[name] = {"bwd_ms": round(timed(backward, 15), 4), "kernels": kernel_times(backward, match="")}
        print(name, json.dumps(report[name]), flush=True)
    for fn in (kernels.attn_bwd_dkdv, kernels.attn_bwd_dq, kernels.attn_fwd):
        for cache in getattr(fn, "device_caches", {}).values():
            for kern in cache[0].values():
                print("ours", fn.fn.__name__, "regs", kern.n_regs, "spills", kern.n_spills, "warps",
                      kern.metadata.num_warps, "stages", kern.metadata.num_stages, "smem", kern.metadata.shared,
                      flush=True)
    for src in glob.glob("/tmp/torchinductor_*/**/*.py", recursive=True):
        with open(src) as handle:
            text = handle.read()
        if "flex_attention_backward" in text and "def triton" in text:
            with open(os.path.join(out, "flex_src_" + os.path.basename(src)), "w") as handle:
                handle.write(text)
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
    for cubin in glob.glob("/tmp/torchinductor_*/**/*.cubin", recursive=True):
        usage = subprocess.run([cuobjdump, "-res-usage", cubin], capture_output=True, text=True).stdout
        print("inductor cubin", os.path.basename(cubin),
              " ".join(line.strip() for line in usage.splitlines() if "REG" in line)[:300], flush=True)
    with open(os.path.join(out, "flex_vs_ours.json"), "w") as handle:
        json.dump(report, handle, indent=1)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python3 tools/flash_bench/flex_vs_ours.py OUT")
    sys.exit(main(sys.argv[1]))
