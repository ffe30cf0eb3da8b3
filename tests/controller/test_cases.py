"""Case sets and the implementation contract's declared capabilities."""

from __future__ import annotations

import pytest

from pytest_attnkit.cases import PROFILES, correctness_cases
from pytest_attnkit.contract import AttentionImpl, Case


@pytest.mark.parametrize("profile", PROFILES)
def test_case_ids_are_unique_and_readable(profile: str) -> None:
    cases = correctness_cases(profile)
    ids = [case.id for case in cases]
    assert len(ids) == len(set(ids))
    assert all(" " not in case_id for case_id in ids)


def test_smoke_covers_what_the_rules_need() -> None:
    cases = correctness_cases("smoke")
    assert any(c.seqlen_q > c.seqlen_k and c.causal for c in cases)  # rows that see no key
    assert any(c.seqlen_q < c.seqlen_k for c in cases)
    assert any(c.seqlen_q == 1 for c in cases)  # decode
    assert any(c.heads_kv == 1 < c.heads_q for c in cases)  # MQA
    assert any(1 < c.heads_kv < c.heads_q for c in cases)  # GQA
    assert {c.dtype for c in cases} == {"float16", "bfloat16", "float32"}
    assert any(c.layout == "bshd" for c in cases) and any(c.logit_scale > 1 for c in cases)
    assert min(c.head_dim for c in cases) <= 32 and max(c.head_dim for c in cases) == 256


def test_case_id() -> None:
    case = Case(2, 8, 2, 113, 203, 64, "bfloat16", causal=True, layout="bshd", logit_scale=8.0)
    assert case.id == "b2-h8:2-q113-k203-d64-bf16-causal-bshd-x8"
    assert Case.from_dict(case.to_dict()) == case


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"heads_q": 6, "heads_kv": 4}, "heads_q=6 is not a multiple of heads_kv=4"),
        ({"seqlen_q": 0}, "Case.seqlen_q must be a positive int"),
        ({"dtype": "float8"}, "Case.dtype='float8'"),
        ({"layout": "sbhd"}, "Case.layout='sbhd'"),
    ],
)
def test_bad_cases_are_refused_clearly(kwargs: dict, message: str) -> None:
    values = dict(batch=1, heads_q=4, heads_kv=4, seqlen_q=8, seqlen_k=8, head_dim=64)
    values.update(kwargs)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Case(**values)


def test_declared_capabilities_become_reasons_in_words() -> None:
    class Limited(AttentionImpl):
        devices = ("cuda",)
        dtypes = ("float16",)
        head_dims = range(16, 129)
        supports_causal = False
        supports_gqa = False
        supports_seqlen_mismatch = False
        supports_backward = False

    case = Case(1, 4, 2, 1, 300, 256, "bfloat16", causal=True)
    reasons = Limited().not_supported_reasons(case, "cpu", backward=True)
    assert reasons == [
        "device=cpu (supported: cuda)",
        "dtype=bfloat16 (supported: float16)",
        "head_dim=256 (supported: 16..128)",
        "causal masking is not supported",
        "grouped kv heads (4 q heads, 2 kv heads) are not supported",
        "seqlen_q=1 != seqlen_k=300 is not supported",
        "backward is not supported",
    ]
    assert Limited().unavailable_reason("cpu") == "runs on cuda, not cpu"
