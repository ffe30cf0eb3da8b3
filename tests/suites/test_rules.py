"""Every correctness rule, fed a broken implementation that the rule must catch.

Each fake implementation in conftest.py is correct except for one fault. One inner run holds
them all, on two smoke cases: causal with seqlen_q > seqlen_k (rows that see no key, and the
bottom-right alignment) and GQA.
"""

from __future__ import annotations

import pytest

from helpers import fake, run_attnkit
from pytest_attnkit.cases import correctness_cases

NQ_GT_NK = "b1-h2-q203-k113-d64-fp16-causal"
GQA = "b2-h4:2-q113-k113-d64-fp16-causal"

FORWARD_FAULTS = {
    # implementation: (cases it must fail on, words the failure must contain)
    "wrong_scale": ((NQ_GT_NK, GQA), "exceeds allowed"),
    "top_left_causal": ((NQ_GT_NK,), "exceeds allowed"),
    "gqa_modulo": ((GQA,), "exceeds allowed"),
    "half_written": ((NQ_GT_NK, GQA), "out:"),
    "nan_output": ((NQ_GT_NK, GQA), "NaN/Inf values"),
    "modifies_input": ((NQ_GT_NK, GQA), "modified its input k"),
    "wrong_shape": ((NQ_GT_NK, GQA), "63] where the contract asks ["),
    "wrong_dtype": ((NQ_GT_NK, GQA), "returned dtype torch.float32 where the contract asks torch.float16"),
    "wrong_device": ((NQ_GT_NK, GQA), "on device meta where the contract asks cpu"),
    "not_a_tensor": ((NQ_GT_NK, GQA), "output: returned a list where the contract asks a torch.Tensor"),
    "raises": ((NQ_GT_NK, GQA), "kernel launch failed"),
}



def test_each_forward_rule_catches_its_fault(pytester: pytest.Pytester, fake_dist) -> None:
    fake_dist({name: fake(name) for name in ["good", *FORWARD_FAULTS]})
    outcomes, _ = run_attnkit(pytester, "--attnkit-impl", ",".join(["good", *FORWARD_FAULTS]), "-k", f"test_forward and ({NQ_GT_NK} or {GQA})")
    for case in (NQ_GT_NK, GQA):
        assert outcomes[f"test_forward[good-{case}]"].outcome == "passed", outcomes[f"test_forward[good-{case}]"].text
    for name, (failing_cases, words) in FORWARD_FAULTS.items():
        for case in (NQ_GT_NK, GQA):
            outcome = outcomes[f"test_forward[{name}-{case}]"]
            if case in failing_cases:
                assert outcome.outcome == "failed", f"{name} on {case} was not caught"
                assert words in outcome.text, f"{name} on {case}: {outcome.text}"
                assert "seed" in outcome.text and "--attnkit-seed=0" in outcome.text
            else:
                assert outcome.outcome == "passed", f"{name} on {case}: {outcome.text}"


def test_failure_message_gives_index_error_allowed_and_share(pytester: pytest.Pytester, fake_dist) -> None:
    fake_dist({"wrong_scale": fake("wrong_scale")})
    outcomes, _ = run_attnkit(pytester, "--attnkit-impl", "wrong_scale", "-k", f"test_forward and {GQA}")
    text = outcomes[f"test_forward[wrong_scale-{GQA}]"].text
    assert "wrong_scale is wrong on b2-h4:2-q113-k113-d64-fp16-causal, seed " in text
    for words in ("out: max error", "exceeds allowed", "plain same-precision error", "floor",
                  "worst at index [", "got ", "expected ", "of elements outside"):
        assert words in text, text


def test_gradient_rules(pytester: pytest.Pytester, fake_dist) -> None:
    fake_dist({name: fake(name) for name in ("good", "wrong_grad", "detached")})
    outcomes, _ = run_attnkit(pytester, "--attnkit-impl", "good,wrong_grad,detached", "-k", GQA)
    assert outcomes[f"test_backward[good-{GQA}]"].outcome == "passed"
    assert outcomes[f"test_forward[wrong_grad-{GQA}]"].outcome == "passed"
    wrong_grad = outcomes[f"test_backward[wrong_grad-{GQA}]"]
    assert wrong_grad.outcome == "failed" and "dv: max error" in wrong_grad.text
    assert "dq:" not in wrong_grad.text  # only the gradient that is wrong is reported
    detached = outcomes[f"test_backward[detached-{GQA}]"]
    assert detached.outcome == "failed" and "detached from autograd" in detached.text


def test_good_implementation_passes_the_whole_smoke_set(pytester: pytest.Pytester, fake_dist) -> None:
    """Every plain case passes; the variant and layout cases skip, since a plain function declares none."""
    fake_dist({"good": fake("good")})
    outcomes, recorder = run_attnkit(pytester, "--attnkit-impl", "good", "--attnkit-suite", "correctness")
    variant_ids = {case.id for case in correctness_cases("smoke") if case.variants or case.head_dim_v
                   or case.kind != "dense"}
    expected = {name: "skipped" if name.split("-", 1)[1].rstrip("]") in variant_ids else "passed" for name in outcomes}
    assert outcomes and all(outcome.outcome == expected[name] for name, outcome in outcomes.items()), {
        name: outcome.text for name, outcome in outcomes.items() if outcome.outcome != expected[name]}
    assert recorder.ret == 0
