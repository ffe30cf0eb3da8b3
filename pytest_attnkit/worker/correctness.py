"""The correctness check that a worker runs for one implementation and one case.

For each trial: draw fresh seeded inputs, snapshot them, poison the allocator, run the
implementation (and its backward), check the contract (a tensor of the right shape, dtype and
device; inputs untouched), and only then compute the float64 oracle and the plain
same-precision reference, and apply the rule of :mod:`pytest_attnkit.worker.tolerance` to the output
and the gradients. Running the implementation before any reference means no freed reference
buffer can hold the right answer when the implementation allocates its output.

A variant case (window, softcap, ALiBi, sinks, the LSE, V's head dim) is called with its keyword
arguments and checked the same way: the LSE and, with backward, the sinks' gradient are compared
too, and the LSE gets an upstream gradient of its own so that its backward is checked with the
output's.

A varlen or paged-KV case is called with its layout's keywords and checked in its layout (the
contract's shapes); the references split it by sequence (:mod:`pytest_attnkit.oracle`), and a
varlen case's unused rows after the last sequence are left out of every comparison.

Which rule judges (see :mod:`pytest_attnkit.worker.tolerance`): an FP8 case, FA3's FP8 rule; else
the accuracy the pytest side sends (the implementation's declaration, or what the hook
``pytest_attnkit_accuracy`` chose for the case): "exact" is FlashAttention's rule, "quantized" or
an :class:`~pytest_attnkit.contract.AccuracyBudget` a budget of relative figures.

A failure's message ends with what the result looks like, where one common bug explains it
(:mod:`pytest_attnkit.worker.diagnosis`: wrong-on-purpose references of the oracle, judged by the
same rule; computed only after a failure).

Returns a :class:`~pytest_attnkit.messages.Reply` whose data is a
:class:`~pytest_attnkit.records.CorrectnessResult`: the deciding seed and trial, and every comparison.
"""

from __future__ import annotations

import math
from typing import Any

from pytest_attnkit.contract import FP8_OUTPUT_DTYPE, AccuracyBudget, AttentionImpl, Case, accuracy_budget, is_fp8
from pytest_attnkit.oracle import forward_and_grads, lse_rows_with_a_key
from pytest_attnkit.messages import Reply, Status
from pytest_attnkit.records import Comparison, CorrectnessResult
from pytest_attnkit.worker.calls import (ContractViolation, InputWatch, call_implementation, check_returned,
                                         given_inputs, gradients, kernel_traceback)
from pytest_attnkit.worker.diagnosis import Evidence, Suspect, Wrap, diagnose, keyless_rows_nonfinite
from pytest_attnkit.worker.inputs import dequantized, expected_shapes, make_inputs, poison_free_memory, trial_seed
from pytest_attnkit.worker.out_of_memory import out_of_memory_reply
from pytest_attnkit.worker.tolerance import compare, compare_budget, factor_and_extra_floor


