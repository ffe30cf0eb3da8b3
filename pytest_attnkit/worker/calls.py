"""Calling an implementation as every suite of the worker does: held to the contract on the way,
and what it raises shown as its own.

:func:`call_implementation` makes the call, with the case's keywords
(:func:`~pytest_attnkit.worker.inputs.variant_keywords`); a forward() that refuses one of them,
which its declaration brings, is a breach of the contract, named with the declaration.

The contract's checks of one call live here, once, for the correctness, speed, properties and
memory suites: what the call returned is a tensor of the shape, dtype and device the contract asks
(:func:`check_returned`), with backward it is attached to autograd and gives every gradient
(:func:`gradients`), and the inputs are as they were (:class:`InputWatch`). A breach raises
:class:`ContractViolation`, which the worker's loop turns into a WRONG reply in every suite, in the
same words: "output: returned shape [1, 2, 17, 31] where the contract asks [1, 2, 17, 32]", "the
implementation modified its input k". The correctness suite checks every call it makes; the others
check the first call of a request (the speed suite's first warm-up call, never a timed one).

Inputs are compared bit for bit with a copy made once per request, before the first call. Where a
copy does not fit beside the case (on the GPU, inputs larger than :data:`COPY_SHARE` of the free
device memory; the memory suite, which measures the memory a copy would take, never copies), a
checksum of their bits stands in: the integer sum of each element's bit pattern, taken in pieces
of :data:`CHECKSUM_PIECE` elements. It sees any change of a single element and almost any other,
but not one that exactly offsets another (two elements swapped).

:func:`kernel_traceback` formats what an implementation raised without the harness's own frames:
the frames from the implementation's first one down, after one line saying where the harness
called it.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
import traceback
from typing import TYPE_CHECKING, Any, Iterator

from pytest_attnkit.contract import FP8_DTYPES, FP8_OUTPUT_DTYPE, PAGED_KEYWORDS, VARLEN_KEYWORDS, Case, is_fp8
from pytest_attnkit.worker.inputs import Inputs, expected_shapes, make_inputs, variant_keywords

if TYPE_CHECKING:
    import torch

#: Inputs are copied for the comparison when they take at most this share of the free device memory.
COPY_SHARE = 0.25
#: The checksum's piece: its int64 copy is 64 MiB at most.
CHECKSUM_PIECE = 8 * 2**20
#: Where the harness's own code lives: frames from here, before the implementation's first, are not shown.
HARNESS_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: Where an installed copy keeps the bundled implementations (pyproject.toml maps ``implementations/``
#: to ``pytest_attnkit.implementations``): under HARNESS_ROOT, but theirs are the kernel's frames.
BUNDLED_ROOT = os.path.join(HARNESS_ROOT, "implementations")


class ContractViolation(Exception):
    """The implementation returned something the contract forbids (wrong shape, modified inputs...)."""


def _listed(shape: Any) -> str:
    return "[" + ", ".join(str(size) for size in shape) + "]"


def check_tensor(name: str, value: Any, reference: Any, *, shape: tuple[int, ...] | None = None,
                 dtype: Any = None) -> None:
    """``value`` must be a tensor with ``reference``'s shape, dtype and device (or those given)."""
    import torch

    if not isinstance(value, torch.Tensor):
        raise ContractViolation(f"{name}: returned a {type(value).__name__} where the contract asks a torch.Tensor")
    shape = tuple(reference.shape) if shape is None else tuple(shape)
    dtype = reference.dtype if dtype is None else dtype
    problems = []
    if tuple(value.shape) != shape:
        problems.append(f"returned shape {_listed(value.shape)} where the contract asks {_listed(shape)}")
    if value.dtype != dtype:
        problems.append(f"returned dtype {value.dtype} where the contract asks {dtype}")
    if value.device != reference.device:
        problems.append(f"returned it on device {value.device} where the contract asks {reference.device}")
    if problems:
        raise ContractViolation(f"{name}: " + "; ".join(problems))


