"""What a wrong result looks like: the usual bugs, each as a wrong-on-purpose reference.

When a correctness check fails, the worker compares the implementation's result with a few
references that are wrong on purpose, each the float64 oracle (:mod:`pytest_attnkit.oracle`) with
one thing altered the way a common bug alters it: the causal mask aligned top-left as torch's
``is_causal`` aligns it, the scale 1 instead of ``1/sqrt(head_dim)``, GQA through ``repeat``
instead of ``repeat_interleave``, the last partial tile of keys dropped, and so on
(:data:`SUSPECTS`). It runs only on a failure, so a passing run costs nothing more.

A suspect is named only when all of these hold (:func:`diagnose`):

- it applies to the case (a window suspect only on a window case, ...);
- its reference differs from the contract's here: judged as an implementation by the real rule,
  it fails (a suspect that changes nothing on this case explains nothing);
- the result is closer to it than to the oracle on every comparison that failed (a quick
  test that spares computing the plain same-precision reference of a
  hopeless suspect);
- the result passes against it by the same rule the real check used, on every comparison the
  check made (the output, the LSE and, in a backward test, every gradient): its reference computed
  in float64 and, for the "exact" and FP8 rules, its plain same-precision reference, wrong the
  same way.

When several suspects pass, the diagnosis names one only if it refines all the others (its
``refines`` lists them: the last tile of queries dropped is a case of "rows left unwritten", and
the more particular explanation is named); otherwise it says nothing, because a guess that is wrong
misleads more than no guess.

Each suspect is declared as data: its name, the words after ``looks like:``, the contract's doc
anchor it breaks, the cases it applies to, and how its reference alters the oracle's math (a
``wrap`` of :func:`~pytest_attnkit.oracle.attention_math`, or of
:func:`~pytest_attnkit.oracle.packed_attention_math` with the case's packing bound, that calls it
with altered arguments or inputs). docs/accuracy.md lists them, with the test kernel that proves
each is named (tests/fakes/buggy_kernels.py).
"""

from __future__ import annotations

import functools
import math
import textwrap
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

from pytest_attnkit.contract import Case
from pytest_attnkit.oracle import Packing, packed_attention_math
from pytest_attnkit.records import Comparison

if TYPE_CHECKING:
    import torch

#: The attention function a reference differentiates, and a suspect's alteration of it.
Math = Callable[..., Any]
Wrap = Callable[[Math], Math]

CONTRACT = "docs/contract.md#what-an-implementation-is-handed"
VARIANTS = "docs/variants.md#variants-window-softcap-alibi-sinks-the-lse-v-head-dims"
LAYOUTS = "docs/variants.md#packed-sequences-varlen-and-paged-kv-caches"
#: The longest line the diagnosis writes.
WIDTH = 100
#: The tile sizes whose last partial tile a kernel may drop (FlashAttention's 128 and 64, and 16).
TILES = (128, 64, 16)


@dataclass(frozen=True)
class Evidence:
    """What a suspect may look at to build its reference: the case, the packed layout's
    ``packing``, and the implementation's result (``actual``, trimmed as the check compared it)."""

    case: Case
    packing: Packing | None
    actual: dict[str, "torch.Tensor"]


@dataclass(frozen=True)
class Suspect:
    """One common bug, as a wrong-on-purpose reference (module docstring)."""

    #: A short name for tests and docs.
    name: str
    #: What the result looks like, after ``looks like:``.
    says: str
    #: Why that is wrong: what the contract says instead.
    why: str
    #: Where the contract says it: a docs path with its anchor.
    anchor: str
    #: Whether the bug can show on the case (a window suspect needs a window, ...).
    applies: Callable[[Case], bool]
    #: The alteration of the oracle's math, or None where the evidence rules the suspect out.
    wrap: Callable[[Evidence], Wrap | None]
    #: The more general suspects this one is a particular case of: named in their place.
    refines: tuple[str, ...] = ()

    def line(self) -> str:
        """The failure message's line(s): ``looks like: ...``, at most :data:`WIDTH` columns."""
        return looks_like(self.says, self.why, self.anchor)


