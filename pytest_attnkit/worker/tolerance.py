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

Two more rules judge low-precision kernels (docs/accuracy.md, "Accuracy classes"):

- FP8 cases (FlashAttention-3's rule, ``hopper/test_flash_attn.py``): the same 2x, against a plain
  reference in bf16 on the dequantized inputs with P rounded to e4m3 before the PV product; the
  caller passes that reference as ``plain`` and ``rule="fp8"``.
- An implementation of accuracy class "quantized", or with an
  :class:`~pytest_attnkit.contract.AccuracyBudget` of its own: :func:`compare_budget`, relative
  figures (SageAttention's cosine similarity and relative L1, per tensor and per row, and
  optionally FlashInfer's elementwise atol/rtol) against the budget's limits.

Every comparison, whatever its rule, carries the same figures (:func:`error_figures`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pytest_attnkit.contract import AccuracyBudget
from pytest_attnkit.records import Comparison

if TYPE_CHECKING:
    import torch

#: Rows whose reference is (nearly) zero get this share of the tensor's RMS per element in the
#: row figure's denominator, so a row that sees no key cannot divide by zero.
ROW_FLOOR = 1e-3

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


def error_figures(actual64: "torch.Tensor", oracle: "torch.Tensor") -> dict[str, float]:
    """Relative L1 (whole tensor and worst row), cosine similarity and RMSE of ``actual64``
    against ``oracle`` (both float64, same shape; rows run along the last dim). Non-finite values
    make every figure the worst it can be."""
    import torch

    if not oracle.numel():
        return {"rel_l1": 0.0, "row_rel_l1": 0.0, "cosine": 1.0, "rmse": 0.0}
    if not bool(torch.isfinite(actual64).all()):
        inf = float("inf")
        return {"rel_l1": inf, "row_rel_l1": inf, "cosine": -1.0, "rmse": inf}
    difference = (actual64 - oracle).abs()
    reference_l1 = float(oracle.abs().sum().item())
    error_l1 = float(difference.sum().item())
    rel_l1 = error_l1 / reference_l1 if reference_l1 else (0.0 if error_l1 == 0 else float("inf"))
    rms = float(oracle.pow(2).mean().sqrt().item())
    row_error = difference.reshape(-1, oracle.shape[-1]).sum(dim=-1) if oracle.dim() else difference.reshape(1)
    row_reference = oracle.abs().reshape(-1, oracle.shape[-1]).sum(dim=-1) if oracle.dim() else oracle.abs().reshape(1)
    row_reference = row_reference + ROW_FLOOR * rms * (oracle.shape[-1] if oracle.dim() else 1)
    rows = row_error / row_reference
    rows = torch.where(row_error == 0, torch.zeros_like(rows), rows)
    row_rel_l1 = float(rows.max().item())
    norms = float(actual64.norm().item()) * float(oracle.norm().item())
    cosine = float((actual64 * oracle).sum().item()) / norms if norms else (1.0 if error_l1 == 0 else 0.0)
    rmse = float(difference.pow(2).mean().sqrt().item())
    return {"rel_l1": rel_l1, "row_rel_l1": row_rel_l1, "cosine": cosine, "rmse": rmse}


def compare(
    name: str,
    actual: "torch.Tensor",
    oracle: "torch.Tensor",
    plain: "torch.Tensor",
    *,
    dtype: "torch.dtype",
    factor: float,
    extra_floor: float = 0.0,
    rule: str = "exact",
) -> Comparison:
    """Apply the rule to ``actual`` (any dtype) against the float64 ``oracle`` and ``plain``;
    ``extra_floor`` is added to the rounding floor. ``rule`` names the rule ("exact" or "fp8":
    the same arithmetic, with FA3's FP8 reference as ``plain``)."""
    import torch

    actual64 = actual.detach().to(device=oracle.device, dtype=torch.float64)
    plain64 = plain.detach().to(device=oracle.device, dtype=torch.float64)
    floor = rounding_floor(oracle, dtype) + extra_floor
    plain_error = float((plain64 - oracle).abs().max().item()) if oracle.numel() else 0.0
    allowed = factor * plain_error + floor

    nonfinite, first_nonfinite = _nonfinite(actual64)

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
    figures = error_figures(actual64, oracle)
    headroom = max_error / allowed if allowed else (0.0 if max_error == 0 else float("inf"))
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
        rule=rule,
        headroom=headroom if not nonfinite else float("inf"),
        **figures,
    )


def budget_headroom(figures: dict[str, float], budget: AccuracyBudget, elementwise: float | None) -> float:
    """The largest measured / limit over the budget's limits (``elementwise``: the worst
    ``|x - ref| / (atol * max(1, rms(ref)) + rtol * |ref|)``, when the budget sets atol and rtol)."""
    ratios = [0.0]
    if budget.max_rel_l1 is not None:
        ratios.append(figures["rel_l1"] / budget.max_rel_l1)
    if budget.max_row_rel_l1 is not None:
        ratios.append(figures["row_rel_l1"] / budget.max_row_rel_l1)
    if budget.min_cosine is not None:
        ratios.append((1.0 - figures["cosine"]) / (1.0 - budget.min_cosine))
    if budget.max_rel_rmse is not None:
        ratios.append(figures["rel_rmse"] / budget.max_rel_rmse)
    if elementwise is not None:
        ratios.append(elementwise)
    return max(ratios)


def compare_budget(name: str, actual: "torch.Tensor", oracle: "torch.Tensor", budget: AccuracyBudget) -> Comparison:
    """Judge ``actual`` against the float64 ``oracle`` by ``budget``'s relative limits."""
    import torch

    actual64 = actual.detach().to(device=oracle.device, dtype=torch.float64)
    nonfinite, first_nonfinite = _nonfinite(actual64)
    figures = error_figures(actual64, oracle)
    rms = float(oracle.pow(2).mean().sqrt().item()) if oracle.numel() else 0.0
    figures_for_budget = {**figures, "rel_rmse": figures["rmse"] / rms if rms else (0.0 if figures["rmse"] == 0
                                                                                     else float("inf"))}
    error = (actual64 - oracle).abs().nan_to_num(nan=float("inf"))
    elementwise = None
    if budget.atol is not None and budget.rtol is not None and error.numel():
        bound = budget.atol * max(1.0, rms) + budget.rtol * oracle.abs()
        elementwise = float((error / bound).max().item())
    headroom = budget_headroom(figures_for_budget, budget, elementwise) if not nonfinite else float("inf")
    if error.numel():
        flat_worst = int(error.flatten().argmax().item())
        worst_index = tuple(int(i) for i in _unravel(flat_worst, error.shape))
        max_error = float(error.flatten()[flat_worst].item())
        worst_actual = float(actual64.flatten()[flat_worst].item())
        worst_expected = float(oracle.flatten()[flat_worst].item())
    else:
        worst_index, max_error, worst_actual, worst_expected = (), 0.0, 0.0, 0.0
    return Comparison(
        name=name, passed=nonfinite == 0 and headroom <= 1.0, max_error=max_error, allowed=0.0,
        plain_error=0.0, floor=0.0, factor=0.0, worst_index=worst_index, worst_actual=worst_actual,
        worst_expected=worst_expected, outside_fraction=0.0, nonfinite=nonfinite,
        first_nonfinite_index=first_nonfinite, rule="quantized", headroom=headroom, budget=budget.describe(),
        **figures,
    )


def _nonfinite(values: "torch.Tensor") -> tuple[int, tuple[int, ...] | None]:
    """How many NaN/Inf ``values`` holds, and the index of the first."""
    import torch

    finite = torch.isfinite(values)
    count = int((~finite).sum().item())
    if not count:
        return 0, None
    flat = int((~finite).flatten().nonzero()[0].item())
    return count, tuple(int(i) for i in _unravel(flat, values.shape))


def _unravel(flat_index: int, shape: "torch.Size") -> list[int]:
    index = []
    for size in reversed(shape):
        index.append(flat_index % size)
        flat_index //= size
    return list(reversed(index))
