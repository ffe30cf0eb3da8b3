"""Three forwards of one bundled-kernel case, for Nsight Compute to profile the third.

Usage (on the GPU machine, after tools/install_offline.sh), for CASE one of fp8-d64-4k,
bf16-d64-4k, fp8-d128-4k, bf16-d128-4k (dtype, head dim, sequence length; batch x heads fixed at
16k tokens x 2048 / D, the speed suite's shapes):

    ncu --target-processes all -k regex:attn_fwd --launch-skip 2 --launch-count 1 \\
        --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \\
        --section WarpStateStats --section Occupancy --section LaunchStats \\
        --metrics sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active \\
        python3 tools/flash_bench/ncu_case.py CASE
"""

import sys

import torch

from pytest_attnkit.implementations.triton_flash import flash_attention


def main(case: str) -> None:
    dtype, head_dim, length = case.split("-")
    d, n = int(head_dim[1:]), int(length[:-1]) * 1024
    batch, heads = 16384 // n, 2048 // d
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(batch, heads, n, d, device="cuda", generator=gen) for _ in range(3))
    cast = torch.float8_e4m3fn if dtype == "fp8" else torch.bfloat16
    q, k, v = (t.to(cast) for t in (q, k, v))
    with torch.no_grad():
        for _ in range(3):
            flash_attention(q, k, v)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main(sys.argv[1])
