"""Seeded inputs for a case, and the allocator poisoning that exposes unwritten outputs.

Every trial draws fresh inputs from its own seed, so a rerun with the printed seed reproduces a
failure exactly (on the same device type). ``layout="bshd"`` builds a ``[B, N, H, D]`` tensor and
hands out its ``[B, H, N, D]`` transpose: a non-contiguous view, as a model's projections give.

A variant case draws its extra inputs from the same seed: ALiBi slopes (uniform in [0, 0.3), as
FlashAttention's tests draw them), sink logits around ``log(seqlen_k)`` (so the sink takes a share
of each row comparable to the keys', and ignoring it shows), and the LSE's upstream gradient,
zero on rows whose LSE the contract leaves open. :func:`call_implementation` is the one place
that turns a case into the implementation's keyword arguments.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

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
    alibi_slopes: "torch.Tensor | None" = None
    sinks: "torch.Tensor | None" = None
    dlse: "torch.Tensor | None" = None


def make_inputs(case: Case, device: str, seed: int) -> Inputs:
    """q, k, v and an output gradient for ``case`` on ``device``, drawn from ``seed``."""
    import torch

    dtype = getattr(torch, case.dtype)
    generator = torch.Generator(device=device).manual_seed(seed)

    def draw(heads: int, seqlen: int, multiplier: float, head_dim: int = case.head_dim) -> "torch.Tensor":
        shape = (case.batch, seqlen, heads, head_dim) if case.layout == "bshd" else (case.batch, heads, seqlen, head_dim)
        values = torch.randn(shape, generator=generator, device=device, dtype=torch.float32) * multiplier
        values = values.to(dtype)
        return values.transpose(1, 2) if case.layout == "bshd" else values

    q = draw(case.heads_q, case.seqlen_q, case.logit_scale)
    k = draw(case.heads_kv, case.seqlen_k, case.logit_scale)
    v = draw(case.heads_kv, case.seqlen_k, 1.0, case.value_dim)
    dout = draw(case.heads_q, case.seqlen_q, 1.0, case.value_dim)
    inputs = Inputs(q=q, k=k, v=v, dout=dout, seed=seed)
    # Drawn after the dense inputs, so a variant case's q, k, v equal its dense twin's.
    if case.alibi:
        inputs.alibi_slopes = torch.rand(case.heads_q, generator=generator, device=device) * 0.3
    if case.sinks:
        inputs.sinks = torch.randn(case.heads_q, generator=generator, device=device) + math.log(case.seqlen_k)
    if case.return_lse:
        dlse = torch.randn(case.batch, case.heads_q, case.seqlen_q, generator=generator, device=device)
        if not case.sinks:
            from pytest_attnkit.oracle import rows_with_a_key

            dlse = dlse * rows_with_a_key(case.seqlen_q, case.seqlen_k, causal=case.causal, window=case.window,
                                          device=device)
        inputs.dlse = dlse
    return inputs


def variant_keywords(case: Case, inputs: Inputs) -> dict[str, Any]:
    """The keyword arguments a variant case adds to the call; empty for a plain case."""
    keywords: dict[str, Any] = {}
    if case.window is not None:
        keywords["window_size"] = case.window
    if case.softcap:
        keywords["softcap"] = case.softcap
    if case.alibi:
        keywords["alibi_slopes"] = inputs.alibi_slopes
    if case.sinks:
        keywords["sinks"] = inputs.sinks
    if case.return_lse:
        keywords["return_lse"] = True
    return keywords


def call_implementation(impl: Any, case: Case, q: Any, k: Any, v: Any, inputs: Inputs, *,
                        sinks: Any = None) -> Any:
    """Call ``impl`` on ``case`` as the contract says: the variant keywords only when the case
    uses them (``sinks`` overrides the inputs' sink tensor, to hand one that requires grad)."""
    keywords = variant_keywords(case, inputs)
    if sinks is not None:
        keywords["sinks"] = sinks
    return impl(q, k, v, causal=case.causal, scale=None, **keywords)


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