def split_output(case: Case, returned: Any) -> tuple[Any, Any]:
    """(out, lse) from what the implementation returned: ``(out, lse)`` when the case asks for it."""
    if not case.return_lse:
        return returned, None
    if not isinstance(returned, (tuple, list)) or len(returned) != 2:
        raise ContractViolation(f"return_lse=True: expected (out, lse), got a {type(returned).__name__}"
                                + (f" of length {len(returned)}" if isinstance(returned, (tuple, list)) else ""))
    return returned[0], returned[1]


def check_returned(case: Case, returned: Any, q: Any, *, backward: bool = False) -> tuple[Any, Any]:
    """(out, lse) of a call on ``q``, each as the contract asks; with ``backward``, attached to autograd."""
    import torch

    out, lse = split_output(case, returned)
    out_shape, lse_shape = expected_shapes(case)
    check_tensor("output", out, q, shape=out_shape, dtype=getattr(torch, FP8_OUTPUT_DTYPE) if is_fp8(case.dtype)
                 else q.dtype)
    if lse is not None:
        check_tensor("lse", lse, q, shape=lse_shape, dtype=torch.float32)
    if backward:
        if not out.requires_grad:
            raise ContractViolation(
                "the output is detached from autograd (no grad_fn), but the implementation declares backward support")
        if lse is not None and not lse.requires_grad:
            raise ContractViolation("the lse is detached from autograd (no grad_fn): its gradient must flow")
    return out, lse


def gradients(outputs: list[Any], upstream: list[Any], leaves: dict[str, Any]) -> dict[str, Any]:
    """The gradients of ``leaves`` (by name: "dq", ...) for ``outputs`` and their upstream
    gradients, held to the contract by :func:`check_gradients`."""
    import torch

    grads = torch.autograd.grad(outputs, tuple(leaves.values()), upstream, allow_unused=True)
    check_gradients(leaves, grads)
    return dict(zip(leaves, grads))


def check_gradients(leaves: dict[str, Any], grads: Any) -> None:
    """Each gradient (``allow_unused=True``'s, in the order of ``leaves``) present and shaped as its leaf."""
    for (name, leaf), grad in zip(leaves.items(), grads):
        if grad is None:
            raise ContractViolation(f"gradient {name} is missing: the result does not depend on {name[1:]} "
                                    "through autograd")
        check_tensor(f"gradient {name}", grad, leaf)


def given_inputs(q: Any, k: Any, v: Any, inputs: Inputs, *, sinks: Any = None) -> dict[str, Any]:
    """Every tensor a call hands the implementation, by name."""
    given = {"q": q, "k": k, "v": v, "sinks": inputs.sinks if sinks is None else sinks,
             "alibi_slopes": inputs.alibi_slopes, "q_descale": inputs.q_descale, "k_descale": inputs.k_descale,
             "v_descale": inputs.v_descale, **(inputs.layout_keywords or {})}
    return {name: tensor for name, tensor in given.items() if hasattr(tensor, "detach")}


def _integer_bits(tensor: Any) -> Any:
    import torch

    kind = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[tensor.element_size()]
    return tensor.detach().view(kind)  # a view of the same element size works on any strides


