"""The implementation contract: what a third-party attention kernel declares and provides.

This module is the one place that says what an attention implementation is to pytest-attnkit.
It imports nothing heavy (no torch), so the pytest process can read it freely.

An entry point in the group ``attnkit.implementations`` names either

(a) a plain callable ``attn(q, k, v, *, causal=False, scale=None) -> o``, which is taken to
    support every dense case in the standard dtypes on every device, with its backward through
    autograd, and no variant, layout or FP8 input (:class:`FunctionImpl`); or
(b) an :class:`AttentionImpl` subclass (or an instance of one) that declares its capabilities
    as class attributes and may refine them in :meth:`AttentionImpl.not_supported_reasons`.

Tensors are torch tensors laid out ``[batch, heads, seqlen, head_dim]`` on one device. ``k`` and
``v`` may have fewer heads than ``q`` (GQA/MQA): query head ``h`` reads kv head
``h // (heads_q // heads_kv)``. ``scale=None`` means ``1/sqrt(head_dim)``. Causal masks are
aligned bottom-right: query ``i`` sees key ``j`` when ``j <= i + seqlen_k - seqlen_q``
(FlashAttention's convention; torch's ``is_causal`` when the lengths are equal). A query row
that sees no key at all (causal with ``seqlen_q > seqlen_k``) must hold zeros in the output,
and its gradients are zero.

Variants (FlashAttention's keyword names), passed only when the case uses them and only to an
implementation that declares them (``supports_window`` and so on); a plain function or a class
that declares none of them is never handed one:

- ``window_size=(left, right)``: query ``i`` sees key ``j`` when
  ``i + Nk - Nq - left <= j <= i + Nk - Nq + right``; ``-1`` leaves that side unbounded. With
  ``causal=True`` both apply (FlashAttention sets ``right`` to 0 under causal: the same keys).
- ``softcap``: after scaling, scores become ``softcap * tanh(scores / softcap)``.
- ``alibi_slopes``: float32 ``[Hq]``; adds ``-slope[h] * |i + Nk - Nq - j|`` to the (capped)
  scores before masking, as FlashAttention's reference does.
- ``sinks``: float32 ``[Hq]`` logits that join every row's softmax denominator and produce no
  output (gpt-oss's attention sinks); their gradient is checked.
- ``return_lse=True``: the call returns ``(out, lse)``, lse float32 ``[B, Hq, Nq]``, the natural
  log of each row's softmax denominator (sinks included); gradients flow through it. The LSE of a
  row that sees no key and has no sink is not checked (FlashAttention writes +inf, FlexAttention
  -inf).
- V's head dim may differ from Q and K's (MLA): the output is ``[B, Hq, Nq, head_dim_v]``.

Two layouts change the tensors themselves (FlashAttention's names and layouts), each handed only to
an implementation that declares it (``supports_varlen``, ``supports_paged_kv``):

- **varlen** (``flash_attn_varlen_func``): q, k and v are packed ``[total_tokens, H, D]``; the call
  adds ``cu_seqlens_q`` and ``cu_seqlens_k`` (int32 ``[B + 1]``, cumulative lengths from 0) and
  ``max_seqlen_q``, ``max_seqlen_k`` (ints). Sequence ``b`` owns the rows
  ``cu_seqlens[b]:cu_seqlens[b + 1]``; sequences never see each other, and causal masking, the
  window and ALiBi use positions within the sequence (bottom-right per sequence). Lengths may be 0,
  and the packed tensors may hold unused tokens after ``cu_seqlens[-1]``: those rows of the output
  and of the gradients are not checked, and no sequence may read them. The output is packed like
  q, ``[total_q, Hq, Dv]``; the LSE is float32 ``[Hq, total_q]`` (FlashAttention's varlen LSE).
- **paged KV** (``flash_attn_with_kvcache``): q is ``[B, Nq, Hq, D]``; k and v are the caches
  ``k_cache``, ``v_cache`` ``[num_pages, page_size, Hkv, D]``, and the call adds ``block_table``
  (int32 ``[B, max_pages]``: sequence ``b``'s token ``t`` is in page ``block_table[b, t // page_size]``
  at slot ``t % page_size``) and ``cache_seqlens`` (int32 ``[B]``). Causal aligns each sequence's
  queries to the end of its cache: query ``i`` sees key ``j`` when ``j <= i + cache_seqlens[b] - Nq``.
  The output is ``[B, Nq, Hq, Dv]``, the LSE ``[B, Hq, Nq]``. Pages come shuffled, some unused, and
  slots past a sequence's length hold other values; the block table may be wider than the longest
  sequence needs. No page is shared between sequences (prefix caching is not in these cases). Backward (gradients of q and both caches) is
  asked only of an implementation that declares ``supports_paged_kv_backward``.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any, Callable, ClassVar, Collection

#: FP8 inputs (FlashAttention-3's e4m3 forward, FlashInfer's e4m3 and e5m2 KV caches): q, k and v
#: arrive quantized with float32 descales ``q_descale``, ``k_descale``, ``v_descale`` of shape
#: ``[batch, heads_kv]`` (FA3's names and shape); the values are ``x.float() * descale`` (q's
#: descale is per kv head: query head ``h`` uses that of kv head ``h // (Hq // Hkv)``). The output
#: is bfloat16. FP8 cases are forward only, and always judged by FA3's FP8 rule.
FP8_DTYPES: tuple[str, ...] = ("float8_e4m3fn", "float8_e5m2")
#: The dtypes a case may have. An implementation's default is :data:`STANDARD_DTYPES`: FP8 must be
#: declared, since it changes the call (the descales) and the output dtype.
STANDARD_DTYPES: tuple[str, ...] = ("float16", "bfloat16", "float32")
DTYPES: tuple[str, ...] = STANDARD_DTYPES + FP8_DTYPES
#: The devices an implementation may declare (:attr:`AttentionImpl.devices`) and a run may test on.
DEVICES: tuple[str, ...] = ("cpu", "cuda")
SHORT_DTYPE = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "float8_e4m3fn": "e4m3",
               "float8_e5m2": "e5m2"}
#: The output dtype of an FP8 case (FA3's FP8 forward returns bf16).
FP8_OUTPUT_DTYPE = "bfloat16"
#: How an implementation's results are judged; see :class:`AccuracyBudget` and docs/accuracy.md,
#: "Accuracy classes". "exact" is FlashAttention's rule; "quantized" is :data:`QUANTIZED_BUDGET`.
ACCURACY_CLASSES: tuple[str, ...] = ("exact", "quantized")
LAYOUTS: tuple[str, ...] = ("bhsd", "bshd")


class MemoryClass(str, Enum):
    """How an implementation's extra device memory grows with the sequence length. An
    implementation declares LINEAR or QUADRATIC (:attr:`AttentionImpl.memory_class`; the plain
    strings "linear" and "quadratic" are the same values); the memory suite's fit
    (controller/memory.py) also finds NEITHER, or UNCLEAR where no power law describes the sweep."""

    __str__ = str.__str__  # f"{memory_class}" and str(memory_class) give the value

    LINEAR = "linear"
    QUADRATIC = "quadratic"
    NEITHER = "neither"
    UNCLEAR = "unclear"


#: The memory classes an implementation may declare (:attr:`AttentionImpl.memory_class`).
MEMORY_CLASSES: tuple[str, ...] = (MemoryClass.LINEAR.value, MemoryClass.QUADRATIC.value)
#: The keyword arguments a variant case adds to the call (FlashAttention's names).
VARIANT_KEYWORDS: tuple[str, ...] = ("window_size", "softcap", "alibi_slopes", "sinks", "return_lse")
#: The keyword arguments of the two layouts (FlashAttention's names): varlen, then paged KV.
VARLEN_KEYWORDS: tuple[str, ...] = ("cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k")
PAGED_KEYWORDS: tuple[str, ...] = ("block_table", "cache_seqlens")


def is_fp8(dtype: str) -> bool:
    return dtype in FP8_DTYPES


@dataclass(frozen=True)
class AccuracyBudget:
    """How far from the float64 oracle a quantized implementation's tensors may be, as data.

    Each limit applies to the output and to each gradient (and the LSE) separately; None turns a
    limit off. The figures are SageAttention's (Zhang et al., "SageAttention: Accurate 8-bit
    attention...", ICLR 2025, and its repository's benchmarks report attention accuracy as
    cosine similarity, relative L1 ``sum|o - ref| / sum|ref|`` and RMSE), plus the same relative
    L1 taken over each row (one query's output, one key's gradient): a fault confined to a few
    rows (a mask off by one, a dropped key) moves a row by far more than quantization does, while
    it hides in the whole tensor's figure. ``atol`` and ``rtol`` add an elementwise bound
    ``|x - ref| <= atol * max(1, rms(ref)) + rtol * |ref|``, as FlashInfer's FP8 KV-cache tests
    use with ``atol=1e-2, rtol=0.2`` (:data:`FLASHINFER_FP8_KV_BUDGET`).

    The headroom of a comparison is the largest of measured / limit over the limits set (for
    cosine similarity: ``(1 - cos) / (1 - min_cosine)``); above 1 fails.
    """

    max_rel_l1: float | None = 0.02
    min_cosine: float | None = 0.9998
    max_row_rel_l1: float | None = 0.06
    max_rel_rmse: float | None = None
    atol: float | None = None
    rtol: float | None = None
    name: str = "custom"

    def __post_init__(self) -> None:
        for field_name in ("max_rel_l1", "max_row_rel_l1", "max_rel_rmse", "atol", "rtol"):
            value = getattr(self, field_name)
            if value is not None and not (isinstance(value, (int, float)) and 0 < value < float("inf")):
                raise ValueError(f"AccuracyBudget.{field_name} must be positive and finite or None, got {value!r}")
        if self.min_cosine is not None and not (0 < self.min_cosine < 1):
            raise ValueError(f"AccuracyBudget.min_cosine must be between 0 and 1, got {self.min_cosine!r}")
        if (self.atol is None) != (self.rtol is None):
            raise ValueError("AccuracyBudget: atol and rtol go together (FlashInfer's elementwise bound)")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "AccuracyBudget":
        return cls(**values)

    def describe(self) -> str:
        limits = []
        if self.max_rel_l1 is not None:
            limits.append(f"rel L1 <= {self.max_rel_l1:g}")
        if self.max_row_rel_l1 is not None:
            limits.append(f"row rel L1 <= {self.max_row_rel_l1:g}")
        if self.min_cosine is not None:
            limits.append(f"cosine >= {self.min_cosine:g}")
        if self.max_rel_rmse is not None:
            limits.append(f"RMSE/RMS(ref) <= {self.max_rel_rmse:g}")
        if self.atol is not None:
            limits.append(f"|err| <= {self.atol:g} + {self.rtol:g}|ref|")
        return f"{self.name} budget ({', '.join(limits) or 'no limits'})"


#: The "quantized" class: limits set between what an honest INT8 per-block Q/K kernel
#: (SageAttention's scheme) makes and what a 5% scale error makes (docs/accuracy.md gives the figures;
#: tests/suites/test_accuracy.py holds both sides). Large logits (``x8`` cases) defeat INT8 Q/K.
QUANTIZED_BUDGET = AccuracyBudget(name="quantized")
#: FlashInfer's tolerance for FP8 KV caches (``tests/attention``: ``atol=1e-2, rtol=2e-1``), for
#: kernels that quantize only K and V.
FLASHINFER_FP8_KV_BUDGET = AccuracyBudget(max_rel_l1=None, min_cosine=None, max_row_rel_l1=None,
                                          atol=1e-2, rtol=0.2, name="flashinfer-fp8-kv")


def accuracy_budget(accuracy: "str | AccuracyBudget | dict[str, Any] | None") -> AccuracyBudget | None:
    """The budget an accuracy declaration stands for: None for "exact" (FlashAttention's rule)."""
    if accuracy is None or accuracy == "exact":
        return None
    if accuracy == "quantized":
        return QUANTIZED_BUDGET
    if isinstance(accuracy, AccuracyBudget):
        return accuracy
    if isinstance(accuracy, dict):
        return AccuracyBudget.from_dict(accuracy)
    raise ValueError(f"accuracy must be one of {', '.join(ACCURACY_CLASSES)} or an AccuracyBudget, got {accuracy!r}")


def accuracy_to_wire(accuracy: "str | AccuracyBudget") -> "str | dict[str, Any]":
    """An accuracy declaration as JSON: the class name, or the budget's fields."""
    accuracy_budget(accuracy)  # rejects what is neither
    return accuracy.to_dict() if isinstance(accuracy, AccuracyBudget) else accuracy


@dataclass(frozen=True)
class Case:
    """One attention problem: shapes, dtype, masking and how the inputs are laid out.

    ``layout="bshd"`` hands the implementation non-contiguous views (a ``[B, N, H, D]`` tensor
    transposed to ``[B, H, N, D]``). ``logit_scale`` multiplies q and k, so the logits grow by
    its square: large values test the softmax's numerical stability.

    The variant fields default to plain attention: ``head_dim_v`` (None: equal to ``head_dim``),
    ``window`` (``(left, right)``, -1 unbounded; None: no window), ``softcap`` (0: none),
    ``alibi``, ``sinks`` and ``return_lse``. A value equal to the default is stored as the
    default, so equal problems have equal ids.
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
    head_dim_v: int | None = None
    window: tuple[int, int] | None = None
    softcap: float = 0.0
    alibi: bool = False
    sinks: bool = False
    return_lse: bool = False
    seqlens_q: tuple[int, ...] | None = None
    seqlens_k: tuple[int, ...] | None = None
    unused_tokens: int = 0
    page_size: int | None = None

    @classmethod
    def packed(cls, seqlens_q: "tuple[int, ...] | list[int]", seqlens_k: "tuple[int, ...] | list[int]", heads_q: int,
               heads_kv: int, head_dim: int, dtype: str = "float16", **fields: Any) -> "Case":
        """A varlen case: sequence ``b`` has ``seqlens_q[b]`` queries and ``seqlens_k[b]`` keys."""
        return cls(len(seqlens_q), heads_q, heads_kv, max(max(seqlens_q), 1), max(max(seqlens_k), 1), head_dim,
                   dtype, seqlens_q=tuple(seqlens_q), seqlens_k=tuple(seqlens_k), **fields)

    @classmethod
    def paged(cls, seqlen_q: int, cache_seqlens: "tuple[int, ...] | list[int]", page_size: int, heads_q: int,
              heads_kv: int, head_dim: int, dtype: str = "float16", **fields: Any) -> "Case":
        """A paged-KV case: ``seqlen_q`` queries per sequence against ``cache_seqlens[b]`` cached keys."""
        return cls(len(cache_seqlens), heads_q, heads_kv, seqlen_q, max(max(cache_seqlens), 1), head_dim, dtype,
                   seqlens_k=tuple(cache_seqlens), page_size=page_size, **fields)

    def __post_init__(self) -> None:
        # JSON turns the window into a list; (-1, -1) is FlashAttention's "no window".
        if self.window is not None:
            window = tuple(self.window)
            if len(window) != 2 or not all(isinstance(side, int) and side >= -1 for side in window):
                raise ValueError(f"Case.window must be (left, right) ints >= -1, got {self.window!r}")
            object.__setattr__(self, "window", None if window == (-1, -1) else window)
        if self.head_dim_v is not None and self.head_dim_v == self.head_dim:
            object.__setattr__(self, "head_dim_v", None)
        if self.head_dim_v is not None and (not isinstance(self.head_dim_v, int) or self.head_dim_v < 1):
            raise ValueError(f"Case.head_dim_v must be a positive int or None, got {self.head_dim_v!r}")
        if not (isinstance(self.softcap, (int, float)) and 0 <= self.softcap < float("inf")):
            raise ValueError(f"Case.softcap must be 0 (none) or positive and finite, got {self.softcap!r}")
        object.__setattr__(self, "softcap", float(self.softcap))
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
        self._check_layout()

    def _check_layout(self) -> None:
        """The varlen and paged fields agree with each other and with batch and the max lengths."""
        for name in ("seqlens_q", "seqlens_k"):
            lengths = getattr(self, name)
            if lengths is None:
                continue
            lengths = tuple(lengths)
            if not lengths or not all(isinstance(n, int) and n >= 0 for n in lengths):
                raise ValueError(f"Case.{name} must be lengths >= 0, got {getattr(self, name)!r}")
            object.__setattr__(self, name, lengths)
        if not isinstance(self.unused_tokens, int) or self.unused_tokens < 0:
            raise ValueError(f"Case.unused_tokens must be an int >= 0, got {self.unused_tokens!r}")
        if self.page_size is not None:
            if not isinstance(self.page_size, int) or self.page_size < 1:
                raise ValueError(f"Case.page_size must be a positive int, got {self.page_size!r}")
            if self.seqlens_k is None or self.seqlens_q is not None:
                raise ValueError("a paged case gives its cache lengths as seqlens_k, and no seqlens_q "
                                 "(use Case.paged)")
        elif (self.seqlens_q is None) != (self.seqlens_k is None):
            raise ValueError("a varlen case gives both seqlens_q and seqlens_k (use Case.packed)")
        if self.unused_tokens and self.seqlens_q is None:
            raise ValueError("Case.unused_tokens applies to varlen cases only")
        if self.seqlens_k is None:
            return
        if len(self.seqlens_k) != self.batch or (self.seqlens_q is not None and len(self.seqlens_q) != self.batch):
            raise ValueError(f"Case.batch={self.batch} must equal the number of sequences "
                             f"({len(self.seqlens_k)})")
        expected_k = max(max(self.seqlens_k), 1)
        expected_q = self.seqlen_q if self.seqlens_q is None else max(max(self.seqlens_q), 1)
        if (self.seqlen_q, self.seqlen_k) != (expected_q, expected_k):
            raise ValueError(f"Case.seqlen_q, seqlen_k must be the longest sequences ({expected_q}, {expected_k}), "
                             f"got ({self.seqlen_q}, {self.seqlen_k})")
        if self.layout != "bhsd":
            raise ValueError("varlen and paged cases have FlashAttention's layouts; Case.layout must stay 'bhsd'")
        if self.dtype in FP8_DTYPES:
            raise ValueError("varlen and paged cases do not take FP8 inputs (their descales are per dense batch)")
        if not any(queries and keys for queries, keys in self.sequences):
            raise ValueError("a varlen or paged case needs a sequence with both queries and keys: otherwise the "
                             "output depends on no input")

    @property
    def kind(self) -> str:
        """"dense", "varlen" (packed sequences) or "paged" (a paged KV cache)."""
        if self.page_size is not None:
            return "paged"
        return "varlen" if self.seqlens_q is not None else "dense"

    @property
    def sequences(self) -> list[tuple[int, int]]:
        """(queries, keys) of each sequence: the batch's for a dense case."""
        if self.seqlens_k is None:
            return [(self.seqlen_q, self.seqlen_k)] * self.batch
        queries = self.seqlens_q if self.seqlens_q is not None else (self.seqlen_q,) * self.batch
        return list(zip(queries, self.seqlens_k))

    @property
    def total_q(self) -> int:
        return sum(n for n, _ in self.sequences)

    @property
    def total_k(self) -> int:
        return sum(n for _, n in self.sequences)

    @property
    def sweep_length(self) -> int:
        """The length a memory sweep steps: N for a dense case, the packed tokens for varlen, the
        cached tokens for a paged KV cache."""
        return {"dense": self.seqlen_q, "varlen": self.total_q, "paged": self.total_k}[self.kind]

    @property
    def id(self) -> str:
        """A short, stable, readable id used in test ids: ``b2-h8:2-q113-k127-d64-fp16-causal``.
        Varlen and paged cases add their layout, total tokens and a checksum of the lengths:
        ``b5-h4-q300-k300-d64-fp16-varlen-t620:700-u7-3fa1``, ``...-paged16-t9000-0b2c``."""
        heads = f"h{self.heads_q}" if self.heads_q == self.heads_kv else f"h{self.heads_q}:{self.heads_kv}"
        parts = [
            f"b{self.batch}",
            heads,
            f"q{self.seqlen_q}",
            f"k{self.seqlen_k}",
            f"d{self.head_dim}",
        ]
        if self.head_dim_v is not None:
            parts.append(f"dv{self.head_dim_v}")
        parts.append(SHORT_DTYPE[self.dtype])
        if self.causal:
            parts.append("causal")
        if self.window is not None:
            parts.append(f"w{self.window[0]}:{self.window[1]}")
        if self.softcap:
            parts.append(f"cap{self.softcap:g}")
        if self.alibi:
            parts.append("alibi")
        if self.sinks:
            parts.append("sinks")
        if self.return_lse:
            parts.append("lse")
        if self.layout != "bhsd":
            parts.append(self.layout)
        if self.logit_scale != 1.0:
            parts.append(f"x{self.logit_scale:g}")
        if self.kind != "dense":
            checksum = zlib.crc32(repr((self.seqlens_q, self.seqlens_k)).encode()) & 0xFFFF
            if self.kind == "varlen":
                parts.append(f"varlen-t{self.total_q}:{self.total_k}")
                if self.unused_tokens:
                    parts.append(f"u{self.unused_tokens}")
            else:
                parts.append(f"paged{self.page_size}-t{self.total_k}")
            parts.append(f"{checksum:04x}")
        return "-".join(parts)

    @property
    def is_gqa(self) -> bool:
        return self.heads_q != self.heads_kv

    @property
    def value_dim(self) -> int:
        """V's head dim, and so the output's: ``head_dim_v``, or ``head_dim`` when that is None."""
        return self.head_dim if self.head_dim_v is None else self.head_dim_v

    @property
    def variants(self) -> tuple[str, ...]:
        """The keyword arguments this case adds to the call (names from :data:`VARIANT_KEYWORDS`)."""
        used = {"window_size": self.window is not None, "softcap": bool(self.softcap),
                "alibi_slopes": self.alibi, "sinks": self.sinks, "return_lse": self.return_lse}
        return tuple(name for name in VARIANT_KEYWORDS if used[name])

    def to_dict(self) -> dict[str, Any]:
        values = asdict(self)
        for name in ("window", "seqlens_q", "seqlens_k"):
            if values[name] is not None:
                values[name] = list(values[name])
        return values

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
    devices: ClassVar[tuple[str, ...]] = DEVICES
    #: FP8 dtypes (:data:`FP8_DTYPES`) must be listed to be handed FP8 inputs and descales.
    dtypes: ClassVar[tuple[str, ...]] = STANDARD_DTYPES
    #: How results are judged: "exact" (FlashAttention's rule), "quantized" (INT8/FP8 kernels,
    #: :data:`QUANTIZED_BUDGET`), or an :class:`AccuracyBudget` of the implementation's own. FP8
    #: cases are judged by FA3's FP8 rule whatever is declared here; the hook
    #: ``pytest_attnkit_accuracy`` may choose per case.
    accuracy: ClassVar["str | AccuracyBudget"] = "exact"
    #: ``None`` accepts any head dim; otherwise a collection such as ``range(16, 257)``.
    head_dims: ClassVar[Collection[int] | None] = None
    supports_causal: ClassVar[bool] = True
    supports_gqa: ClassVar[bool] = True
    #: Whether seqlen_q may differ from seqlen_k (decode, chunked prefill).
    supports_seqlen_mismatch: ClassVar[bool] = True
    supports_backward: ClassVar[bool] = True
    #: Sequence lengths (query and key) must be multiples of this; the harness then runs an
    #: in-contract stand-in for each case it would refuse for its lengths alone (lengths rounded up).
    seqlen_multiple: ClassVar[int] = 1
    #: How the implementation's extra memory grows with sequence length: "linear" or "quadratic"
    #: (a :class:`MemoryClass` or its value; None: undeclared, as for a plain function; the memory
    #: suite then only reports).
    memory_class: ClassVar[MemoryClass | str | None] = MemoryClass.LINEAR
    #: Variants (see the module docstring); an implementation is handed only those it declares.
    supports_window: ClassVar[bool] = False
    supports_softcap: ClassVar[bool] = False
    supports_alibi: ClassVar[bool] = False
    supports_sinks: ClassVar[bool] = False
    supports_lse: ClassVar[bool] = False
    #: V head dims accepted when they differ from head_dim (MLA); None: V's head dim equals Q's.
    head_dims_v: ClassVar[Collection[int] | None] = None
    #: The two layouts (see the module docstring): packed sequences, and a paged KV cache with the
    #: page sizes taken (None: any), forward only unless ``supports_paged_kv_backward``.
    supports_varlen: ClassVar[bool] = False
    supports_paged_kv: ClassVar[bool] = False
    page_sizes: ClassVar[Collection[int] | None] = None
    supports_paged_kv_backward: ClassVar[bool] = False
    #: Behaviour the properties suite holds the implementation to (pytest_attnkit/worker/
    #: properties.py); what is not declared is still checked, and reported without failing.
    #: The same inputs give bitwise the same tensors run after run: True or "both" (the forward's
    #: output and LSE, and the gradients), "forward" (the forward only), "backward" (the gradients
    #: only), or False or None (neither).
    deterministic: ClassVar["bool | str | None"] = False
    #: Each sequence's result has the same bits alone and inside batches of other sizes and orders.
    batch_invariant: ClassVar[bool] = False
    #: A call can be captured in a CUDA graph and replayed on new inputs copied into its buffers
    #: (no host sync, no allocation outside torch's allocator during the call).
    supports_cuda_graphs: ClassVar[bool] = False
    #: The call runs inside ``torch.compile(fullgraph=True)`` with no graph break.
    supports_torch_compile: ClassVar[bool] = False
    #: The torch custom op the forward goes through ("mylib::attention"), checked with
    #: ``torch.library.opcheck``; None when the forward is not one.
    custom_op: ClassVar[str | None] = None

    def declaration_problems(self) -> list[str]:
        """What is wrong with the declarations that name things (devices, dtypes, memory_class,
        accuracy, deterministic): a value the harness does not know matches no case, so a typo
        would quietly skip every test ("fp16" for "float16"). The registry refuses an
        implementation with any (:func:`pytest_attnkit.registry.load_implementation`)."""
        problems = []
        short_names = {short: name for name, short in SHORT_DTYPE.items()}
        for kind, values, known in (("devices", self.devices, DEVICES), ("dtypes", self.dtypes, DTYPES)):
            if isinstance(values, str):
                problems.append(f"{kind} = {values!r} is a string; it must be a tuple of names, "
                                f"e.g. ({values!r},)")
                continue
            for value in values:
                if value not in known:
                    hint = f" ({value!r} is the short name of {short_names[value]!r})" if value in short_names else ""
                    problems.append(f"{kind}: {value!r} is not one of {', '.join(known)}{hint}")
        memory = self.memory_class
        if memory is not None and not (isinstance(memory, str) and str(memory) in MEMORY_CLASSES):
            problems.append(f"memory_class = {memory!r} is not one of {', '.join(MEMORY_CLASSES)} or None")
        for check in (lambda: accuracy_budget(self.accuracy), self.deterministic_directions):
            try:
                check()
            except (ValueError, TypeError, KeyError) as error:
                problems.append(str(error))
        return problems

    def deterministic_directions(self) -> tuple[str, ...]:
        """The directions :attr:`deterministic` declares: ("forward", "backward"), one, or none;
        a value that is none of those it accepts raises ValueError, naming every one of them."""
        value = self.deterministic
        if value is True or value == "both":
            return ("forward", "backward")
        if value in ("forward", "backward"):
            return (str(value),)
        if value is False or value is None:
            return ()
        raise ValueError(f"deterministic must be True, 'both', 'forward', 'backward', False or None, not {value!r}")

    def forward(self, q: Any, k: Any, v: Any, *, causal: bool = False, scale: float | None = None,
                **variants: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} does not implement forward()")

    def __call__(self, q: Any, k: Any, v: Any, *, causal: bool = False, scale: float | None = None,
                 **variants: Any) -> Any:
        # Variant keywords reach forward() only when the case uses them, so a forward() written
        # without them keeps working on every plain case.
        return self.forward(q, k, v, causal=causal, scale=scale, **variants)

    def unavailable_reason(self, device: str) -> str | None:
        """Why the implementation cannot run on ``device`` ("cpu" or "cuda"), or None if it can."""
        if device not in self.devices:
            return f"runs on {', '.join(self.devices)}, not {device}"
        return None

    def path_note(self, device: str) -> str | None:
        """Optional: one line on which code path runs on ``device`` where that depends on the
        machine (a kernel for one GPU generation, a fallback), shown under the implementation in
        the run's header and kept in the report. None (the default) shows nothing."""
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
        if backward and is_fp8(case.dtype):
            reasons.append(f"backward on {case.dtype} inputs (FP8 cases are forward only, as FA3's FP8)")
        if case.head_dim_v is not None:
            if self.head_dims_v is None:
                reasons.append(f"head_dim_v={case.head_dim_v} != head_dim={case.head_dim} (V's head dim must equal Q's)")
            elif case.head_dim_v not in self.head_dims_v:
                reasons.append(f"head_dim_v={case.head_dim_v} (supported: {_describe_allowed(self.head_dims_v)})")
        if case.window is not None and not self.supports_window:
            reasons.append(f"sliding window (window_size={case.window}) is not supported")
        if case.softcap and not self.supports_softcap:
            reasons.append("softcap is not supported")
        if case.alibi and not self.supports_alibi:
            reasons.append("ALiBi (alibi_slopes) is not supported")
        if case.sinks and not self.supports_sinks:
            reasons.append("attention sinks are not supported")
        if case.return_lse and not self.supports_lse:
            reasons.append("returning the LSE (return_lse) is not supported")
        if case.kind == "varlen" and not self.supports_varlen:
            reasons.append("varlen (packed sequences with cu_seqlens) is not supported")
        if case.kind == "paged":
            if not self.supports_paged_kv:
                reasons.append("a paged KV cache (block_table) is not supported")
            elif self.page_sizes is not None and case.page_size not in self.page_sizes:
                reasons.append(f"page_size={case.page_size} (supported: {_describe_allowed(self.page_sizes)})")
            if backward and self.supports_paged_kv and not self.supports_paged_kv_backward:
                reasons.append("backward through a paged KV cache is not supported (supports_paged_kv_backward)")
        multiple = self.seqlen_multiple
        if multiple > 1 and case.kind != "dense" and any(n % multiple for pair in case.sequences for n in pair):
            reasons.append(f"sequence lengths that are not multiples of {multiple}")
        elif multiple > 1 and (case.seqlen_q % multiple or case.seqlen_k % multiple):
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
            "window": self.supports_window,
            "softcap": self.supports_softcap,
            "alibi": self.supports_alibi,
            "sinks": self.supports_sinks,
            "lse": self.supports_lse,
            "head_dims_v": None if self.head_dims_v is None else _describe_allowed(self.head_dims_v),
            "varlen": self.supports_varlen,
            "paged_kv": self.supports_paged_kv,
            "page_sizes": None if self.page_sizes is None else _describe_allowed(self.page_sizes),
            "paged_kv_backward": self.supports_paged_kv_backward,
            "accuracy": accuracy_to_wire(self.accuracy),
            "deterministic": list(self.deterministic_directions()),
            "batch_invariant": bool(self.batch_invariant),
            "cuda_graphs": bool(self.supports_cuda_graphs),
            "torch_compile": bool(self.supports_torch_compile),
            "custom_op": self.custom_op,
        }


class FunctionImpl(AttentionImpl):
    """Form (a) of the contract: a plain callable, taken to support every dense case but FP8 inputs
    (its signature has no place for the descales), the variants and the two layouts (README.md and
    docs/contract.md say so, and tests/e2e/test_docs.py holds them to this class).

    It declares no memory class: the memory suite reports what it measures without failing it,
    and no variant: its signature has no place for one.
    """

    memory_class = None  # type: ignore[assignment]

    def __init__(self, function: Callable[..., Any]) -> None:
        self.function = function

    def forward(self, q: Any, k: Any, v: Any, *, causal: bool = False, scale: float | None = None) -> Any:
        return self.function(q, k, v, causal=causal, scale=scale)
