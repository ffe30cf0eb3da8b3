"""Every suite holds a kernel to the contract and shows what it raised as its own (issue 44, items
7 and 8): a wrong shape or a modified input is named as such in the correctness, speed (forward and
backward, with no figure) and properties suites, and a traceback shows the kernel's frames, not the
harness's. The worker's requests run here in this process (the worker's loop, without its socket),
and one inner run checks what the pytest side then says."""

from __future__ import annotations

import re
import time
import traceback

import pytest

from helpers import fake, run_attnkit

torch = pytest.importorskip("torch")

from pytest_attnkit.contract import AttentionImpl, Case, FunctionImpl  # noqa: E402
from pytest_attnkit.controller.session import SUITE_TYPES  # noqa: E402
from pytest_attnkit.messages import Op, Reply, Request, Status  # noqa: E402
from pytest_attnkit.worker import calls  # noqa: E402
from pytest_attnkit.worker.server import Handler  # noqa: E402

CASE = Case(2, 2, 2, 17, 17, 32, "float32")
#: Each request a suite makes of a worker that calls the kernel on the CPU (memory needs a GPU).
REQUESTS = {
    "correctness": Request(Op.RUN, CASE, False, 0, {"trials": 1}, suite="correctness"),
    "correctness backward": Request(Op.RUN, CASE, True, 0, {"trials": 1}, suite="correctness"),
    "speed forward": Request(Op.RUN, CASE, False, 0, {"budget_ms": 5}, suite="speed"),
    "speed backward": Request(Op.RUN, CASE, True, 0, {"budget_ms": 5}, suite="speed"),
    "warm-up": Request(Op.WARM, CASE, True, 0),
    "determinism": Request(Op.RUN, CASE, False, 0, {"check": "determinism"}, suite="properties"),
    "determinism backward": Request(Op.RUN, CASE, True, 0, {"check": "determinism"}, suite="properties"),
    "batch invariance": Request(Op.RUN, CASE, False, 0, {"check": "batch_invariance"}, suite="properties"),
}


def _right(q, k, v, *, causal=False, scale=None):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)


def _launch(q):
    raise RuntimeError("kernel launch failed: too many resources requested")


def raises_in_helper(q, k, v, *, causal=False, scale=None):
    return _launch(q)


def wrong_shape(q, k, v, *, causal=False, scale=None):
    return _right(q, k, v, causal=causal, scale=scale)[..., :-1]


def modifies_k(q, k, v, *, causal=False, scale=None):
    out = _right(q, k, v, causal=causal, scale=scale)
    with torch.no_grad():
        k[0, 0, 0, 0] += 1.0
    return out


def _replies(kernel) -> dict[str, Reply]:
    handler = Handler()
    handler.handle(Request(Op.INIT, options={"device": "cpu", "handlers": {
        name: suite.handler for name, suite in SUITE_TYPES.items()}}))
    handler.impl = FunctionImpl(kernel)
    return {name: handler.handle(request) for name, request in REQUESTS.items()}


def test_a_raising_kernel_shows_its_own_frames_in_every_suite() -> None:
    for suite, reply in _replies(raises_in_helper).items():
        assert reply.status is Status.RAISED, (suite, reply)
        text = reply.message
        frames = re.findall(r'^  File "([^"]+)", line \d+, in (\w+)$', text, flags=re.MULTILINE)
        assert [name for _, name in frames] == ["raises_in_helper", "_launch"], (suite, text)
        assert all(path == __file__ for path, _ in frames), (suite, text)
        assert text.count("(called by the harness: pytest_attnkit/") == 1, (suite, text)
        assert text.rstrip().endswith("RuntimeError: kernel launch failed: too many resources requested")


@pytest.mark.parametrize("kernel, said", [
    (wrong_shape, "output: returned shape [2, 2, 17, 31] where the contract asks [2, 2, 17, 32]"),
    (modifies_k, "the implementation modified its input k (1 element changed)"),
], ids=["wrong_shape", "modifies_k"])
def test_a_breach_of_the_contract_is_named_in_every_suite(kernel, said: str) -> None:
    for suite, reply in _replies(kernel).items():
        assert (reply.status, reply.message) == (Status.WRONG, said), suite
        assert "timing" not in reply.data, suite  # no speed figure for a wrong call