def _pieces(tensor: Any, limit: int) -> Iterator[Any]:
    if tensor.numel() <= limit or tensor.dim() == 0:
        yield tensor
        return
    step = max(1, limit // max(1, tensor.numel() // tensor.shape[0]))
    for part in tensor.split(step, dim=0):
        if part.numel() <= limit or part.dim() == 1:
            yield part
        else:
            yield from _pieces(part[0], limit)


def checksum(tensor: Any) -> int:
    """The integer sum of the bit patterns of ``tensor``'s elements (see the module docstring)."""
    import torch

    bits = _integer_bits(tensor)
    total = torch.zeros((), dtype=torch.int64, device=tensor.device)
    for piece in _pieces(bits, CHECKSUM_PIECE):
        total += piece.sum(dtype=torch.int64)
    return int(total)


class InputWatch:
    """What a call's inputs were before it, to tell afterwards whether the implementation changed
    them: a copy of each, or its :func:`checksum` where copies do not fit (module docstring)."""

    def __init__(self, given: dict[str, Any], *, copy: bool = True) -> None:
        import torch

        self.given = given
        size = sum(tensor.numel() * tensor.element_size() for tensor in given.values())
        on_gpu = any(tensor.is_cuda for tensor in given.values())
        if copy and on_gpu:
            copy = size <= COPY_SHARE * torch.cuda.mem_get_info()[0]
        self.copies = {name: tensor.detach().clone() for name, tensor in given.items()} if copy else None
        self.sums = None if copy else {name: checksum(tensor) for name, tensor in given.items()}

    @contextlib.contextmanager
    def blaming(self) -> Iterator[None]:
        """Where what runs inside raises (a :class:`ContractViolation` aside) and the inputs
        changed, raise :class:`ContractViolation` from it: autograd's complaint about a tensor
        "modified by an inplace operation" is then the modification's consequence, and the
        modification is what to report."""
        try:
            yield
        except ContractViolation:
            raise
        except Exception as error:
            try:
                self.check()
            except ContractViolation as violation:
                raise violation from error
            raise

    def check(self) -> None:
        """Raise :class:`ContractViolation` naming the first input that changed; then let go of the copies."""
        import torch

        for name, tensor in self.given.items():
            if self.copies is not None:
                before = self.copies[name]
                if not torch.equal(_integer_bits(tensor), _integer_bits(before)):
                    changed = int((_integer_bits(tensor) != _integer_bits(before)).sum())
                    raise ContractViolation(f"the implementation modified its input {name} ({changed} "
                                            f"element{'s' if changed != 1 else ''} changed)")
            elif checksum(tensor) != self.sums[name]:  # type: ignore[index]
                raise ContractViolation(f"the implementation modified its input {name} (the checksum of its bits "
                                        "changed)")
        self.copies = None


def call_implementation(impl: Any, case: Case, q: Any, k: Any, v: Any, inputs: Inputs, *,
                        sinks: Any = None) -> Any:
    """Call ``impl`` on ``case`` as the contract says: the variant keywords only when the case
    uses them (``sinks`` overrides the inputs' sink tensor, to hand one that requires grad)."""
    keywords = variant_keywords(case, inputs)
    if sinks is not None:
        keywords["sinks"] = sinks
    try:
        return impl(q, k, v, causal=case.causal, scale=None, **keywords)
    except TypeError as error:
        refused = refused_keyword(error, keywords)
        if refused is None:
            raise
        raise ContractViolation(refused) from None


#: The declaration that has the harness hand forward() each keyword (the contract's module doc).
DECLARED_BY: dict[str, str] = {
    "window_size": "supports_window = True", "softcap": "supports_softcap = True",
    "alibi_slopes": "supports_alibi = True", "sinks": "supports_sinks = True", "return_lse": "supports_lse = True",
    **{name: "supports_varlen = True" for name in VARLEN_KEYWORDS},
    **{name: "supports_paged_kv = True" for name in PAGED_KEYWORDS},
    **{name: f"an FP8 dtype in dtypes ({', '.join(FP8_DTYPES)})" for name in ("q_descale", "k_descale", "v_descale")},
}


def refused_keyword(error: TypeError, keywords: dict[str, Any]) -> str | None:
    """The words for a forward() that refused a keyword the harness handed it, because its
    declaration asks for it (Python's "got an unexpected keyword argument 'return_lse'", raised
    where the harness calls it, before any of the implementation's code ran); None for any other
    TypeError, the implementation's own included, which stays a traceback."""
    match = re.search(r"unexpected keyword argument '(\w+)'", str(error))
    frames = traceback.extract_tb(error.__traceback__)
    if match is None or match.group(1) not in keywords or not frames or not _is_harness(frames[-1]):
        return None
    name = match.group(1)
    return (f"forward() does not take the keyword {name}, which the harness hands it on this case because "
            f"the implementation declares {DECLARED_BY.get(name, 'a variant that uses it')}. "
            f"Give forward() the parameter ({name}=None, or **variants), or drop the declaration. "
            f"(TypeError: {error})")


def checked_call(impl: Any, case: Case, q: Any, k: Any, v: Any, inputs: Inputs, *, sinks: Any = None,
                 backward: bool = False, copy: bool = True) -> Any:
    """One call, as :func:`call_implementation` makes it, held to the contract: what it returned
    (with ``backward``, attached to autograd) and its inputs unchanged. Returns what it returned."""
    watch = InputWatch(given_inputs(q, k, v, inputs, sinks=sinks), copy=copy)
    returned = call_implementation(impl, case, q, k, v, inputs, sinks=sinks)
    if q.is_cuda:
        import torch

        torch.cuda.synchronize()
    check_returned(case, returned, q, backward=backward)
    watch.check()
    return returned


#: A warm-up calls its case a second time only when the first call took at most this long: then
#: the second says how much of the first was the case's first-call setup (a plan built, a kernel
#: compiled or loaded), at the cost of one call. A longer case's setup is left unmeasured.
NEXT_CALL_MAX_S = 1.0


def warm_call(impl: Any, case: Case, *, device: str, seed: int, backward: bool,
              again: bool = False) -> "tuple[float, float | None]":
    """One call of ``impl`` on ``case`` held to the contract (and the backward of its output, as
    the speed suite runs it), the results dropped: whatever the implementation compiles on a first
    call is compiled. Returns the seconds of that call and, with ``again`` where it took at most
    :data:`NEXT_CALL_MAX_S`, of a second one on the same inputs (else None), each synchronized
    and held to the contract alike, so that their difference is the first call's setup."""
    import torch

    inputs = make_inputs(case, device, seed)
    q, k, v = (t.detach().requires_grad_(backward) for t in (inputs.q, inputs.k, inputs.v))

    def timed() -> float:
        if device == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        with torch.set_grad_enabled(backward):
            returned = checked_call(impl, case, q, k, v, inputs, backward=backward)
        if backward:
            out = returned[0] if case.return_lse else returned
            watch = InputWatch(given_inputs(q, k, v, inputs))
            with watch.blaming():
                grads = torch.autograd.grad(out, (q, k, v), inputs.dout, allow_unused=True)
            check_gradients({"dq": q, "dk": k, "dv": v}, grads)
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - started

    first = timed()
    return first, (timed() if again and first <= NEXT_CALL_MAX_S else None)


def _is_harness(frame: traceback.FrameSummary) -> bool:
    """Whether ``frame`` is the harness's, not an implementation's: a bundled implementation's is
    its own in a checkout (``implementations/``) and in an installed copy (under the package)."""
    path = os.path.abspath(frame.filename)
    return path.startswith(HARNESS_ROOT + os.sep) and not path.startswith(BUNDLED_ROOT + os.sep)


def _trimmed(exception: traceback.TracebackException) -> str | None:
    """Drop the harness's frames before the implementation's first; the line that says where the
    harness called it, or None where every frame is the harness's (its own failure: kept whole)."""
    frames = list(exception.stack)
    first = next((index for index, frame in enumerate(frames) if not _is_harness(frame)), None)
    if first is None or first == 0:
        return None
    caller = frames[first - 1]
    exception.stack = traceback.StackSummary.from_list(frames[first:])
    where = os.path.relpath(caller.filename, os.path.dirname(HARNESS_ROOT))
    return f"  (called by the harness: {where}:{caller.lineno}, in {caller.name})\n"


def _format(exception: traceback.TracebackException, seen: set[int]) -> list[str]:
    seen.add(id(exception))
    lines: list[str] = []
    cause, context = exception.__cause__, exception.__context__
    if cause is not None and id(cause) not in seen:
        lines += _format(cause, seen) + ["\nThe above exception was the direct cause of the following exception:\n\n"]
    elif context is not None and not exception.__suppress_context__ and id(context) not in seen:
        lines += _format(context, seen) + ["\nDuring handling of the above exception, another exception occurred:\n\n"]
    called = _trimmed(exception)
    if exception.stack:
        lines.append("Traceback (most recent call last):\n")
        if called:
            lines.append(called)
        lines += exception.stack.format()
    lines += list(exception.format_exception_only())
    return lines


def kernel_traceback(error: BaseException) -> str:
    """``error``'s traceback as the implementation's: the harness's frames before the
    implementation's first frame left out, with one line saying where the harness called it."""
    return "".join(_format(traceback.TracebackException.from_exception(error), set()))
