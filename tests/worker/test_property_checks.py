"""The properties suite's worker side, in this process on the CPU: every check has the one
signature its Property's checker promises, the handler finds the check by the request's name and
tells it whether the implementation declares it, and each check fails a broken implementation
that declares the property."""

from __future__ import annotations

import inspect

import pytest

torch = pytest.importorskip("torch")

from pytest_attnkit.contract import AttentionImpl, Case  # noqa: E402
from pytest_attnkit.controller.session import SUITE_TYPES  # noqa: E402
from pytest_attnkit.messages import Op, Reply, Request, Status  # noqa: E402
from pytest_attnkit.properties import PROPERTIES  # noqa: E402
from pytest_attnkit.worker.server import Handler  # noqa: E402
from pytest_attnkit.worker.suites.properties import checker  # noqa: E402

BATCH = Case(3, 2, 2, 16, 16, 16, "float32")


def sdpa(q, k, v, causal, scale):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)


class Honest(AttentionImpl):
    devices = ("cpu",)
    supports_backward = True
    deterministic = True
    batch_invariant = True
    supports_torch_compile = True

    def forward(self, q, k, v, *, causal=False, scale=None):
        return torch.cat([sdpa(q[b:b + 1], k[b:b + 1], v[b:b + 1], causal, scale) for b in range(q.shape[0])])


class JitteryForward(Honest):
    """Adds noise to the output that changes every run (its gradients do not move: the noise is a
    constant to autograd)."""

    def forward(self, q, k, v, *, causal=False, scale=None):
        out = super().forward(q, k, v, causal=causal, scale=scale)
        return out + torch.rand_like(out).detach() * 1e-6


class JitteryForwardBackwardDeclared(JitteryForward):
    deterministic = "backward"


class BatchDependent(Honest):
    def forward(self, q, k, v, *, causal=False, scale=None):
        return super().forward(q, k, v, causal=causal, scale=scale) * (1 + 1e-3 * q.shape[0])


class GraphBreak(Honest):
    def forward(self, q, k, v, *, causal=False, scale=None):
        if float(q.sum()) > float("inf"):  # a value read on the host: a graph break
            return q
        return super().forward(q, k, v, causal=causal, scale=scale)


class NamesAnOpItNeverCalls(Honest):
    custom_op = "aten::mm"


def answer(impl: AttentionImpl, check: str, *, case: Case = BATCH, backward: bool = False) -> Reply:
    handler = Handler()
    started = handler.handle(Request(Op.INIT, options={"device": "cpu",
                                                        "handlers": {"properties": SUITE_TYPES["properties"].handler}}))
    assert started.status is Status.OK
    handler.impl = impl
    return handler.handle(Request(Op.RUN, case, backward, 0, {"check": check}, suite="properties", checked=True))


@pytest.mark.parametrize("check", PROPERTIES, ids=lambda check: check.name)
def test_every_checker_takes_the_one_signature(check) -> None:
    parameters = inspect.signature(checker(check.checker)).parameters
    assert list(parameters)[:2] == ["impl", "case"]
    keywords = {name for name, parameter in parameters.items() if parameter.kind is inspect.Parameter.KEYWORD_ONLY}
    assert {"device", "seed", "backward", "declared", "accuracy"} <= keywords
    assert all(parameters[name].default is not inspect.Parameter.empty
               for name in keywords - {"device", "seed", "backward", "declared"})


def test_an_honest_implementation_holds_what_it_declares() -> None:
    for check in ("determinism", "batch_invariance"):
        reply = answer(Honest(), check)
        assert reply.status is Status.OK and reply.data["check"] == check
        assert reply.data["declared"] is True and reply.data["holds"] is True


def test_a_declared_determinism_that_does_not_hold_is_wrong() -> None:
    reply = answer(JitteryForward(), "determinism")
    assert reply.status is Status.WRONG and reply.data["check"] == "determinism"
    assert "forward is not deterministic" in reply.message and "out differs in" in reply.message


def test_the_backward_holds_the_forward_s_bits_only_where_the_forward_is_declared() -> None:
    both = answer(JitteryForward(), "determinism", backward=True)
    assert both.status is Status.WRONG and "out differs in" in both.message
    backward_only = answer(JitteryForwardBackwardDeclared(), "determinism", backward=True)
    assert backward_only.status is Status.OK and backward_only.data["holds"] is True
    assert "not held, the forward is not declared deterministic" in backward_only.data["detail"]


def test_an_undeclared_property_that_does_not_hold_is_reported_not_wrong() -> None:
    class Undeclared(JitteryForward):
        deterministic = False

    reply = answer(Undeclared(), "determinism")
    assert reply.status is Status.OK and reply.data["declared"] is False and reply.data["holds"] is False


def test_a_declared_batch_invariance_that_does_not_hold_is_wrong() -> None:
    reply = answer(BatchDependent(), "batch_invariance")
    assert reply.status is Status.WRONG and reply.data["check"] == "batch_invariance"
    assert reply.message.startswith("not batch-invariant")


def test_a_declared_torch_compile_that_breaks_the_graph_is_wrong() -> None:
    reply = answer(GraphBreak(), "torch_compile")
    assert reply.status is Status.WRONG and reply.data["check"] == "torch_compile"
    assert reply.message.startswith("breaks torch.compile(fullgraph=True)")


def test_a_custom_op_the_forward_never_calls_is_wrong() -> None:
    reply = answer(NamesAnOpItNeverCalls(), "opcheck")
    assert reply.status is Status.WRONG and reply.data["check"] == "opcheck"
    assert reply.message == "the forward never called the custom op aten::mm it names (custom_op)"
