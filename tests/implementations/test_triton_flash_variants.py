"""triton_flash's variants and layouts against float64 attention, in Triton's CPU interpreter.

The variants (``window_size``, ``softcap``, ``alibi_slopes``, ``sinks``, ``return_lse``, a V head
dim of its own) of ``flash_attention``, forward and backward; ``flash_attention_varlen`` (packed
sequences, lengths 0 included, unused tokens at the end), forward and backward; and
``flash_attention_with_kvcache`` (paged KV: shuffled pages, a block table wider than needed,
slots past each length holding other values), forward. Semantics: ``pytest_attnkit.contract``.

The kernels run in child processes (two, started together), as the harness's workers run them:
``TRITON_INTERPRET=1`` must be set before the kernels are defined, and this pytest process stays
free of Triton. Each child returns plain numbers as JSON; the tests here only assert.

Each tensor (out, the LSE, dq, dk, dv, dsinks) is judged by the harness's own rule
(``pytest_attnkit.worker.tolerance.compare``, FlashAttention's): its largest error against the
float64 oracle (``pytest_attnkit.oracle``, sequence by sequence for the packed layouts) may be at
most 2x (gradients: 3x) that of the same math in the inputs' own precision, plus a rounding floor.
float32 cases make that rule sharp (a key too many or too few in a window fails it by far);
float16 ones check the half-precision path. bfloat16 does not run in the interpreter.

Beyond the rule: rows that see no key must hold exact zeros (and zero dq), sequences of a varlen
batch must not change when another sequence's keys or the unused tokens do, and bad arguments
must raise ValueError or TypeError naming the argument.
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import math
import os
import subprocess
import sys
import tempfile
import traceback
import zlib
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
DTYPES = ("float32", "float16")


def spec(**fields: Any) -> dict[str, Any]:
    """A case: shapes and variants; what is left out is plain attention."""
    base = dict(batch=1, hq=2, hkv=2, nq=128, nk=128, d=64, dv=None, causal=False, window=None, softcap=0.0,
                alibi=False, sinks=False, lse=False, logit_scale=1.0, scale=None, layout="bhsd")
    unknown = set(fields) - set(base) - {"seqlens_q", "seqlens_k", "unused_q", "unused_k", "page_size",
                                          "cache_seqlens", "nan_unused"}
    assert not unknown, unknown
    return {**base, **fields}


DENSE = {
    "causal-window64,0-q200-k300": spec(hq=4, hkv=2, nq=200, nk=300, causal=True, window=(64, 0)),
    "window32,16-b2-q257": spec(batch=2, nq=257, nk=257, window=(32, 16)),
    "window-1,8-q300-k100": spec(nq=300, nk=100, window=(-1, 8)),  # rows 0..191 see no key
    "window-1,0-is-causal-q100-k190": spec(nq=100, nk=190, window=(-1, 0)),
    "softcap20-scale0.3": spec(nq=160, nk=230, softcap=20.0, logit_scale=3.0, scale=0.3),
    # A negative scale keeps the forward on the scaled scores' maximum (RAW_MAX needs scale > 0).
    "scale-0.2-causal-q200": spec(nq=200, nk=200, causal=True, scale=-0.2),
    "alibi-gqa8:2-q128-k300": spec(hq=8, hkv=2, nq=128, nk=300, alibi=True),
    "alibi-mqa4:1-causal-q300": spec(hq=4, hkv=1, nq=300, nk=300, causal=True, alibi=True),
    # Odd heads' slopes negated: a bias that grows with distance, in the forward's float form too.
    "alibi-signs-gqa4:2-q200-k300": spec(hq=4, hkv=2, nq=200, nk=300, alibi="signs"),
    "sinks-lse-causal-q200": spec(hq=4, hkv=2, nq=200, nk=200, causal=True, sinks=True, lse=True),
    "mla-d64-dv128-causal-lse": spec(hq=4, hkv=2, nq=150, nk=200, d=64, dv=128, causal=True, lse=True),
    "mla-d128-dv64": spec(nq=200, nk=150, d=128, dv=64),
    "no-key-rows-causal-q300-k130": spec(nq=300, nk=130, causal=True),
    "no-key-rows-causal-sinks-lse-q300-k130": spec(nq=300, nk=130, causal=True, sinks=True, lse=True),
    "everything-bshd": spec(batch=2, hq=6, hkv=2, nq=200, nk=150, d=64, dv=128, causal=True, window=(40, 0),
                            softcap=30.0, alibi=True, sinks=True, lse=True, logit_scale=3.0, layout="bshd"),
}

VARLEN = {
    "varlen": spec(hq=4, hkv=2, seqlens_q=(0, 17, 113, 1, 40), seqlens_k=(0, 17, 113, 1, 40), unused_q=7,
                   unused_k=5),
    "varlen-causal": spec(hq=4, hkv=2, causal=True, seqlens_q=(0, 17, 113, 1, 40), seqlens_k=(0, 30, 113, 64, 25),
                          unused_q=7, unused_k=5),
    # Sequences longer than a tile, 128 rows or more on average: dK/dV reads the padded LSE/delta
    # copies unmasked, and the rows past a sequence's end read its last row again (p = 0 there).
    # Unused query rows hold NaN (nan_unused), in q, dO and dLSE, so a read past the last sequence
    # shows.
    "varlen-long": spec(hq=4, hkv=2, seqlens_q=(300, 0, 129, 260), seqlens_k=(300, 0, 129, 200), unused_q=9,
                        unused_k=3, nan_unused=True),
    "varlen-long-window40,8-alibi-sinks-lse": spec(hq=4, hkv=2, window=(40, 8), alibi=True, sinks=True, lse=True,
                                                  seqlens_q=(300, 0, 140, 200), seqlens_k=(260, 5, 140, 230),
                                                  unused_q=4, unused_k=2, nan_unused=True),
    "varlen-long-causal": spec(hq=4, hkv=2, causal=True, seqlens_q=(300, 129, 200), seqlens_k=(300, 200, 129),
                               unused_q=5, unused_k=0, nan_unused=True),
    # No sequence has a key (the backward's early return): the sinks take each row's whole gradient,
    # and the unused rows' NaN dLSE must stay out of it.
    "varlen-no-keys-sinks-lse": spec(hq=4, hkv=2, sinks=True, lse=True, seqlens_q=(5, 0, 9), seqlens_k=(0, 0, 0),
                                     unused_q=3, unused_k=2, nan_unused=True),
    "varlen-window16,4-sinks-lse": spec(hq=4, hkv=2, window=(16, 4), sinks=True, lse=True,
                                        seqlens_q=(0, 17, 113, 1, 40, 9), seqlens_k=(3, 17, 150, 1, 40, 0),
                                        unused_q=3, unused_k=11),
    "varlen-everything": spec(hq=6, hkv=2, dv=128, causal=True, window=(24, -1), softcap=20.0, alibi=True,
                              sinks=True, lse=True, logit_scale=2.5, seqlens_q=(0, 17, 113, 1, 40),
                              seqlens_k=(0, 30, 113, 64, 25), unused_q=7, unused_k=5),
}

PAGED = {
    **{f"paged-decode-p{p}": spec(hq=8, hkv=2, nq=1, page_size=p, cache_seqlens=(1, 257, 130), causal=p == 16)
       for p in (1, 16, 64)},
    **{f"paged-prefill33-causal-p{p}": spec(hq=4, hkv=2, nq=33, page_size=p, cache_seqlens=(40, 257, 20),
                                            causal=True)
       for p in (1, 16, 64)},  # the last sequence: 13 rows see no key
    "paged-decode-window64,0-sinks-lse-p64": spec(hq=8, hkv=2, nq=1, page_size=64, cache_seqlens=(1, 257, 130),
                                                  window=(64, 0), sinks=True, lse=True),
    "paged-everything-p16": spec(hq=4, hkv=2, nq=33, dv=128, page_size=16, cache_seqlens=(70, 200, 33),
                                 causal=True, window=(48, -1), softcap=20.0, alibi=True, sinks=True, lse=True,
                                 logit_scale=2.5),
}

#: The varlen case whose sequences are checked for independence (see isolation()).
ISOLATION_CASE = "varlen"


def case_ids(cases: dict[str, dict]) -> list[tuple[str, str]]:
    return [(name, dtype) for name in cases for dtype in DTYPES]


# ---------------------------------------------------------------------------------------------
# The child: runs the kernels and measures, returning plain numbers (see child_main).
# ---------------------------------------------------------------------------------------------


def _seed(*parts: str) -> int:
    return zlib.crc32("/".join(parts).encode())


def alibi_slopes(heads: int) -> "torch.Tensor":
    """ALiBi's geometric slopes 2^(-8 (h + 1) / H), float32 [H]."""
    return torch.tensor([2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)], dtype=torch.float32)


