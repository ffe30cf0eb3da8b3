"""The correctness check that a worker runs for one implementation and one case.

For each trial: draw fresh seeded inputs, snapshot them, poison the allocator, run the
implementation (and its backward), check the contract (a tensor of the right shape, dtype and
device; inputs untouched), and only then compute the float64 oracle and the plain
same-precision reference, and apply the rule of :mod:`pytest_attnkit.worker.tolerance` to the output
and the gradients. Running the implementation before any reference means no freed reference
buffer can hold the right answer when the implementation allocates its output.

Returns a :class:`~pytest_attnkit.records.Reply` whose data is a
:class:`~pytest_attnkit.records.CorrectnessResult`: the deciding seed and trial, and every comparison.
"""

from __future__ import annotations

import traceback
from typing import Any

from pytest_attnkit.contract import AttentionImpl, Case
from pytest_attnkit.oracle import forward_and_grads
from pytest_attnkit.records import CorrectnessResult, Reply, Status
from pytest_attnkit.worker.inputs import make_inputs, poison_free_memory, trial_seed
from pytest_attnkit.worker.tolerance import FORWARD_FACTOR, GRADIENT_FACTOR, compare


class ContractViolation(Exception):
    """The implementation returned something the contract forbids (wrong shape, modified inputs...)."""


def _check_tensor(name: str, value: Any, reference: Any) -> None:
    import torch

    if not isinstance(value, torch.Tensor):
        raise ContractViolation(f"{name} is a {type(value).__name__}, expected a torch.Tensor")
    problems = []
    if tuple(value.shape) != tuple(reference.shape):
        problems.append(f"shape {tuple(value.shape)} (expected {tuple(reference.shape)})")
    if value.dtype != reference.dtype:
        problems.append(f"dtype {value.dtype} (expected {reference.dtype})")
    if value.device != reference.device:
        problems.append(f"device {value.device} (expected {reference.device})")
    if problems:
        raise ContractViolation(f"{name} has the wrong " + " and ".join(problems))


def _synchronize(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def _run_implementation(impl: AttentionImpl, case: Case, inputs: Any, device: str, backward: bool) -> dict[str, Any]:
    import torch

    q, k, v = (t.detach().requires_grad_(backward) for t in (inputs.q, inputs.k, inputs.v))
    snapshots = {name: t.detach().clone() for name, t in (("q", q), ("k", k), ("v", v))}
    out_bytes = q.numel() * q.element_size()
    poison_free_memory(device, [out_bytes] * 2 + ([k.numel() * k.element_size()] * 2 if backward else []))

    with torch.set_grad_enabled(backward):
        out = impl(q, k, v, causal=case.causal, scale=None)
    _synchronize(device)
    _check_tensor("output", out, q)
    results = {"out": out.detach()}
    if backward:
        if not out.requires_grad:
            raise ContractViolation(
                "the output is detached from autograd (no grad_fn), but the implementation declares backward support"
            )
        grads = torch.autograd.grad(out, (q, k, v), inputs.dout)
        _synchronize(device)
        for name, grad, leaf in zip(("dq", "dk", "dv"), grads, (q, k, v)):
            _check_tensor(f"gradient {name}", grad, leaf)
            results[name] = grad.detach()
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        if not torch.equal(tensor.detach(), snapshots[name]):
            changed = int((tensor.detach() != snapshots[name]).sum().item())
            raise ContractViolation(f"the implementation modified its input {name} ({changed} elements changed)")
    return results


def run_correctness(
    impl: AttentionImpl,
    case: Case,
    *,
    device: str,
    base_seed: int,
    trials: int,
    backward: bool,
) -> Reply:
    """Check ``impl`` on ``case``; see the module docstring. Never raises for the implementation's faults."""
    import torch

    dtype = getattr(torch, case.dtype)
    result = CorrectnessResult(trials)
    for trial in range(trials):
        seed = trial_seed(base_seed, case, trial)
        result = CorrectnessResult(trials, seed, trial, result.comparisons)
        inputs = make_inputs(case, device, seed)
        try:
            actual = _run_implementation(impl, case, inputs, device, backward)
        except ContractViolation as violation:
            return Reply(Status.WRONG, str(violation), result.to_dict())
        except Exception:  # the implementation's own exception: report it whole
            return Reply(Status.RAISED, traceback.format_exc(), result.to_dict())
        dout = inputs.dout if backward else None
        oracle = forward_and_grads(inputs.q, inputs.k, inputs.v, dout, causal=case.causal, float64=True)
        plain = forward_and_grads(inputs.q, inputs.k, inputs.v, dout, causal=case.causal, float64=False)
        comparisons = tuple(
            compare(name, actual[name], oracle[name], plain[name], dtype=dtype,
                    factor=FORWARD_FACTOR if name == "out" else GRADIENT_FACTOR)
            for name in (("out", "dq", "dk", "dv") if backward else ("out",))
        )
        result = CorrectnessResult(trials, seed, trial, comparisons)
        failed = [comparison for comparison in comparisons if not comparison.passed]
        if failed:
            return Reply(Status.WRONG, "\n".join(comparison.describe() for comparison in failed), result.to_dict())
        del actual, oracle, plain, inputs
    return Reply(Status.OK, "", result.to_dict())