def looks_like(says: str, why: str, anchor: str) -> str:
    """``looks like: SAYS (WHY: ANCHOR)``, wrapped to :data:`WIDTH` columns: a suspect's line,
    and the NaN rows' (:func:`keyless_rows_nonfinite`)."""
    return "\n".join(textwrap.wrap(f"looks like: {says} ({why}: {anchor})", width=WIDTH, subsequent_indent="  ",
                                   break_long_words=False, break_on_hyphens=False))


# -- the alterations ------------------------------------------------------------------------------


def _altered(**changes: Any) -> Callable[[Evidence], Wrap]:
    """A suspect whose reference is the oracle called with ``changes`` to its keyword arguments
    (each a value, or a function of the case giving one)."""

    def build(evidence: Evidence) -> Wrap:
        values = {name: change(evidence.case) if callable(change) else change for name, change in changes.items()}

        def wrap(attend: Math) -> Math:
            return lambda q, k, v, **options: attend(q, k, v, **{**options, **values})

        return wrap

    return build


def _default_scale(case: Case) -> float:
    return 1.0 / math.sqrt(case.head_dim)


def _gqa_modulo(evidence: Evidence) -> Wrap:
    """Query head h reads KV head h % Hkv: K and V tiled with ``repeat`` to Hq heads."""
    case = evidence.case
    group = case.heads_q // case.heads_kv
    head_dim = 1 if case.kind == "dense" else -2  # [B, H, N, D]; packed [rows, H, D], paged [pages, size, H, D]

    def tiled(tensor: "torch.Tensor") -> "torch.Tensor":
        counts = [1] * tensor.dim()
        counts[head_dim] = group
        return tensor.repeat(*counts)

    def wrap(attend: Math) -> Math:
        return lambda q, k, v, **options: attend(q, tiled(k), tiled(v), **options)

    return wrap


def _lse_altered(change: Callable[[Math, Any, Any, Any, dict[str, Any]], Any]) -> Callable[[Evidence], Wrap]:
    """A suspect whose output is right and whose LSE is ``change(attend, q, k, v, options)``."""

    def build(evidence: Evidence) -> Wrap:
        def wrap(attend: Math) -> Math:
            def wrong(q: Any, k: Any, v: Any, **options: Any) -> Any:
                out, _ = attend(q, k, v, **options)
                return out, change(attend, q, k, v, options)

            return wrong

        return wrap

    return build


def _lse_base_2(attend: Math, q: Any, k: Any, v: Any, options: dict[str, Any]) -> Any:
    return attend(q, k, v, **options)[1] / math.log(2.0)


def _lse_without_sinks(attend: Math, q: Any, k: Any, v: Any, options: dict[str, Any]) -> Any:
    return attend(q, k, v, **{**options, "sinks": None})[1]


def _keys_tail_dropped(tile: int) -> Callable[[Evidence], Wrap]:
    """Keys from the last multiple of ``tile`` on ignored, the masks still aligned to all Nk."""

    def build(evidence: Evidence) -> Wrap:
        case = evidence.case
        kept = case.seqlen_k // tile * tile

        def wrap(attend: Math) -> Math:
            return lambda q, k, v, **options: attend(q, k[..., :kept, :], v[..., :kept, :],
                                                     **{**options, "key_offset": case.seqlen_k - case.seqlen_q})

        return wrap

    return build


def _rows_zeroed(rows: Callable[[Evidence], "torch.Tensor | None"]) -> Callable[[Evidence], Wrap | None]:
    """The output zero on the rows ``rows`` marks True (the LSE as the contract's: a kernel may
    write it apart); the evidence rules the suspect out where it marks none."""

    def build(evidence: Evidence) -> Wrap | None:
        zeroed = rows(evidence)
        if zeroed is None or not bool(zeroed.any()):
            return None
        kept = ~zeroed

        def wrap(attend: Math) -> Math:
            def wrong(q: Any, k: Any, v: Any, **options: Any) -> Any:
                result = attend(q, k, v, **options)
                if not options.get("return_lse"):
                    return result * kept[..., None].to(result.dtype)
                out, lse = result
                return out * kept[..., None].to(out.dtype), lse

            return wrong

        return wrap

    return build


