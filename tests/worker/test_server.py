"""The worker's Handler, in this process: every op has a handler in its table and answers one
Reply envelope; what the harness raises (an op this version does not know too) is the
HARNESS_ERROR envelope with the traceback, never an answer of another shape. A suite's request
(``run``) is answered by the handler its init named for the suite (the registry,
pytest_attnkit/worker/handlers.py): a handler that cannot be made, or a suite with none, fails that
suite's requests alone; the implementation is asked whether it supports a case only where
collection did not ask it already (``Request.checked``); and what a handler keeps is forgotten
before any other request.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from pytest_attnkit.contract import Case, FunctionImpl  # noqa: E402
from pytest_attnkit.controller.session import SUITE_TYPES  # noqa: E402
from pytest_attnkit.messages import Op, Reply, Request, Status  # noqa: E402
from pytest_attnkit.worker.handlers import HandlerError, Handlers, load_handler  # noqa: E402
from pytest_attnkit.worker.server import Handler  # noqa: E402
from pytest_attnkit.worker.suite import SuiteHandler  # noqa: E402

CASE = Case(1, 1, 1, 8, 8, 16, "float32")
#: The bundled suites' handlers, as the session names them in every worker's init.
BUNDLED = {name: suite.handler for name, suite in SUITE_TYPES.items()}
FAKES = Path(__file__).parent.parent / "fakes"


def sdpa(q, k, v, *, causal=False, scale=None):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)


def started(handlers: dict[str, str] | None = None, impl=None) -> Handler:
    handler = Handler()
    reply = handler.handle(Request(Op.INIT, options={"device": "cpu", "handlers": BUNDLED if handlers is None
                                                      else handlers}))
    assert reply.status is Status.OK
    handler.impl = impl if impl is not None else FunctionImpl(sdpa)
    return handler


@pytest.fixture
def handler() -> Handler:
    return started()


def run(suite: str, options: dict | None = None, *, case: Case = CASE, backward: bool = False,
        checked: bool = False) -> Request:
    return Request(Op.RUN, case, backward, 0, options or {}, suite=suite, checked=checked)


def test_the_op_table_has_a_handler_for_every_op() -> None:
    assert set(Handler().ops) == set(Op)


#: One request of each op (a suite's, of each bundled suite), and a key its reply's data holds
#: (memory's meter needs a GPU: left out).
REQUESTS = {
    "init": (Request(Op.INIT, options={"device": "cpu", "handlers": BUNDLED}), "pid"),
    "describe": (Request(Op.DESCRIBE), "capabilities"),
    "environment": (Request(Op.ENVIRONMENT), None),
    "support": (Request(Op.SUPPORT, options={"queries": [{"case": CASE.to_dict(), "backward": False}]}), "refusals"),
    "run correctness": (run("correctness", {"trials": 1}), "comparisons"),
    "run speed": (run("speed", {"budget_ms": 5}), "timing"),
    "run sanitize": (run("sanitize"), None),
    "run properties": (run("properties", {"check": "determinism"}), None),
    "warm": (Request(Op.WARM, CASE, True, 0), None),
    "ceilings": (Request(Op.CEILINGS), "ceilings"),
    "shutdown": (Request(Op.SHUTDOWN), None),
}


def test_every_op_has_a_request_here() -> None:
    assert {request.op for request, _ in REQUESTS.values()} == set(Op)
    assert {request.suite for request, _ in REQUESTS.values() if request.op is Op.RUN} == set(BUNDLED) - {"memory"}


@pytest.mark.parametrize("name", list(REQUESTS))
def test_each_op_answers_one_reply_envelope(handler: Handler, name: str) -> None:
    request, key = REQUESTS[name]
    # Over the wire as the worker loop takes it: the request's JSON in, one Reply out.
    reply = handler.answer(json.loads(json.dumps(request.to_wire())))
    assert isinstance(reply, Reply)
    assert reply.status is Status.OK, reply.message
    if key is not None:
        assert key in reply.data, reply.data
    assert reply.spent.wall_s is not None and reply.spent.wall_s >= 0
    wire = json.loads(json.dumps(reply.to_wire()))  # plain JSON: what the socket carries back
    assert Reply.from_wire(wire).to_wire() == wire
    assert handler.stopping is (request.op is Op.SHUTDOWN)


def test_a_request_keeps_its_suite_and_checked_over_the_wire() -> None:
    request = run("correctness", {"trials": 1}, backward=True, checked=True)
    assert Request.from_wire(json.loads(json.dumps(request.to_wire()))) == request
    assert Request.from_wire(Request(Op.WARM, CASE).to_wire()).suite is None


def test_a_failure_names_what_the_worker_was_doing_in_the_words_it_always_had() -> None:
    assert [run(suite).doing for suite in ("correctness", "memory", "speed", "properties", "sanitize", "bounds")] \
        == ["correctness", "memory", "speed", "property", "guard", "bounds"]
    assert Request(Op.DESCRIBE).doing == "describe"


def test_every_bundled_suite_names_a_handler_the_worker_can_make() -> None:
    assert set(BUNDLED) == {"correctness", "memory", "speed", "properties", "sanitize"}
    handlers = Handlers(BUNDLED)
    for name, path in BUNDLED.items():
        assert isinstance(load_handler(path), SuiteHandler), path
        assert isinstance(handlers.get(name), SuiteHandler)


def test_support_names_the_refusal_of_each_query(handler: Handler) -> None:
    fp8 = Case(1, 1, 1, 8, 8, 16, "float8_e4m3fn")
    reply = handler.handle(Request(Op.SUPPORT, options={"queries": [
        {"case": CASE.to_dict(), "backward": False}, {"case": fp8.to_dict(), "backward": False}]}))
    supported, refused = reply.data["refusals"]
    assert supported is None and refused


class Refusing(FunctionImpl):
    """Correct, but refuses every case, and counts how often it is asked."""

    def __init__(self) -> None:
        super().__init__(sdpa)
        self.asked = 0

    def not_supported_reasons(self, case, device, *, backward=False):
        self.asked += 1
        return ["it refuses every case"]


@pytest.mark.parametrize("request_of", [lambda checked: run("correctness", {"trials": 1}, checked=checked),
                                        lambda checked: Request(Op.WARM, CASE, False, 0, checked=checked)],
                         ids=["run", "warm"])
def test_the_implementation_is_asked_whether_it_supports_a_case_only_where_collection_did_not(request_of) -> None:
    impl = Refusing()
    handler = started(impl=impl)
    unchecked = handler.answer(request_of(False).to_wire())
    assert (unchecked.status, unchecked.message, impl.asked) == (Status.UNSUPPORTED, "it refuses every case", 1)
    # Accepted at collection (the runner sets checked): run without asking again.
    checked = handler.answer(request_of(True).to_wire())
    assert checked.status is Status.OK, checked.message
    assert impl.asked == 1


def test_a_checked_request_is_still_refused_for_a_broken_or_unavailable_implementation() -> None:
    handler = Handler()
    handler.handle(Request(Op.INIT, options={"device": "cpu", "handlers": BUNDLED}))
    reply = handler.answer(run("correctness", {"trials": 1}, checked=True).to_wire())
    assert (reply.status, reply.message) == (Status.BROKEN, "no implementation loaded")

    class Unavailable(FunctionImpl):
        def unavailable_reason(self, device):
            return "it needs a GPU"

    handler.impl = Unavailable(sdpa)
    reply = handler.answer(run("correctness", {"trials": 1}, checked=True).to_wire())
    assert (reply.status, reply.message) == (Status.UNAVAILABLE, "it needs a GPU")


def test_an_unknown_op_is_the_harness_error_envelope(handler: Handler) -> None:
    reply = handler.answer({"op": "no such op", "options": {}})
    assert reply.status is Status.HARNESS_ERROR
    assert "'no such op' is not a valid Op" in reply.message and "Traceback" in reply.message
    assert reply.spent.wall_s is not None and not reply.restart


def test_a_suite_without_a_handler_is_the_harness_error_envelope(handler: Handler) -> None:
    reply = handler.answer(run("nope").to_wire())
    assert reply.status is Status.HARNESS_ERROR
    assert ("this worker has no handler for the suite 'nope' (its init named: correctness, memory, properties, "
            "sanitize, speed)") in reply.message
    with pytest.raises(HandlerError, match="no handler for the suite 'nope'"):
        handler.handle(run("nope"))  # in-process: it meets the test as it is
    assert handler.answer(run("correctness", {"trials": 1}).to_wire()).status is Status.OK  # the worker goes on


def test_a_handler_that_cannot_be_made_fails_its_suite_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(FAKES))
    broken = {"broken": "broken_suite_handler:Handler", "missing": "no_such_attnkit_module:Handler",
              "absent": "suite_handlers:Absent", "other": "suite_handlers:NotAHandler", "malformed": "suite_handlers",
              "recording": "suite_handlers:Recording", "instance": "suite_handlers:INSTANCE"}
    handler = started({**broken, "correctness": BUNDLED["correctness"]})
    expected = {
        "broken": "RuntimeError: the handler module of a suite broke at import",
        "missing": "ModuleNotFoundError: No module named 'no_such_attnkit_module'",
        "absent": "AttributeError: module 'suite_handlers' has no attribute 'Absent'",
        "other": "suite_handlers:NotAHandler is <class 'suite_handlers.NotAHandler'>, not a "
                 "pytest_attnkit.worker.suite.SuiteHandler subclass",
        "malformed": "'suite_handlers' is not 'package.module:Class'",
    }
    for suite, words in expected.items():
        reply = handler.answer(run(suite).to_wire())
        assert reply.status is Status.HARNESS_ERROR, suite
        assert f"the {suite} suite's worker handler {broken[suite]} could not be made" in reply.message
        assert words in reply.message, reply.message
    for suite in ("recording", "instance"):
        reply = handler.answer(run(suite).to_wire())
        assert (reply.status, reply.data["case"], reply.data["device"]) == (Status.OK, CASE.id, "cpu")
    assert handler.answer(run("correctness", {"trials": 1}).to_wire()).status is Status.OK


def test_what_a_handler_keeps_is_forgotten_before_any_other_request(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(FAKES))
    handler = started({"recording": "suite_handlers:Recording", "correctness": BUNDLED["correctness"]})
    forgotten = lambda: handler.answer(run("recording").to_wire()).data["forgotten"]  # noqa: E731
    assert forgotten() == 0
    assert forgotten() == 0  # its own requests: kept
    handler.answer(Request(Op.DESCRIBE).to_wire())
    assert forgotten() == 1
    handler.answer(run("correctness", {"trials": 1}).to_wire())
    assert forgotten() == 2


def test_the_speed_handler_keeps_its_warm_call_for_blocks_only(handler: Handler) -> None:
    speed = handler.handlers.get("speed")
    block = run("speed", {"budget_ms": 5, "samples": 2})
    assert handler.answer(block.to_wire()).status is Status.OK
    warm = speed._warm_call
    assert warm is not None
    assert handler.answer(block.to_wire()).data["timing"]
    assert speed._warm_call is warm  # the next block samples the same call
    handler.answer(run("correctness", {"trials": 1}).to_wire())
    assert speed._warm_call is None  # another suite's request: dropped
    handler.answer(block.to_wire())
    assert speed._warm_call is not None
    handler.answer(run("speed", {"budget_ms": 5}).to_wire())
    assert speed._warm_call is None  # a speed request that is no block: dropped too


def test_a_harness_failure_in_an_op_is_the_harness_error_envelope_and_raises_in_handle(handler: Handler) -> None:
    request = run("correctness", {"trials": 1}, case=None)  # no case: the harness's own bug
    reply = handler.answer(request.to_wire())
    assert reply.status is Status.HARNESS_ERROR
    assert "'correctness' request names no case" in reply.message
    with pytest.raises(ValueError, match="names no case"):  # in-process: it meets the test as it is (pdb)
        handler.handle(request)


def test_a_refused_case_is_a_reply_not_a_harness_error() -> None:
    handler = Handler()
    handler.handle(Request(Op.INIT, options={"device": "cpu", "handlers": BUNDLED}))
    reply = handler.answer(run("correctness", {"trials": 1}).to_wire())
    assert (reply.status, reply.message) == (Status.BROKEN, "no implementation loaded")