def _synchronize(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def run_for_results(impl: AttentionImpl, case: Case, inputs: Any, device: str, backward: bool) -> dict[str, Any]:
    """Call ``impl`` on ``inputs`` (and its backward): the output, the LSE and the gradients by
    name; raises :class:`~pytest_attnkit.worker.calls.ContractViolation` for a breach of the
    contract (a wrong shape, a detached output, a modified input) and whatever the implementation
    raises."""
    import torch

    q, k, v = (t.detach().requires_grad_(backward) for t in (inputs.q, inputs.k, inputs.v))
    sinks = None if inputs.sinks is None else inputs.sinks.detach().requires_grad_(backward)
    watch = InputWatch(given_inputs(q, k, v, inputs, sinks=sinks))
    out_dtype = getattr(torch, FP8_OUTPUT_DTYPE) if is_fp8(case.dtype) else q.dtype
    out_shape, _ = expected_shapes(case)
    out_bytes = math.prod(out_shape) * out_dtype.itemsize
    poison_free_memory(device, [out_bytes] * 2 + ([k.numel() * k.element_size()] * 2 if backward else []))

    with torch.set_grad_enabled(backward):
        returned = call_implementation(impl, case, q, k, v, inputs, sinks=sinks)
    _synchronize(device)
    out, lse = check_returned(case, returned, q, backward=backward)
    results = {"out": out.detach()}
    if lse is not None:
        results["lse"] = lse.detach()
    if backward:
        outputs, upstream = [out], [inputs.dout]
        if lse is not None:
            outputs.append(lse)
            upstream.append(inputs.dlse)
        leaves = {"dq": q, "dk": k, "dv": v}
        if sinks is not None:
            leaves["dsinks"] = sinks
        with watch.blaming():  # autograd's "modified by an inplace operation": the modification is the fault
            grads = gradients(outputs, upstream, leaves)
        _synchronize(device)
        results.update({name: grad.detach() for name, grad in grads.items()})
    watch.check()
    return results


def _references(case: Case, inputs: Any, backward: bool, *, float64: bool, wrap: Wrap | None = None) -> dict[str, Any]:
    """The float64 oracle, or the plain reference: in the inputs' precision, or for an FP8 case
    FA3's, bf16 on the dequantized inputs with P rounded to the case's FP8 dtype. ``wrap``: a
    diagnosis suspect's alteration of the math (:mod:`pytest_attnkit.worker.diagnosis`)."""
    import torch

    fp8 = is_fp8(case.dtype)
    q, k, v = dequantized(case, inputs)
    plain_dtype = getattr(torch, FP8_OUTPUT_DTYPE) if fp8 and not float64 else None
    probs_dtype = getattr(torch, case.dtype) if fp8 and not float64 else None
    return forward_and_grads(q, k, v, inputs.dout if backward else None, causal=case.causal,
                             float64=float64, window=case.window, softcap=case.softcap,
                             alibi_slopes=inputs.alibi_slopes, sinks=inputs.sinks, return_lse=case.return_lse,
                             dlse=inputs.dlse, dtype=plain_dtype, probs_dtype=probs_dtype, packing=inputs.packing,
                             wrap=wrap)


def _used_rows(case: Case, tensors: dict[str, Any]) -> dict[str, Any]:
    """A varlen case's tensors without the unused rows after the last sequence (not checked)."""
    if case.kind != "varlen" or not case.unused_tokens:
        return tensors
    rows = {"out": case.total_q, "dq": case.total_q, "dk": case.total_k, "dv": case.total_k}
    trimmed = {name: tensor[:rows[name]] if name in rows else tensor for name, tensor in tensors.items()}
    if "lse" in trimmed:
        trimmed["lse"] = trimmed["lse"][:, :case.total_q]
    return trimmed


def _judge(case: Case, actual: dict[str, Any], oracle: dict[str, Any], inputs: Any, backward: bool,
           budget: AccuracyBudget | None, *, wrap: Wrap | None = None,
           plain: dict[str, Any] | None = None) -> tuple[Comparison, ...]:
    """Every comparison of ``actual`` with the oracle, by the rule that applies (module docstring).
    A diagnosis judges against a wrong-on-purpose ``oracle`` with the plain reference altered by the
    same ``wrap``; ``plain``, where given, is that plain reference, already computed."""
    import torch

    if budget is not None and not is_fp8(case.dtype):
        return tuple(compare_budget(name, actual[name], oracle[name], budget) for name in oracle)
    if plain is None:
        plain = _used_rows(case, _references(case, inputs, backward, float64=False, wrap=wrap))
    dtype = getattr(torch, FP8_OUTPUT_DTYPE if is_fp8(case.dtype) else case.dtype)
    return tuple(
        compare(name, actual[name], oracle[name], plain[name], dtype=dtype,
                rule="fp8" if is_fp8(case.dtype) else "exact", **factor_and_extra_floor(name, softcap=case.softcap))
        for name in oracle
    )


def _open_lse_rows_zeroed(case: Case, actual: dict[str, Any]) -> None:
    """The contract leaves the LSE of a row that sees no key (and has no sink) open; the
    references hold 0 there, and so does the implementation's once this has run."""
    import torch

    if "lse" not in actual or case.sinks:
        return
    rows = lse_rows_with_a_key(case, actual["lse"].device).expand_as(actual["lse"])
    if not bool(rows.all()):
        actual["lse"] = torch.where(rows, actual["lse"], torch.zeros((), dtype=actual["lse"].dtype,
                                                                     device=actual["lse"].device))


def judge_forward(impl: AttentionImpl, case: Case, inputs: Any, returned: Any,
                  accuracy: "str | dict[str, Any] | None" = None) -> tuple[Comparison, ...]:
    """The correctness rule applied to one forward call's result (``returned``, as the
    implementation gave it) on ``inputs``: for checks that run the kernel some other way than
    :func:`run_correctness` does (replayed from a CUDA graph, compiled by torch.compile).
    Raises :class:`ContractViolation` for a result of the wrong kind or shape."""
    out, lse = check_returned(case, returned, inputs.q)
    actual = {"out": out.detach()}
    if lse is not None:
        actual["lse"] = lse.detach()
    _open_lse_rows_zeroed(case, actual)
    oracle = _used_rows(case, _references(case, inputs, False, float64=True))
    budget = accuracy_budget(impl.accuracy if accuracy is None else accuracy)
    return _judge(case, _used_rows(case, actual), oracle, inputs, False, budget)


def _diagnosis(case: Case, inputs: Any, backward: bool, budget: AccuracyBudget | None, actual: dict[str, Any],
               oracle: dict[str, Any], comparisons: tuple[Comparison, ...]) -> "Suspect | None":
    """The common bug that explains a failed check, if one does (:mod:`pytest_attnkit.worker.diagnosis`);
    the wrong-on-purpose references are judged by the same rule as the check."""
    plain: dict[str, Any] = {}

    def judge(result: dict[str, Any], reference: dict[str, Any], wrap: Wrap | None) -> tuple[Comparison, ...]:
        if wrap is not None:
            return _judge(case, result, reference, inputs, backward, budget, wrap=wrap)
        if not plain and (budget is None or is_fp8(case.dtype)):  # the contract's plain reference, once
            plain.update(_used_rows(case, _references(case, inputs, backward, float64=False)))
        return _judge(case, result, reference, inputs, backward, budget, plain=plain or None)

    def reference(wrap: Wrap) -> dict[str, Any]:
        return _used_rows(case, _references(case, inputs, backward, float64=True, wrap=wrap))

    try:
        return diagnose(Evidence(case, inputs.packing, actual), comparisons, oracle, reference, judge)
    except Exception:  # noqa: BLE001 - a diagnosis that cannot finish (out of memory, say) names nothing
        return None


def run_correctness(
    impl: AttentionImpl,
    case: Case,
    *,
    device: str,
    base_seed: int,
    trials: int,
    backward: bool,
    accuracy: "str | dict[str, Any] | None" = None,
) -> Reply:
    """Check ``impl`` on ``case``; see the module docstring. Never raises for the implementation's
    faults. ``accuracy`` (a class name or a budget's fields) overrides the implementation's own."""
    budget = accuracy_budget(impl.accuracy if accuracy is None else accuracy)
    result = CorrectnessResult(trials)
    for trial in range(trials):
        seed = trial_seed(base_seed, case, trial)
        result = CorrectnessResult(trials, seed, trial, result.comparisons)
        inputs = make_inputs(case, device, seed)
        try:
            actual = run_for_results(impl, case, inputs, device, backward)
        except ContractViolation as violation:
            return Reply(Status.WRONG, str(violation), result.to_dict())
        except Exception as error:  # the implementation's own exception: its traceback, not the harness's
            return (out_of_memory_reply(error, result.to_dict())
                    or Reply(Status.RAISED, kernel_traceback(error), result.to_dict()))
        _open_lse_rows_zeroed(case, actual)
        actual = _used_rows(case, actual)
        oracle = _used_rows(case, _references(case, inputs, backward, float64=True))
        comparisons = _judge(case, actual, oracle, inputs, backward, budget)
        result = CorrectnessResult(trials, seed, trial, comparisons)
        failed = [comparison for comparison in comparisons if not comparison.passed]
        if failed:
            message = "\n".join(comparison.describe() for comparison in failed)
            suspect = _diagnosis(case, inputs, backward, budget, actual, oracle, comparisons)
            if suspect is not None:
                message += "\n" + suspect.line()
            elif (keyless := keyless_rows_nonfinite(case, actual, comparisons)) is not None:
                message += "\n" + keyless
            return Reply(Status.WRONG, message, result.to_dict())
        del actual, oracle, inputs
    return Reply(Status.OK, "", result.to_dict())
