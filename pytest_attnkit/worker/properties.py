"""The property checks, as the worker runs them: what the oracle cannot see on the day.

A kernel can give the right numbers and still be unusable: its backward differs from run to run
although it says ``deterministic``, one sequence's result changes with what else is in the batch,
it cannot be captured in a CUDA graph, or it breaks ``torch.compile(fullgraph=True)``. Each check
here runs one case and returns a :class:`~pytest_attnkit.messages.Reply` whose data says whether
the property held and how (:func:`result`); whether that fails the test is the declaration's to
decide (:mod:`pytest_attnkit.controller.properties`). Each is the ``checker`` of one
:class:`~pytest_attnkit.properties.Property`, and all take the same arguments,
``(impl, case, *, device, seed, backward, declared, accuracy)``; the worker's handler
(:mod:`pytest_attnkit.worker.suites.properties`) calls the one a request names and puts its name
in the reply. Every check holds its first call to the
contract (:mod:`pytest_attnkit.worker.calls`): a result of the wrong shape or a modified input is
WRONG, whatever is declared.

- :func:`check_determinism`: the same inputs, run ``runs`` times (forward, or forward and
  backward), must give bitwise the same tensors; the figures say how far apart they were. A
  backward run holds the gradients, and the forward's output and LSE only where the forward is
  declared deterministic too: ``deterministic = "backward"`` promises nothing about the forward.
- :func:`check_batch_invariance`: every sequence alone, in the batch reversed and in each half
  of it must give the bits it gives in the whole batch (dense: a sub-batch of the tensors;
  varlen: the sequences packed again; paged: rows of the block table over the same cache).
- :func:`check_cuda_graph`: warmed up on a side stream, captured, replayed on new inputs copied
  into the captured buffers, and the replay judged by the correctness rule against the float64
  oracle of the new inputs. A capture that fails says why (a host sync, an allocation outside
  torch's allocator); a sync is caught by torch's sync debug mode ("error") during the capture.
- :func:`check_torch_compile`: the call inside ``torch.compile(fullgraph=True)``, its result
  judged by the correctness rule; a graph break fails with torch's explanation.
- :func:`check_opcheck`: ``torch.library.opcheck`` on the custom op an implementation names
  (``custom_op``), with the arguments its forward passes it on one case.
"""

from __future__ import annotations

import dataclasses
import traceback
from typing import Any, Callable

from pytest_attnkit.contract import AttentionImpl, Case
from pytest_attnkit.messages import Reply, Status
from pytest_attnkit.worker.calls import (InputWatch, call_implementation, check_returned, checked_call, given_inputs,
                                         gradients)
from pytest_attnkit.worker.inputs import Inputs, make_inputs
from pytest_attnkit.worker.out_of_memory import is_out_of_memory

#: How often the determinism check runs a case.
DETERMINISM_RUNS = 3


def result(declared: bool, holds: bool, detail: str, **figures: Any) -> Reply:
    """A check's reply: WRONG when a declared property does not hold; OK otherwise (an undeclared
    property that does not hold is reported, not judged). The handler adds the check's name."""
    status = Status.WRONG if declared and not holds else Status.OK
    return Reply(status, detail if status is Status.WRONG else "",
                 {"declared": declared, "holds": holds, "detail": detail, "figures": figures})


def _outputs(case: Case, returned: Any) -> dict[str, Any]:
    if case.return_lse and isinstance(returned, (tuple, list)):
        return {"out": returned[0], "lse": returned[1]}
    return {"out": returned}


def _bits(tensor: Any) -> Any:
    """The tensor's bytes, so that equality is bitwise (NaN payloads and signed zeros included)."""
    import torch

    return tensor.detach().contiguous().view(torch.uint8)


def _same_bits(a: Any, b: Any) -> bool:
    import torch

    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(_bits(a), _bits(b))


def _spread(a: Any, b: Any) -> tuple[float, int]:
    """(the largest absolute difference, how many elements differ in their bits)."""
    import torch

    if a.shape != b.shape:
        return float("inf"), a.numel()
    differ = int((_bits(a).view(-1, a.element_size()) != _bits(b).view(-1, b.element_size())).any(-1).sum())
    largest = float((a.double() - b.double()).abs().nan_to_num(nan=float("inf")).max()) if a.numel() else 0.0
    return largest, differ


