"""The property checks as classes (pytest_attnkit/properties.py), without a worker: the one list
makes the suite's test functions (today's names, in today's order), each class reads its
declaration from an implementation's capabilities(), says when it does not apply, and the suite
plans, words and summarises each check from its class."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_attnkit.contract import AttentionImpl, Case
from pytest_attnkit.controller.impls import ImplInfo
from pytest_attnkit.controller.outcome import Outcomes, Verdict
from pytest_attnkit.controller.pool import WorkerPool
from pytest_attnkit.controller.properties import PropertyCheck
from pytest_attnkit.controller.suite import SuiteItem
from pytest_attnkit.controller.table import property_verdicts
from pytest_attnkit.messages import Isolation, Reply, Status
from pytest_attnkit.properties import (PROPERTIES, BatchInvariance, CudaGraph, Determinism, Opcheck, TorchCompile,
                                       by_name)

#: The properties suite's test functions before they were made from PROPERTIES (node ids keep them).
FUNCTIONS = ["test_determinism", "test_determinism_backward", "test_batch_invariance", "test_cuda_graph",
             "test_torch_compile", "test_opcheck"]
BATCH = Case(3, 4, 2, 65, 65, 64, "float16", causal=True)
ALONE = Case(1, 4, 2, 65, 65, 64, "float16", causal=True)


class Declares(AttentionImpl):
    devices = ("cpu", "cuda")
    deterministic = True
    batch_invariant = True
    supports_cuda_graphs = True
    supports_torch_compile = True
    custom_op = "attnkit_test::attention"


class BackwardOnly(AttentionImpl):
    deterministic = "backward"


class Plain(AttentionImpl):
    """Declares none of the properties."""


def test_the_suite_s_test_functions_are_made_from_the_list_in_today_s_order() -> None:
    assert [spec.function for spec in PropertyCheck.tests] == FUNCTIONS
    assert [(spec.params["check"], spec.backward) for spec in PropertyCheck.tests] == [
        (check.name, direction == "backward") for check in PROPERTIES for direction in check.directions]
    assert {spec.cases for spec in PropertyCheck.tests} == {"properties"}
    assert [type(check) for check in PROPERTIES] == [Determinism, BatchInvariance, CudaGraph, TorchCompile, Opcheck]


def test_each_property_is_listed_once_and_found_by_its_name() -> None:
    names = [check.name for check in PROPERTIES]
    assert len(set(names)) == len(names) == 5
    assert all(by_name(name) is check for name, check in zip(names, PROPERTIES))
    with pytest.raises(KeyError, match="no property check is named 'determinsm'"):
        by_name("determinsm")


def test_only_the_torch_compile_check_asks_for_a_worker_of_its_own() -> None:
    assert {check.name: check.isolation for check in PROPERTIES} == {
        "determinism": Isolation.SHARED, "batch_invariance": Isolation.SHARED, "cuda_graph": Isolation.SHARED,
        "torch_compile": Isolation.DEDICATED, "opcheck": Isolation.SHARED}


@pytest.mark.parametrize("check", PROPERTIES, ids=lambda check: check.name)
def test_a_property_is_declared_only_by_the_implementation_that_declares_it(check) -> None:
    declares, plain = Declares().capabilities(), Plain().capabilities()
    for backward in [direction == "backward" for direction in check.directions]:
        assert check.declared(declares, backward) is True
        assert check.declared(plain, backward) is False


def test_determinism_is_declared_per_direction() -> None:
    backward_only = BackwardOnly().capabilities()
    assert Determinism().declared(backward_only, backward=True) is True
    assert Determinism().declared(backward_only, backward=False) is False


def test_a_check_says_why_it_does_not_apply() -> None:
    declares, plain = Declares().capabilities(), Plain().capabilities()
    assert CudaGraph().not_applicable("k", BATCH, declares, "cpu") == "CUDA graphs need a CUDA device; this run is on the CPU"
    assert CudaGraph().not_applicable("k", BATCH, declares, "cuda") is None
    assert Opcheck().not_applicable("k", BATCH, plain, "cuda") == (
        "k names no custom op (custom_op), so there is nothing for torch.library.opcheck")
    assert Opcheck().not_applicable("k", BATCH, declares, "cuda") is None
    assert BatchInvariance().not_applicable("k", ALONE, declares, "cuda") == "a batch of one sequence has no other composition"
    assert BatchInvariance().not_applicable("k", BATCH, declares, "cuda") is None
    for check in (Determinism(), TorchCompile()):
        assert check.not_applicable("k", ALONE, plain, "cpu") is None


@pytest.fixture
def suite():
    pool = WorkerPool(device="cpu", timeout=10.0)
    pool.impls = {"declares": ImplInfo("declares", "fake:Declares", capabilities=Declares().capabilities()),
                  "plain": ImplInfo("plain", "fake:Plain", capabilities=Plain().capabilities())}
    yield PropertyCheck(pool, Outcomes(), 0, "cpu")
    pool.close()


def _item(function: str, impl: str, case: Case = BATCH) -> SuiteItem:
    spec = PropertyCheck.spec(function)
    assert spec is not None
    return SuiteItem("properties", spec, impl, case)


def test_the_plan_sends_the_check_in_the_worker_its_property_asks_for(suite) -> None:
    for spec in PropertyCheck.tests:
        if spec.function in ("test_cuda_graph", "test_opcheck"):
            continue  # not on the CPU, nor without a custom op: below
        (planned,) = suite.plan(_item(spec.function, "plain"))
        check = by_name(spec.params["check"])
        assert planned.request.options == {"check": check.name} and planned.request.backward is spec.backward
        assert (planned.isolation, planned.tag) == (check.isolation, check.name)
    assert suite.plan(_item("test_cuda_graph", "declares")) == []
    assert suite.plan(_item("test_opcheck", "plain")) == []
    assert suite.plan(_item("test_batch_invariance", "declares", ALONE)) == []


def test_a_check_that_does_not_apply_is_skipped_with_its_reason(suite) -> None:
    judgement = suite.judge(_item("test_opcheck", "plain"), [])
    assert judgement.verdict is Verdict.SKIPPED
    assert judgement.message == "plain names no custom op (custom_op), so there is nothing for torch.library.opcheck"


def _reply(check: str, *, declared: bool, holds: bool, detail: str) -> Reply:
    status = Status.WRONG if declared and not holds else Status.OK
    return Reply(status, detail if status is Status.WRONG else "",
                 {"check": check, "declared": declared, "holds": holds, "detail": detail, "figures": {}})


@pytest.mark.parametrize("check", PROPERTIES, ids=lambda check: check.name)
def test_a_declared_property_that_does_not_hold_fails_in_its_declaration_s_words(suite, check) -> None:
    function = check.test_function(check.directions[0])
    judgement = suite.judge(_item(function, "declares"), [_reply(check.name, declared=True, holds=False,
                                                                  detail="it broke")])
    if check.not_applicable("declares", BATCH, suite.pool.info("declares").capabilities, "cpu"):
        assert judgement.verdict is Verdict.SKIPPED  # CUDA graphs, on the CPU
        return
    assert judgement.verdict is Verdict.FAILED
    assert judgement.message == f"declares declares {check.declaration}, and on {BATCH.id}: it broke"
    assert (f"attnkit_{check.name}", "does not hold") in judgement.properties
    assert suite.results[-1]["check"] == check.name and suite.results[-1]["holds"] is False


def test_an_undeclared_property_that_does_not_hold_is_reported_not_failed(suite) -> None:
    judgement = suite.judge(_item("test_torch_compile", "plain"),
                            [_reply("torch_compile", declared=False, holds=False, detail="a graph break")])
    assert judgement.verdict is Verdict.PASSED
    assert ("attnkit_torch_compile_declared", False) in judgement.properties


def test_the_summary_shows_the_checks_in_the_list_s_order_under_their_titles() -> None:
    entries: list[dict[str, Any]] = [
        {"impl": "k", "check": check.name, "holds": check.name != "opcheck", "declared": check.name == "opcheck"}
        for check in reversed(PROPERTIES)]
    assert property_verdicts({"properties": entries}, "k") == [
        "deterministic holds (1/1)", "batch-invariant holds (1/1)", "CUDA graphs holds (1/1)",
        "torch.compile holds (1/1)", "opcheck FAILS (0/1, declared)"]


def test_the_summary_blames_only_a_declared_case() -> None:
    """Determinism declared for the forward only (triton_flash with the Gluon backward switched on,
    results/2026-11-28-session16): the backward's differing bits are "no", not "FAILS"; a
    forward that differs is "FAILS"."""
    def entries(forward_holds: bool) -> dict[str, Any]:
        return {"properties": [
            {"impl": "k", "check": "determinism", "backward": backward, "declared": not backward,
             "holds": forward_holds if not backward else holds}
            for backward, holds in ((False, True), (False, True), (True, False), (True, True))]}

    assert property_verdicts(entries(True), "k") == ["deterministic no (3/4, declared for 2)"]
    assert property_verdicts(entries(False), "k") == ["deterministic FAILS (1/4, declared for 2)"]
