"""Guarded inputs: every input of a call inside a buffer whose bytes before and after it are poison.

compute-sanitizer's memcheck checks each access against the allocations. Inside torch's caching
allocator a tensor is a piece of a larger block, and a read of a few hundred bytes past its end is
not out of bounds for the tool; the suite's worker under the tool turns the cache off and pads
each allocation, and then memcheck reported every read from 4 bytes to 256 KiB past tensors of
3616 bytes to 1 MiB (H100 2026-11-25, H200 2026-11-26: docs/properties.md, "What it sees"). That
is the commonest out-of-bounds bug of an attention kernel: an unmasked load of the last, partial
tile of keys or values, whose extra rows the scores then mask out, so every number is right.

The sanitize suite also runs each case with its inputs guarded: a second net that does not
depend on the tool (it runs on the CPU, and without compute-sanitizer), and that names the input. Each input tensor (q, k, v, the
upstream gradient, a variant's slopes, sinks and LSE gradient, FP8 descales, and the integer
offsets, block tables and cache lengths of packed and paged cases) is copied into the middle of a
buffer of its own, :data:`GUARD_BYTES` of poison on each side: NaN for a floating-point tensor,
:data:`INT_POISON` for an integer one. The call then runs on the guarded copies, with the same
values, strides and alignment (a guard is a whole number of 256-byte blocks), and

- a read past an input's end (or before its start) reads NaN, which reaches the result where it
  is multiplied, even by a probability of zero (``0 * NaN`` is NaN): an output element that is
  finite without guards and not finite with them is a read out of bounds. A value read past the
  end that is discarded before any arithmetic (``where(mask, s, -inf)`` on loaded keys) does not
  reach the result: then only memcheck can see the read, and only when it leaves the allocation;
- a read past the end of an integer input gets an offset or a page number far out of range, which
  the kernel then follows: the guarded call faults or runs out of bounds where the plain one did not;
- a write past an input's end, or before its start, changes the guard.

Once something is found, each input is guarded alone to say which one it was. What this cannot
see: reads and writes out of bounds of the buffers the kernel allocates itself (memcheck's, through
torch's allocator: :mod:`pytest_attnkit.controller.sanitize`), and reads further from the input
than the guard reaches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

#: Poison on each side of every guarded input: a whole tile of the largest inputs the sanitize
#: cases have (128 rows of 4 heads of 128 bf16 values are 128 KiB) and more.
GUARD_BYTES = 1 << 20
#: What the guard of an integer input holds: an offset, a length or a page number no case has,
#: that sends a kernel which uses it far out of bounds.
INT_POISON = 1 << 30


@dataclass
class Guard:
    """One guarded input: the buffer, how many elements of poison lie before the input's span,
    and how long the span is."""

    name: str
    buffer: "torch.Tensor"
    before: int
    span: int

    def poison_kept(self) -> bool:
        """Whether both guards still hold their poison (a write out of bounds changes them)."""
        head, tail = self.buffer[: self.before], self.buffer[self.before + self.span:]
        return bool(_is_poison(head).all()) and bool(_is_poison(tail).all())


def _is_poison(values: "torch.Tensor") -> "torch.Tensor":
    import torch

    if values.dtype.is_floating_point:
        return torch.isnan(values.float())
    return values == INT_POISON


def _span(tensor: "torch.Tensor") -> int:
    """Elements from the tensor's first to its last element in its storage (strides >= 0)."""
    return 1 + sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride()))


def guarded_copy(name: str, tensor: "torch.Tensor", guard_bytes: int = GUARD_BYTES) -> tuple["torch.Tensor", Guard]:
    """A copy of ``tensor`` with the same shape, strides and values, inside a buffer with
    ``guard_bytes`` of poison before and after its span."""
    import torch

    if any(stride < 0 for stride in tensor.stride()):
        raise ValueError(f"{name} has a negative stride; a guard needs strides of at least 0")
    element = tensor.element_size()
    before = math.ceil(guard_bytes / 256) * 256 // element
    span = _span(tensor) if tensor.numel() else 0
    buffer = torch.empty(before + span + before, dtype=tensor.dtype, device=tensor.device)
    if tensor.dtype.is_floating_point and element == 1:
        buffer.view(torch.uint8).fill_(0x7F)  # NaN in FP8's e4m3 and e5m2 alike
    elif tensor.dtype.is_floating_point:
        buffer.fill_(float("nan"))
    else:
        buffer.fill_(INT_POISON)
    copy = buffer.as_strided(tensor.shape, tensor.stride(), storage_offset=before)
    copy.copy_(tensor.detach())
    return copy.detach(), Guard(name, buffer, before, span)