def _run_once(impl: AttentionImpl, case: Case, inputs: Inputs, backward: bool, *, checked: bool = False) -> dict[str, Any]:
    """One call on copies of the inputs: its outputs and, with backward, the gradients; ``checked``
    holds the call to the contract (:mod:`pytest_attnkit.worker.calls`)."""
    import torch

    q, k, v = (t.detach().clone().requires_grad_(backward) for t in (inputs.q, inputs.k, inputs.v))
    with torch.set_grad_enabled(backward):
        if checked:
            tensors = _outputs(case, checked_call(impl, case, q, k, v, inputs, backward=backward))
        else:
            tensors = _outputs(case, call_implementation(impl, case, q, k, v, inputs))
    if backward:
        outputs, upstream = [tensors["out"]], [inputs.dout]
        if "lse" in tensors and inputs.dlse is not None:
            outputs.append(tensors["lse"])
            upstream.append(inputs.dlse)
        if checked:
            tensors.update(gradients(outputs, upstream, {"dq": q, "dk": k, "dv": v}))
        else:
            grads = torch.autograd.grad(outputs, (q, k, v), upstream, allow_unused=True)
            tensors.update({name: grad for name, grad in zip(("dq", "dk", "dv"), grads) if grad is not None})
    return {name: tensor.detach().clone() for name, tensor in tensors.items()}


#: The tensors a backward run adds to the forward's, each the gradient of one input.
GRADIENTS = ("dq", "dk", "dv")


def check_determinism(impl: AttentionImpl, case: Case, *, device: str, seed: int, backward: bool,
                      declared: bool, accuracy: Any = None, runs: int = DETERMINISM_RUNS) -> Reply:
    """Whether ``runs`` runs on the same inputs give the same bits. With ``backward``, the property
    is the gradients'; the output and LSE of those runs are held too where the forward is declared
    deterministic as well. Otherwise their differences are in the detail and the figures, and the
    check holds all the same: ``deterministic = "backward"`` promises the gradients, nothing about
    the forward."""
    from pytest_attnkit.properties import Determinism

    hold_forward = Determinism().declared(impl.capabilities(), backward=False)
    inputs = make_inputs(case, device, seed)
    first = _run_once(impl, case, inputs, backward, checked=True)
    largest: dict[str, float] = {name: 0.0 for name in first}
    differing: dict[str, int] = {name: 0 for name in first}
    for _ in range(runs - 1):
        again = _run_once(impl, case, inputs, backward)
        for name, tensor in first.items():
            spread, count = _spread(tensor, again.get(name, tensor.new_empty(0)))
            largest[name] = max(largest[name], spread)
            differing[name] = max(differing[name], count)
    held = [name for name in first if not backward or hold_forward or name in GRADIENTS]
    moved = [name for name in held if differing[name]]
    aside = [name for name in first if name not in held and differing[name]]

    def differences(names: list[str]) -> str:
        return "; ".join(f"{name} differs in {differing[name]} elements, by up to {largest[name]:.3g}"
                         for name in names)

    what = "backward" if backward and not hold_forward else ("forward and backward" if backward else "forward")
    if moved:
        detail = f"{what} is not deterministic: over {runs} runs on the same inputs, {differences(moved)}"
    else:
        detail = f"{what}: bitwise identical over {runs} runs on the same inputs"
    if aside:
        detail += f" (not held, the forward is not declared deterministic: {differences(aside)})"
    return result(declared, not moved, detail, runs=runs, largest=largest, differing=differing)


# -- batch invariance ----------------------------------------------------------------------------


def _sub_batch(case: Case, inputs: Inputs, indices: list[int]) -> tuple[Case, Inputs]:
    """The case and inputs of the sequences ``indices`` (in that order), as a batch of their own."""
    import torch

    index = torch.tensor(indices, device=inputs.q.device)
    if case.kind == "dense":
        sub_case = dataclasses.replace(case, batch=len(indices))
        picked = {name: getattr(inputs, name).index_select(0, index) for name in ("q", "k", "v", "dout")}
        for name in ("q_descale", "k_descale", "v_descale"):
            if getattr(inputs, name) is not None:
                picked[name] = getattr(inputs, name).index_select(0, index)
        return sub_case, dataclasses.replace(inputs, **picked)
    if case.kind == "paged":
        keywords = dict(inputs.layout_keywords or {})
        keywords["block_table"] = keywords["block_table"].index_select(0, index)
        keywords["cache_seqlens"] = keywords["cache_seqlens"].index_select(0, index)
        assert case.seqlens_k is not None
        lengths = tuple(case.seqlens_k[i] for i in indices)
        sub_case = dataclasses.replace(case, batch=len(indices), seqlens_k=lengths, seqlen_k=max(max(lengths), 1))
        return sub_case, dataclasses.replace(inputs, q=inputs.q.index_select(0, index),
                                             dout=inputs.dout.index_select(0, index), layout_keywords=keywords)
    assert case.seqlens_q is not None and case.seqlens_k is not None
    starts_q, starts_k = _starts(case.seqlens_q), _starts(case.seqlens_k)
    rows_q = [torch.arange(starts_q[i], starts_q[i] + case.seqlens_q[i]) for i in indices]
    rows_k = [torch.arange(starts_k[i], starts_k[i] + case.seqlens_k[i]) for i in indices]
    pick_q = torch.cat(rows_q).to(inputs.q.device)
    pick_k = torch.cat(rows_k).to(inputs.q.device)
    lengths_q = tuple(case.seqlens_q[i] for i in indices)
    lengths_k = tuple(case.seqlens_k[i] for i in indices)
    sub_case = dataclasses.replace(case, batch=len(indices), seqlens_q=lengths_q, seqlens_k=lengths_k,
                                   seqlen_q=max(max(lengths_q), 1), seqlen_k=max(max(lengths_k), 1), unused_tokens=0)
    int32 = {"dtype": torch.int32, "device": inputs.q.device}
    keywords = {"cu_seqlens_q": torch.tensor(_starts(lengths_q) + [sum(lengths_q)], **int32),
                "cu_seqlens_k": torch.tensor(_starts(lengths_k) + [sum(lengths_k)], **int32),
                "max_seqlen_q": max(lengths_q), "max_seqlen_k": max(lengths_k)}
    return sub_case, dataclasses.replace(inputs, q=inputs.q.index_select(0, pick_q), k=inputs.k.index_select(0, pick_k),
                                         v=inputs.v.index_select(0, pick_k), dout=inputs.dout.index_select(0, pick_q),
                                         layout_keywords=keywords)


