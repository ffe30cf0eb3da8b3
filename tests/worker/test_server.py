"""The worker's Handler, in this process: every op has a handler in its table and answers one
Reply envelope; what the harness raises (an op this version does not know too) is the
HARNESS_ERROR envelope with the traceback, never an answer of another shape.
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from pytest_attnkit.contract import Case, FunctionImpl  # noqa: E402
from pytest_attnkit.messages import Op, Reply, Request, Status  # noqa: E402
from pytest_attnkit.worker.server import Handler  # noqa: E402

CASE = Case(1, 1, 1, 8, 8, 16, "float32")


def sdpa(q, k, v, *, causal=False, scale=None):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)


@pytest.fixture
def handler() -> Handler:
    handler = Handler()
    handler.handle(Request(Op.INIT, options={"device": "cpu"}))
    handler.impl = FunctionImpl(sdpa)
    return handler


def test_the_op_table_has_a_handler_for_every_op() -> None:
    assert set(Handler().ops) == set(Op)


#: One request of each op, and a key its reply's data holds (memory's meter needs a GPU: left out).
REQUESTS = {
    Op.INIT: (Request(Op.INIT, options={"device": "cpu"}), "pid"),
    Op.DESCRIBE: (Request(Op.DESCRIBE), "capabilities"),
    Op.ENVIRONMENT: (Request(Op.ENVIRONMENT), None),
    Op.SUPPORT: (Request(Op.SUPPORT, options={"queries": [{"case": CASE.to_dict(), "backward": False}]}), "refusals"),
    Op.CORRECTNESS: (Request(Op.CORRECTNESS, CASE, False, 0, {"trials": 1}), "comparisons"),
    Op.SPEED: (Request(Op.SPEED, CASE, False, 0, {"budget_ms": 5}), "timing"),
    Op.WARM: (Request(Op.WARM, CASE, True, 0), None),
    Op.GUARD: (Request(Op.GUARD, CASE, False, 0), None),
    Op.PROPERTY: (Request(Op.PROPERTY, CASE, False, 0, {"check": "determinism"}), None),
    Op.CEILINGS: (Request(Op.CEILINGS), "ceilings"),
    Op.SHUTDOWN: (Request(Op.SHUTDOWN), None),
}


@pytest.mark.parametrize("op", [op for op in Op if op is not Op.MEMORY], ids=lambda op: op.value)
def test_each_op_answers_one_reply_envelope(handler: Handler, op: Op) -> None:
    request, key = REQUESTS[op]
    # Over the wire as the worker loop takes it: the request's JSON in, one Reply out.
    reply = handler.answer(json.loads(json.dumps(request.to_wire())))
    assert isinstance(reply, Reply)
    assert reply.status is Status.OK, reply.message
    if key is not None:
        assert key in reply.data, reply.data
    assert reply.spent.wall_s is not None and reply.spent.wall_s >= 0
    wire = json.loads(json.dumps(reply.to_wire()))  # plain JSON: what the socket carries back
    assert Reply.from_wire(wire).to_wire() == wire
    assert handler.stopping is (op is Op.SHUTDOWN)


def test_support_names_the_refusal_of_each_query(handler: Handler) -> None:
    fp8 = Case(1, 1, 1, 8, 8, 16, "float8_e4m3fn")
    reply = handler.handle(Request(Op.SUPPORT, options={"queries": [
        {"case": CASE.to_dict(), "backward": False}, {"case": fp8.to_dict(), "backward": False}]}))
    supported, refused = reply.data["refusals"]
    assert supported is None and refused


def test_an_unknown_op_is_the_harness_error_envelope(handler: Handler) -> None:
    reply = handler.answer({"op": "no such op", "options": {}})
    assert reply.status is Status.HARNESS_ERROR
    assert "'no such op' is not a valid Op" in reply.message and "Traceback" in reply.message
    assert reply.spent.wall_s is not None and not reply.restart


def test_a_harness_failure_in_an_op_is_the_harness_error_envelope_and_raises_in_handle(handler: Handler) -> None:
    request = Request(Op.CORRECTNESS, None, False, 0, {"trials": 1})  # no case: the harness's own bug
    reply = handler.answer(request.to_wire())
    assert reply.status is Status.HARNESS_ERROR
    assert "names no case" in reply.message
    with pytest.raises(ValueError, match="names no case"):  # in-process: it meets the test as it is (pdb)
        handler.handle(request)


def test_a_refused_case_is_a_reply_not_a_harness_error() -> None:
    handler = Handler()
    reply = handler.answer(Request(Op.CORRECTNESS, CASE, False, 0, {"trials": 1}).to_wire())
    assert (reply.status, reply.message) == (Status.BROKEN, "no implementation loaded")
