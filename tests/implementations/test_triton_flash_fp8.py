"""triton_flash's FP8 (e4m3) forward against attention on the values its inputs stand for.

The kernel runs in a child process, as the harness's workers run it: on the CPU in Triton's
interpreter (``TRITON_INTERPRET=1`` must be set before the kernels are defined, and this pytest
process stays free of Triton), and on a CUDA GPU with FP8 tensor cores (sm89+) where there is one.
Inputs are quantized as the harness quantizes them (a float32 descale per (batch, kv head), q's
over the query heads that share it). Each case is held to FlashAttention-3's FP8 rule, loosely:
the largest error against float64 attention on the dequantized values may be at most twice that
of FA3's own reference (bf16 on the dequantized values, P rounded to e4m3), plus bf16's rounding
of the output. Rows that see no key must be zeros, V given with its keys already contiguous must
give the same bits, and the interpreter's float32 -> e4m3 cast, which the kernel works around
there, must round as torch does once worked around.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]

#: (batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, causal, layout, logit_scale)
CASES = [
    (1, 4, 2, 300, 300, 128, True, "bhsd", 1.0),   # GQA, causal, a ragged last key block
    (2, 2, 2, 257, 257, 64, False, "bhsd", 1.0),    # batch > 1, head dim 64
    (1, 2, 2, 300, 130, 128, True, "bshd", 1.0),    # Nq > Nk: rows that see no key; non-contiguous
    (1, 2, 1, 130, 300, 64, True, "bhsd", 1.0),     # Nq < Nk, MQA
    (1, 4, 1, 1, 300, 64, False, "bhsd", 1.0),      # decode
    (1, 2, 2, 256, 256, 128, False, "bhsd", 8.0),   # large logits
]


def case_id(case: tuple) -> str:
    b, hq, hkv, nq, nk, d, causal, layout, scale = case
    flags = ("-causal" if causal else "") + f"-{layout}" + (f"-x{scale:g}" if scale != 1 else "")
    return f"b{b}-h{hq}:{hkv}-q{nq}-k{nk}-d{d}{flags}"


# ---------------------------------------------------------------------------------------------
# The child: runs the kernel and measures, returning plain numbers (see child_main).
# ---------------------------------------------------------------------------------------------


def quantize(values: "torch.Tensor", heads_kv: int) -> tuple["torch.Tensor", "torch.Tensor"]:
    """``values`` [B, H, N, D] in e4m3 with a float32 descale per (batch, kv head), as the harness
    draws FP8 inputs (``pytest_attnkit.worker.inputs``)."""
    batch, heads = values.shape[:2]
    grouped = values.reshape(batch, heads_kv, heads // heads_kv, *values.shape[2:])
    descale = (grouped.abs().amax(dim=(2, 3, 4)).clamp_min(1e-12) / 448.0).to(torch.float32)
    per_head = descale.repeat_interleave(heads // heads_kv, dim=1)[:, :, None, None]
    return (values / per_head).to(torch.float8_e4m3fn), descale


def attention(q: "torch.Tensor", k: "torch.Tensor", v: "torch.Tensor", causal: bool,
              probs_dtype: "torch.dtype | None" = None) -> "torch.Tensor":
    """Plain attention in q's dtype; rows that see no key are zeros; ``probs_dtype`` rounds P."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = (q * (1.0 / math.sqrt(q.shape[-1]))) @ k.transpose(-1, -2)
    n_q, n_k = scores.shape[-2:]
    if causal:
        rows = torch.arange(n_q)[:, None]
        cols = torch.arange(n_k)[None, :]
        scores = scores.masked_fill(cols > rows + n_k - n_q, float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    if probs_dtype is not None:
        probs = probs.to(probs_dtype).to(v.dtype)
    return probs @ v


def run_case(case: tuple, device: str, seed: int) -> dict[str, Any]:
    from pytest_attnkit.implementations.triton_flash import flash_attention
    from pytest_attnkit.implementations.triton_flash.launch import keys_contiguous

    batch, heads_q, heads_kv, n_q, n_k, head_dim, causal, layout, logit_scale = case
    generator = torch.Generator().manual_seed(seed)

    def draw(heads: int, n: int, multiplier: float) -> "torch.Tensor":
        shape = (batch, n, heads, head_dim) if layout == "bshd" else (batch, heads, n, head_dim)
        values = torch.randn(shape, generator=generator) * multiplier
        return values.transpose(1, 2) if layout == "bshd" else values

    q, q_descale = quantize(draw(heads_q, n_q, logit_scale), heads_kv)
    k, k_descale = quantize(draw(heads_kv, n_k, logit_scale), heads_kv)
    v, v_descale = quantize(draw(heads_kv, n_k, 1.0), heads_kv)
    if layout == "bshd":  # quantize() keeps the layout; make sure the kernel got views
        assert not q.is_contiguous()
    group = heads_q // heads_kv
    values = [t.double() * d.double().repeat_interleave(r, dim=1)[:, :, None, None]
              for t, d, r in ((q, q_descale, group), (k, k_descale, 1), (v, v_descale, 1))]
    oracle = attention(*values, causal)
    fa3 = attention(*(t.to(torch.bfloat16) for t in values), causal, probs_dtype=torch.float8_e4m3fn).double()

    on = {"device": device}
    descales = {"q_descale": q_descale.to(**on), "k_descale": k_descale.to(**on), "v_descale": v_descale.to(**on)}
    q_d, k_d, v_d = q.to(**on), k.to(**on), v.to(**on)
    out = flash_attention(q_d, k_d, v_d, causal=causal, **descales)
    out_vt = flash_attention(q_d, k_d, keys_contiguous(v_d), causal=causal, **descales)
    # The same values with q's signs and its descale both negated (the kernel folds a negative
    # logit scale into q's sign), and with q's descale 0 (every score 0: the uniform average).
    negated = (-q.float()).to(torch.float8_e4m3fn).to(**on)
    out_negated = flash_attention(negated, k_d, v_d, causal=causal, **{**descales, "q_descale": -descales["q_descale"]})
    out_zero = flash_attention(q_d, k_d, v_d, causal=causal, **{**descales, "q_descale": 0 * descales["q_descale"]})
    uniform = attention(values[0] * 0, values[1], values[2], causal)
    error = (out.double().cpu() - oracle).abs()
    no_key = torch.arange(n_q) + n_k - n_q < 0 if causal else torch.zeros(n_q, dtype=torch.bool)
    return {
        "dtype": str(out.dtype), "shape": list(out.shape),
        "max_error": error.max().item(),
        "fa3_error": (fa3 - oracle).abs().max().item(),
        "floor": 2.0 ** -8 * oracle.abs().max().item(),
        "rel_l1": (error.sum() / oracle.abs().sum().clamp_min(1e-30)).item(),
        "rows_without_key": int(no_key.sum()),
        "max_on_rows_without_key": out.cpu()[:, :, no_key].abs().max().item() if no_key.any() else 0.0,
        "same_with_v_transposed": bool(torch.equal(out, out_vt)),
        "same_with_q_and_descale_negated": bool(torch.equal(out, out_negated)),
        "zero_descale_error": (out_zero.double().cpu() - uniform).abs().max().item(),
        "zero_descale_floor": 2.0 ** -8 * uniform.abs().max().item(),
    }


def _probe_kernels() -> tuple[Any, Any]:
    """Two small kernels, defined in the child only (this module's globals are where Triton looks
    up the names a kernel uses, and the pytest process must not import Triton)."""
    import triton
    import triton.language as tl

    from pytest_attnkit.implementations.triton_flash.kernels import _round_to_e4m3

    globals().update(triton=triton, tl=tl, _round_to_e4m3=_round_to_e4m3)

    @triton.jit
    def cast(X, Y, N: tl.constexpr):
        offs = tl.arange(0, N)
        tl.store(Y + offs, _round_to_e4m3(tl.load(X + offs)).to(tl.float8e4nv))

    @triton.jit
    def dot(A, B, C, N: tl.constexpr):
        offs = tl.arange(0, N)
        tile = offs[:, None] * N + offs[None, :]
        tl.store(C + tile, tl.dot(tl.load(A + tile), tl.load(B + tile)))

    return cast, dot


def interpreter_cast_mismatches() -> int:
    """The kernel's interpreter-only rounding, then the cast, against torch's float32 -> e4m3."""
    cast, _ = _probe_kernels()
    generator = torch.Generator().manual_seed(0)
    n = 1 << 14
    x = torch.rand(n, generator=generator) * torch.exp2(torch.rand(n, generator=generator) * 26 - 18)  # 2^-18..2^8
    ties = [0.0, 256.0, 2.0 ** -10, 3 * 2.0 ** -10, 1.0625, 1.1875, 0.4975, 2.0 ** -6 * (1 - 1 / 32)]
    x[:len(ties)] = torch.tensor(ties)
    y = torch.empty(n, dtype=torch.float8_e4m3fn)
    cast[(1,)](x, y, n)
    return int((y.view(torch.uint8) != x.to(torch.float8_e4m3fn).view(torch.uint8)).sum())


def interpreter_runs_fp8_dots() -> str | None:
    """None when Triton's interpreter runs an FP8 tl.dot; otherwise why it cannot. The same dot
    in fp16 must run first, so that only an FP8-specific failure can answer."""
    _, dot = _probe_kernels()
    a16, b16 = torch.randn(16, 16).half(), torch.randn(16, 16).half()
    c = torch.empty(16, 16)
    dot[(1,)](a16, b16, c, 16)  # any failure here is not about FP8: it fails the test
    a, b = a16.to(torch.float8_e4m3fn), b16.to(torch.float8_e4m3fn)
    try:
        dot[(1,)](a, b, c, 16)
    except Exception as error:  # noqa: BLE001 - the reason is reported, whatever it is
        return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    if not torch.equal(c, a.float() @ b.float()):
        return "its FP8 tl.dot gives wrong products"
    return None


def declarations() -> dict[str, Any]:
    from pytest_attnkit.contract import Case
    from pytest_attnkit.implementations.triton_flash import TritonFlash

    impl = TritonFlash()
    return {
        "dtypes": list(impl.dtypes),
        "d96": impl.not_supported_reasons(Case(1, 2, 2, 64, 64, 96, "float8_e4m3fn"), "cpu"),
        "d128": impl.not_supported_reasons(Case(1, 2, 2, 64, 64, 128, "float8_e4m3fn", causal=True), "cpu"),
        "backward": impl.not_supported_reasons(Case(1, 2, 2, 64, 64, 128, "float8_e4m3fn"), "cpu", backward=True),
        "e5m2": impl.not_supported_reasons(Case(1, 2, 2, 64, 64, 128, "float8_e5m2"), "cpu"),
    }


def rejections() -> dict[str, str]:
    """The error each input the FP8 forward refuses raises."""
    from pytest_attnkit.implementations.triton_flash import flash_attention

    q = torch.zeros(1, 2, 8, 64).to(torch.float8_e4m3fn)
    ones = torch.ones(1, 2)
    attempts = {
        "e5m2": lambda: flash_attention(*(torch.zeros(1, 2, 8, 64).to(torch.float8_e5m2),) * 3),
        "d96": lambda: flash_attention(*(torch.zeros(1, 2, 8, 96).to(torch.float8_e4m3fn),) * 3),
        "descale_shape": lambda: flash_attention(q, q, q, q_descale=torch.ones(2, 1), k_descale=ones, v_descale=ones),
        "descale_on_bf16": lambda: flash_attention(*(torch.zeros(1, 2, 8, 64),) * 3, q_descale=ones),
    }
    messages = {}
    for name, attempt in attempts.items():
        try:
            attempt()
        except (TypeError, ValueError) as error:
            messages[name] = str(error)
        else:
            messages[name] = "(no error)"
    return messages


def child_main(device: str) -> dict[str, Any]:
    result: dict[str, Any] = {}
    if device == "cpu":
        reason = interpreter_runs_fp8_dots()
        if reason is not None:
            return {"interpreter_cannot": reason}
        result["cast_mismatches"] = interpreter_cast_mismatches()
        result["declarations"] = declarations()
        result["rejections"] = rejections()
    result["cases"] = {case_id(case): run_case(case, device, seed) for seed, case in enumerate(CASES)}
    return result


# ---------------------------------------------------------------------------------------------
# The tests
# ---------------------------------------------------------------------------------------------


def _cuda_skip_reason() -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA device"
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) < (8, 9):
        return f"FP8 tensor cores need sm89+ (this GPU is sm{major}{minor})"
    return None


