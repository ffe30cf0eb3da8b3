"""Varlen packed sequences and paged KV caches: each rule fed a broken implementation that it must
catch, a correct one that must pass, and the oracle, the inputs and the counts checked by hand.

The implementations live in a fake module (``layout_kernels``) registered through a fake
distribution, as in test_variants.py: ``Reference`` is plain torch in float32, one sequence at a
time, and declares both layouts and every variant; each other class is ``Reference`` with the one
fault kernel authors fear most in these layouts. One inner run holds them all, on the smoke cases.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from helpers import fake, only, run_attnkit
from pytest_attnkit.cases import correctness_cases, memory_layout_sweep, speed_cases
from pytest_attnkit.contract import AttentionImpl, Case
from pytest_attnkit.counts import byte_count, flop_count
from pytest_attnkit.oracle import attention_math, forward_and_grads
from pytest_attnkit.worker.inputs import make_inputs

LAYOUT_KERNELS = '''
import torch
from pytest_attnkit import AttentionImpl
from pytest_attnkit.oracle import attention_math


def attend(q, k, v, **options):
    """Dense attention on one sequence's [N, H, D] rows, in float32, back in that layout."""
    if k.shape[0] == 0:
        out = q.new_zeros(q.shape[0], q.shape[1], v.shape[-1])
        lse = q.new_zeros(q.shape[1], q.shape[0], dtype=torch.float32)
        sinks = options.get("sinks")
        return (out, lse if sinks is None else sinks[:, None].expand_as(lse).float())
    out, lse = attention_math(q.float().transpose(0, 1)[None], k.float().transpose(0, 1)[None],
                              v.float().transpose(0, 1)[None], return_lse=True, **options)
    return out[0].transpose(0, 1).to(q.dtype), lse[0].float()