def _kernel_kwargs(case: dict, slopes: "torch.Tensor | None", sinks: "torch.Tensor | None") -> dict[str, Any]:
    """The keywords of the call: only those the case sets, so that the defaults are used too."""
    kwargs: dict[str, Any] = {"causal": case["causal"]}
    if case["scale"] is not None:
        kwargs["scale"] = case["scale"]
    if case["window"] is not None:
        kwargs["window_size"] = case["window"]
    if case["softcap"]:
        kwargs["softcap"] = case["softcap"]
    if slopes is not None:
        kwargs["alibi_slopes"] = slopes
    if sinks is not None:
        kwargs["sinks"] = sinks
    if case["lse"]:
        kwargs["return_lse"] = True
    return kwargs


def _oracle_options(case: dict) -> dict[str, Any]:
    return {"causal": case["causal"], "scale": case["scale"], "window": case["window"], "softcap": case["softcap"]}


def reference(q, k, v, dout, dlse, slopes, sinks, case: dict, *, float64: bool, packing=None) -> dict[str, Any]:
    """The oracle (``float64``) or the plain same-precision reference: out, lse and, with ``dout``,
    dq, dk, dv (and dsinks); packed layouts sequence by sequence (:class:`oracle.Packing`)."""
    from pytest_attnkit.oracle import attention_math, packed_attention_math

    cast = (lambda t: t.detach().double()) if float64 else (lambda t: t.detach().clone())  # noqa: E731
    backward = dout is not None
    leaves = [cast(t).requires_grad_(backward) for t in (q, k, v)]
    names = ["dq", "dk", "dv"]
    sink_leaf = None
    if sinks is not None:  # float32 in the plain reference, as the kernel is handed them
        sink_leaf = cast(sinks).requires_grad_(backward)
        leaves.append(sink_leaf)
        names.append("dsinks")
    options = dict(_oracle_options(case), alibi_slopes=None if slopes is None else cast(slopes), sinks=sink_leaf,
                   return_lse=True)
    with torch.enable_grad():
        if packing is None:
            out, lse = attention_math(*leaves[:3], **options)
        else:
            out, lse = packed_attention_math(*leaves[:3], packing, **options)
        found = {"out": out.detach(), "lse": lse.detach()}
        if backward:
            outputs, upstream = [out], [cast(dout)]
            if dlse is not None:
                outputs.append(lse)
                upstream.append(cast(dlse).to(lse.dtype))
            # With no key at all the output is a constant 0: only what depends on a leaf goes in,
            # and a leaf nothing depends on gets a zero gradient.
            kept = [(o, u) for o, u in zip(outputs, upstream) if o.requires_grad]
            grads = torch.autograd.grad([o for o, _ in kept], leaves, [u for _, u in kept], allow_unused=True)
            found.update(zip(names, (torch.zeros_like(x) if g is None else g for g, x in zip(grads, leaves))))
    return found


