"""Three calls of one attention case, for Nsight Compute to profile the third.

Usage (on the GPU machine, after tools/install_offline.sh), for CASE one of fp8-d64-4k,
bf16-d64-4k, fp8-d128-4k, bf16-d128-4k (a forward: dtype, head dim, sequence length; batch x
heads fixed at 16k tokens x 2048 / D, the speed suite's shapes), or ``bwd-`` and a bf16 case with
an optional Gluon backward configuration (``bwd-bf16-d128-4k``, ``bwd-bf16-d128-4k-m64s2-tmar-sw``):
the Gluon backward (``gluon_backward.flash_bwd``, kernel ``_attn_bwd_sm90``) after one forward.
``d192`` is MLA (V's head dim 128; b4-h16 at 4k, the speed suite's MLA case).
``--by triton`` runs the same backward through the Triton kernels (``launch.flash_bwd`` with
``gluon=False``) and ``--by cudnn`` through torch's cuDNN attention, so the
three can be read side by side (``--causal`` for the causal case); the third call runs inside the
NVTX range ``profiled``:

    ncu --target-processes all --nvtx --nvtx-include "profiled/" \\
        --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \\
        --section WarpStateStats --section Occupancy --section LaunchStats \\
        --metrics sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active \\
        python3 tools/flash_bench/ncu_case.py CASE [--by gluon|triton|cudnn] [--causal]
"""

import argparse

import torch

from pytest_attnkit.implementations.triton_flash import flash_attention


def _three_calls(call, prepare=None) -> None:
    """``call`` three times, synchronized, the third inside the NVTX range ``profiled``; where
    given, ``prepare`` runs before each, outside the range, and what it returns is ``call``'s argument."""
    for index in range(3):
        made = () if prepare is None else (prepare(),)
        torch.cuda.synchronize()
        if index == 2:
            torch.cuda.nvtx.range_push("profiled")
        call(*made)
        torch.cuda.synchronize()
        if index == 2:
            torch.cuda.nvtx.range_pop()


def main(case: str, by: str, causal: bool = False) -> None:
    backward = case.startswith("bwd-")
    dtype, head_dim, length, *config = case.removeprefix("bwd-").split("-", 3)
    d, n = int(head_dim[1:]), int(length[:-1]) * 1024
    d_v = 128 if d == 192 else d  # MLA: Q's and K's head dim 192, V's 128
    batch, heads = 16384 // n, 2048 // d_v
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(batch, heads, n, dim, device="cuda", generator=gen) for dim in (d, d, d_v))
    cast = torch.float8_e4m3fn if dtype == "fp8" else torch.bfloat16
    q, k, v = (t.to(cast) for t in (q, k, v))
    if by == "cudnn":
        from torch.nn.attention import SDPBackend, sdpa_kernel
        from torch.nn.functional import scaled_dot_product_attention

        q, k, v = (t.requires_grad_(backward) for t in (q, k, v))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            if backward:  # autograd runs it on a thread of its own: outside the range (the docstring)
                def forward():
                    out = scaled_dot_product_attention(q, k, v, is_causal=causal)
                    return out, torch.randn_like(out)

                _three_calls(lambda made: made[0].backward(made[1]), forward)
            else:
                _three_calls(lambda: scaled_dot_product_attention(q, k, v, is_causal=causal))
        return
    with torch.no_grad():
        if backward:
            from pytest_attnkit.implementations.triton_flash import gluon_backward, launch

            chosen = gluon_backward.Config.parse(config[0]) if config else None
            o, lse = launch.flash_fwd(q, k, v, causal, d ** -0.5)
            do = torch.randn_like(o)
            if by == "triton":
                _three_calls(lambda: launch.flash_bwd(do, q, k, v, o, lse, causal, d ** -0.5, gluon=False))
            else:
                _three_calls(lambda: gluon_backward.flash_bwd(do, q, k, v, o, lse, causal, d ** -0.5, chosen))
        else:
            _three_calls(lambda: flash_attention(q, k, v, causal=causal))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("case")
    parser.add_argument("--by", choices=("gluon", "triton", "cudnn"), default="gluon",
                        help="the backward's implementation (forwards: gluon and triton are the bundled kernel)")
    parser.add_argument("--causal", action="store_true", help="causal (bottom-right; square here, so cuDNN's agrees)")
    arguments = parser.parse_args()
    main(arguments.case, arguments.by, arguments.causal)