def guard_inputs(inputs: Any, only: str | None = None) -> tuple[Any, list[Guard]]:
    """``inputs`` (:class:`pytest_attnkit.worker.inputs.Inputs`) with every tensor guarded, or
    only the one named ``only``; the guards, to check after the call."""
    import torch

    guards: list[Guard] = []
    changes: dict[str, Any] = {}

    def guard(name: str, value: Any) -> Any:
        if not isinstance(value, torch.Tensor) or (only is not None and name != only):
            return value
        copy, kept = guarded_copy(name, value)
        guards.append(kept)
        return copy

    for field in fields(inputs):
        value = getattr(inputs, field.name)
        if isinstance(value, torch.Tensor):
            changes[field.name] = guard(field.name, value)
    if inputs.layout_keywords:
        changes["layout_keywords"] = {key: guard(key, value) for key, value in inputs.layout_keywords.items()}
    return replace(inputs, **changes), guards


def input_names(inputs: Any) -> list[str]:
    """The names of the tensors :func:`guard_inputs` guards."""
    import torch

    names = [field.name for field in fields(inputs) if isinstance(getattr(inputs, field.name), torch.Tensor)]
    return names + [key for key, value in (inputs.layout_keywords or {}).items() if isinstance(value, torch.Tensor)]


def newly_not_finite(plain: dict[str, "torch.Tensor"], guarded: dict[str, "torch.Tensor"]) -> dict[str, int]:
    """Per result (``out``, ``lse``, ``dq``, ...): how many elements are finite in the plain call
    and not finite in the guarded one."""
    import torch

    found = {}
    for name, value in plain.items():
        other = guarded.get(name)
        if other is None or other.shape != value.shape:
            continue
        count = int((torch.isfinite(value.float()) & ~torch.isfinite(other.float())).sum().item())
        if count:
            found[name] = count
    return found


def check_guarded(impl: Any, case: Any, *, device: str, seed: int, backward: bool) -> Any:
    """Run ``case`` on plain inputs, then on guarded copies of the same inputs (the module
    docstring), and reply ``WRONG`` with what the guards found: results that are finite on plain
    inputs and not on guarded ones, guards that changed, a call that fails only when guarded; each
    traced to the input whose guard alone gives it. ``OK`` with the inputs guarded otherwise. What
    the implementation raises on plain inputs propagates (its correctness tests say more)."""
    from pytest_attnkit.messages import Reply, Status
    from pytest_attnkit.worker.correctness import run_for_results
    from pytest_attnkit.worker.inputs import make_inputs

    inputs = make_inputs(case, device, seed)
    plain = run_for_results(impl, case, inputs, device, backward)

    def guarded_run(only: str | None) -> tuple[dict[str, int], list[str], str | None]:
        guarded, guards = guard_inputs(inputs, only)
        try:
            results = run_for_results(impl, case, guarded, device, backward)
            _synchronize(device)
        except Exception as error:  # fails only when guarded: it followed a poisoned offset
            text = str(error).strip()
            return {}, [], f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"

        return newly_not_finite(plain, results), [guard.name for guard in guards if not guard.poison_kept()], None

    found, breached, failed = guarded_run(None)
    names = input_names(inputs)
    if not found and not breached and failed is None:
        return Reply(Status.OK, "", {"guarded": names, "guard_bytes": GUARD_BYTES})
    culprits = []
    for name in names if _usable(device) else ():  # which input's guard alone gives it
        alone, breached_alone, failed_alone = guarded_run(name)
        if alone or breached_alone or failed_alone:
            culprits.append((name, alone, breached_alone, failed_alone))
    lines = []
    for name, alone, breached_alone, failed_alone in culprits:
        if alone:
            counts = ", ".join(f"{count} of {result}" for result, count in alone.items())
            lines.append(f"reads past the end (or before the start) of {name}: with {GUARD_BYTES // 1024} KiB of "
                         f"{_poison_word(inputs, name)} around {name}, {counts} became NaN or infinite where the "
                         "same inputs unguarded give finite values")
        if breached_alone:
            lines.append(f"writes past the end (or before the start) of its input {name}: the poison around it "
                         "changed")
        if failed_alone:
            lines.append(f"fails only with {name} guarded ({_poison_word(inputs, name)} around it): it reads past "
                         f"its end and follows what it read ({failed_alone})")
    if not lines:  # only all guards together show it
        detail = failed or "; ".join(f"{count} of {result} not finite" for result, count in found.items())
        lines.append(f"differs with every input guarded and with no single one: {detail or 'guards changed: ' + ', '.join(breached)}")
    return Reply(Status.WRONG, "out of bounds with guarded inputs (each input inside poison; "
                 "pytest_attnkit/worker/guards.py):\n" + "\n".join(f"- {line}" for line in lines),
                 {"guarded": names, "guard_bytes": GUARD_BYTES, "culprits": [name for name, *_ in culprits]})


def _poison_word(inputs: Any, name: str) -> str:
    tensor = getattr(inputs, name, None)
    if tensor is None:
        tensor = (inputs.layout_keywords or {}).get(name)
    return "NaN" if tensor is None or tensor.dtype.is_floating_point else f"{INT_POISON}"


def _usable(device: str) -> bool:
    """Whether the device still runs work: an illegal address poisons a CUDA context for good."""
    try:
        _synchronize(device)
    except Exception:
        return False
    return True


def _synchronize(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()
