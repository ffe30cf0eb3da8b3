"""Seeded inputs for a case, and the allocator poisoning that exposes unwritten outputs.

Every trial draws fresh inputs from its own seed, so a rerun with the printed seed reproduces a
failure exactly (on the same device type). ``layout="bshd"`` builds a ``[B, N, H, D]`` tensor and
hands out its ``[B, H, N, D]`` transpose: a non-contiguous view, as a model's projections give.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pytest_attnkit.contract import Case

if TYPE_CHECKING:
    import torch


def trial_seed(base_seed: int, case: Case, trial: int) -> int:
    """A stable 31-bit seed for one trial of one case."""
    return zlib.crc32(f"{base_seed}:{case.id}:{trial}".encode()) & 0x7FFFFFFF


@dataclass
class Inputs:
    q: "torch.Tensor"
    k: "torch.Tensor"
    v: "torch.Tensor"
    dout: "torch.Tensor"
    seed: int


def make_inputs(case: Case, device: str, seed: int) -> Inputs:
    """q, k, v and an output gradient for ``case`` on ``device``, drawn from ``seed``."""
    import torch

    dtype = getattr(torch, case.dtype)
    generator = torch.Generator(device=device).manual_seed(seed)

    def draw(heads: int, seqlen: int, multiplier: float) -> "torch.Tensor":
        shape = (case.batch, seqlen, heads, case.head_dim) if case.layout == "bshd" else (case.batch, heads, seqlen, case.head_dim)
        values = torch.randn(shape, generator=generator, device=device, dtype=torch.float32) * multiplier
        values = values.to(dtype)
        return values.transpose(1, 2) if case.layout == "bshd" else values

    q = draw(case.heads_q, case.seqlen_q, case.logit_scale)
    k = draw(case.heads_kv, case.seqlen_k, case.logit_scale)
    v = draw(case.heads_kv, case.seqlen_k, 1.0)
    dout = draw(case.heads_q, case.seqlen_q, 1.0)
    return Inputs(q=q, k=k, v=v, dout=dout, seed=seed)


def poison_free_memory(device: str, sizes_in_bytes: list[int]) -> None:
    """Fill and release blocks of these sizes with NaN so an implementation's next allocations
    of those sizes start out holding NaN instead of stale values.

    On CUDA, torch's caching allocator hands a freed block of the right size to the next request
    (best fit), so an output the implementation leaves partly unwritten shows NaN. Together with
    the ordering in :mod:`pytest_attnkit.worker.correctness` (the implementation runs on fresh inputs
    before any reference is computed), stale right answers cannot pass.
    """
    import torch

    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    blocks = [torch.full((max(1, size // 4),), float("nan"), dtype=torch.float32, device=device) for size in sizes_in_bytes]
    if device == "cuda":
        torch.cuda.synchronize()
    del blocks
