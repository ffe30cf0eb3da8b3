"""Three calls of one bundled-kernel case, for Nsight Compute to profile the third.

Usage (on the GPU machine, after tools/install_offline.sh), for CASE one of fp8-d64-4k,
bf16-d64-4k, fp8-d128-4k, bf16-d128-4k (a forward: dtype, head dim, sequence length; batch x
heads fixed at 16k tokens x 2048 / D, the speed suite's shapes), or ``bwd-`` and a bf16 case with
an optional Gluon backward configuration (``bwd-bf16-d128-4k``, ``bwd-bf16-d128-4k-m64s2-tmar-sw``):
the Gluon backward (``gluon_backward.flash_bwd``, kernel ``_attn_bwd_sm90``) after one forward:

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
    backward = case.startswith("bwd-")
    dtype, head_dim, length, *config = case.removeprefix("bwd-").split("-", 3)
    d, n = int(head_dim[1:]), int(length[:-1]) * 1024
    batch, heads = 16384 // n, 2048 // d
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(batch, heads, n, d, device="cuda", generator=gen) for _ in range(3))
    cast = torch.float8_e4m3fn if dtype == "fp8" else torch.bfloat16
    q, k, v = (t.to(cast) for t in (q, k, v))
    with torch.no_grad():
        if backward:
            from pytest_attnkit.implementations.triton_flash import gluon_backward, launch

            chosen = gluon_backward.Config.parse(config[0]) if config else None
            o, lse = launch.flash_fwd(q, k, v, False, d ** -0.5)
            do = torch.randn_like(q)
            for _ in range(3):
                gluon_backward.flash_bwd(do, q, k, v, o, lse, False, d ** -0.5, chosen)
        else:
            for _ in range(3):
                flash_attention(q, k, v)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main(sys.argv[1])