_RESULTS: dict[str, dict[str, Any]] = {}


def results(device: str) -> dict[str, Any]:
    """The child's measurements on ``device``, once per session; skips where it cannot run."""
    if device == "cuda" and (reason := _cuda_skip_reason()) is not None:
        pytest.skip(reason)
    if device not in _RESULTS:
        env = dict(os.environ)
        env.pop("TRITON_INTERPRET", None)
        if device == "cpu":
            env["TRITON_INTERPRET"] = "1"
        code = (f"import json, sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
                f"import {Path(__file__).stem} as t; print('RESULT' + json.dumps(t.child_main({device!r})))")
        done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=900)
        lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT")]
        assert done.returncode == 0 and lines, f"the child failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
        _RESULTS[device] = json.loads(lines[-1].removeprefix("RESULT"))
    found = _RESULTS[device]
    if "interpreter_cannot" in found:
        pytest.skip(f"Triton's interpreter cannot run FP8 dots here: {found['interpreter_cannot']}")
    return found


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_fp8_forward_matches_attention_on_the_dequantized_values(device: str, case: tuple) -> None:
    got = results(device)["cases"][case_id(case)]
    assert got["dtype"] == "torch.bfloat16"
    assert got["shape"] == [case[0], case[1], case[3], case[5]]
    allowed = 2 * got["fa3_error"] + got["floor"]
    assert got["max_error"] <= allowed, (
        f"max error {got['max_error']:.3e} > allowed {allowed:.3e} (2 x FA3 reference's {got['fa3_error']:.3e} "
        f"+ floor {got['floor']:.3e}); rel L1 {got['rel_l1']:.2e}")
    # FP8's rounding of P alone makes rel L1 about 0.02 on diffuse rows; a mask or head off by
    # one goes past 0.05, where the max-error rule above is loose (large logits in bf16).
    assert got["rel_l1"] <= 0.05, f"rel L1 {got['rel_l1']:.2e} > 0.05"
    assert got["max_on_rows_without_key"] == 0.0
    assert got["same_with_v_transposed"]
    assert got["same_with_q_and_descale_negated"]
    assert got["zero_descale_error"] <= got["zero_descale_floor"], got


