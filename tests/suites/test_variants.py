"""The variants (window, softcap, ALiBi, sinks, the LSE, V head dims): each rule fed a broken
implementation that it must catch, a correct one that must pass, and the oracle checked by hand.

The implementations live in a fake module (``variant_kernels``) registered through a fake
distribution, as in test_rules.py: ``reference`` is plain torch in float32 that declares every
variant; each other class is ``reference`` with one fault. One inner run holds them all, on a few
smoke cases selected with -k.
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from helpers import fake, only, run_attnkit
from pytest_attnkit.contract import AttentionImpl, Case, FunctionImpl
from pytest_attnkit.counts import flop_count, visible_pairs
from pytest_attnkit.oracle import attention_math, forward_and_grads, visibility_mask
from pytest_attnkit.worker.tolerance import factor_and_extra_floor

VARIANT_KERNELS = '''
import math
import torch
from pytest_attnkit import AttentionImpl
from pytest_attnkit.oracle import attention_math


def scores_and_values(q, k, v, scale=None):
    group = q.shape[1] // k.shape[1]
    k, v = k.float().repeat_interleave(group, 1), v.float().repeat_interleave(group, 1)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    return q.float() @ k.transpose(-1, -2), v, scale


def distances(q, k):
    n_q, n_k = q.shape[-2], k.shape[-2]
    return torch.arange(n_q)[:, None] + n_k - n_q - torch.arange(n_k)[None, :]


class Reference(AttentionImpl):
    """Plain attention in float32 with every variant: correct within the rule."""
    supports_window = supports_softcap = supports_alibi = supports_sinks = supports_lse = True
    head_dims_v = range(1, 1025)
    supports_backward = True

    def forward(self, q, k, v, *, causal=False, scale=None, window_size=None, softcap=0.0, alibi_slopes=None,
                sinks=None, return_lse=False):
        result = attention_math(q.float(), k.float(), v.float(), causal=causal, scale=scale, window=window_size,
                                softcap=softcap, alibi_slopes=alibi_slopes, sinks=sinks, return_lse=return_lse)
        if return_lse:
            return result[0].to(q.dtype), result[1].float()
        return result.to(q.dtype)


class WindowOffByOne(Reference):
    def forward(self, q, k, v, *, window_size=None, **variants):
        left, right = window_size
        return super().forward(q, k, v, window_size=(left + 1, right), **variants)


class WindowIgnoresRight(Reference):
    def forward(self, q, k, v, *, window_size=None, **variants):
        return super().forward(q, k, v, window_size=(window_size[0], -1), **variants)


class SoftcapBeforeScale(Reference):
    def forward(self, q, k, v, *, causal=False, scale=None, softcap=0.0, **variants):
        scores, values, scale = scores_and_values(q, k, v, scale)
        scores = softcap * torch.tanh(scores / softcap) * scale
        if causal:
            scores = scores.masked_fill(distances(q, k) < 0, -math.inf)
        return (scores.softmax(-1) @ values).to(q.dtype)


class AlibiSignFlipped(Reference):
    def forward(self, q, k, v, *, causal=False, scale=None, alibi_slopes=None, **variants):
        scores, values, scale = scores_and_values(q, k, v, scale)
        distance = distances(q, k)
        scores = scores * scale - alibi_slopes[:, None, None] * (-distance)  # j - i: the sign flipped, no |.|
        if causal:
            scores = scores.masked_fill(distance < 0, -math.inf)
        return (scores.softmax(-1) @ values).to(q.dtype)


class SinksIgnored(Reference):
    def forward(self, q, k, v, *, sinks=None, **variants):
        return super().forward(q, k, v, **variants)


class SinksDetached(Reference):
    def forward(self, q, k, v, *, sinks=None, **variants):
        return super().forward(q, k, v, sinks=sinks.detach(), **variants)


class LseInLog2(Reference):
    def forward(self, q, k, v, **variants):
        out, lse = super().forward(q, k, v, **variants)
        return out, lse / math.log(2)


class LseDetached(Reference):
    def forward(self, q, k, v, **variants):
        out, lse = super().forward(q, k, v, **variants)
        return out, lse.detach()


class ScaleFromValueDim(Reference):
    """Takes 1/sqrt(head dim) from V's head dim instead of Q's."""
    def forward(self, q, k, v, *, scale=None, **variants):
        return super().forward(q, k, v, scale=1 / math.sqrt(v.shape[-1]), **variants)


class OutputShapedLikeQ(Reference):
    """Allocates the output with Q's head dim."""
    def forward(self, q, k, v, **variants):
        right = super().forward(q, k, v, **variants)
        out = torch.zeros_like(q)
        out[..., : right.shape[-1]] = right[..., : q.shape[-1]]
        return out
