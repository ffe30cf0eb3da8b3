"""The implementation contract: what a third-party attention kernel declares and provides.

This module is the one place that says what an attention implementation is to pytest-attnkit.
It imports nothing heavy (no torch), so the pytest process can read it freely.

An entry point in the group ``attnkit.implementations`` names either

(a) a plain callable ``attn(q, k, v, *, causal=False, scale=None) -> o``, which is taken to
    support every case on every device, with its backward through autograd; or
(b) an :class:`AttentionImpl` subclass (or an instance of one) that declares its capabilities
    as class attributes and may refine them in :meth:`AttentionImpl.not_supported_reasons`.

Tensors are torch tensors laid out ``[batch, heads, seqlen, head_dim]`` on one device. ``k`` and
``v`` may have fewer heads than ``q`` (GQA/MQA): query head ``h`` reads kv head
``h // (heads_q // heads_kv)``. ``scale=None`` means ``1/sqrt(head_dim)``. Causal masks are
aligned bottom-right: query ``i`` sees key ``j`` when ``j <= i + seqlen_k - seqlen_q``
(FlashAttention's convention; torch's ``is_causal`` when the lengths are equal). A query row
that sees no key at all (causal with ``seqlen_q > seqlen_k``) must hold zeros in the output,
and its gradients are zero.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, ClassVar, Collection

DTYPES: tuple[str, ...] = ("float16", "bfloat16", "float32")
SHORT_DTYPE = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}
LAYOUTS: tuple[str, ...] = ("bhsd", "bshd")
MEMORY_CLASSES: tuple[str, ...] = ("linear", "quadratic")


@dataclass(frozen=True)
class Case:
    """One attention problem: shapes, dtype, masking and how the inputs are laid out.

    ``layout="bshd"`` hands the implementation non-contiguous views (a ``[B, N, H, D]`` tensor
    transposed to ``[B, H, N, D]``). ``logit_scale`` multiplies q and k, so the logits grow by
    its square: large values test the softmax's numerical stability.
    """

    batch: int
    heads_q: int
    heads_kv: int
    seqlen_q: int
    seqlen_k: int
    head_dim: int
    dtype: str = "float16"
    causal: bool = False
    layout: str = "bhsd"
    logit_scale: float = 1.0

    def __post_init__(self) -> None:
        for name in ("batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_k", "head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"Case.{name} must be a positive int, got {value!r}")
        if self.heads_q % self.heads_kv:
            raise ValueError(
                f"Case.heads_q={self.heads_q} is not a multiple of heads_kv={self.heads_kv}"
            )
        if self.dtype not in DTYPES:
            raise ValueError(f"Case.dtype={self.dtype!r} (known: {', '.join(DTYPES)})")
        if self.layout not in LAYOUTS:
            raise ValueError(f"Case.layout={self.layout!r} (known: {', '.join(LAYOUTS)})")
        if not (self.logit_scale > 0 and math.isfinite(self.logit_scale)):
            raise ValueError(f"Case.logit_scale must be positive and finite, got {self.logit_scale!r}")

    @property
    def id(self) -> str:
        """A short, stable, readable id used in test ids: ``b2-h8:2-q113-k127-d64-fp16-causal``."""
        heads = f"h{self.heads_q}" if self.heads_q == self.heads_kv else f"h{self.heads_q}:{self.heads_kv}"
        parts = [
            f"b{self.batch}",
            heads,
            f"q{self.seqlen_q}",
            f"k{self.seqlen_k}",
            f"d{self.head_dim}",
            SHORT_DTYPE[self.dtype],
        ]
        if self.causal:
            parts.append("causal")
        if self.layout != "bhsd":
            parts.append(self.layout)
        if self.logit_scale != 1.0:
            parts.append(f"x{self.logit_scale:g}")
        return "-".join(parts)

    @property
    def is_gqa(self) -> bool:
        return self.heads_q != self.heads_kv

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "Case":
        return cls(**values)


def _describe_allowed(allowed: Collection[int]) -> str:
    if isinstance(allowed, range) and allowed.step == 1:
        return f"{allowed.start}..{allowed.stop - 1}"
    return ", ".join(str(value) for value in sorted(allowed))


class AttentionImpl:
    """Base class for an implementation that declares what it supports, as data.

    Subclasses set the class attributes below and implement :meth:`forward`. The harness
    instantiates a subclass with no arguments. Override :meth:`unavailable_reason` to explain why
    the implementation cannot run here ("cupy: no CUDA device"), and extend
    :meth:`not_supported_reasons` (calling ``super()``) for rules the attributes cannot say.
    """

    #: Set by the registry from the entry-point name.
    name: str = ""
    devices: ClassVar[tuple[str, ...]] = ("cpu", "cuda")
    dtypes: ClassVar[tuple[str, ...]] = DTYPES
    #: ``None`` accepts any head dim; otherwise a collection such as ``range(16, 257)``.
    head_dims: ClassVar[Collection[int] | None] = None
    supports_causal: ClassVar[bool] = True
    supports_gqa: ClassVar[bool] = True
    #: Whether seqlen_q may differ from seqlen_k (decode, chunked prefill).
    supports_seqlen_mismatch: ClassVar[bool] = True
    supports_backward: ClassVar[bool] = True
    #: Sequence lengths (query and key) must be multiples of this; the harness then runs an
    #: in-contract twin of each case it would refuse for its lengths alone (lengths rounded up).
    seqlen_multiple: ClassVar[int] = 1
    #: How the implementation's extra memory grows with sequence length: "linear" or "quadratic"
    #: (None: undeclared, as for a plain function; the memory suite then only reports).
    memory_class: ClassVar[str | None] = "linear"

    def forward(self, q: Any, k: Any, v: Any, *, causal: bool = False, scale: float | None = None) -> Any:
        raise NotImplementedError(f"{type(self).__name__} does not implement forward()")

    def __call__(self, q: Any, k: Any, v: Any, *, causal: bool = False, scale: float | None = None) -> Any:
        return self.forward(q, k, v, causal=causal, scale=scale)

    def unavailable_reason(self, device: str) -> str | None:
        """Why the implementation cannot run on ``device`` ("cpu" or "cuda"), or None if it can."""
        if device not in self.devices:
            return f"runs on {', '.join(self.devices)}, not {device}"
        return None

    def not_supported_reasons(self, case: Case, device: str, *, backward: bool = False) -> list[str]:
        """Every reason this implementation refuses ``case``, in words; empty when supported."""
        reasons: list[str] = []
        if device not in self.devices:
            reasons.append(f"device={device} (supported: {', '.join(self.devices)})")
        if case.dtype not in self.dtypes:
            reasons.append(f"dtype={case.dtype} (supported: {', '.join(self.dtypes)})")
        if self.head_dims is not None and case.head_dim not in self.head_dims:
            reasons.append(f"head_dim={case.head_dim} (supported: {_describe_allowed(self.head_dims)})")
        if case.causal and not self.supports_causal:
            reasons.append("causal masking is not supported")
        if case.is_gqa and not self.supports_gqa:
            reasons.append(f"grouped kv heads ({case.heads_q} q heads, {case.heads_kv} kv heads) are not supported")
        if case.seqlen_q != case.seqlen_k and not self.supports_seqlen_mismatch:
            reasons.append(f"seqlen_q={case.seqlen_q} != seqlen_k={case.seqlen_k} is not supported")
        if backward and not self.supports_backward:
            reasons.append("backward is not supported")
        multiple = self.seqlen_multiple
        if multiple > 1 and (case.seqlen_q % multiple or case.seqlen_k % multiple):
            reasons.append(f"seqlen_q={case.seqlen_q}, seqlen_k={case.seqlen_k} (must be multiples of {multiple})")
        return reasons

    def expected_extra_bytes(self, case: Case, *, backward: bool = False) -> int | None:
        """Optional analytic model: the extra device memory (beyond inputs and returned tensors)
        one call should need. When given, the memory suite checks the measurement against it."""
        return None

    def capabilities(self) -> dict[str, Any]:
        """The declared capabilities as plain data, for reports and the pytest process."""
        head_dims = self.head_dims
        return {
            "devices": list(self.devices),
            "dtypes": list(self.dtypes),
            "head_dims": None if head_dims is None else _describe_allowed(head_dims),
            "causal": self.supports_causal,
            "gqa": self.supports_gqa,
            "seqlen_mismatch": self.supports_seqlen_mismatch,
            "backward": self.supports_backward,
            "memory_class": self.memory_class,
            "seqlen_multiple": self.seqlen_multiple,
        }


class FunctionImpl(AttentionImpl):
    """Form (a) of the contract: a plain callable, taken to support everything.

    It declares no memory class: the memory suite reports what it measures without failing it.
    """

    memory_class = None  # type: ignore[assignment]

    def __init__(self, function: Callable[..., Any]) -> None:
        self.function = function

    def forward(self, q: Any, k: Any, v: Any, *, causal: bool = False, scale: float | None = None) -> Any:
        return self.function(q, k, v, causal=causal, scale=scale)


@dataclass
class ImplInfo:
    """What the pytest process knows about one implementation, as reported by its worker."""

    name: str
    entry_point: str
    distribution: str | None = None
    load_error: str | None = None
    unavailable: str | None = None
    capabilities: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)

    @property
    def status(self) -> str:
        if self.load_error:
            return "broken"
        if self.unavailable:
            return "unavailable"
        return "available"