def test_rows_without_a_key_are_in_the_cases() -> None:
    # The Nq > Nk causal case must have rows that see no key, or the zero check above is empty.
    assert results("cpu")["cases"][case_id(CASES[2])]["rows_without_key"] == 170


def test_interpreter_cast_rounds_as_torch_once_worked_around() -> None:
    assert results("cpu")["cast_mismatches"] == 0


def test_adapter_declares_e4m3_and_refuses_in_words() -> None:
    found = results("cpu")["declarations"]
    assert "float8_e4m3fn" in found["dtypes"] and "float8_e5m2" not in found["dtypes"]
    assert found["d128"] == []
    assert any("head dims 64, 128" in reason for reason in found["d96"]), found["d96"]
    assert any("backward" in reason for reason in found["backward"]), found["backward"]
    assert any("float8_e5m2" in reason for reason in found["e5m2"]), found["e5m2"]


def test_fp8_forward_rejects_what_it_does_not_take() -> None:
    found = results("cpu")["rejections"]
    assert "float8_e4m3fn" in found["e5m2"], found
    assert "head_dim=96" in found["d96"], found
    assert "q_descale must be a tensor of shape [batch, heads_kv]" in found["descale_shape"], found
    assert "descales go with FP8 inputs" in found["descale_on_bf16"], found