'''

W_CAUSAL = "b1-h2-q113-k113-d64-fp16-causal-w32:0"
W_TWO_SIDED = "b2-h4:2-q113-k203-d64-bf16-w32:16"
CAP = "b2-h4:2-q113-k113-d64-bf16-causal-cap15-x4"
ALIBI = "b1-h4:1-q127-k127-d128-fp16-alibi"
SINKS = "b1-h4:2-q100-k100-d64-bf16-causal-sinks"
LSE = "b1-h2-q64-k64-d64-fp32-lse"
MLA = "b1-h2-q64-k64-d192-dv128-bf16-causal"
EVERYTHING = "b1-h4:2-q257-k257-d64-fp16-causal-w64:0-cap30-alibi-sinks-lse"
CASES = (W_CAUSAL, W_TWO_SIDED, CAP, ALIBI, SINKS, LSE, MLA, EVERYTHING)

FORWARD_FAULTS = {
    # implementation: (cases it must fail on, words the failure must contain)
    "WindowOffByOne": ((W_CAUSAL, W_TWO_SIDED, EVERYTHING), "out: max error"),
    "WindowIgnoresRight": ((W_TWO_SIDED,), "out: max error"),
    "SoftcapBeforeScale": ((CAP,), "3 x plain same-precision error"),  # FA3/FA4's rtol with softcap
    "AlibiSignFlipped": ((ALIBI,), "out: max error"),
    "SinksIgnored": ((SINKS, EVERYTHING), "out: max error"),
    "LseInLog2": ((LSE, EVERYTHING), "lse: max error"),
    "ScaleFromValueDim": ((MLA,), "out: max error"),
    "OutputShapedLikeQ": ((MLA,), "output: returned shape [1, 2, 64, 192] where the contract asks [1, 2, 64, 128]"),
}


def _register(fake_dist, names) -> None:
    fake_dist({name: f"variant_kernels:{name}" for name in names} | {"good": fake("good")},
              extra_modules={"variant_kernels": VARIANT_KERNELS})


def test_each_variant_rule_catches_its_fault(pytester: pytest.Pytester, fake_dist) -> None:
    names = ["Reference", *FORWARD_FAULTS]
    _register(fake_dist, names)
    selected = only("test_forward", {"Reference": CASES} | {name: cases for name, (cases, _) in FORWARD_FAULTS.items()})
    outcomes, _ = run_attnkit(pytester, "--attnkit-impl", ",".join(names), "--attnkit-suite", "correctness",
                              "-k", selected)
    for case in CASES:
        outcome = outcomes[f"test_forward[Reference-{case}]"]
        assert outcome.outcome == "passed", f"Reference on {case}: {outcome.text}"
    for name, (failing_cases, words) in FORWARD_FAULTS.items():
        for case in failing_cases:
            outcome = outcomes[f"test_forward[{name}-{case}]"]
            assert outcome.outcome == "failed", f"{name} on {case} was not caught"
            assert words in outcome.text, f"{name} on {case}: {outcome.text}"


def test_gradients_of_sinks_and_lse(pytester: pytest.Pytester, fake_dist) -> None:
    names = ["Reference", "SinksDetached", "LseDetached", "LseInLog2"]
    _register(fake_dist, names)
    outcomes, _ = run_attnkit(pytester, "--attnkit-impl", ",".join(names), "--attnkit-suite", "correctness",
                              "-k", f"test_backward and ({SINKS} or {LSE} or {EVERYTHING})")
    for case in (SINKS, LSE, EVERYTHING):
        outcome = outcomes[f"test_backward[Reference-{case}]"]
        assert outcome.outcome == "passed", f"Reference backward on {case}: {outcome.text}"
    sinks = outcomes[f"test_backward[SinksDetached-{SINKS}]"]
    assert sinks.outcome == "failed" and "gradient dsinks is missing" in sinks.text, sinks.text
    lse = outcomes[f"test_backward[LseDetached-{LSE}]"]
    assert lse.outcome == "failed" and "the lse is detached from autograd" in lse.text, lse.text
    log2 = outcomes[f"test_backward[LseInLog2-{LSE}]"]
    assert log2.outcome == "failed" and "lse: max error" in log2.text  # its gradient is off too: "dq:"
    assert "dq: max error" in log2.text, log2.text


def test_undeclared_variants_are_skipped_in_words(pytester: pytest.Pytester, fake_dist) -> None:
    _register(fake_dist, [])
    outcomes, _ = run_attnkit(pytester, "--attnkit-impl", "good", "--attnkit-suite", "correctness",
                              "-k", f"test_forward and ({W_CAUSAL} or {MLA} or {EVERYTHING})")
    assert outcomes[f"test_forward[good-{W_CAUSAL}]"].outcome == "skipped"
    assert "sliding window (window_size=(32, 0)) is not supported" in outcomes[f"test_forward[good-{W_CAUSAL}]"].text
    assert "head_dim_v=128 != head_dim=192" in outcomes[f"test_forward[good-{MLA}]"].text
    everything = outcomes[f"test_forward[good-{EVERYTHING}]"].text
    for words in ("softcap", "ALiBi", "sinks", "LSE"):
        assert words in everything, everything


# -- the contract's data, without a worker ------------------------------------------------------

def test_case_ids_and_round_trip() -> None:
    case = Case(1, 4, 2, 257, 257, 192, "bfloat16", causal=True, head_dim_v=128, window=(128, 0), softcap=30,
                alibi=True, sinks=True, return_lse=True)
    assert case.id == "b1-h4:2-q257-k257-d192-dv128-bf16-causal-w128:0-cap30-alibi-sinks-lse"
    assert Case.from_dict(json.loads(json.dumps(case.to_dict()))) == case
    assert case.variants == ("window_size", "softcap", "alibi_slopes", "sinks", "return_lse")
    # Defaults are stored as defaults, so equal problems have equal ids.
    assert Case(1, 1, 1, 8, 8, 64, head_dim_v=64, window=(-1, -1)).id == "b1-h1-q8-k8-d64-fp16"
    assert dataclasses.replace(case, seqlen_q=300, dtype="float16").id.startswith("b1-h4:2-q300-k257-d192-dv128-fp16")
    for bad in ({"window": (-2, 0)}, {"window": (1,)}, {"softcap": -1.0}, {"head_dim_v": 0}):
        with pytest.raises(ValueError):
            Case(1, 1, 1, 8, 8, 64, **bad)


def test_declarations_and_refusals() -> None:
    case = Case(1, 2, 2, 8, 8, 64, window=(4, 0), softcap=5.0, alibi=True, sinks=True, return_lse=True,
                head_dim_v=32)
    reasons = FunctionImpl(lambda *a, **k: None).not_supported_reasons(case, "cpu")
    assert len(reasons) == 6, reasons

    class MlaOnly(AttentionImpl):
        supports_window = supports_softcap = supports_alibi = supports_sinks = supports_lse = True
        head_dims_v = (128,)

    assert MlaOnly().not_supported_reasons(case, "cpu") == ["head_dim_v=32 (supported: 128)"]
    assert MlaOnly().capabilities()["head_dims_v"] == "128"


def test_oracle_masks_follow_flash_attention() -> None:
    for n_q, n_k, causal, window in ((7, 11, True, (2, 0)), (11, 7, False, (1, 3)), (9, 9, True, (-1, 2)),
                                     (5, 9, False, (3, -1))):
        mask = visibility_mask(n_q, n_k, causal=causal, window=window, device="cpu")
        for i in range(n_q):
            for j in range(n_k):
                d = i + n_k - n_q - j  # FA: masked where j > i + Nk - Nq + right or j < i + Nk - Nq - left
                expected = (not causal or d >= 0) and (window[0] < 0 or d <= window[0]) and (window[1] < 0 or d >= -window[1])
                assert bool(mask[i, j]) == expected, (n_q, n_k, causal, window, i, j)


def test_oracle_variants_by_hand() -> None:
    generator = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 2, 5, 8, generator=generator, dtype=torch.float64) for _ in range(2))
    v = torch.randn(1, 2, 5, 3, generator=generator, dtype=torch.float64)  # V head dim 3
    slopes = torch.tensor([0.25, 0.5], dtype=torch.float64)
    sinks = torch.tensor([0.3, -1.0], dtype=torch.float64)
    out, lse = attention_math(q, k, v, causal=False, softcap=2.0, alibi_slopes=slopes, sinks=sinks, return_lse=True)
    scores = q @ k.transpose(-1, -2) / math.sqrt(8)
    scores = 2.0 * torch.tanh(scores / 2.0)  # capped after scaling
    distance = (torch.arange(5)[:, None] - torch.arange(5)[None, :]).abs().double()
    scores = scores - slopes[:, None, None] * distance
    denominator = scores.exp().sum(-1) + sinks[:, None].exp()  # the sink joins the denominator only
    assert torch.allclose(lse, denominator.log())
    assert torch.allclose(out, (scores.exp() / denominator[..., None]) @ v)
    assert out.shape == (1, 2, 5, 3)


def test_oracle_gradients_include_sinks_and_lse() -> None:
    generator = torch.Generator().manual_seed(1)
    q, k, v, dout = (torch.randn(1, 2, 6, 4, generator=generator) for _ in range(4))
    sinks = torch.randn(2, generator=generator)
    dlse = torch.randn(1, 2, 6, generator=generator)
    refs = forward_and_grads(q, k, v, dout, causal=True, float64=True, sinks=sinks, return_lse=True, dlse=dlse)
    assert set(refs) == {"out", "lse", "dq", "dk", "dv", "dsinks"}
    without_dlse = forward_and_grads(q, k, v, dout, causal=True, float64=True, sinks=sinks, return_lse=True)
    assert not torch.allclose(refs["dq"], without_dlse["dq"])  # the LSE's gradient flows into dq


def test_window_flops_count_the_band_only() -> None:
    window = Case(1, 16, 16, 16384, 16384, 128, "bfloat16", causal=True, window=(4096, 0))
    assert visible_pairs(window) == 16384 * 4097 - 4096 * 4097 // 2
    assert flop_count(window, "forward") == 4 * 16 * 128 * visible_pairs(window)
    mla = Case(1, 1, 1, 10, 10, 192, head_dim_v=128)
    assert flop_count(mla, "forward") == 2 * 100 * (192 + 128)


def test_softcap_widens_the_rule_as_flash_attention_3_does() -> None:
    assert factor_and_extra_floor("out") == {"factor": 2.0, "extra_floor": 0.0}
    assert factor_and_extra_floor("out", softcap=30.0) == {"factor": 3.0, "extra_floor": 0.0}
    assert factor_and_extra_floor("lse", softcap=30.0)["factor"] == 3.0
    assert factor_and_extra_floor("dsinks", softcap=30.0) == {"factor": 3.0, "extra_floor": 3e-4}