def _starts(lengths: "tuple[int, ...] | list[int]") -> list[int]:
    starts, total = [], 0
    for length in lengths:
        starts.append(total)
        total += length
    return starts


def _sequence_rows(case: Case, tensors: dict[str, Any], position: int) -> dict[str, Any]:
    """The output (and LSE) rows of the sequence at ``position`` of a batch."""
    if case.kind == "varlen":
        assert case.seqlens_q is not None
        start = _starts(case.seqlens_q)[position]
        stop = start + case.seqlens_q[position]
        rows = {"out": tensors["out"][start:stop]}
        if "lse" in tensors:
            rows["lse"] = tensors["lse"][:, start:stop]
        return rows
    return {name: tensor[position] for name, tensor in tensors.items()}


def check_batch_invariance(impl: AttentionImpl, case: Case, *, device: str, seed: int, backward: bool,
                           declared: bool, accuracy: Any = None) -> Reply:
    import torch

    inputs = make_inputs(case, device, seed)
    with torch.no_grad():
        whole = _outputs(case, checked_call(impl, case, inputs.q, inputs.k, inputs.v, inputs))
    sequences = list(range(case.batch))
    half = max(1, case.batch // 2)
    compositions = [[i] for i in sequences] + [sequences[::-1], sequences[:half], sequences[half:]]
    broken: list[str] = []
    for indices in compositions:
        if not indices:
            continue
        sub_case, sub_inputs = _sub_batch(case, inputs, indices)
        with torch.no_grad():
            part = _outputs(sub_case, call_implementation(impl, sub_case, sub_inputs.q, sub_inputs.k, sub_inputs.v,
                                                          sub_inputs))
        for position, sequence in enumerate(indices):
            expected = _sequence_rows(case, whole, sequence)
            got = _sequence_rows(sub_case, part, position)
            for name, tensor in expected.items():
                if not _same_bits(tensor, got[name]):
                    spread, count = _spread(tensor, got[name])
                    broken.append(f"sequence {sequence} in batch {indices}: {name} differs from the whole batch's in "
                                  f"{count} elements, by up to {spread:.3g}")
    if broken:
        detail = (f"not batch-invariant ({len(broken)} of the sequences' results moved): " + "; ".join(broken[:3])
                  + ("; ..." if len(broken) > 3 else ""))
    else:
        detail = (f"every sequence gave the same bits alone and in {len(compositions) - case.batch} other "
                  "compositions of the batch")
    return result(declared, not broken, detail, compositions=len(compositions),
                  moved=len(broken))


# -- CUDA graphs -------------------------------------------------------------------------------


def _copy_into(static: Inputs, fresh: Inputs) -> None:
    """New values into the captured buffers (the layout's tensors stay: the same sequences)."""
    for name in ("q", "k", "v", "alibi_slopes", "sinks", "q_descale", "k_descale", "v_descale"):
        target, source = getattr(static, name), getattr(fresh, name)
        if target is not None and source is not None:
            target.copy_(source)


def _judged(impl: AttentionImpl, case: Case, inputs: Inputs, returned: Any, declared: bool,
            accuracy: Any, how: str) -> Reply:
    from pytest_attnkit.worker.correctness import judge_forward

    # A result that breaks the contract raises ContractViolation: WRONG, declared or not.
    comparisons = judge_forward(impl, case, inputs, returned, accuracy)
    failed = [comparison for comparison in comparisons if not comparison.passed]
    if failed:
        return result(declared, False, f"{how}, and its result is wrong: "
                      + " ".join(comparison.describe() for comparison in failed))
    worst = max((comparison.headroom for comparison in comparisons), default=0.0)
    return result(declared, True, f"{how}; the result is right (worst headroom {worst:.2f})", headroom=worst)


def _first_line(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}".strip()
    return text.splitlines()[0] if text else type(error).__name__


def check_cuda_graph(impl: AttentionImpl, case: Case, *, device: str, seed: int, backward: bool, declared: bool,
                     accuracy: Any = None) -> Reply:
    import torch

    static = make_inputs(case, device, seed)

    def call() -> Any:
        return call_implementation(impl, case, static.q, static.k, static.v, static)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(side):
        checked_call(impl, case, static.q, static.k, static.v, static)
        for _ in range(2):  # compilation, autotuning and lazy allocations happen here, not in the capture
            call()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    previous = torch.cuda.get_sync_debug_mode()
    try:
        torch.cuda.set_sync_debug_mode("error")  # a host sync during the capture raises, with its place
        with torch.no_grad(), torch.cuda.graph(graph):
            captured = call()
    except Exception as error:
        if is_out_of_memory(error):
            raise  # not the property's failure: the case did not fit (worker/out_of_memory.py)
        torch.cuda.set_sync_debug_mode(previous)
        torch.cuda.synchronize()
        where = traceback.extract_tb(error.__traceback__)[-1]
        return result(declared, False,
                      f"cannot be captured in a CUDA graph: {_first_line(error)} (at {where.filename}:{where.lineno})")
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    fresh = make_inputs(case, device, seed + 1)
    _copy_into(static, fresh)
    graph.replay()
    torch.cuda.synchronize()
    return _judged(impl, case, static, captured, declared, accuracy,
                   "captured, and replayed on new inputs copied into its buffers")


# -- torch.compile -----------------------------------------------------------------------------


def check_torch_compile(impl: AttentionImpl, case: Case, *, device: str, seed: int, backward: bool,
                        declared: bool, accuracy: Any = None) -> Reply:
    import torch

    inputs = make_inputs(case, device, seed)

    def model(q: Any, k: Any, v: Any) -> Any:
        return call_implementation(impl, case, q, k, v, inputs)

    # A fresh compilation: nothing from an earlier case is reused. It throws away whatever else this
    # process compiled, which is why this check runs in a worker of its own (Isolation.DEDICATED).
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, dynamic=False)
    watch = InputWatch(given_inputs(inputs.q, inputs.k, inputs.v, inputs))
    try:
        with torch.no_grad():
            returned = compiled(inputs.q, inputs.k, inputs.v)
    except Exception as error:
        if is_out_of_memory(error):
            raise
        explanation = str(error).strip()
        lines = [line for line in explanation.splitlines() if line.strip()][:12]
        return result(declared, False,
                      f"breaks torch.compile(fullgraph=True): {type(error).__name__}: " + "\n".join(lines))
    watch.check()
    return _judged(impl, case, inputs, returned, declared, accuracy,
                   "runs inside torch.compile(fullgraph=True)")


