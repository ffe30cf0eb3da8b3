"""The correctness rule: how far from the float64 oracle an implementation may be.

Following FlashAttention's tests, an implementation's worst error against the oracle may be at
most ``factor`` times the worst error of the plain same-precision implementation (2 for the
output, 3 for gradients), plus an absolute floor: twice the rounding error of the oracle's own
values in the tested dtype (see :func:`rounding_floor`). The floor keeps a
plain error of exactly zero from failing a correct kernel. NaN and Inf never pass.

The same rule covers the LSE (as an output) and the sinks' gradient (as a gradient). With a soft
cap, FlashAttention-3's and -4's tests widen the rule (see :func:`factor_and_extra_floor`).

A failure says where and by how much: the worst index, the values there, the error, the allowed
error and the share of elements outside the allowed error.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pytest_attnkit.records import Comparison

if TYPE_CHECKING:
    import torch

FORWARD_FACTOR = 2.0
GRADIENT_FACTOR = 3.0
#: With a soft cap, FlashAttention-3 and -4 allow 3x for the output too and add 3e-4 to the
#: gradients' floor: ``rtol = 2 if softcap == 0.0 else 3`` and
#: ``dq_atol = 2 * (dq_ref + 0.3 - 0.3 - dq_ref).abs().max().item() + (0 if softcap == 0 else 3e-4)``
#: in Dao-AILab/flash-attention ``hopper/test_flash_attn.py`` and ``tests/cute/test_flash_attn.py``.
SOFTCAP_FORWARD_FACTOR = 3.0
SOFTCAP_GRADIENT_EXTRA_FLOOR = 3e-4
#: The comparisons that are outputs of the forward pass; every other name is a gradient.
FORWARD_NAMES = ("out", "lse")


def factor_and_extra_floor(name: str, *, softcap: float = 0.0) -> dict[str, float]:
    """The rule's factor and any published widening of its floor, for the comparison ``name``."""
    if name in FORWARD_NAMES:
        return {"factor": SOFTCAP_FORWARD_FACTOR if softcap else FORWARD_FACTOR, "extra_floor": 0.0}
    return {"factor": GRADIENT_FACTOR, "extra_floor": SOFTCAP_GRADIENT_EXTRA_FLOOR if softcap else 0.0}


def rounding_floor(oracle: "torch.Tensor", dtype: "torch.dtype") -> float:
    """Twice the largest rounding error of ``x + 0.3`` held in ``dtype``, over the oracle's values.

    FlashAttention writes this ``(x + 0.3 - 0.3 - x)`` in the low precision; evaluating the
    rounding error in float64 keeps its meaning where ``x`` is exactly zero (a gradient that
    vanishes, as dq does with one key), which torch's CPU half arithmetic would round away.
    """
    import torch

    if not oracle.numel():
        return 0.0
    shifted = oracle.detach().to(torch.float64) + 0.3
    step = (shifted.to(dtype).to(torch.float64) - shifted).abs().max().item()
    return 2.0 * float(step)


def compare(
    name: str,
    actual: "torch.Tensor",
    oracle: "torch.Tensor",
    plain: "torch.Tensor",
    *,
    dtype: "torch.dtype",
    factor: float,
    extra_floor: float = 0.0,
) -> Comparison:
    """Apply the rule to ``actual`` (any dtype) against the float64 ``oracle`` and ``plain``;
    ``extra_floor`` is added to the rounding floor."""
    import torch

    actual64 = actual.detach().to(device=oracle.device, dtype=torch.float64)
    plain64 = plain.detach().to(device=oracle.device, dtype=torch.float64)
    floor = rounding_floor(oracle, dtype) + extra_floor
    plain_error = float((plain64 - oracle).abs().max().item()) if oracle.numel() else 0.0
    allowed = factor * plain_error + floor

    finite = torch.isfinite(actual64)
    nonfinite = int((~finite).sum().item())
    first_nonfinite = None
    if nonfinite:
        flat = int((~finite).flatten().nonzero()[0].item())
        first_nonfinite = tuple(int(i) for i in _unravel(flat, actual64.shape))

    error = (actual64 - oracle).abs().nan_to_num(nan=float("inf"))
    if error.numel():
        flat_worst = int(error.flatten().argmax().item())
        worst_index = tuple(int(i) for i in _unravel(flat_worst, error.shape))
        max_error = float(error.flatten()[flat_worst].item())
        outside = float((error > allowed).double().mean().item())
        worst_actual = float(actual64.flatten()[flat_worst].item())
        worst_expected = float(oracle.flatten()[flat_worst].item())
    else:
        worst_index, max_error, outside, worst_actual, worst_expected = (), 0.0, 0.0, 0.0, 0.0
    return Comparison(
        name=name,
        passed=nonfinite == 0 and max_error <= allowed,
        max_error=max_error,
        allowed=allowed,
        plain_error=plain_error,
        floor=floor,
        factor=factor,
        worst_index=worst_index,
        worst_actual=worst_actual,
        worst_expected=worst_expected,
        outside_fraction=outside,
        nonfinite=nonfinite,
        first_nonfinite_index=first_nonfinite,
    )


def _unravel(flat_index: int, shape: "torch.Size") -> list[int]:
    index = []
    for size in reversed(shape):
        index.append(flat_index % size)
        flat_index //= size
    return list(reversed(index))
