"""Attention kernels with one common bug each, for the diagnosis's tests (tests/suites/test_diagnosis.py).

Each is written the way the bug is written in practice: torch's SDPA with ``is_causal``, or
:func:`eager`, a plain float32 attention of its own (explicit scores, masks and softmax; it does
not call the oracle, so a kernel and the diagnosis's references are computed independently), with
the bug planted. ``fake_dist`` copies this file into a fake distribution; it is also imported
directly by the tests that call the worker's check in-process.
"""

import math

import torch
import torch.nn.functional as F

from pytest_attnkit import AttentionImpl


def sdpa_is_causal(q, k, v, *, causal=False, scale=None):
    """The obvious kernel: torch SDPA's is_causal aligns the mask top-left where Nq != Nk."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale,
                                          enable_gqa=q.shape[1] != k.shape[1])


def eager(q, k, v, *, causal=False, scale=None, window=None, softcap=0.0, alibi_slopes=None, sinks=None,
          top_left=False, kv_heads="interleave", softcap_first=False, lse_base_2=False, lse_sinks=True,
          keys_kept=None, keyless_nan=False):
    """Plain attention in float32 on [B, H, N, D] tensors: (out, lse), out in q's dtype. The
    keywords after ``sinks`` plant the bugs (their defaults are right)."""
    dtype = q.dtype
    q, k, v = q.float(), k.float(), v.float()
    n_q, n_k, heads_q, heads_kv = q.shape[-2], k.shape[-2], q.shape[1], k.shape[1]
    if heads_q != heads_kv:
        group = heads_q // heads_kv
        if kv_heads == "interleave":
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        else:  # the bug: query head h reads kv head h % heads_kv
            k, v = k.repeat(1, group, 1, 1), v.repeat(1, group, 1, 1)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = q @ k.transpose(-1, -2)
    if softcap and softcap_first:
        scores = softcap * torch.tanh(scores / softcap) * scale
    else:
        scores = scores * scale
        if softcap:
            scores = softcap * torch.tanh(scores / softcap)
    i = torch.arange(n_q, device=q.device)[:, None]
    j = torch.arange(n_k, device=q.device)[None, :]
    diagonal = i if top_left else i + (n_k - n_q)
    if alibi_slopes is not None:
        scores = scores - alibi_slopes.float()[:, None, None] * (diagonal - j).abs()
    visible = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device)
    if causal:
        visible &= j <= diagonal
    if window is not None:
        left, right = window
        if left >= 0:
            visible &= j >= diagonal - left
        if right >= 0:
            visible &= j <= diagonal + right
    if keys_kept is not None:
        visible &= j < keys_kept
    scores = scores.masked_fill(~visible, -math.inf)
    if sinks is not None:
        column = sinks.float()[None, :, None, None].expand(*scores.shape[:-1], 1)
        full = torch.cat([scores, column], dim=-1)
        lse = torch.logsumexp(full, dim=-1)
        probs = torch.softmax(full, dim=-1)[..., :-1]
        if not lse_sinks:
            lse = torch.logsumexp(scores, dim=-1)
    elif keyless_nan:  # the bug: a row that sees no key is softmax over -inf alone, 0 / 0
        probs = torch.softmax(scores, dim=-1)
        lse = torch.logsumexp(scores, dim=-1)
    else:
        seen = visible.any(dim=-1)
        scores = scores.masked_fill(~seen[:, None], 0.0)
        probs = torch.softmax(scores, dim=-1) * seen[:, None]
        lse = torch.logsumexp(scores, dim=-1) * seen
    lse = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    if lse_base_2:
        lse = lse / math.log(2.0)
    return (probs @ v).to(dtype), lse


class Planted(AttentionImpl):
    """:func:`eager` on every variant and layout, with the keywords of ``bug`` planted; an
    ``out_bug`` alters the output after the fact (rows left zero). Right when both are empty."""

    supports_window = supports_softcap = supports_alibi = supports_sinks = supports_lse = True
    supports_varlen = supports_paged_kv = supports_paged_kv_backward = True
    memory_class = None
    bug = {}

    def out_bug(self, out):
        return out

    def dense(self, q, k, v, **options):
        return eager(q, k, v, **options, **self.bug)

    def forward(self, q, k, v, *, causal=False, scale=None, window_size=None, softcap=0.0, alibi_slopes=None,
                sinks=None, return_lse=False, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
                max_seqlen_k=None, block_table=None, cache_seqlens=None):
        window = None if window_size is None else tuple(window_size)
        options = dict(causal=causal, scale=scale, window=window, softcap=softcap, alibi_slopes=alibi_slopes,
                       sinks=sinks)
        if cu_seqlens_q is not None:
            out, lse = self.varlen(q, k, v, cu_seqlens_q.tolist(), cu_seqlens_k.tolist(), options)
        elif block_table is not None:
            out, lse = self.paged(q, k, v, block_table.tolist(), cache_seqlens.tolist(), options)
        else:
            out, lse = self.dense(q, k, v, **options)
            out = self.out_bug(out)
        return (out, lse) if return_lse else out

    def varlen(self, q, k, v, cu_q, cu_k, options):
        outs = [torch.zeros(q.shape[0], q.shape[1], v.shape[-1], dtype=q.dtype, device=q.device)]
        lses = [torch.zeros(q.shape[1], q.shape[0], device=q.device)]
        pieces_out, pieces_lse = [], []
        for b in range(len(cu_q) - 1):
            rows_q, rows_k = slice(cu_q[b], cu_q[b + 1]), self.key_rows(cu_q, cu_k, b)
            if cu_q[b + 1] == cu_q[b]:
                continue
            if rows_k.stop == rows_k.start:
                pieces_out.append(torch.zeros(cu_q[b + 1] - cu_q[b], q.shape[1], v.shape[-1], dtype=q.dtype))
                pieces_lse.append(torch.zeros(q.shape[1], cu_q[b + 1] - cu_q[b]) if options["sinks"] is None
                                  else options["sinks"].float()[:, None].expand(-1, cu_q[b + 1] - cu_q[b]))
                continue
            out, lse = self.dense(q[rows_q].transpose(0, 1)[None], k[rows_k].transpose(0, 1)[None],
                                  v[rows_k].transpose(0, 1)[None], **options)
            pieces_out.append(out[0].transpose(0, 1))
            pieces_lse.append(lse[0])
        unused = q.shape[0] - cu_q[-1]
        out = torch.cat(pieces_out + [outs[0][:unused]])
        lse = torch.cat(pieces_lse + [lses[0][:, :unused]], dim=1)
        return out, lse

    def key_rows(self, cu_q, cu_k, b):
        return slice(cu_k[b], cu_k[b + 1])

    def pages(self, block_table, lengths, b, size):
        return block_table[b][:-(-lengths[b] // size)]

    def paged(self, q, k, v, block_table, lengths, options):
        size = k.shape[1]
        outs, lses = [], []
        for b in range(q.shape[0]):
            pages = torch.tensor(self.pages(block_table, lengths, b, size), dtype=torch.long)
            keys = k[pages].reshape(-1, *k.shape[2:])[:lengths[b]]
            values = v[pages].reshape(-1, *v.shape[2:])[:lengths[b]]
            out, lse = self.dense(q[b].transpose(0, 1)[None], keys.transpose(0, 1)[None],
                                  values.transpose(0, 1)[None], **options)
            outs.append(out[0].transpose(0, 1))
            lses.append(lse[0])
        return torch.stack(outs), torch.stack(lses)


class Correct(Planted):
    """No bug: must pass, with no diagnosis."""


class Perturbed(Planted):
    """Right, plus seeded random noise (5% of the output's mean magnitude): wrong in a way no
    suspect explains."""

    def out_bug(self, out):
        noise = torch.randn(out.shape, generator=torch.Generator().manual_seed(0)).to(out.dtype)
        return out + 0.05 * noise * out.detach().abs().mean()


class CausalMissing(Planted):
    def dense(self, q, k, v, **options):
        return eager(q, k, v, **{**options, "causal": False})


class CausalUnasked(Planted):
    def dense(self, q, k, v, **options):
        return eager(q, k, v, **{**options, "causal": True})


class ScaleOne(Planted):
    bug = {"scale": 1.0}

    def dense(self, q, k, v, **options):
        return eager(q, k, v, **{**options, **self.bug})


class ScaleTwice(Planted):
    """Scales q by 1/sqrt(d) and then lets the scores be scaled again."""

    def dense(self, q, k, v, **options):
        return eager(q * (1.0 / math.sqrt(q.shape[-1])), k, v, **options)


class GqaModulo(Planted):
    bug = {"kv_heads": "repeat"}


class _WindowShifted(Planted):
    """Moves side ``side`` (0 left, 1 right) of a bounded window by ``step`` keys."""

    side, step = 0, 0

    def dense(self, q, k, v, **options):
        window = options["window"]
        if window is not None and window[self.side] >= 0 and window[self.side] + self.step >= 0:
            moved = list(window)
            moved[self.side] += self.step
            options["window"] = tuple(moved)
        return eager(q, k, v, **options)


class WindowLeftWider(_WindowShifted):
    side, step = 0, 1


class WindowLeftNarrower(_WindowShifted):
    side, step = 0, -1


class WindowRightWider(_WindowShifted):
    side, step = 1, 1


class WindowRightNarrower(_WindowShifted):
    side, step = 1, -1


class SoftcapFirst(Planted):
    bug = {"softcap_first": True}


class LseBase2(Planted):
    bug = {"lse_base_2": True}


class LseWithoutSinks(Planted):
    bug = {"lse_sinks": False}


class SinksIgnored(Planted):
    def dense(self, q, k, v, **options):
        sinks = options.pop("sinks")
        out, lse = eager(q, k, v, **options)
        return (out + 0 * sinks.sum()).to(q.dtype) if sinks is not None else out, lse


class VarlenNeighbourKeys(Planted):
    def key_rows(self, cu_q, cu_k, b):
        return slice(cu_q[b], cu_q[b + 1])


class PagedInPageOrder(Planted):
    def pages(self, block_table, lengths, b, size):
        start = sum(-(-length // size) for length in lengths[:b])
        return list(range(start, start - (-lengths[b] // size)))


class KeysTail64(Planted):
    """Loops over whole tiles of 64 keys only."""

    def dense(self, q, k, v, **options):
        return eager(q, k, v, **options, keys_kept=k.shape[-2] // 64 * 64)


class KeylessRowsNaN(Planted):
    """Softmax over the masked scores as they are: a query row that sees no key (causal with
    Nq > Nk) divides 0 by 0 and comes out NaN; every other row is right."""

    bug = {"keyless_nan": True}


class NaNOnARowWithKeys(Planted):
    """Right everywhere but one element of the last query row, which sees keys whatever the mask:
    NaN."""

    def out_bug(self, out):
        out = out.clone()
        out[..., -1, 0] = float("nan")
        return out


class QueriesTail64(Planted):
    """Writes whole tiles of 64 query rows only; the output buffer starts as zeros."""

    def out_bug(self, out):
        kept = torch.arange(out.shape[-2]) < out.shape[-2] // 64 * 64
        return out * kept[:, None].to(out.dtype)


class RowsSkipped(Planted):
    """Leaves query rows 16 to 31 of every head zero (a grid that skips one program)."""

    def out_bug(self, out):
        kept = (torch.arange(out.shape[-2]) < 16) | (torch.arange(out.shape[-2]) >= 32)
        return out * kept[:, None].to(out.dtype)
