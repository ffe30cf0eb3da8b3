"""Seeded inputs for a case, and the allocator poisoning that exposes unwritten outputs.

Every trial draws fresh inputs from its own seed, so a rerun with the printed seed reproduces a
failure exactly (on the same device type). ``layout="bshd"`` builds a ``[B, N, H, D]`` tensor and
hands out its ``[B, H, N, D]`` transpose: a non-contiguous view, as a model's projections give.

A variant case draws its extra inputs from the same seed: ALiBi slopes (uniform in [0, 0.3), as
FlashAttention's tests draw them), sink logits around ``log(seqlen_k)`` (so the sink takes a share
of each row comparable to the keys', and ignoring it shows), and the LSE's upstream gradient,
zero on rows whose LSE the contract leaves open. :func:`variant_keywords` is the one place that
turns a case into the implementation's keyword arguments
(:func:`~pytest_attnkit.worker.calls.call_implementation` makes the call).

A varlen case draws its packed q, k and v (``[rows, H, D]``, unused rows after the last sequence
holding values of their own, never zeros, so reading them shows) and its cumulative lengths; a
paged case draws its caches with pages in a shuffled order, a quarter more pages than the
sequences use, block-table entries past a sequence's last page pointing at unused pages, and slots
past a sequence's length holding values, and the table two entries wider than the longest sequence
needs: a kernel that reads pages in order, past the block table or past the cache length, or that
assumes the table's width, reads numbers that change its result. The upstream gradient is zero on
unused rows.

An FP8 case draws the same float32 values and quantizes them as FA3's users do: a descale per
(batch, kv head), the largest magnitude over that slice (q's over the query heads that share the
kv head) divided by the format's largest finite value, so each slice uses the format's full
range. The implementation gets the FP8 tensors and the float32 ``[B, Hkv]`` descales;
:func:`dequantized` gives the values they stand for, on which the references work.
"""

from __future__ import annotations

import itertools
import math
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pytest_attnkit.contract import FP8_OUTPUT_DTYPE, Case, is_fp8
from pytest_attnkit.oracle import Packing, lse_rows_with_a_key

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
    q_descale: "torch.Tensor | None" = None
    k_descale: "torch.Tensor | None" = None
    v_descale: "torch.Tensor | None" = None
    #: varlen / paged KV: where the sequences are, and the call's keywords saying it.
    packing: Packing | None = None
    layout_keywords: dict[str, Any] | None = None


