"""The properties suite on the CPU: each check fails a kernel that declares the property and breaks
it, passes an honest one, and reports (without failing) a kernel that does not declare it."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import run_attnkit

SOURCE = (Path(__file__).parents[1] / "fakes" / "property_kernels.py").read_text()
#: The smoke set's dense property case: three sequences of 65 rows, causal GQA.
DENSE = "b3-h4:2-q65-k65-d64-fp16-causal"


def _run(pytester: pytest.Pytester, fake_dist, impls: dict[str, str], *args: str):
    fake_dist({name: f"property_kernels:{target}" for name, target in impls.items()},
              extra_modules={"property_kernels": SOURCE})
    return run_attnkit(pytester, "--attnkit-suite=properties", f"--attnkit-impl={','.join(impls)}", "--attnkit-report=out",
                       *args)


def _entries(pytester: pytest.Pytester, check: str, *, backward: bool = False) -> dict[str, dict]:
    import json

    document = json.loads((pytester.path / "out" / "attnkit-report.json").read_text())
    return {entry["impl"]: entry for entry in document["properties"]
            if entry["check"] == check and entry["backward"] is backward}


def test_determinism_holds_the_declared_and_reports_the_rest(pytester: pytest.Pytester, fake_dist) -> None:
    outcomes, _ = _run(pytester, fake_dist, {"honest": "Honest", "jittery": "Jittery", "undeclared": "JitteryUndeclared"},
                       "-k", f"test_determinism and {DENSE}")
    assert outcomes[f"test_determinism[honest-{DENSE}]"].outcome == "passed"
    assert outcomes[f"test_determinism_backward[honest-{DENSE}]"].outcome == "passed"
    lying = outcomes[f"test_determinism[jittery-{DENSE}]"]
    assert lying.outcome == "failed"
    assert "jittery declares deterministic, and on" in lying.text and "forward is not deterministic" in lying.text
    assert "out differs in" in lying.text
    assert outcomes[f"test_determinism[undeclared-{DENSE}]"].outcome == "passed"
    entries = _entries(pytester, "determinism")
    assert entries["undeclared"]["holds"] is False and entries["undeclared"]["declared"] is False
    assert entries["honest"]["holds"] is True
    # Its noise is a constant to autograd: the gradients hold, as they would if it declared "backward".
    assert _entries(pytester, "determinism", backward=True)["undeclared"]["holds"] is True


def test_a_backward_only_declaration_holds_the_gradients_alone(pytester: pytest.Pytester, fake_dist) -> None:
    """deterministic = "backward" promises nothing about the forward: an output that moves from run
    to run is reported in the backward check's detail, and fails neither test; gradients that move fail."""
    outcomes, _ = _run(pytester, fake_dist, {"backward_only": "DeterministicBackwardOnly",
                                             "jittery_grads": "JitteryGradients"},
                       "-k", f"test_determinism and {DENSE}")
    assert outcomes[f"test_determinism[backward_only-{DENSE}]"].outcome == "passed"  # undeclared: reported
    assert outcomes[f"test_determinism_backward[backward_only-{DENSE}]"].outcome == "passed"
    lying = outcomes[f"test_determinism_backward[jittery_grads-{DENSE}]"]
    assert lying.outcome == "failed" and "jittery_grads declares deterministic, and on" in lying.text
    assert "backward is not deterministic" in lying.text and "dq differs in" in lying.text
    entry = _entries(pytester, "determinism", backward=True)["backward_only"]
    assert entry["declared"] is True and entry["holds"] is True
    assert entry["detail"].startswith("backward: bitwise identical over 3 runs on the same inputs (not held")
    assert "out differs in" in entry["detail"] and entry["figures"]["differing"]["out"] > 0


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_the_time_table_counts_property_checks_as_properties(pytester: pytest.Pytester, fake_dist, jobs: str) -> None:
    """One row name whether the checks run ahead (--attnkit-jobs above 1) or one at a time."""
    outcomes, _ = _run(pytester, fake_dist, {"honest": "Honest"}, f"--attnkit-jobs={jobs}",
                       "-k", f"test_determinism and {DENSE}")
    assert outcomes[f"test_determinism[honest-{DENSE}]"].outcome == "passed"
    assert outcomes[f"test_determinism_backward[honest-{DENSE}]"].outcome == "passed"
    import json

    document = json.loads((pytester.path / "out" / "attnkit-report.json").read_text())
    assert [(row["suite"], row["requests"]) for row in document["time"]["rows"]] == [("properties", 2)]


