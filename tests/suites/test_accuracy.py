"""Accuracy classes, error figures and FP8 inputs (issue 19), through an inner pytest run.

The kernels live in tests/fakes/quant_kernels.py: an honest INT8 kernel quantized as
SageAttention does (per-block int8 Q and K, P and V in fp16), and the same kernel with one real
bug each. Under "exact" (FlashAttention's rule) the honest kernel fails, as a new user saw on an
H200; under "quantized" it passes and every bug still fails.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from helpers import run_attnkit
from pytest_attnkit.contract import QUANTIZED_BUDGET, AccuracyBudget, AttentionImpl, Case
from pytest_attnkit.records import Comparison

QUANT_KERNELS = (Path(__file__).parents[1] / "fakes" / "quant_kernels.py").read_text()

GQA = "b2-h4:2-q113-k113-d64-fp16-causal"
NQ_GT_NK = "b1-h2-q203-k113-d64-fp16-causal"
DECODE = "b1-h4:1-q1-k300-d64-fp16"
CASES = (GQA, NQ_GT_NK, DECODE)
SELECT = f"test_forward and ({' or '.join(CASES)})"

KERNELS = {
    "int8_honest": "quant_kernels:Int8Honest",
    "int8_exact": "quant_kernels:Int8HonestExact",
    "int8_wrong_scale": "quant_kernels:Int8WrongScale",
    "int8_causal_off_by_one": "quant_kernels:Int8CausalOffByOne",
    "int8_drops_last_key": "quant_kernels:Int8DropsLastKey",
    "int8_gqa_modulo": "quant_kernels:Int8GqaModulo",
    "int8_nan": "quant_kernels:Int8Nan",
    "fp8_plain": "quant_kernels:Fp8Plain",
    "fp8_ignores_v_descale": "quant_kernels:Fp8IgnoresVDescale",
}

#: Each broken quantized kernel: the cases its bug shows on (it is right on the others).
FAULTS = {
    "int8_wrong_scale": CASES,
    "int8_causal_off_by_one": (GQA, NQ_GT_NK),
    "int8_drops_last_key": CASES,
    "int8_gqa_modulo": (GQA,),
    "int8_nan": CASES,
}


@pytest.fixture
def quant_dist(fake_dist):
    def register(*names: str) -> None:
        fake_dist({name: KERNELS[name] for name in names}, extra_modules={"quant_kernels": QUANT_KERNELS})

    return register


def test_honest_int8_passes_quantized_and_fails_exact(pytester: pytest.Pytester, quant_dist) -> None:
    quant_dist("int8_honest", "int8_exact")
    outcomes, _ = run_attnkit(pytester, "--attnkit-impl=int8_honest,int8_exact", "-k", SELECT)
    for case in CASES:
        honest = outcomes[f"test_forward[int8_honest-{case}]"]
        assert honest.outcome == "passed", honest.text
        exact = outcomes[f"test_forward[int8_exact-{case}]"]
        assert exact.outcome == "failed", f"FlashAttention's rule let INT8 through on {case}"
        assert "exceeds allowed" in exact.text and "plain same-precision error" in exact.text


def test_quantized_budget_catches_each_real_bug(pytester: pytest.Pytester, quant_dist) -> None:
    quant_dist(*FAULTS)
    # A modulo head mapping is right with one kv head (MQA): gqa_modulo shows only on GQA.
    outcomes, _ = run_attnkit(pytester, f"--attnkit-impl={','.join(FAULTS)}", "-k", SELECT)
    for name, failing in FAULTS.items():
        for case in CASES:
            outcome = outcomes[f"test_forward[{name}-{case}]"]
            if case in failing:
                assert outcome.outcome == "failed", f"{name} on {case} was not caught under 'quantized'"
                words = "NaN/Inf values" if name == "int8_nan" else "outside the quantized budget"
                assert words in outcome.text, outcome.text
            else:
                assert outcome.outcome == "passed", f"{name} on {case}: {outcome.text}"


def test_figures_on_every_case_in_junit_report_and_summary(pytester: pytest.Pytester, quant_dist) -> None:
    quant_dist("int8_honest", "int8_wrong_scale")
    result = pytester.runpytest("--attnkit", "-p", "no:cacheprovider", "--attnkit-impl=int8_honest,int8_wrong_scale",
                                "-k", f"test_forward and {GQA}", "--junitxml=junit.xml", "--attnkit-report=out")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["int8_honest*correctness  pass*", "* accuracy     quantized rule; worst headroom 0.* (out,*",
                                 "int8_wrong_scale*correctness  FAIL*",
                                 "* accuracy     quantized rule; worst headroom [1-9].* (out,*"])
    properties = {}
    for case in ElementTree.parse(pytester.path / "junit.xml").iter("testcase"):
        properties[case.get("name")] = {p.get("name"): p.get("value") for p in case.iter("property")}
    for name in ("int8_honest", "int8_wrong_scale"):
        found = properties[f"test_forward[{name}-{GQA}]"]
        for figure in ("max_error", "headroom", "rel_l1", "row_rel_l1", "cosine", "rmse"):
            assert f"attnkit_out_{figure}" in found, found
        assert found["attnkit_accuracy_rule"] == "quantized"
    document = json.loads((pytester.path / "out" / "attnkit-report.json").read_text())
    figures = {test["impl"]: test["comparisons"][0] for test in document["tests"]}
    assert figures["int8_honest"]["headroom"] < 1 < figures["int8_wrong_scale"]["headroom"]
    assert 0.999 < figures["int8_honest"]["cosine"] < 1 and figures["int8_honest"]["rel_l1"] > 0
    assert document["implementations"]["int8_honest"]["capabilities"]["accuracy"] == "quantized"


def test_hook_chooses_the_accuracy_per_case(pytester: pytest.Pytester, quant_dist) -> None:
    quant_dist("int8_honest", "int8_wrong_scale")
    pytester.makeconftest("""
        from pytest_attnkit import AccuracyBudget

        def pytest_attnkit_accuracy(config, impl, case):
            if impl == "int8_honest" and case.heads_q != case.heads_kv and case.seqlen_q > 1:
                return "exact"
            if impl == "int8_wrong_scale":
                return AccuracyBudget(max_rel_l1=0.2, min_cosine=0.99, max_row_rel_l1=0.5, name="loose")
    """)
    outcomes, _ = run_attnkit(pytester, "--attnkit-impl=int8_honest,int8_wrong_scale", "-k",
                              f"test_forward and ({GQA} or {NQ_GT_NK})")
    assert outcomes[f"test_forward[int8_honest-{GQA}]"].outcome == "failed"
    assert outcomes[f"test_forward[int8_honest-{NQ_GT_NK}]"].outcome == "passed"
    for case in (GQA, NQ_GT_NK):
        assert outcomes[f"test_forward[int8_wrong_scale-{case}]"].outcome == "passed"


def test_hook_returning_nonsense_fails_with_its_value(pytester: pytest.Pytester, quant_dist) -> None:
    quant_dist("int8_honest")
    pytester.makeconftest("""
        def pytest_attnkit_accuracy(config, impl, case):
            return "approximate"
    """)
    result = pytester.runpytest("--attnkit", "-p", "no:cacheprovider", "--attnkit-impl=int8_honest",
                                "-k", f"test_forward and {GQA}")
    result.stdout.fnmatch_lines(["*pytest_attnkit_accuracy returned 'approximate'*"])


FP8_CASES = """
    from pytest_attnkit import Case

    def pytest_attnkit_modify_cases(config, family, cases):
        if family == "correctness":
            cases[:] = [Case(2, 4, 2, 113, 113, 64, "float8_e4m3fn", causal=True),
                        Case(1, 2, 2, 77, 77, 128, "float8_e5m2")]