class LseWithoutTheKeyword(AttentionImpl):
    """Declares supports_lse, but its forward() has no return_lse (the newcomer's probe's find)."""

    supports_lse = True

    def forward(self, q, k, v, *, causal=False, scale=None):
        return _right(q, k, v, causal=causal, scale=scale)


class PassesTheKeywordOn(AttentionImpl):
    """Takes return_lse, then hands it to a function of its own that does not: its own TypeError."""

    supports_lse = True

    def forward(self, q, k, v, *, causal=False, scale=None, return_lse=False):
        return _right(q, k, v, causal=causal, scale=scale, return_lse=return_lse)


def test_a_declared_keyword_forward_does_not_take_is_named_with_its_declaration_in_every_suite() -> None:
    lse = Case(2, 2, 2, 17, 17, 32, "float32", return_lse=True)
    requests = {name: Request(request.op, lse, request.backward, 0, request.options, suite=request.suite)
                for name, request in REQUESTS.items()}
    for kernel, status in ((LseWithoutTheKeyword(), Status.WRONG), (PassesTheKeywordOn(), Status.RAISED)):
        handler = Handler()
        handler.handle(Request(Op.INIT, options={"device": "cpu", "handlers": {
            name: suite.handler for name, suite in SUITE_TYPES.items()}}))
        handler.impl = kernel
        for name, request in requests.items():
            reply = handler.handle(request)
            assert reply.status is status, (type(kernel).__name__, name, reply)
            if status is Status.WRONG:  # one line, no traceback of the harness's frames
                assert reply.message.startswith("forward() does not take the keyword return_lse, which the harness "
                                                "hands it on this case because the implementation declares "
                                                "supports_lse = True. Give forward() the parameter"), reply.message
                assert "Traceback" not in reply.message and "\n" not in reply.message
            else:  # the kernel's own call refused it: its traceback, its frames
                assert 'in forward' in reply.message and "does not take the keyword" not in reply.message


def test_the_harness_own_failure_keeps_its_traceback_whole() -> None:
    def harness() -> None:
        raise ValueError("a bug of the harness")

    try:
        harness()
    except ValueError as error:
        text = calls.kernel_traceback(error)
    assert "in harness" in text and "called by the harness" not in text  # no kernel frame: nothing left out


def test_an_installed_bundled_implementation_s_frames_are_its_own(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path) -> None:
    """Installed (not editable), the bundled implementations live under the package
    (``pytest_attnkit.implementations``): their frames are still the kernel's. Its own call that
    passes a keyword another function does not take stays its traceback, not a refusal."""
    package = tmp_path / "site-packages" / "pytest_attnkit"
    monkeypatch.setattr(calls, "HARNESS_ROOT", str(package))
    monkeypatch.setattr(calls, "BUNDLED_ROOT", str(package / "implementations"))
    kernel = traceback.FrameSummary(str(package / "implementations" / "torch_flex.py"), 10, "forward")
    harness = traceback.FrameSummary(str(package / "worker" / "calls.py"), 20, "call_implementation")
    assert calls._is_harness(harness) and not calls._is_harness(kernel)


def test_inputs_too_big_to_copy_are_compared_by_checksum() -> None:
    given = {"k": torch.randn(3, 5, 7, dtype=torch.float16).transpose(1, 2), "idx": torch.arange(40, dtype=torch.int32)}
    watch = calls.InputWatch(given, copy=False)
    assert watch.copies is None
    watch.check()  # unchanged
    given["k"][2, 6, 4] += 1
    with pytest.raises(calls.ContractViolation, match="modified its input k"):
        watch.check()
    # Pieces cover every element once, also a tensor whose rows are each larger than a piece.
    values = torch.arange(2 * 3 * 10, dtype=torch.int64).reshape(2, 3, 10).transpose(0, 2)
    pieces = list(calls._pieces(values, 4))
    assert sum(piece.numel() for piece in pieces) == values.numel() and max(piece.numel() for piece in pieces) <= 4
    assert sorted(torch.cat([piece.reshape(-1) for piece in pieces]).tolist()) == list(range(60))