def test_batch_invariance_holds_the_declared(pytester: pytest.Pytester, fake_dist) -> None:
    outcomes, _ = _run(pytester, fake_dist, {"honest": "Honest", "batch_dependent": "BatchDependent"},
                              "-k", "test_batch_invariance")
    ran = {name: outcome for name, outcome in outcomes.items() if outcome.outcome != "skipped"}
    assert {outcome.outcome for name, outcome in ran.items() if "[honest-" in name} == {"passed"}
    failed = [outcome for name, outcome in ran.items() if "[batch_dependent-" in name]
    assert failed and {outcome.outcome for outcome in failed} == {"failed"}
    assert "not batch-invariant" in failed[0].text and "differs from the whole batch's" in failed[0].text


def test_torch_compile_fails_a_declared_graph_break_with_torch_s_explanation(pytester: pytest.Pytester,
                                                                             fake_dist) -> None:
    outcomes, _ = _run(pytester, fake_dist, {"honest": "Honest", "host_read": "ReadsALengthOnTheHost"},
                       "-k", f"test_torch_compile and {DENSE}")
    assert outcomes[f"test_torch_compile[honest-{DENSE}]"].outcome == "passed"
    broken = outcomes[f"test_torch_compile[host_read-{DENSE}]"]
    assert broken.outcome == "failed"
    assert "breaks torch.compile(fullgraph=True)" in broken.text


def test_opcheck_runs_on_the_custom_op_a_kernel_names(pytester: pytest.Pytester, fake_dist) -> None:
    outcomes, _ = _run(pytester, fake_dist, {"custom": "CustomOp", "misregistered": "MisregisteredOp",
                                             "honest": "Honest"}, "-k", f"test_opcheck and {DENSE}")
    assert outcomes[f"test_opcheck[custom-{DENSE}]"].outcome == "passed"
    wrong = outcomes[f"test_opcheck[misregistered-{DENSE}]"]
    assert wrong.outcome == "failed" and "torch.library.opcheck(attnkit_test::misregistered_attention) failed" in wrong.text
    assert outcomes[f"test_opcheck[honest-{DENSE}]"].outcome == "skipped"


def test_cuda_graphs_say_they_need_a_gpu(pytester: pytest.Pytester, fake_dist) -> None:
    outcomes, _ = _run(pytester, fake_dist, {"honest": "Honest"}, "-k", f"test_cuda_graph and {DENSE}")
    outcome = outcomes[f"test_cuda_graph[honest-{DENSE}]"]
    assert outcome.outcome == "skipped" and "CUDA graphs need a CUDA device" in outcome.text


def test_a_declaration_that_is_not_one_breaks_the_implementation(pytester: pytest.Pytester, fake_dist) -> None:
    outcomes, _ = _run(pytester, fake_dist, {"bad": "BadDeclaration"}, "-k", f"test_determinism and {DENSE}")
    outcome = outcomes[f"test_determinism[bad-{DENSE}]"]
    assert outcome.outcome == "failed"
    assert "deterministic must be True, 'both', 'forward', 'backward', False or None, not 'sometimes'" in outcome.text


def test_every_value_deterministic_accepts_declares_its_directions() -> None:
    from pytest_attnkit import AttentionImpl

    declared = {value: type("Impl", (AttentionImpl,), {"deterministic": value})().deterministic_directions()
                for value in (True, "both", "forward", "backward", False, None)}
    assert declared == {True: ("forward", "backward"), "both": ("forward", "backward"), "forward": ("forward",),
                        "backward": ("backward",), False: (), None: ()}
    with pytest.raises(ValueError, match="True, 'both', 'forward', 'backward', False or None, not 'sometimes'"):
        type("Impl", (AttentionImpl,), {"deterministic": "sometimes"})().deterministic_directions()


def test_the_summary_shows_each_check_per_implementation(pytester: pytest.Pytester, fake_dist) -> None:
    fake_dist({"honest": "property_kernels:Honest", "jittery": "property_kernels:JitteryUndeclared"},
              extra_modules={"property_kernels": SOURCE})
    result = pytester.runpytest("--attnkit", "-p", "no:cacheprovider", "--attnkit-suite=properties",
                                "--attnkit-impl=honest,jittery", "-k", f"determinism and {DENSE}")
    result.stdout.fnmatch_lines(["honest *", "*properties   deterministic holds (2/2, declared)*",
                                 # its forward moves, its gradients do not: "backward" could be declared
                                 "jittery *", "*properties   deterministic no (1/2)*"])