def judge(name: str, actual: "torch.Tensor", oracle: "torch.Tensor", plain: "torch.Tensor", dtype: "torch.dtype",
          softcap: float) -> dict[str, Any]:
    """The harness's rule (FlashAttention's) on one tensor, as plain data."""
    from pytest_attnkit.worker.tolerance import compare, factor_and_extra_floor

    if tuple(actual.shape) != tuple(oracle.shape):
        return {"passed": False, "text": f"{name}: shape {list(actual.shape)}, expected {list(oracle.shape)}",
                "headroom": float("inf")}
    comparison = compare(name, actual, oracle, plain, dtype=dtype, **factor_and_extra_floor(name, softcap=softcap))
    return {"passed": comparison.passed, "text": comparison.describe(), "headroom": comparison.headroom}


def _sees_a_key(n_q: int, n_k: int, case: dict) -> "torch.Tensor":
    """Boolean [n_q]: the rows that see at least one of n_k keys."""
    from pytest_attnkit.masks import rows_with_a_key

    if n_k == 0:
        return torch.zeros(n_q, dtype=torch.bool)
    return rows_with_a_key(n_q, n_k, causal=case["causal"], window=case["window"], device="cpu")


def _max_abs(t: "torch.Tensor") -> float:
    return float(t.detach().abs().max().item()) if t.numel() else 0.0


def _call(fn, *args, lse: bool, **kwargs) -> tuple["torch.Tensor", "torch.Tensor | None", str]:
    """Call the kernel; (out, lse or None, how the result came back)."""
    result = fn(*args, **kwargs)
    if lse:
        kind = "tuple" if isinstance(result, tuple) and len(result) == 2 else type(result).__name__
        return (result[0], result[1], kind) if kind == "tuple" else (result, None, kind)
    return result, None, "tensor" if isinstance(result, torch.Tensor) else type(result).__name__


def _what_came_back(out: "torch.Tensor", lse: "torch.Tensor | None", returned: str) -> dict[str, Any]:
    return {"returned": returned, "out_dtype": str(out.dtype), "out_shape": list(out.shape),
            "lse_dtype": None if lse is None else str(lse.dtype), "lse_shape": None if lse is None else list(lse.shape)}


def _variants_drawn(case: dict, generator: "torch.Generator") -> tuple["torch.Tensor | None", "torch.Tensor | None"]:
    slopes = alibi_slopes(case["hq"]) if case["alibi"] else None
    if case["alibi"] == "signs":
        slopes[1::2] *= -1
    sinks = (torch.randn(case["hq"], generator=generator) * 2.0).float() if case["sinks"] else None
    return slopes, sinks


def _judge_all(kernel: dict, oracle: dict, plain: dict, dtype, case: dict, lse_checked) -> dict[str, Any]:
    found = {}
    for name in ("out", "lse", "dq", "dk", "dv", "dsinks"):
        if name not in kernel:
            continue
        actual, expected, yardstick = kernel[name], oracle[name], plain[name]
        if name == "lse" and actual.shape == expected.shape:  # rows whose LSE the contract leaves open: out
            actual, expected, yardstick = (t[lse_checked(t)] for t in (actual, expected, yardstick))
        found[name] = judge(name, actual, expected, yardstick, dtype, case["softcap"])
    return found