"""


def test_fp8_inputs_with_descales_judged_by_fa3_rule(pytester: pytest.Pytester, quant_dist) -> None:
    quant_dist("fp8_plain", "fp8_ignores_v_descale")
    pytester.makeconftest(FP8_CASES)
    outcomes, _ = run_attnkit(pytester, "--attnkit-impl=fp8_plain,fp8_ignores_v_descale,torch_sdpa,torch_flex",
                              "--attnkit-suite=correctness")
    for case in ("b2-h4:2-q113-k113-d64-e4m3-causal", "b1-h2-q77-k77-d128-e5m2"):
        plain = outcomes[f"test_forward[fp8_plain-{case}]"]
        assert plain.outcome == "passed", plain.text
        broken = outcomes[f"test_forward[fp8_ignores_v_descale-{case}]"]
        assert broken.outcome == "failed" and "FA3 FP8 reference's error (P in e4m3)" in broken.text, broken.text
        backward = outcomes[f"test_backward[fp8_plain-{case}]"]
        assert backward.outcome == "skipped"
        for bundled in ("torch_sdpa", "torch_flex"):
            refused = outcomes[f"test_forward[{bundled}-{case}]"]
            assert refused.outcome == "skipped" and "dtype=float8_" in refused.text, refused.text


def test_records_round_trip_and_budgets_are_checked() -> None:
    comparison = Comparison("dq", True, 1e-3, 2e-3, 5e-4, 1e-4, 3.0, (0, 1, 2, 3), 0.5, 0.499, 0.0, 0, None,
                            rule="quantized", headroom=0.4, rel_l1=0.01, row_rel_l1=0.03, cosine=0.9999,
                            rmse=1e-3, budget=QUANTIZED_BUDGET.describe())
    assert Comparison.from_dict(json.loads(json.dumps(comparison.to_dict()))) == comparison
    assert AccuracyBudget.from_dict(QUANTIZED_BUDGET.to_dict()) == QUANTIZED_BUDGET
    with pytest.raises(ValueError, match="min_cosine"):
        AccuracyBudget(min_cosine=1.5)
    with pytest.raises(ValueError, match="atol and rtol"):
        AccuracyBudget(atol=1e-2)
    assert Case(1, 2, 2, 64, 64, 64, "float8_e4m3fn").id == "b1-h2-q64-k64-d64-e4m3"
    assert AttentionImpl.accuracy == "exact"
    assert "float8_e4m3fn" not in AttentionImpl.dtypes
    reasons = AttentionImpl().not_supported_reasons(Case(1, 2, 2, 64, 64, 64, "float8_e5m2"), "cpu", backward=True)
    assert any("forward only" in reason for reason in reasons)