class Reference(AttentionImpl):
    """Plain attention sequence by sequence: correct within the rule on every layout."""
    supports_window = supports_softcap = supports_alibi = supports_sinks = supports_lse = True
    supports_varlen = supports_paged_kv = supports_paged_kv_backward = True
    head_dims_v = range(1, 1025)

    def forward(self, q, k, v, *, causal=False, scale=None, window_size=None, softcap=0.0, alibi_slopes=None,
                sinks=None, return_lse=False, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
                max_seqlen_k=None, block_table=None, cache_seqlens=None):
        options = dict(causal=causal, scale=scale, window=window_size, softcap=softcap, alibi_slopes=alibi_slopes,
                       sinks=sinks)
        if block_table is not None:
            outs, lses = [], []
            for b, length in enumerate(cache_seqlens.tolist()):
                keys, values = self.cache_rows(k, v, block_table[b], length)
                out, lse = attend(q[b], keys, values, **options)
                outs.append(out)
                lses.append(lse)
            out, lse = torch.stack(outs), torch.stack(lses)
        else:
            outs, lses = [], []
            for (q0, q1), (k0, k1) in self.sequences(cu_seqlens_q.tolist(), cu_seqlens_k.tolist(), k.shape[0]):
                out, lse = attend(q[q0:q1], k[k0:k1], v[k0:k1], **options)
                outs.append(out)
                lses.append(lse)
            unused = q.shape[0] - cu_seqlens_q[-1].item()
            out = torch.cat(outs + [q.new_zeros(unused, q.shape[1], v.shape[-1])])
            lse = torch.cat(lses + [q.new_zeros(q.shape[1], unused, dtype=torch.float32)], dim=1)
        return (out, lse) if return_lse else out

    def sequences(self, cu_q, cu_k, rows_k):
        return [((cu_q[b], cu_q[b + 1]), (cu_k[b], cu_k[b + 1])) for b in range(len(cu_q) - 1)]

    def cache_rows(self, k, v, table_row, length):
        pages = table_row[: -(-length // k.shape[1])].long()
        return k[pages].flatten(0, 1)[:length], v[pages].flatten(0, 1)[:length]


class SeesOtherSequences(Reference):
    """Ignores cu_seqlens: the packed tokens are one long sequence."""
    def sequences(self, cu_q, cu_k, rows_k):
        return [((0, cu_q[-1]), (0, cu_k[-1]))] + [((q, q), (0, 0)) for q in [cu_q[-1]] * (len(cu_q) - 2)]


class CuSeqlensOffByOne(Reference):
    """Reads each sequence's keys one row late."""
    def sequences(self, cu_q, cu_k, rows_k):
        return [((q0, q1), (min(k0 + 1, rows_k), min(k1 + 1, rows_k))) for (q0, q1), (k0, k1)
                in super().sequences(cu_q, cu_k, rows_k)]


class ZeroLengthReadsOne(Reference):
    """A sequence without keys reads one key anyway (a loop written do-while)."""
    def sequences(self, cu_q, cu_k, rows_k):
        return [((q0, q1), (k0, max(k1, k0 + 1))) for (q0, q1), (k0, k1) in super().sequences(cu_q, cu_k, rows_k)]


class ReadsUnusedTokens(Reference):
    """The last sequence's keys run to the end of the packed tensor, over the unused tokens."""
    def sequences(self, cu_q, cu_k, rows_k):
        spans = super().sequences(cu_q, cu_k, rows_k)
        (q0, q1), (k0, _) = spans[-1]
        return spans[:-1] + [((q0, q1), (k0, rows_k))]


class PagesInOrder(Reference):
    """Takes each sequence's pages to be the next ones in the cache, ignoring the block table."""
    def forward(self, q, k, v, *, block_table=None, cache_seqlens=None, **variants):
        if block_table is not None:
            counts = [-(-n // k.shape[1]) for n in cache_seqlens.tolist()]
            starts = [sum(counts[:b]) for b in range(len(counts))]
            width = max(max(counts), 1)
            in_order = [[(start + i) % k.shape[0] for i in range(width)] for start in starts]
            block_table = torch.tensor(in_order, dtype=torch.int32, device=k.device)
        return super().forward(q, k, v, block_table=block_table, cache_seqlens=cache_seqlens, **variants)


class IgnoresCacheLength(Reference):
    """Reads every slot of every page in its block-table row, past the cache length."""
    def cache_rows(self, k, v, table_row, length):
        pages = table_row.long()
        return k[pages].flatten(0, 1), v[pages].flatten(0, 1)


class CausalFromCacheStart(Reference):
    """Aligns a paged causal mask to the start of the cache (query i sees keys 0..i)."""
    def forward(self, q, k, v, *, causal=False, block_table=None, cache_seqlens=None, **variants):
        if block_table is None or not causal:
            return super().forward(q, k, v, causal=causal, block_table=block_table, cache_seqlens=cache_seqlens,
                                   **variants)
        outs = []
        for b, length in enumerate(cache_seqlens.tolist()):
            keys, values = self.cache_rows(k, v, block_table[b], length)
            n_q, n_k = q.shape[1], keys.shape[0]
            visible = torch.arange(n_k)[None, :] <= torch.arange(n_q)[:, None]
            group = q.shape[2] // k.shape[2]
            kk = keys.float().repeat_interleave(group, 1).transpose(0, 1)
            vv = values.float().repeat_interleave(group, 1).transpose(0, 1)
            s = q[b].float().transpose(0, 1) @ kk.transpose(-1, -2) / q.shape[-1] ** 0.5
            outs.append((s.masked_fill(~visible, float("-inf")).softmax(-1) @ vv).transpose(0, 1).to(q.dtype))
        return torch.stack(outs)


class KeysBoundByMaxSeqlenQ(Reference):
    """Sizes each sequence's key loop from max_seqlen_q (max_seqlen_q and max_seqlen_k swapped)."""
    def forward(self, q, k, v, *, max_seqlen_q=None, **variants):
        self.bound = max_seqlen_q
        return super().forward(q, k, v, max_seqlen_q=max_seqlen_q, **variants)

    def sequences(self, cu_q, cu_k, rows_k):
        return [((q0, q1), (k0, min(k1, k0 + self.bound))) for (q0, q1), (k0, k1)
                in super().sequences(cu_q, cu_k, rows_k)]


class TableWidthAssumed(Reference):
    """Takes the block table's row length to be the pages the longest sequence needs."""
    def forward(self, q, k, v, *, block_table=None, cache_seqlens=None, **variants):
        if block_table is not None:
            width = -(-max(cache_seqlens.tolist()) // k.shape[1])
            flat = block_table.flatten()
            block_table = torch.stack([flat[b * width:(b + 1) * width] for b in range(block_table.shape[0])])
        return super().forward(q, k, v, block_table=block_table, cache_seqlens=cache_seqlens, **variants)


class ForwardOnlyPaged(Reference):
    supports_paged_kv_backward = False
'''

V_ZERO = "b5-h4:2-q113-k113-d64-fp16-causal-varlen-t171:171-u5-9ff7"
V_LONG = "b6-h2-q300-k300-d64-fp32-varlen-t371:410-f3e9"
V_UNEVEN = "b3-h2-q513-k1000-d32-fp16-causal-varlen-t560:1120-737e"
V_VARIANTS = "b3-h4:2-q100-k100-d64-fp16-causal-w16:0-cap20-alibi-varlen-t197:197-cc6d"
V_SINKS = "b3-h4:2-q100-k100-d64-fp16-causal-sinks-lse-varlen-t165:181-5939"
P_DECODE = "b4-h4:1-q1-k300-d64-fp16-paged16-t382-e497"
P_PREFILL = "b3-h4:2-q33-k300-d64-fp32-causal-paged1-t433-e3df"
P_CAP = "b3-h4-q1-k700-d128-fp16-cap30-paged256-t961-1f28"
P_WINDOW = "b4-h4:2-q20-k200-d64-fp16-causal-w32:0-paged64-t400-a572"
VARLEN = (V_ZERO, V_LONG, V_UNEVEN, V_VARIANTS, V_SINKS)
PAGED = (P_DECODE, P_PREFILL, P_CAP, P_WINDOW)

FAULTS = {
    # implementation: the cases it must fail on (forward)
    "SeesOtherSequences": (V_ZERO, V_LONG, V_UNEVEN, V_VARIANTS, V_SINKS),
    "CuSeqlensOffByOne": (V_ZERO, V_LONG, V_VARIANTS, V_SINKS),
    "ZeroLengthReadsOne": (V_LONG,),
    "ReadsUnusedTokens": (V_ZERO,),
    "PagesInOrder": PAGED,
    "IgnoresCacheLength": PAGED,
    "CausalFromCacheStart": (P_PREFILL, P_WINDOW),
    "KeysBoundByMaxSeqlenQ": (V_UNEVEN,),
    "TableWidthAssumed": PAGED,
}


def _register(fake_dist, names) -> None:
    fake_dist({name: f"layout_kernels:{name}" for name in names} | {"good": fake("good")},
              extra_modules={"layout_kernels": LAYOUT_KERNELS})


def test_the_smoke_set_holds_these_cases() -> None:
    ids = {case.id for case in correctness_cases("smoke")}
    assert set(VARLEN + PAGED) <= ids, sorted(set(VARLEN + PAGED) - ids)


def test_each_layout_rule_catches_its_fault(pytester: pytest.Pytester, fake_dist) -> None:
    names = ["Reference", *FAULTS]
    _register(fake_dist, names)
    outcomes, _ = run_attnkit(pytester, "--attnkit-impl", ",".join(names), "--attnkit-suite", "correctness",
                              "-k", only("test_forward", {"Reference": VARLEN + PAGED, **FAULTS}))
    for case in VARLEN + PAGED:
        outcome = outcomes[f"test_forward[Reference-{case}]"]
        assert outcome.outcome == "passed", f"Reference on {case}: {outcome.text}"
    for name, failing in FAULTS.items():
        for case in failing:
            outcome = outcomes[f"test_forward[{name}-{case}]"]
            assert outcome.outcome == "failed", f"{name} on {case} was not caught"
            assert "out: max error" in outcome.text, f"{name} on {case}: {outcome.text}"


def test_backward_through_both_layouts(pytester: pytest.Pytester, fake_dist) -> None:
    names = ["Reference", "CuSeqlensOffByOne", "ForwardOnlyPaged"]
    _register(fake_dist, names)
    outcomes, _ = run_attnkit(pytester, "--attnkit-impl", ",".join(names), "--attnkit-suite", "correctness",
                              "-k", only("test_backward", {"Reference": (V_ZERO, V_LONG, V_SINKS, P_PREFILL),
                                                           "CuSeqlensOffByOne": (V_LONG,),
                                                           "ForwardOnlyPaged": (P_PREFILL,)}))
    for case in (V_ZERO, V_LONG, V_SINKS, P_PREFILL):
        outcome = outcomes[f"test_backward[Reference-{case}]"]
        assert outcome.outcome == "passed", f"Reference backward on {case}: {outcome.text}"
    shifted = outcomes[f"test_backward[CuSeqlensOffByOne-{V_LONG}]"]
    assert shifted.outcome == "failed" and "dk: max error" in shifted.text, shifted.text
    skipped = outcomes[f"test_backward[ForwardOnlyPaged-{P_PREFILL}]"]
    assert skipped.outcome == "skipped" and "backward through a paged KV cache is not supported" in skipped.text


def test_undeclared_layouts_are_skipped_in_words(pytester: pytest.Pytester, fake_dist) -> None:
    _register(fake_dist, [])
    outcomes, _ = run_attnkit(pytester, "--attnkit-impl", "good", "--attnkit-suite", "correctness",
                              "-k", f"test_forward and ({V_LONG} or {P_DECODE})")
    assert "varlen (packed sequences with cu_seqlens) is not supported" in outcomes[f"test_forward[good-{V_LONG}]"].text
    assert "a paged KV cache (block_table) is not supported" in outcomes[f"test_forward[good-{P_DECODE}]"].text


# -- the contract's data, the inputs and the oracle, without a worker ---------------------------

def test_case_ids_round_trip_and_validation() -> None:
    case = Case.packed((0, 5, 9), (3, 0, 9), 4, 2, 32, causal=True, unused_tokens=2)
    assert (case.batch, case.seqlen_q, case.seqlen_k, case.total_q, case.total_k) == (3, 9, 9, 14, 12)
    assert case.kind == "varlen" and "-varlen-t14:12-u2-" in case.id
    assert Case.from_dict(json.loads(json.dumps(case.to_dict()))) == case
    paged = Case.paged(2, (100, 7), 16, 4, 4, 64)
    assert paged.kind == "paged" and paged.seqlen_k == 100 and "-paged16-t107-" in paged.id
    assert Case.from_dict(json.loads(json.dumps(paged.to_dict()))) == paged
    assert Case.paged(2, (100, 8), 16, 4, 4, 64).id != paged.id  # the checksum tells the lengths apart
    for bad in (dict(seqlens_q=(3,), seqlens_k=None), dict(seqlens_q=(3, -1), seqlens_k=(3, 1)),
                dict(unused_tokens=3), dict(seqlens_q=(3,), seqlens_k=(3,), layout="bshd"),
                dict(seqlens_q=(3,), seqlens_k=(3,), dtype="float8_e4m3fn")):
        with pytest.raises(ValueError):
            Case(1, 1, 1, 3, 3, 64, **bad)
    with pytest.raises(ValueError, match="longest"):
        Case(2, 1, 1, 5, 3, 64, seqlens_q=(3, 1), seqlens_k=(3, 2))
    # No sequence with both queries and keys: the output would depend on no input.
    for degenerate in (lambda: Case.packed((0, 3), (5, 0), 2, 2, 8), lambda: Case.paged(2, (0, 0), 4, 2, 2, 8)):
        with pytest.raises(ValueError, match="both queries and keys"):
            degenerate()


def test_declarations_refuse_in_words() -> None:
    class PagedSixteen(AttentionImpl):
        supports_paged_kv = True
        page_sizes = (16,)

    impl = PagedSixteen()
    assert impl.not_supported_reasons(Case.paged(1, (40,), 16, 2, 2, 64), "cpu") == []
    assert impl.not_supported_reasons(Case.paged(1, (40,), 64, 2, 2, 64), "cpu") == ["page_size=64 (supported: 16)"]
    assert "backward through a paged KV cache" in impl.not_supported_reasons(
        Case.paged(1, (40,), 16, 2, 2, 64), "cpu", backward=True)[0]
    assert impl.capabilities()["page_sizes"] == "16" and impl.capabilities()["varlen"] is False


def test_paged_inputs_shuffle_pages_and_keep_spares() -> None:
    case = Case.paged(3, (40, 17, 1), 8, 2, 2, 16, "float32")
    inputs = make_inputs(case, "cpu", 7)
    table, lengths = inputs.layout_keywords["block_table"], inputs.layout_keywords["cache_seqlens"]
    assert lengths.tolist() == [40, 17, 1] and table.dtype == torch.int32
    pages = inputs.k.shape[0]
    used = [table[b, : -(-n // 8)].tolist() for b, n in enumerate((40, 17, 1))]
    flat = [page for row in used for page in row]
    assert len(set(flat)) == len(flat) == 5 + 3 + 1 and pages > len(flat)  # distinct pages, and spares
    assert table.shape == (3, 5 + 2)  # wider than the longest sequence needs
    assert flat != sorted(flat)  # not in order
    assert inputs.q.shape == (3, 3, 2, 16) and inputs.k.shape == (pages, 8, 2, 16)
    assert make_inputs(case, "cpu", 7).layout_keywords["block_table"].tolist() == table.tolist()  # seeded


def test_varlen_unused_rows_hold_values_and_no_gradient() -> None:
    case = Case.packed((3, 0, 4), (5, 2, 0), 2, 2, 8, "float32", unused_tokens=3)
    inputs = make_inputs(case, "cpu", 1)
    assert inputs.layout_keywords["cu_seqlens_q"].tolist() == [0, 3, 3, 7]
    assert inputs.layout_keywords["cu_seqlens_k"].tolist() == [0, 5, 7, 7]
    assert inputs.q.shape == (10, 2, 8) and inputs.k.shape == (10, 2, 8)
    assert bool(inputs.k[7:].abs().sum() > 0)  # unused keys are not zeros: reading them shows
    assert bool((inputs.dout[7:] == 0).all())


def test_packed_oracle_is_each_sequence_alone() -> None:
    case = Case.packed((3, 0, 4, 2), (5, 2, 6, 0), 4, 2, 8, "float32", causal=True, unused_tokens=2)
    inputs = make_inputs(case, "cpu", 3)
    refs = forward_and_grads(inputs.q, inputs.k, inputs.v, inputs.dout, causal=True, float64=True,
                             packing=inputs.packing, return_lse=True)
    q, k, v = (t.double() for t in (inputs.q, inputs.k, inputs.v))
    # Sequence 2 (rows 3..6, keys 7..12) on its own, bottom-right causal within it.
    alone, lse = attention_math(q[3:7].transpose(0, 1)[None], k[7:13].transpose(0, 1)[None],
                                v[7:13].transpose(0, 1)[None], causal=True, return_lse=True)
    assert torch.allclose(refs["out"][3:7], alone[0].transpose(0, 1))
    assert torch.allclose(refs["lse"][:, 3:7], lse[0])
    assert bool((refs["out"][7:] == 0).all())  # sequence 3 has no keys; then the unused rows
    assert refs["dk"].shape == inputs.k.shape and bool((refs["dk"][13:] == 0).all())


def test_paged_oracle_reads_through_the_block_table() -> None:
    case = Case.paged(2, (11, 3), 4, 2, 1, 8, "float32", causal=True)
    inputs = make_inputs(case, "cpu", 5)
    refs = forward_and_grads(inputs.q, inputs.k, inputs.v, None, causal=True, float64=True, packing=inputs.packing)
    table = inputs.layout_keys = inputs.layout_keywords["block_table"]
    keys = inputs.k.double()[table[0, :3].long()].flatten(0, 1)[:11]
    values = inputs.v.double()[table[0, :3].long()].flatten(0, 1)[:11]
    q = inputs.q.double()[0]  # [Nq, Hq, D]
    scores = torch.einsum("qhd,kd->hqk", q, keys[:, 0]) / math.sqrt(8)
    visible = torch.arange(11)[None, :] <= torch.arange(2)[:, None] + 11 - 2  # aligned to the cache's end
    expected = torch.einsum("hqk,kd->qhd", scores.masked_fill(~visible, -math.inf).softmax(-1), values[:, 0])
    assert torch.allclose(refs["out"][0], expected)


def test_layout_counts_use_the_actual_lengths() -> None:
    case = Case.packed((100, 0, 28), (100, 5, 28), 2, 2, 64, "bfloat16")
    assert flop_count(case, "forward") == 2 * 2 * 128 * (100 * 100 + 0 + 28 * 28)
    causal = Case.packed((100, 28), (100, 28), 2, 2, 64, "bfloat16", causal=True)
    assert flop_count(causal, "forward") == 2 * 2 * 128 * (100 * 100 // 2 + 28 * 28 // 2)
    paged = Case.paged(1, (33, 16), 16, 8, 2, 128, "bfloat16")
    # Pages read whole: 3 + 1 pages of 16 tokens, K and V, 2 kv heads of 128 bf16 values.
    assert byte_count(paged, "forward") == 2 * (3 + 1) * 16 * 2 * 128 * 2 + 2 * (2 * 8 * 128 * 2)
    mixed = [case for mode, case in speed_cases("default") if case.kind == "varlen"][0]
    assert mixed.total_q == 16384 and min(mixed.seqlens_q) == 128 and max(mixed.seqlens_q) == 8192


def test_layout_memory_sweeps_grow_tokens_not_the_longest_squared() -> None:
    for layout in ("varlen", "paged"):
        sweep = memory_layout_sweep("default", layout)
        cases = [sweep.case(n) for n in sweep.seqlens]
        assert [case.sweep_length for case in cases] == list(sweep.seqlens)
        longest = [max(length for _, length in case.sequences) for case in cases]
        padded = [case.batch * max(length for _, length in case.sequences) for case in cases]
        ratio = sweep.seqlens[-1] / sweep.seqlens[0]
        assert longest[-1] ** 2 / longest[0] ** 2 == pytest.approx(ratio**2)
        assert padded[-1] / padded[0] > ratio**1.8  # the batch times the longest grows as N^2 too