def run_dense(name: str, case: dict, dtype_name: str) -> dict[str, Any]:
    from pytest_attnkit.implementations.triton_flash import flash_attention

    dtype = getattr(torch, dtype_name)
    generator = torch.Generator().manual_seed(_seed("dense", name, dtype_name))
    b, hq, hkv, nq, nk, d = (case[key] for key in ("batch", "hq", "hkv", "nq", "nk", "d"))
    dv = case["dv"] or d

    def draw(heads: int, n: int, dim: int, multiplier: float) -> "torch.Tensor":
        if case["layout"] == "bshd":  # non-contiguous [B, H, N, D] views of [B, N, H, D] tensors
            return (torch.randn(b, n, heads, dim, generator=generator) * multiplier).to(dtype).transpose(1, 2)
        return (torch.randn(b, heads, n, dim, generator=generator) * multiplier).to(dtype)

    q, k, v = draw(hq, nq, d, case["logit_scale"]), draw(hkv, nk, d, case["logit_scale"]), draw(hkv, nk, dv, 1.0)
    slopes, sinks = _variants_drawn(case, generator)
    sees = _sees_a_key(nq, nk, case)
    lse_rows = sees | (sinks is not None)  # a row with no key and no sink: its LSE is left open
    dout = torch.randn(b, hq, nq, dv, generator=generator).to(dtype)
    dlse = (torch.randn(b, hq, nq, generator=generator) * lse_rows).float() if case["lse"] else None

    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    sink_leaf = sinks.detach().clone().requires_grad_() if sinks is not None else None
    out, lse, returned = _call(flash_attention, *leaves, lse=case["lse"],
                               **_kernel_kwargs(case, slopes.clone() if slopes is not None else None, sink_leaf))
    kernel = {"out": out, **({"lse": lse} if lse is not None else {})}
    grad_leaves = leaves + ([sink_leaf] if sink_leaf is not None else [])
    outputs, upstream = [out], [dout]
    if lse is not None:
        outputs.append(lse)
        upstream.append(dlse)
    grads = torch.autograd.grad(outputs, grad_leaves, upstream)
    kernel.update(zip(["dq", "dk", "dv", "dsinks"], grads))

    oracle = reference(q, k, v, dout, dlse, slopes, sinks, case, float64=True)
    plain = reference(q, k, v, dout, dlse, slopes, sinks, case, float64=False)
    if not case["lse"]:
        oracle.pop("lse"), plain.pop("lse")
    no_key = ~sees
    binding = None
    if case["softcap"]:
        scale = case["scale"] or 1 / math.sqrt(d)
        scores = (q.double() * scale) @ k.double().repeat_interleave(hq // hkv, 1).transpose(-1, -2)
        binding = float((scores.abs() > case["softcap"]).double().mean())
    return {
        **_what_came_back(out, lse, returned),
        "expected_out_shape": [b, hq, nq, dv], "expected_lse_shape": [b, hq, nq],
        "comparisons": _judge_all(kernel, oracle, plain, dtype, case, lambda t: lse_rows.expand(t.shape)),
        "rows_without_key": int(no_key.sum()),
        "out_on_rows_without_key": _max_abs(out[:, :, no_key]),
        "dq_on_rows_without_key": _max_abs(kernel["dq"][:, :, no_key]),
        "softcap_binding": binding,
    }


def _varlen_inputs(case: dict, dtype, generator, dv: int) -> dict[str, Any]:
    lens_q, lens_k = case["seqlens_q"], case["seqlens_k"]
    cu_q = [0] + [sum(lens_q[:i + 1]) for i in range(len(lens_q))]
    cu_k = [0] + [sum(lens_k[:i + 1]) for i in range(len(lens_k))]
    total_q, total_k = cu_q[-1] + case["unused_q"], cu_k[-1] + case["unused_k"]
    ls = case["logit_scale"]
    q = (torch.randn(total_q, case["hq"], case["d"], generator=generator) * ls).to(dtype)
    if case.get("nan_unused"):
        q[cu_q[-1]:] = float("nan")
    return {
        "cu_q": cu_q, "cu_k": cu_k, "q": q,
        "k": (torch.randn(total_k, case["hkv"], case["d"], generator=generator) * ls).to(dtype),
        "v": torch.randn(total_k, case["hkv"], dv, generator=generator).to(dtype),
    }


def run_varlen(name: str, case: dict, dtype_name: str) -> dict[str, Any]:
    from pytest_attnkit.implementations.triton_flash import flash_attention_varlen
    from pytest_attnkit.implementations.triton_flash.launch import pads_rows
    from pytest_attnkit.oracle import Packing

    dtype = getattr(torch, dtype_name)
    generator = torch.Generator().manual_seed(_seed("varlen", name, dtype_name))
    hq, dv = case["hq"], case["dv"] or case["d"]
    inputs = _varlen_inputs(case, dtype, generator, dv)
    q, k, v, cu_q, cu_k = (inputs[key] for key in ("q", "k", "v", "cu_q", "cu_k"))
    slopes, sinks = _variants_drawn(case, generator)
    sees = torch.cat([_sees_a_key(nq, nk, case) for nq, nk in zip(case["seqlens_q"], case["seqlens_k"])])
    used_q, used_k = cu_q[-1], cu_k[-1]
    lse_rows = torch.cat([sees | (sinks is not None), torch.zeros(case["unused_q"], dtype=torch.bool)])
    dout = torch.randn(q.shape[0], hq, dv, generator=generator).to(dtype)
    dlse = (torch.randn(hq, q.shape[0], generator=generator) * lse_rows).float() if case["lse"] else None
    if case.get("nan_unused"):  # the upstream gradients of rows of no sequence are the caller's garbage too
        dout[used_q:] = float("nan")
        if dlse is not None:
            dlse[:, used_q:] = float("nan")

    layout = (torch.tensor(cu_q, dtype=torch.int32), torch.tensor(cu_k, dtype=torch.int32),
              max(case["seqlens_q"]), max(case["seqlens_k"]))
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    sink_leaf = sinks.detach().clone().requires_grad_() if sinks is not None else None
    kwargs = _kernel_kwargs(case, slopes, sink_leaf)
    out, lse, returned = _call(flash_attention_varlen, *leaves, *layout, lse=case["lse"], **kwargs)
    kernel = {"out": out, **({"lse": lse} if lse is not None else {})}
    outputs, upstream = [out], [dout]
    if lse is not None:
        outputs.append(lse)
        upstream.append(dlse)
    grads = torch.autograd.grad(outputs, leaves + ([sink_leaf] if sink_leaf is not None else []), upstream)
    kernel.update(zip(["dq", "dk", "dv", "dsinks"], grads))

    packing = Packing("varlen", cu_seqlens_q=tuple(cu_q), cu_seqlens_k=tuple(cu_k))
    oracle = reference(q, k, v, dout, dlse, slopes, sinks, case, float64=True, packing=packing)
    plain = reference(q, k, v, dout, dlse, slopes, sinks, case, float64=False, packing=packing)
    if not case["lse"]:
        oracle.pop("lse"), plain.pop("lse")
    # Unused tokens are not checked: cut them off every packed tensor (the LSE is [Hq, rows]).
    rows = {"out": used_q, "dq": used_q, "dk": used_k, "dv": used_k}
    for found in (kernel, oracle, plain):
        for key, n in rows.items():
            if key in found and found[key].shape[0] >= n:
                found[key] = found[key][:n]
    no_key = ~sees
    result = {
        **_what_came_back(out, lse, returned),
        "expected_out_shape": [q.shape[0], hq, dv], "expected_lse_shape": [hq, q.shape[0]],
        "comparisons": _judge_all(kernel, oracle, plain, dtype, case, lambda t: lse_rows[None, :].expand(t.shape)),
        "rows_without_key": int(no_key.sum()),
        "out_on_rows_without_key": _max_abs(kernel["out"][no_key]),
        "dq_on_rows_without_key": _max_abs(kernel["dq"][no_key]),
        "padded_rows": pads_rows(q.shape[0], len(case["seqlens_q"])),
    }
    if name == ISOLATION_CASE and dtype_name == "float32":
        result["isolation"] = isolation(flash_attention_varlen, case, inputs, layout, kwargs, out.detach(), generator)
    return result


def isolation(fn, case: dict, inputs: dict, layout: tuple, kwargs: dict, out: "torch.Tensor",
              generator: "torch.Generator") -> dict[str, Any]:
    """Redraw the keys and values of one sequence and of the unused tokens: every other
    sequence's output rows must keep the same bits, and that sequence's rows must change."""
    cu_q, cu_k = inputs["cu_q"], inputs["cu_k"]
    target = max(range(len(case["seqlens_q"])), key=lambda b: case["seqlens_k"][b])
    k, v = inputs["k"].clone(), inputs["v"].clone()
    for lo, hi in ((cu_k[target], cu_k[target + 1]), (cu_k[-1], k.shape[0])):
        k[lo:hi] = torch.randn(k[lo:hi].shape, generator=generator).to(k.dtype)
        v[lo:hi] = torch.randn(v[lo:hi].shape, generator=generator).to(v.dtype)
    redrawn = fn(inputs["q"], k, v, *layout, **kwargs)
    redrawn = redrawn[0] if isinstance(redrawn, tuple) else redrawn
    rows = torch.ones(cu_q[-1], dtype=torch.bool)
    rows[cu_q[target]:cu_q[target + 1]] = False
    return {
        "sequence": target,
        "other_rows": int(rows.sum()),
        "other_rows_unchanged": bool(torch.equal(redrawn[:cu_q[-1]][rows], out[:cu_q[-1]][rows])),
        "its_rows_changed": not torch.equal(redrawn[cu_q[target]:cu_q[target + 1]], out[cu_q[target]:cu_q[target + 1]]),
    }


def run_paged(name: str, case: dict, dtype_name: str) -> dict[str, Any]:
    from pytest_attnkit.implementations.triton_flash import flash_attention_with_kvcache
    from pytest_attnkit.oracle import Packing

    dtype = getattr(torch, dtype_name)
    generator = torch.Generator().manual_seed(_seed("paged", name, dtype_name))
    lengths, page, nq, hq, hkv, d = (case[key] for key in ("cache_seqlens", "page_size", "nq", "hq", "hkv", "d"))
    dv = case["dv"] or d
    batch = len(lengths)
    needed = [-(-n // page) for n in lengths]
    width = max(needed) + 2  # wider than the longest sequence needs
    num_pages = sum(needed) + 5  # some pages belong to no sequence
    order = torch.randperm(num_pages, generator=generator).tolist()  # shuffled pages
    table = []
    for n in needed:
        mine, order = order[:n], order[n:]
        # Entries past what a sequence needs point at other sequences' (or unused) pages.
        table.append(mine + torch.randint(0, num_pages, (width - n,), generator=generator).tolist())
    ls = case["logit_scale"]
    # Every slot holds random values, those past a sequence's length included.
    k_cache = (torch.randn(num_pages, page, hkv, d, generator=generator) * ls).to(dtype)
    v_cache = torch.randn(num_pages, page, hkv, dv, generator=generator).to(dtype)
    q = (torch.randn(batch, nq, hq, d, generator=generator) * ls).to(dtype)
    slopes, sinks = _variants_drawn(case, generator)
    sees = torch.stack([_sees_a_key(nq, n, case) for n in lengths])  # [B, Nq]
    lse_rows = (sees | (sinks is not None))[:, None, :]  # [B, 1, Nq]

    out, lse, returned = _call(flash_attention_with_kvcache, q, k_cache, v_cache,
                               torch.tensor(table, dtype=torch.int32), torch.tensor(lengths, dtype=torch.int32),
                               lse=case["lse"], **_kernel_kwargs(case, slopes, sinks))
    kernel = {"out": out, **({"lse": lse} if lse is not None else {})}
    packing = Packing("paged", block_table=tuple(map(tuple, table)), cache_seqlens=tuple(lengths), page_size=page)
    oracle = reference(q, k_cache, v_cache, None, None, slopes, sinks, case, float64=True, packing=packing)
    plain = reference(q, k_cache, v_cache, None, None, slopes, sinks, case, float64=False, packing=packing)
    if not case["lse"]:
        oracle.pop("lse"), plain.pop("lse")
    no_key = ~sees
    return {
        **_what_came_back(out, lse, returned),
        "expected_out_shape": [batch, nq, hq, dv], "expected_lse_shape": [batch, hq, nq],
        "comparisons": _judge_all(kernel, oracle, plain, dtype, case, lambda t: lse_rows.expand(t.shape)),
        "rows_without_key": int(no_key.sum()),
        "out_on_rows_without_key": _max_abs(out[no_key]),
        "table_width": width, "pages_needed": max(needed),
    }


def rejections() -> dict[str, str]:
    """The error each bad argument raises: 'TypeName: message', or '(no error)'."""
    from pytest_attnkit.implementations.triton_flash import (flash_attention, flash_attention_varlen,
                                                             flash_attention_with_kvcache)

    q = torch.zeros(1, 2, 8, 64)
    packed = torch.zeros(10, 2, 64)
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    q_paged, cache = torch.zeros(2, 1, 2, 64), torch.zeros(4, 16, 2, 64)
    table, lengths = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32), torch.tensor([20, 9], dtype=torch.int32)
    attempts = {
        "window_size=(64,)": lambda: flash_attention(q, q, q, window_size=(64,)),
        "window_size=(-2, 0)": lambda: flash_attention(q, q, q, window_size=(-2, 0)),
        "window_size=(1.5, 0)": lambda: flash_attention(q, q, q, window_size=(1.5, 0)),
        "softcap=-1": lambda: flash_attention(q, q, q, softcap=-1.0),
        "alibi_slopes [3] for 2 heads": lambda: flash_attention(q, q, q, alibi_slopes=torch.ones(3)),
        "alibi_slopes [2, 2] for batch 1": lambda: flash_attention(q, q, q, alibi_slopes=torch.ones(2, 2)),
        "sinks [2, 1]": lambda: flash_attention(q, q, q, sinks=torch.zeros(2, 1)),
        "varlen window_size=(8, -3)": lambda: flash_attention_varlen(packed, packed, packed, cu, cu, 6, 6,
                                                                     window_size=(8, -3)),
        "cu_seqlens_q int64": lambda: flash_attention_varlen(packed, packed, packed, cu.long(), cu, 6, 6),
        "cu_seqlens_k int64": lambda: flash_attention_varlen(packed, packed, packed, cu, cu.long(), 6, 6),
        "cu_seqlens_k of another batch": lambda: flash_attention_varlen(
            packed, packed, packed, cu, torch.tensor([0, 10], dtype=torch.int32), 6, 10),
        "paged softcap=-2": lambda: flash_attention_with_kvcache(q_paged, cache, cache, table, lengths, softcap=-2.0),
        "block_table 1-D": lambda: flash_attention_with_kvcache(q_paged, cache, cache, table.flatten(), lengths),
        "block_table of 3 rows for 2 sequences": lambda: flash_attention_with_kvcache(
            q_paged, cache, cache, torch.zeros(3, 2, dtype=torch.int32), lengths),
        "cache_seqlens of 3 for 2 sequences": lambda: flash_attention_with_kvcache(
            q_paged, cache, cache, table, torch.tensor([20, 9, 1], dtype=torch.int32)),
    }
    messages = {}
    for name, attempt in attempts.items():
        try:
            attempt()
        except (TypeError, ValueError) as error:
            messages[name] = f"{type(error).__name__}: {error}"
        except Exception as error:  # noqa: BLE001 - reported: the wrong kind of error
            messages[name] = f"(wrong kind) {type(error).__name__}: {error}"
        else:
            messages[name] = "(no error)"
    return messages


def _guarded(run, name: str, case: dict, dtype: str) -> dict[str, Any]:
    """``run``'s measurements, or the exception it raised (one failing case fails only its test)."""
    try:
        return run(name, case, dtype)
    except Exception:  # noqa: BLE001 - reported to the test, whatever it is
        return {"error": traceback.format_exc(limit=-8)}


def child_main(part: str) -> dict[str, Any]:
    torch.set_num_threads(1)  # the two children run side by side
    if part == "dense":
        return {"dense": {f"{name}-{dtype}": _guarded(run_dense, name, case, dtype) for name, case in DENSE.items()
                          for dtype in DTYPES}}
    try:
        found_rejections = rejections()
    except Exception:  # noqa: BLE001 - an import error, say: reported by each rejection test
        found_rejections = {"error": traceback.format_exc(limit=-8)}
    return {
        "rejections": found_rejections,
        "varlen": {f"{name}-{dtype}": _guarded(run_varlen, name, case, dtype) for name, case in VARLEN.items()
                   for dtype in DTYPES},
        "paged": {f"{name}-{dtype}": _guarded(run_paged, name, case, dtype) for name, case in PAGED.items()
                  for dtype in DTYPES},
    }


# ---------------------------------------------------------------------------------------------
# The tests
# ---------------------------------------------------------------------------------------------

PARTS = ("dense", "packed")
_CHILDREN: dict[str, tuple[subprocess.Popen, Any, Any]] = {}
_RESULTS: dict[str, dict[str, Any]] = {}


@atexit.register
def _stop_children() -> None:
    """A child no test waited for (a run of a few tests) must not outlive the session."""
    for process, stdout, stderr in _CHILDREN.values():
        if process.poll() is None:
            process.kill()
            process.wait()
        stdout.close(), stderr.close()


def _start(part: str) -> None:
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    code = (f"import json, sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
            f"import {Path(__file__).stem} as t; print('RESULT' + json.dumps(t.child_main({part!r})))")
    stdout, stderr = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
    process = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, stdout=stdout, stderr=stderr, text=True)
    _CHILDREN[part] = (process, stdout, stderr)


def results(part: str) -> dict[str, Any]:
    """One child's measurements, once per session; both children start on the first call."""
    if part not in _RESULTS:
        for name in PARTS:
            if name not in _CHILDREN and name not in _RESULTS:
                _start(name)
        process, stdout, stderr = _CHILDREN.pop(part)
        try:
            returncode = process.wait(timeout=900)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise
        stdout.seek(0), stderr.seek(0)
        out, err = stdout.read(), stderr.read()
        stdout.close(), stderr.close()
        lines = [line for line in out.splitlines() if line.startswith("RESULT")]
        assert returncode == 0 and lines, f"the {part} child failed ({returncode}):\n{out[-5000:]}\n{err[-20000:]}"
        _RESULTS[part] = json.loads(lines[-1].removeprefix("RESULT"))
    return _RESULTS[part]


def case_result(part: str, kind: str, key: str) -> dict[str, Any]:
    got = results(part)[kind][key]
    if "error" in got:
        pytest.fail(f"the kernel raised on {key}:\n{got['error']}", pytrace=False)
    return got


def assert_matches(got: dict[str, Any], *, lse: bool, sinks: bool, backward: bool) -> None:
    assert got["returned"] == ("tuple" if lse else "tensor"), f"return_lse={lse} returned {got['returned']}"
    assert got["out_shape"] == got["expected_out_shape"]
    if lse:
        assert got["lse_dtype"] == "torch.float32" and got["lse_shape"] == got["expected_lse_shape"], got
    expected = {"out"} | ({"lse"} if lse else set())
    if backward:
        expected |= {"dq", "dk", "dv"} | ({"dsinks"} if sinks else set())
    comparisons = got["comparisons"]
    assert set(comparisons) == expected
    failed = [c["text"] for c in comparisons.values() if not c["passed"]]
    assert not failed, "\n".join(failed)
    # Rows that see no key hold zeros, and get no gradient (with or without sinks).
    assert got["out_on_rows_without_key"] == 0.0
    if backward:
        assert got["dq_on_rows_without_key"] == 0.0


@pytest.mark.parametrize(("name", "dtype"), case_ids(DENSE), ids=[f"{n}-{d}" for n, d in case_ids(DENSE)])
def test_dense_variants_forward_and_backward_match_float64(name: str, dtype: str) -> None:
    got = case_result("dense", "dense", f"{name}-{dtype}")
    case = DENSE[name]
    assert got["out_dtype"] == f"torch.{dtype}"
    assert_matches(got, lse=case["lse"], sinks=case["sinks"], backward=True)


@pytest.mark.parametrize(("name", "dtype"), case_ids(VARLEN), ids=[f"{n}-{d}" for n, d in case_ids(VARLEN)])
def test_varlen_forward_and_backward_match_each_sequence_alone(name: str, dtype: str) -> None:
    got = case_result("packed", "varlen", f"{name}-{dtype}")
    case = VARLEN[name]
    assert got["out_dtype"] == f"torch.{dtype}"
    assert_matches(got, lse=case["lse"], sinks=case["sinks"], backward=True)


@pytest.mark.parametrize(("name", "dtype"), case_ids(PAGED), ids=[f"{n}-{d}" for n, d in case_ids(PAGED)])
def test_paged_forward_matches_attention_over_the_gathered_cache(name: str, dtype: str) -> None:
    got = case_result("packed", "paged", f"{name}-{dtype}")
    case = PAGED[name]
    assert got["out_dtype"] == f"torch.{dtype}"
    assert got["table_width"] > got["pages_needed"]
    assert_matches(got, lse=case["lse"], sinks=case["sinks"], backward=False)


def test_varlen_sequences_do_not_see_each_other_or_the_unused_tokens() -> None:
    found = case_result("packed", "varlen", f"{ISOLATION_CASE}-float32")["isolation"]
    assert found["other_rows"] > 0
    assert found["its_rows_changed"], "redrawing a sequence's keys left its own rows alone: the check is empty"
    assert found["other_rows_unchanged"], f"redrawing sequence {found['sequence']}'s keys changed other sequences"


def test_the_cases_exercise_what_they_claim() -> None:
    """The no-key checks above are not empty, and the soft cap binds."""
    for dtype in DTYPES:
        dense = lambda name: case_result("dense", "dense", f"{name}-{dtype}")  # noqa: E731
        assert dense("no-key-rows-causal-q300-k130")["rows_without_key"] == 170
        assert dense("no-key-rows-causal-sinks-lse-q300-k130")["rows_without_key"] == 170
        assert dense("window-1,8-q300-k100")["rows_without_key"] == 192
        assert dense("softcap20-scale0.3")["softcap_binding"] > 0.3
        # varlen: 15 rows of the causal sequence with 40 queries and 25 keys; 9 queries with no key at all
        assert case_result("packed", "varlen", f"varlen-causal-{dtype}")["rows_without_key"] == 15
        assert case_result("packed", "varlen", f"varlen-window16,4-sinks-lse-{dtype}")["rows_without_key"] == 9
        # dK/dV reads padded LSE/delta copies for the long sequences, masked rows for the short
        for name in VARLEN:
            assert case_result("packed", "varlen", f"{name}-{dtype}")["padded_rows"] == name.startswith("varlen-long")
        # paged: 13 of the 33 queries of the sequence with 20 keys in the cache
        assert case_result("packed", "paged", f"paged-prefill33-causal-p16-{dtype}")["rows_without_key"] == 13


REJECTIONS = {
    "window_size=(64,)": "window_size",
    "window_size=(-2, 0)": "window_size",
    "window_size=(1.5, 0)": "window_size",
    "softcap=-1": "softcap",
    "alibi_slopes [3] for 2 heads": "alibi_slopes",
    "alibi_slopes [2, 2] for batch 1": "alibi_slopes",
    "sinks [2, 1]": "sinks",
    "varlen window_size=(8, -3)": "window_size",
    "cu_seqlens_q int64": "cu_seqlens_q",
    "cu_seqlens_k int64": "cu_seqlens_k",
    "cu_seqlens_k of another batch": "cu_seqlens",
    "paged softcap=-2": "softcap",
    "block_table 1-D": "block_table",
    "block_table of 3 rows for 2 sequences": "block_table",
    "cache_seqlens of 3 for 2 sequences": "cache_seqlens",
}


@pytest.mark.parametrize("attempt", list(REJECTIONS))
def test_bad_arguments_raise_naming_the_argument(attempt: str) -> None:
    found = results("packed")["rejections"]
    if "error" in found:
        pytest.fail(f"the rejections could not be tried:\n{found['error']}", pytrace=False)
    message = found[attempt]
    assert message.startswith(("ValueError: ", "TypeError: ")), message
    assert REJECTIONS[attempt] in message, message
