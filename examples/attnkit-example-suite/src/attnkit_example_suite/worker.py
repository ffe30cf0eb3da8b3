"""The bounds suite's worker side: the check, run in the implementation's worker process, and the
record of what it found (read by the pytest side too, so this module stays light: torch is
imported inside ``handle``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Mapping

from pytest_attnkit.messages import Reply, Request, Status
from pytest_attnkit.worker.suite import SuiteHandler, WorkerContext


@dataclass(frozen=True)
class BoundsFinding:
    """How far the output strays outside [min V, max V] over the keys."""

    worst_excess: float  # the largest distance outside the bounds (0.0: every element within)
    allowed: float  # the rounding the dtype allows
    outside: int  # output elements outside the bounds by more than that (or not finite)
    elements: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> "BoundsFinding":
        return cls(float(values["worst_excess"]), float(values["allowed"]), int(values["outside"]),
                   int(values["elements"]))


class BoundsHandler(SuiteHandler):
    """One case, forward: call the implementation on the harness's inputs, compare each output
    element with the range of V over the keys its head reads."""

    def handle(self, context: WorkerContext, request: Request) -> Reply:
        import torch

        case = request.case
        assert case is not None
        inputs = context.inputs(case, request.seed)
        with torch.no_grad():
            out = context.call(case, inputs)
        if case.return_lse:
            out = out[0]
        v = inputs.v.float().repeat_interleave(case.heads_q // case.heads_kv, dim=1)  # (b, h_q, keys, d_v)
        low, high = v.amin(dim=2, keepdim=True), v.amax(dim=2, keepdim=True)
        out = out.float()
        excess = torch.clamp(torch.maximum(out - high, low - out), min=0.0)
        allowed = 4 * torch.finfo(inputs.v.dtype).eps * float(v.abs().max()) + 1e-6
        bad = (excess > allowed) | ~torch.isfinite(out)
        finding = BoundsFinding(float(excess.nan_to_num(float("inf")).max()), allowed, int(bad.sum()), out.numel())
        if finding.outside:
            return Reply(Status.WRONG, f"{finding.outside} of {finding.elements} output elements lie outside the "
                         f"smallest and largest value of V over the keys (by up to {finding.worst_excess:.3g}; "
                         f"rounding allows {allowed:.3g})", finding.to_dict())
        return Reply(Status.OK, data=finding.to_dict())