# -- torch.library.opcheck ---------------------------------------------------------------------


def _op_name(func: Any) -> str | None:
    """"namespace::name" of a torch op (an overload or its packet), None for anything else."""
    schema = getattr(func, "_schema", None)
    if schema is not None:
        return str(schema.name)
    return getattr(func, "_qualified_op_name", None)


def check_opcheck(impl: AttentionImpl, case: Case, *, device: str, seed: int, backward: bool, declared: bool,
                  accuracy: Any = None) -> Reply:
    """Calls the implementation once with the op's calls recorded, then ``opcheck`` on the first
    call of the op it names (``custom_op``) that it made (the arguments it really passes)."""
    import torch

    op_name = str(impl.custom_op)
    namespace, _, name = op_name.partition("::")
    op = getattr(getattr(torch.ops, namespace), name)
    recorded: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    class Recorder(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func: Callable[..., Any], types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            if _op_name(func) == op_name and not recorded:
                recorded.append((args, kwargs))
            return func(*args, **kwargs)

    inputs = make_inputs(case, device, seed)
    watch = InputWatch(given_inputs(inputs.q, inputs.k, inputs.v, inputs))
    with Recorder():
        returned = call_implementation(impl, case, inputs.q, inputs.k, inputs.v, inputs)
    check_returned(case, returned, inputs.q)
    watch.check()
    if not recorded:
        return result(declared, False, f"the forward never called the custom op {op_name} it names (custom_op)")
    args, kwargs = recorded[0]
    try:
        torch.library.opcheck(op, args, kwargs)
    except Exception as error:
        if is_out_of_memory(error):
            raise
        return result(declared, False, f"torch.library.opcheck({op_name}) failed: {_first_line(error)}")
    return result(declared, True, f"torch.library.opcheck({op_name}) passed on the arguments the forward "
                                    "passes it")
