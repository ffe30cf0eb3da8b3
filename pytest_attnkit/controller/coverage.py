"""Which case each implementation runs: the case itself, or its in-contract stand-in.

A kernel that only takes some lengths or some dtypes would otherwise skip most of a case set and
learn nothing from the families it holds (batch > 1, large logits, non-contiguous inputs,
causal, odd lengths). Where an implementation declares such a restriction, it runs a stand-in for the
case instead: the same case with the lengths rounded up to its ``seqlen_multiple`` and the
nearest dtype it declares. Speed cases follow the declared dtypes the same way (bf16 where
supported, else fp16, else fp32), so an fp16-only kernel is timed and gated too. Only the
declarations (plain data from the worker) are read here; a stand-in that is still refused for
another reason is skipped with that reason, as any case is.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pytest_attnkit.contract import Case

#: The dtype to use in place of one an implementation does not take, nearest first.
NEAREST_DTYPES = {
    "bfloat16": ("bfloat16", "float16", "float32"),
    "float16": ("float16", "bfloat16", "float32"),
    "float32": ("float32", "float16", "bfloat16"),
}


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def stand_in(case: Case, capabilities: dict[str, Any]) -> Case:
    """The in-contract stand-in for ``case`` for an implementation with these declarations
    (``case`` itself when it is already within them)."""
    changes: dict[str, Any] = {}
    dtypes = capabilities.get("dtypes") or []
    if dtypes and case.dtype not in dtypes:
        nearest = next((dtype for dtype in NEAREST_DTYPES.get(case.dtype, ()) if dtype in dtypes), None)
        if nearest is not None:
            changes["dtype"] = nearest
    multiple = int(capabilities.get("seqlen_multiple") or 1)
    if multiple > 1 and case.kind == "dense":  # packed lengths are refused in words, not rounded
        for field in ("seqlen_q", "seqlen_k"):
            value = getattr(case, field)
            if value % multiple:
                changes[field] = _round_up(value, multiple)
    return dataclasses.replace(case, **changes) if changes else case


def pairs(impls: dict[str, dict[str, Any]], cases: list[Case]) -> tuple[list[tuple[str, Case]], dict[tuple[str, str], str]]:
    """(implementation, case) pairs to parametrize, each case replaced by its stand-in where needed, and
    for each stand-in the id of the case it stands for. A stand-in equal to a case the implementation
    already runs is left out: it would run the same test twice."""
    chosen: list[tuple[str, Case]] = []
    stand_ins: dict[tuple[str, str], str] = {}
    for name, capabilities in impls.items():
        seen: set[str] = set()
        for case in cases:
            runs = stand_in(case, capabilities)
            if runs.id in seen:
                continue
            seen.add(runs.id)
            chosen.append((name, runs))
            if runs is not case:
                stand_ins[(name, runs.id)] = case.id
    return chosen, stand_ins