@pytest.mark.timing
def test_a_warm_up_times_its_first_call_and_a_second_one_of_a_short_case_where_asked(monkeypatch) -> None:
    """The first call's excess over the next is the setup the warm-up spares the case's timing
    (controller/scheduling/pruning.py): here a plan built on the first call, as cuDNN's is."""
    made: list[int] = []

    def plans_once(q, k, v, *, causal=False, scale=None):
        if not made:
            time.sleep(0.2)  # the plan
        made.append(1)
        return _right(q, k, v, causal=causal, scale=scale)

    first, later = calls.warm_call(FunctionImpl(plans_once), CASE, device="cpu", seed=0, backward=True, again=True)
    assert len(made) == 2 and first >= 0.2 and later is not None and later < first - 0.15
    assert calls.warm_call(FunctionImpl(_right), CASE, device="cpu", seed=0, backward=False)[1] is None
    monkeypatch.setattr(calls, "NEXT_CALL_MAX_S", 0.0)  # a long case: its one call says nothing more
    assert calls.warm_call(FunctionImpl(_right), CASE, device="cpu", seed=0, backward=False, again=True)[1] is None
    # Both calls are held to the contract: a kernel that breaks it on its second call only is caught.
    second: list[int] = []

    def modifies_k_later(q, k, v, *, causal=False, scale=None):
        second.append(1)
        return (modifies_k if len(second) == 2 else _right)(q, k, v, causal=causal, scale=scale)

    monkeypatch.setattr(calls, "NEXT_CALL_MAX_S", 1.0)
    with pytest.raises(calls.ContractViolation, match="modified its input k"):
        calls.warm_call(FunctionImpl(modifies_k_later), CASE, device="cpu", seed=0, backward=False, again=True)


def test_a_warm_up_reply_says_how_long_its_first_call_took() -> None:
    """On the CPU it asks no second call: there is no GPU-alone phase to spare."""
    reply = _replies(_right)["warm-up"]
    assert reply.status is Status.OK and reply.data["first_call_s"] > 0 and reply.data["next_call_s"] is None
    assert not reply.data["process_first"]  # the backwards of the requests before it ran in this process


def test_a_warm_up_says_whether_it_was_its_process_s_first_in_its_direction() -> None:
    """Its first call then also paid the process's own start (CuPy compiles its module once): the
    pruning of warm-ups does not count it (pytest_attnkit/controller/scheduling/pruning.py)."""
    handler = Handler()
    handler.handle(Request(Op.INIT, options={"device": "cpu", "handlers": {}}))
    handler.impl = FunctionImpl(_right)
    said = [handler.handle(Request(Op.WARM, CASE, backward, 0)).data["process_first"]
            for backward in (False, False, True, True)]
    assert said == [True, False, True, False]


def test_the_pytest_side_says_it_in_every_suite(pytester: pytest.Pytester, fake_dist) -> None:
    fake_dist({"raises_in_helper": fake("raises_in_helper"), "wrong_shape": fake("wrong_shape"),
               "modifies_input": fake("modifies_input")})
    outcomes, _ = run_attnkit(
        pytester, "--attnkit-suite=correctness,speed,properties", "--attnkit-device=cpu", "--benchmark-disable",
        "--attnkit-impl=raises_in_helper,wrong_shape,modifies_input",
        "-k", "test_forward and b1-h1-q33-k33-d256-fp32 or test_speed and not causal"
              " or test_determinism and b3-h4:2-q65-k65-d64-fp16-causal and not varlen")
    said = {"wrong_shape": "output: returned shape [3, 4, 65, 63] where the contract asks [3, 4, 65, 64]",
            "modifies_input": "the implementation modified its input k"}
    tests = ("test_forward", "test_speed_forward", "test_speed_backward", "test_determinism", "test_determinism_backward")
    for impl, words in said.items():
        for test in tests:
            [outcome] = [o for name, o in outcomes.items() if name.startswith(f"{test}[{impl}-")]
            assert outcome.outcome == "failed" and f"{impl} is wrong on" in outcome.text, (impl, test, outcome.text)
            if impl == "modifies_input" or test.startswith("test_determinism"):
                assert words in outcome.text, (impl, test, outcome.text)
            else:
                assert "output: returned shape [" in outcome.text and "where the contract asks [" in outcome.text
            assert "TFLOP/s" not in outcome.text
    raised = [o for name, o in outcomes.items() if "[raises_in_helper-" in name]
    assert len(raised) == len(tests) and all(o.outcome == "failed" for o in raised)
    [shown] = [o.text for o in raised if "Traceback (most recent call last)" in o.text]
    frames = re.findall(r'^  File "[^"]+", line \d+, in (\w+)$', shown, flags=re.MULTILINE)
    assert frames == ["raises_in_helper", "_launch"], shown