def _quantize(values: "torch.Tensor", dtype: "torch.dtype", heads_kv: int) -> tuple["torch.Tensor", "torch.Tensor"]:
    """``values`` [B, H, N, D] (float32, possibly a transposed view) in FP8 with a float32
    descale per (batch, kv head): ``quantized.float() * descale`` approximates ``values``."""
    import torch

    batch, heads = values.shape[0], values.shape[1]
    grouped = values.reshape(batch, heads_kv, heads // heads_kv, *values.shape[2:])
    amax = grouped.abs().amax(dim=(2, 3, 4)).clamp_min(1e-12)
    descale = (amax / torch.finfo(dtype).max).to(torch.float32)
    per_head = descale.repeat_interleave(heads // heads_kv, dim=1)[:, :, None, None]
    quantized = (values / per_head).to(dtype)
    return quantized, descale


def dequantized(case: Case, inputs: Inputs) -> tuple["torch.Tensor", "torch.Tensor", "torch.Tensor"]:
    """The float32 values q, k and v stand for (themselves, upcast, when the case is not FP8)."""
    import torch

    if not is_fp8(case.dtype):
        return inputs.q, inputs.k, inputs.v
    group = case.heads_q // case.heads_kv
    results = []
    for tensor, descale, repeat in ((inputs.q, inputs.q_descale, group), (inputs.k, inputs.k_descale, 1),
                                    (inputs.v, inputs.v_descale, 1)):
        assert descale is not None
        results.append(tensor.to(torch.float32) * descale.repeat_interleave(repeat, dim=1)[:, :, None, None])
    return results[0], results[1], results[2]


def expected_shapes(case: Case) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The shapes of the output and of the LSE the contract asks for ``case``."""
    if case.kind == "varlen":
        rows = case.total_q + case.unused_tokens
        return (rows, case.heads_q, case.value_dim), (case.heads_q, rows)
    if case.kind == "paged":
        return (case.batch, case.seqlen_q, case.heads_q, case.value_dim), (case.batch, case.heads_q, case.seqlen_q)
    return (case.batch, case.heads_q, case.seqlen_q, case.value_dim), (case.batch, case.heads_q, case.seqlen_q)


def _packed_inputs(case: Case, device: str, seed: int) -> Inputs:
    """q, k, v, the upstream gradient and the layout's keywords of a varlen or paged case."""
    import torch

    dtype = getattr(torch, case.dtype)
    generator = torch.Generator(device=device).manual_seed(seed)

    def draw(*shape: int, multiplier: float = 1.0) -> "torch.Tensor":
        return (torch.randn(shape, generator=generator, device=device, dtype=torch.float32) * multiplier).to(dtype)

    int32 = {"dtype": torch.int32, "device": device}
    if case.kind == "varlen":
        assert case.seqlens_q is not None and case.seqlens_k is not None
        cu_q, cu_k = (tuple(itertools.accumulate(lengths, initial=0)) for lengths in (case.seqlens_q, case.seqlens_k))
        rows_q, rows_k = cu_q[-1] + case.unused_tokens, cu_k[-1] + case.unused_tokens
        q = draw(rows_q, case.heads_q, case.head_dim, multiplier=case.logit_scale)
        k = draw(rows_k, case.heads_kv, case.head_dim, multiplier=case.logit_scale)
        v = draw(rows_k, case.heads_kv, case.value_dim)
        dout = draw(rows_q, case.heads_q, case.value_dim)
        dout[cu_q[-1]:] = 0
        packing = Packing("varlen", cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
        keywords = {"cu_seqlens_q": torch.tensor(cu_q, **int32), "cu_seqlens_k": torch.tensor(cu_k, **int32),
                    "max_seqlen_q": max(case.seqlens_q), "max_seqlen_k": max(case.seqlens_k)}
    else:
        assert case.seqlens_k is not None and case.page_size is not None
        size = case.page_size
        counts = [-(-length // size) for length in case.seqlens_k]
        used = sum(counts)
        spare = max(2, used // 4)
        order = torch.randperm(used + spare, generator=torch.Generator().manual_seed(seed)).tolist()
        width = max(counts) + 2  # wider than needed: a kernel must take the table's stride as given
        table, start = [], 0
        for count in counts:
            own = order[start:start + count]
            start += count
            table.append(tuple(own + [order[used + (i % spare)] for i in range(width - count)]))
        q = draw(case.batch, case.seqlen_q, case.heads_q, case.head_dim, multiplier=case.logit_scale)
        k = draw(used + spare, size, case.heads_kv, case.head_dim, multiplier=case.logit_scale)
        v = draw(used + spare, size, case.heads_kv, case.value_dim)
        dout = draw(case.batch, case.seqlen_q, case.heads_q, case.value_dim)
        packing = Packing("paged", block_table=tuple(table), cache_seqlens=case.seqlens_k, page_size=size)
        keywords = {"block_table": torch.tensor(table, **int32), "cache_seqlens": torch.tensor(case.seqlens_k, **int32)}
    return Inputs(q=q, k=k, v=v, dout=dout, seed=seed, packing=packing, layout_keywords=keywords)


def make_inputs(case: Case, device: str, seed: int) -> Inputs:
    """q, k, v and an output gradient for ``case`` on ``device``, drawn from ``seed``."""
    import torch

    if case.kind != "dense":
        inputs = _packed_inputs(case, device, seed)
        _draw_variant_inputs(case, inputs, device, torch.Generator(device=device).manual_seed(seed + 1))
        return inputs
    fp8 = is_fp8(case.dtype)
    dtype = getattr(torch, FP8_OUTPUT_DTYPE if fp8 else case.dtype)
    generator = torch.Generator(device=device).manual_seed(seed)

    def draw(heads: int, seqlen: int, multiplier: float, head_dim: int = case.head_dim, *,
             to_dtype: bool = True) -> "torch.Tensor":
        shape = (case.batch, seqlen, heads, head_dim) if case.layout == "bshd" else (case.batch, heads, seqlen, head_dim)
        values = torch.randn(shape, generator=generator, device=device, dtype=torch.float32) * multiplier
        if to_dtype:
            values = values.to(dtype)
        return values.transpose(1, 2) if case.layout == "bshd" else values

    q = draw(case.heads_q, case.seqlen_q, case.logit_scale, to_dtype=not fp8)
    k = draw(case.heads_kv, case.seqlen_k, case.logit_scale, to_dtype=not fp8)
    v = draw(case.heads_kv, case.seqlen_k, 1.0, case.value_dim, to_dtype=not fp8)
    dout = draw(case.heads_q, case.seqlen_q, 1.0, case.value_dim)
    inputs = Inputs(q=q, k=k, v=v, dout=dout, seed=seed)
    if fp8:
        fp8_dtype = getattr(torch, case.dtype)
        inputs.q, inputs.q_descale = _quantize(q, fp8_dtype, case.heads_kv)
        inputs.k, inputs.k_descale = _quantize(k, fp8_dtype, case.heads_kv)
        inputs.v, inputs.v_descale = _quantize(v, fp8_dtype, case.heads_kv)
    # Drawn after the dense inputs, so a variant case's q, k, v equal those of the dense case it varies.
    _draw_variant_inputs(case, inputs, device, generator)
    return inputs


def _draw_variant_inputs(case: Case, inputs: Inputs, device: str, generator: "torch.Generator") -> None:
    """ALiBi slopes, sink logits and the LSE's upstream gradient, where the case uses them."""
    import torch

    if case.alibi:
        inputs.alibi_slopes = torch.rand(case.heads_q, generator=generator, device=device) * 0.3
    if case.sinks:
        inputs.sinks = torch.randn(case.heads_q, generator=generator, device=device) + math.log(case.seqlen_k)
    if case.return_lse:
        dlse = torch.randn(expected_shapes(case)[1], generator=generator, device=device)
        if not case.sinks:
            dlse = dlse * lse_rows_with_a_key(case, device)
        elif case.kind == "varlen":
            dlse[:, case.total_q:] = 0  # unused rows
        inputs.dlse = dlse


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
    if inputs.layout_keywords:
        keywords.update(inputs.layout_keywords)
    if is_fp8(case.dtype):
        keywords.update(q_descale=inputs.q_descale, k_descale=inputs.k_descale, v_descale=inputs.v_descale)
    return keywords


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
