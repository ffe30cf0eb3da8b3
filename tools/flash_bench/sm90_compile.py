"""Compile triton_flash's FP8 forward for a GPU this machine does not have, and say what came out.

No GPU is needed: Triton compiles through its own JIT path for a target given here (a stand-in
driver answers its questions about the device), and its bundled ptxas and cuobjdump read the
result. For each tile it prints the tensor-core instructions (``wgmma.mma_async`` on sm90,
``mma.sync`` on sm89), the P conversion, registers per thread, spilled bytes and shared memory.
A kernel that does not compile for the target fails here, before any GPU time is spent.

Usage: python3 tools/flash_bench/sm90_compile.py [--arch 90] [--untransposed-v]
(``--untransposed-v`` also compiles the forward with V as given, head dim contiguous, to show what
Triton makes of an FP8 PV product whose B operand is not K-major.)
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime import driver  # noqa: E402


class _TargetOnly:
    """What Triton's JIT asks of a driver before it launches, for a GPU that is not here."""

    def __init__(self, arch: int) -> None:
        self.target = GPUTarget("cuda", arch, 32)

    def get_current_target(self) -> GPUTarget:
        return self.target

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_active_torch_device(self) -> torch.device:
        return torch.device("cpu")


def _usage(cubin: bytes) -> str:
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as handle:
        handle.write(cubin)
        handle.flush()
        text = subprocess.run([str(tool), "--dump-resource-usage", handle.name], capture_output=True,
                              text=True).stdout
    found = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", text)
    return f"regs {found[1]}, spill/stack {found[2]}+{found[4]} B" if found else text.strip()


def describe(kernel) -> str:
    ptx = kernel.asm["ptx"]
    wgmma = sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(\S+?)\s", ptx)))
    mma = len(re.findall(r"mma\.sync", ptx))
    cvt = "e4m3x2 cvt" if "cvt.rn.satfinite.e4m3x2.f32" in ptx else "no e4m3 cvt"
    return (f"wgmma {wgmma or '-'}, mma.sync x{mma}, {cvt}; {_usage(kernel.asm['cubin'])}, "
            f"shared {kernel.metadata.shared // 1024} KiB")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", type=int, default=90, help="compute capability as one number (90: H100/H200)")
    parser.add_argument("--untransposed-v", action="store_true")
    args = parser.parse_args()
    driver.set_active(_TargetOnly(args.arch))
    from pytest_attnkit.implementations.triton_flash import kernels, launch

    n, heads = 4096, 16
    fp8 = torch.float8_e4m3fn
    for head_dim in launch.FP8_HEAD_DIMS:
        q = torch.empty(1, heads, n, head_dim, dtype=fp8)
        k = torch.empty_like(q)
        v_t = torch.empty(1, heads, head_dim, n, dtype=fp8).transpose(2, 3)
        o = torch.empty(1, heads, n, head_dim, dtype=torch.bfloat16)
        descale = torch.ones(1, heads)
        layouts = [("V^T", v_t)] + ([("V as given", torch.empty_like(q))] if args.untransposed_v else [])
        for tiles in launch.tile_candidates("fp8", head_dim, fp8):
            for causal in (False, True):
                for name, v in layouts:
                    compiled = kernels.attn_fwd_fp8.warmup(
                        q, k, v, o, descale, descale, descale, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
                        heads, heads, n, n, 1, 0.1, HEAD_DIM=head_dim, BLOCK_M=tiles.block_m,
                        BLOCK_N=tiles.block_n, CAUSAL=causal, EXACT_CAST=False, num_warps=tiles.num_warps,
                        num_stages=tiles.num_stages, grid=(1,))
                    print(f"sm{args.arch} attn_fwd_fp8 d{head_dim} {tiles}{' causal' if causal else ''} "
                          f"({name}): {describe(compiled)}", flush=True)
        compiled = kernels.transpose_keys.warmup(torch.empty_like(q), v_t, *q.stride(), *v_t.stride(), heads, n,
                                                 HEAD_DIM=head_dim, BLOCK_N=64, num_warps=4, grid=(1,))
        print(f"sm{args.arch} transpose_keys d{head_dim}: {_usage(compiled.asm['cubin'])}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