def _query_tail(tile: int) -> Callable[[Evidence], "torch.Tensor | None"]:
    def rows(evidence: Evidence) -> "torch.Tensor":
        import torch

        case = evidence.case
        device = evidence.actual["out"].device
        return (torch.arange(case.seqlen_q, device=device) >= case.seqlen_q // tile * tile).expand(
            case.batch, case.heads_q, case.seqlen_q)

    return rows


def _zero_rows(evidence: Evidence) -> "torch.Tensor | None":
    """The output's rows (all but the last dim) that hold nothing but zeros."""
    return (evidence.actual["out"] == 0).all(dim=-1)


def _paged_in_page_order(evidence: Evidence) -> Wrap:
    """Each sequence reads the cache's pages in storage order, sequence after sequence, as if the
    cache were contiguous, instead of the pages its block table names."""
    packing = evidence.packing
    assert packing is not None
    table, start = [], 0
    for length, row in zip(packing.cache_seqlens, packing.block_table):
        count = -(-length // packing.page_size)
        table.append(tuple(range(start, start + count)) + tuple(row[count:]))
        start += count
    in_order = Packing("paged", block_table=tuple(table), cache_seqlens=packing.cache_seqlens,
                       page_size=packing.page_size)

    def wrap(attend: Math) -> Math:
        return functools.partial(packed_attention_math, packing=in_order)

    return wrap


def _varlen_keys_at_query_offsets(evidence: Evidence) -> Wrap:
    """Each packed sequence's keys taken at ``cu_seqlens_q``'s offsets and lengths."""
    packing = evidence.packing
    assert packing is not None
    shifted = Packing("varlen", cu_seqlens_q=packing.cu_seqlens_q, cu_seqlens_k=packing.cu_seqlens_q)

    def wrap(attend: Math) -> Math:
        return functools.partial(packed_attention_math, packing=shifted)

    return wrap


# -- the suspects, in the order they are tried ------------------------------------------------------


def _partial_tile(tile: int, length: Callable[[Case], int]) -> Callable[[Case], bool]:
    """A dense case whose ``length`` ends in a partial tile of ``tile`` that no larger tile size
    cuts at the same place (203 keys lose the same 11 to tiles of 16 and of 64: that suspect is
    the 64 one's, or the two would tie and name nothing)."""

    def applies(case: Case) -> bool:
        n = length(case)
        if case.kind != "dense" or n <= tile or n % tile == 0:
            return False
        return all(n // larger * larger != n // tile * tile for larger in TILES if larger > tile)

    return applies


def _has_key_tail(tile: int) -> Callable[[Case], bool]:
    return _partial_tile(tile, lambda case: case.seqlen_k)


def _has_query_tail(tile: int) -> Callable[[Case], bool]:
    return _partial_tile(tile, lambda case: case.seqlen_q)


def _lengths_differ(case: Case) -> bool:
    if case.kind == "dense":
        return case.seqlen_q != case.seqlen_k
    return any(queries != keys for queries, keys in case.sequences)


def _window_side(side: int, step: int) -> Callable[[Case], bool]:
    """A window whose side ``side`` (0 left, 1 right) is bounded and stays so after ``step``; a
    right side under a causal mask changes nothing."""

    def applies(case: Case) -> bool:
        if case.window is None or (side == 1 and case.causal):
            return False
        return case.window[side] >= 0 and case.window[side] + step >= 0

    return applies


def _window_moved(side: int, step: int) -> Callable[[Case], tuple[int, int]]:
    def window(case: Case) -> tuple[int, int]:
        assert case.window is not None
        moved = list(case.window)
        moved[side] += step
        return (moved[0], moved[1])

    return window


SUSPECTS: tuple[Suspect, ...] = (
    Suspect("causal-top-left", "the causal mask aligned top-left",
            "torch SDPA's is_causal does this; the contract aligns it bottom-right", CONTRACT,
            lambda case: case.causal and _lengths_differ(case), _altered(key_offset=0)),
    Suspect("causal-missing", "no causal mask", "the case asks causal=True", CONTRACT,
            lambda case: case.causal, _altered(causal=False)),
    Suspect("causal-unasked", "a causal mask where none was asked", "the case asks causal=False", CONTRACT,
            lambda case: not case.causal, _altered(causal=True)),
    Suspect("scale-one", "the scale 1 instead of 1/sqrt(head_dim)", "scale=None means 1/sqrt(head_dim)",
            CONTRACT, lambda case: True, _altered(scale=1.0)),
    Suspect("scale-squared", "the scale 1/head_dim (1/sqrt(head_dim) applied twice?)",
            "scale=None means 1/sqrt(head_dim)", CONTRACT,
            lambda case: True, _altered(scale=lambda case: 1.0 / case.head_dim)),
    Suspect("gqa-modulo", "query head h reading KV head h % Hkv instead of h // (Hq / Hkv)",
            "GQA through repeat where repeat_interleave was meant", CONTRACT,
            lambda case: case.heads_q != case.heads_kv and case.heads_kv > 1, _gqa_modulo),
    *(Suspect(f"window-{'left' if side == 0 else 'right'}-{'wider' if step > 0 else 'narrower'}",
              f"the window's {'left' if side == 0 else 'right'} side one key too {'wide' if step > 0 else 'narrow'}",
              f"window_size=(left, right) counts the keys {'before' if side == 0 else 'after'} the diagonal",
              VARIANTS, _window_side(side, step), _altered(window=_window_moved(side, step)))
      for side in (0, 1) for step in (1, -1)),
    Suspect("softcap-before-scale", "the softcap applied before the scale",
            "the contract caps the scaled scores: softcap * tanh(scale * q.k / softcap)", VARIANTS,
            lambda case: bool(case.softcap), _altered(softcap=lambda case: case.softcap * _default_scale(case))),
    Suspect("lse-base-2", "the LSE in base 2", "the contract's LSE is the natural log", VARIANTS,
            lambda case: case.return_lse, _lse_altered(_lse_base_2)),
    Suspect("lse-without-sinks", "the LSE without the sinks", "the sinks join the softmax's denominator",
            VARIANTS, lambda case: case.return_lse and case.sinks, _lse_altered(_lse_without_sinks)),
    Suspect("sinks-ignored", "the sinks ignored", "their logits join each row's softmax", VARIANTS,
            lambda case: case.sinks, _altered(sinks=None)),
    Suspect("varlen-neighbour-keys", "a packed sequence reading its neighbour's keys",
            "keys taken at cu_seqlens_q's offsets, not cu_seqlens_k's", LAYOUTS,
            lambda case: case.kind == "varlen" and _lengths_differ(case), _varlen_keys_at_query_offsets),
    Suspect("paged-page-order", "paged KV read in page order instead of through block_table",
            "a sequence's pages are anywhere in the cache", LAYOUTS,
            lambda case: case.kind == "paged", _paged_in_page_order),
    *(Suspect(f"keys-tail-{tile}", f"the keys past the last multiple of {tile} ignored, a partial last tile dropped",
              "every key counts", CONTRACT, _has_key_tail(tile), _keys_tail_dropped(tile))
      for tile in TILES),
    *(Suspect(f"queries-tail-{tile}", f"the rows past the last multiple of {tile} left zero, a partial last tile never written",
              "every query row is an output", CONTRACT, _has_query_tail(tile),
              _rows_zeroed(_query_tail(tile)), refines=("rows-unwritten",))
      for tile in TILES),
    Suspect("rows-unwritten", "the output left zero on some rows (never written)", "every query row is an output",
            CONTRACT, lambda case: case.kind != "varlen", _rows_zeroed(_zero_rows)),
)


# -- the diagnosis ---------------------------------------------------------------------------------

def keyless_rows_nonfinite(case: Case, actual: dict[str, "torch.Tensor"],
                           comparisons: Sequence[Comparison]) -> str | None:
    """The ``looks like:`` line for a dense case whose output holds NaN or Inf only on query rows
    that see no key (causal with Nq > Nk, a window): the classic masked softmax that divides 0 by
    0 there. No wrong reference can hold NaN (:func:`diagnose` names nothing then), so this is
    read from where the NaN are. None when some NaN or Inf lies on a row that sees a key."""
    import torch

    from pytest_attnkit.masks import rows_with_a_key

    out = actual.get("out")
    if case.kind != "dense" or out is None or out.dim() != 4 or not any(
            c.nonfinite for c in comparisons if not c.passed):
        return None
    sees = rows_with_a_key(case.seqlen_q, case.seqlen_k, causal=case.causal, window=case.window, device=out.device)
    bad = (~torch.isfinite(out)).any(dim=3).any(dim=1).any(dim=0)  # [Nq]: a row with NaN or Inf anywhere
    if not bool(bad.any()) or bool((bad & sees).any()):
        return None
    cause = "causal with Nq > Nk" if case.window is None else "the window"
    return looks_like(f"NaN or Inf on {int(bad.sum())} of the {int((~sees).sum())} query rows that see no key "
                      f"({cause}), as a masked softmax that divides 0 by 0 gives",
                      "a row that sees no key holds zeros and its gradients are zero", CONTRACT)


def _max_error(actual: "torch.Tensor", reference: "torch.Tensor") -> float:
    import torch

    if not reference.numel():
        return 0.0
    error = (actual.detach().to(device=reference.device, dtype=torch.float64) - reference).abs()
    return float(error.nan_to_num(nan=float("inf")).max().item())


def diagnose(
    evidence: Evidence,
    comparisons: Sequence[Comparison],
    oracle: dict[str, "torch.Tensor"],
    reference: Callable[[Wrap], dict[str, "torch.Tensor"]],
    judge: Callable[[dict[str, "torch.Tensor"], dict[str, "torch.Tensor"], Wrap | None], Sequence[Comparison]],
    suspects: Sequence[Suspect] = SUSPECTS,
) -> Suspect | None:
    """The suspect that explains the failed ``comparisons``, or None (module docstring).

    ``reference(wrap)`` is the float64 oracle altered by ``wrap``, trimmed as ``oracle`` is;
    ``judge(result, reference64, wrap)`` applies the real check's rule to ``result`` against it,
    with the plain same-precision reference altered by the same ``wrap`` (None: the contract's)."""
    failed = [comparison for comparison in comparisons if not comparison.passed]
    if not failed or any(comparison.nonfinite for comparison in failed):
        return None  # NaN and Inf are bugs of their own: no wrong reference holds them
    names = [comparison.name for comparison in comparisons]
    passing: list[Suspect] = []
    for suspect in suspects:
        if not suspect.applies(evidence.case):
            continue
        wrap = suspect.wrap(evidence)
        if wrap is None:
            continue
        wrong = reference(wrap)
        if any(_max_error(evidence.actual[c.name], wrong[c.name]) >= c.max_error for c in failed):
            continue
        if all(c.passed for c in judge({name: wrong[name] for name in names}, oracle, None)):
            continue
        if all(c.passed for c in judge({name: evidence.actual[name] for name in names}, wrong, wrap)):
            passing.append(suspect)
    return _one_explanation(passing)


def _one_explanation(passing: list[Suspect]) -> Suspect | None:
    """The one suspect that refines every other passing suspect, or None."""
    for suspect in passing:
        if all(other is suspect or other.name in suspect.refines for other in passing):
            return suspect
    return None
