"""Implementations for the properties suite's tests: each right on the day (the oracle passes it),
each honest or lying about one declared property. Copied into a fake distribution by the tests
(tests/suites/test_properties.py); never imported by the pytest process that runs the project's tests.
"""

import torch

from pytest_attnkit import AttentionImpl
from pytest_attnkit.oracle import attention_math


def _per_sequence(q, k, v, causal, scale):
    """Plain attention one sequence at a time: its bits cannot depend on the batch."""
    outs = [attention_math(q[b:b + 1].float(), k[b:b + 1].float(), v[b:b + 1].float(), causal=causal, scale=scale)
            for b in range(q.shape[0])]
    return torch.cat(outs).to(q.dtype)


class Honest(AttentionImpl):
    """Declares everything it does: deterministic, batch-invariant, compilable."""

    devices = ("cpu", "cuda")
    supports_backward = True
    deterministic = True
    batch_invariant = True
    supports_torch_compile = True

    def forward(self, q, k, v, *, causal=False, scale=None):
        return _per_sequence(q, k, v, causal, scale)


class Jittery(Honest):
    """Declares determinism, and adds noise far below any tolerance that changes every run."""

    def forward(self, q, k, v, *, causal=False, scale=None):
        out = _per_sequence(q, k, v, causal, scale)
        return out + (torch.rand_like(out, dtype=torch.float32) * 1e-3).to(out.dtype) * out.abs().max().clamp_max(1e-3)


class JitteryUndeclared(Jittery):
    deterministic = False


class DeterministicBackwardOnly(Honest):
    """Declares only its backward deterministic: its output jitters from run to run, by noise that
    autograd takes for a constant, so that the gradients do not."""

    deterministic = "backward"

    def forward(self, q, k, v, *, causal=False, scale=None):
        out = _per_sequence(q, k, v, causal, scale)
        return out + (torch.rand_like(out, dtype=torch.float32) * 1e-3).to(out.dtype)


class JitteryGradients(DeterministicBackwardOnly):
    """Declares only its backward deterministic, and scales its output by a factor that changes every
    run: the gradients move with it."""

    def forward(self, q, k, v, *, causal=False, scale=None):
        out = _per_sequence(q, k, v, causal, scale)
        return (out.float() * (1 + torch.rand_like(out, dtype=torch.float32) * 1e-2)).to(out.dtype)


class BatchDependent(Honest):
    """Declares batch invariance, and rounds differently in a batch of more than one sequence."""

    def forward(self, q, k, v, *, causal=False, scale=None):
        out = _per_sequence(q, k, v, causal, scale)
        if q.shape[0] > 1:
            out = (out.float() * (1 + 2 ** -8)).to(out.dtype)
        return out


class ReadsALengthOnTheHost(Honest):
    """Declares torch.compile, and reads a value back to the host to choose its path."""

    def forward(self, q, k, v, *, causal=False, scale=None):
        if float(q.abs().max()) > 1e6:  # a host read: a graph break under fullgraph=True
            return torch.zeros_like(q)
        return _per_sequence(q, k, v, causal, scale)


class BadDeclaration(Honest):
    deterministic = "sometimes"


@torch.library.custom_op("attnkit_test::plain_attention", mutates_args=())
def plain_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    return _per_sequence(q, k, v, causal, None)


@plain_attention.register_fake
def _(q, k, v, causal):
    return torch.empty_like(q)


@torch.library.custom_op("attnkit_test::misregistered_attention", mutates_args=())
def misregistered_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    return _per_sequence(q, k, v, causal, None)


@misregistered_attention.register_fake
def _(q, k, v, causal):
    return q.new_empty(q.shape[0], q.shape[1], q.shape[2], q.shape[3] + 1)  # the wrong shape


class CustomOp(Honest):
    supports_backward = False
    custom_op = "attnkit_test::plain_attention"

    def forward(self, q, k, v, *, causal=False, scale=None):
        return torch.ops.attnkit_test.plain_attention(q, k, v, causal)


class MisregisteredOp(CustomOp):
    custom_op = "attnkit_test::misregistered_attention"

    def forward(self, q, k, v, *, causal=False, scale=None):
        return torch.ops.attnkit_test.misregistered_attention(q, k, v, causal)
