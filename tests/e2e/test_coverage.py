"""Restricted kernels get a fair share of every case family: in-contract stand-ins, and speed cases in
the dtype an implementation declares."""

from __future__ import annotations

import re

import pytest

from helpers import run_attnkit
from pytest_attnkit.contract import Case
from pytest_attnkit.controller.coverage import pairs, stand_in

RESTRICTED = """
    import torch
    from pytest_attnkit import AttentionImpl
    from fake_kernels import good


    class Multiple64(AttentionImpl):
        seqlen_multiple = 64
        supports_backward = False

        def forward(self, q, k, v, *, causal=False, scale=None):
            assert q.shape[-2] % 64 == 0 and k.shape[-2] % 64 == 0, (q.shape, k.shape)
            return good(q, k, v, causal=causal, scale=scale)


    class Fp16Only(AttentionImpl):
        dtypes = ("float16",)
        supports_backward = False

        def forward(self, q, k, v, *, causal=False, scale=None):
            assert q.dtype == torch.float16, q.dtype
            return good(q, k, v, causal=causal, scale=scale)
"""


def test_a_stand_in_rounds_lengths_up_and_takes_the_nearest_dtype() -> None:
    case = Case(2, 4, 2, 113, 203, 64, "bfloat16", causal=True, layout="bshd", logit_scale=8.0)
    assert stand_in(case, {"dtypes": ["float16", "bfloat16"], "seqlen_multiple": 1}) is case
    assert stand_in(case, {"dtypes": ["float16", "float32"], "seqlen_multiple": 64}) == Case(
        2, 4, 2, 128, 256, 64, "float16", causal=True, layout="bshd", logit_scale=8.0)
    assert stand_in(Case(1, 2, 2, 64, 64, 64, "float32"), {"dtypes": ["bfloat16"]}).dtype == "bfloat16"


def test_stand_ins_equal_to_a_case_already_run_are_left_out() -> None:
    cases = [Case(1, 2, 2, 100, 100, 64), Case(1, 2, 2, 128, 128, 64), Case(1, 2, 2, 1, 1, 64)]
    chosen, stand_ins = pairs({"k": {"seqlen_multiple": 64}}, cases)
    assert [case.id for _, case in chosen] == ["b1-h2-q128-k128-d64-fp16", "b1-h2-q64-k64-d64-fp16"]
    assert stand_ins == {("k", "b1-h2-q128-k128-d64-fp16"): "b1-h2-q100-k100-d64-fp16",
                     ("k", "b1-h2-q64-k64-d64-fp16"): "b1-h2-q1-k1-d64-fp16"}


def test_the_coverage_line_counts_the_stand_ins_that_ran() -> None:
    from pytest_attnkit.controller.table import correctness_verdict

    def test(case: str, outcome: str, stand_in_for: str | None) -> dict:
        return {"impl": "k", "suite": "correctness", "case": case, "outcome": outcome, "reason": None,
                "twin_of": stand_in_for}  # the report's key for a stand-in's case

    document = {"implementations": {"k": {"status": "available"}}, "collected": {"k": {"correctness": 3}},
                "interrupted": False,
                "tests": [test("b1-h2-q128-k128-d64-fp16", "passed", "b1-h2-q100-k100-d64-fp16"),
                          test("b1-h2-q64-k64-d64-fp16", "passed", "b1-h2-q1-k1-d64-fp16"),
                          test("b1-h2-q256-k256-d64-fp16", "passed", None)]}
    assert correctness_verdict(document, "k") == (
        "pass: 3 of 3 tests run (3 passed, 0 failed; 2 as in-contract stand-ins), 0 skipped")


def test_a_multiple_of_64_kernel_runs_every_family_of_the_smoke_set(pytester: pytest.Pytester, fake_dist) -> None:
    fake_dist({"multiple64": "restricted:Multiple64"}, extra_modules={"restricted": RESTRICTED})
    outcomes, _ = run_attnkit(pytester, "--attnkit-impl=multiple64", "--attnkit-suite=correctness",
                              "-k", "test_forward")
    ran = [name for name, outcome in outcomes.items() if outcome.outcome == "passed"]
    # The variant and layout cases skip: the kernel declares none (tests/suites/test_variants.py and
    # tests/suites/test_layouts.py cover them).
    variant = re.compile(r"-(w-?\d+:-?\d+|cap[\d.]+|alibi|sinks|lse|dv\d+|varlen|paged\d+)(-|\])")
    assert ran and not [name for name, outcome in outcomes.items()
                        if outcome.outcome != "passed" and not variant.search(name)], outcomes
    families = {
        "batch > 1": [name for name in ran if "[multiple64-b2-" in name],
        "GQA": [name for name in ran if "-h4:" in name],
        "causal": [name for name in ran if "-causal" in name],
        "large logits": [name for name in ran if "-x8" in name],
        "non-contiguous": [name for name in ran if "-bshd" in name],
        "lengths not a power of two": [name for name in ran if "-k320-" in name],
        "seqlen_q != seqlen_k": [name for name in ran if "-q128-k256-" in name or "-q256-k128-" in name],
        "fp32": [name for name in ran if "-fp32" in name],
    }
    assert all(families.values()), families


def test_an_fp16_only_kernel_is_timed_in_fp16(pytester: pytest.Pytester, fake_dist) -> None:
    fake_dist({"fp16_only": "restricted:Fp16Only"}, extra_modules={"restricted": RESTRICTED})
    outcomes, _ = run_attnkit(pytester, "--attnkit-impl=fp16_only", "--attnkit-suite=speed", "--attnkit-device=cpu",
                              "--benchmark-disable", "-k", "speed_forward")
    assert len(outcomes) == 2 and all("-fp16" in name and outcome.outcome == "passed"
                            for name, outcome in outcomes.items()), outcomes
