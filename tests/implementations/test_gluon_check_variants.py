"""tools/flash_bench/gluon_check.py's variant cases without a GPU: its rule (the harness's
tolerance against the float64 oracle with the same window, ALiBi, softcap and sinks, rows that see
no key zero) run on stand-in kernels on the CPU. A right one passes each variant; one that drops a
window's left edge, the sinks, softcap or ALiBi's bottom-right alignment fails it. The Gluon
kernel itself runs only on an sm_90 GPU, where the same check runs it."""

from __future__ import annotations

import math

import pytest
import torch

from helpers import flash_bench_module
from pytest_attnkit.oracle import attention_math


@pytest.fixture(scope="module")
def gluon_check():
    return flash_bench_module("gluon_check")


def stand_in(*, left_edge: bool = True, sinks: bool = True, softcap: bool = True, top_left_alibi: bool = False):
    """A kernel with gluon_forward.flash_fwd's signature computing attention_math in float32, each
    flag off dropping one part of the variant (a bug of the kind a kernel has)."""

    class Kernel:
        class Config:
            @staticmethod
            def parse(text: str) -> str:
                return text

        @staticmethod
        def unsupported_reason(q, k, v, causal, scale):
            return None

        @staticmethod
        def flash_fwd(q, k, v, causal, scale, config=None, *, out, window=None, alibi_slopes=None, softcap=0.0,
                      sink_logits=None, **rest):
            sink_logits = rest.get("sinks")
            if window is not None and not left_edge:
                window = (-1, window[1])
            got, lse = attention_math(
                q.float(), k.float(), v.float(), causal=causal, scale=scale, window=window,
                softcap=softcap if softcap else 0.0, alibi_slopes=alibi_slopes,
                sinks=sink_logits if sinks else None, return_lse=True,
                key_offset=0 if top_left_alibi and alibi_slopes is not None else None)
            o, base2 = out
            o.copy_(got.to(o.dtype))
            base2.copy_(lse / math.log(2.0))
            if sink_logits is None or not sinks:  # the kernel's own rows that see no key: +inf
                from pytest_attnkit.masks import rows_with_a_key

                seen = rows_with_a_key(q.shape[2], k.shape[2], causal=causal, window=window, device=q.device)
                base2[:, :, ~seen] = float("inf")
            return o, base2

    if not softcap:
        original = Kernel.flash_fwd

        def no_softcap(*args, softcap=0.0, **keywords):
            return original(*args, **keywords)

        Kernel.flash_fwd = staticmethod(no_softcap)
    return Kernel


def case(gluon_check, name: str, shape=(1, 2, 1, 200, 150), head_dim: int = 64) -> dict:
    """The check's case of ATTENTION_VARIANTS' ``name``, on a CPU-sized shape (Nq > Nk: under causal
    or a window, rows that see no key)."""
    found = next(c for c in gluon_check.attention_variant_cases() if f" {name} " in c["id"] and c["head_dim"] == head_dim)
    return {**found, "shape": list(shape), "dtype": "bfloat16"}


@pytest.mark.parametrize("name", ["w128:0", "w256:64", "alibi", "causal-alibi", "cap30-x8", "causal-cap15-x8",
                                  "causal-sinks", "causal-w256:0-cap15-alibi-sinks-x8"])
def test_a_right_kernel_passes_every_variant(gluon_check, name: str) -> None:
    result = gluon_check._check_case(case(gluon_check, name), stand_in(), device="cpu")
    assert result["passed"], result


@pytest.mark.parametrize("name, bug", [("w128:0", dict(left_edge=False)), ("w256:64", dict(left_edge=False)),
                                       ("causal-sinks", dict(sinks=False)), ("cap30-x8", dict(softcap=False)),
                                       ("causal-cap15-x8", dict(softcap=False)),
                                       ("alibi", dict(top_left_alibi=True)),
                                       ("causal-w256:0-cap15-alibi-sinks-x8", dict(sinks=False)),
                                       ("causal-w256:0-cap15-alibi-sinks-x8", dict(left_edge=False))])
def test_a_kernel_that_drops_part_of_a_variant_fails(gluon_check, name: str, bug: dict) -> None:
    result = gluon_check._check_case(case(gluon_check, name, shape=(1, 2, 1, 400, 300)), stand_in(**bug),
                                     device="cpu")
    assert not result["passed"], (name, bug, result)


def test_every_variant_runs_at_every_head_dim_and_compiles_once_each(gluon_check) -> None:
    cases = gluon_check.attention_variant_cases()
    names = {variant[0] for variant in gluon_check.ATTENTION_VARIANTS}
    assert len(cases) == len(names) * len(gluon_check.HEAD_DIMS) * len(gluon_check.ATTENTION_VARIANT_SHAPES)
    assert {c["head_dim"] for c in cases} == {64, 128, 192} and len({c["id"] for c in cases}) == len(cases)
    specs = gluon_check.attention_variant_specs()
    assert len(specs) == len(names) * len(gluon_check.HEAD_DIMS)


def test_a_run_without_timing_says_so_instead_of_a_table_of_dashes(gluon_check) -> None:
    """--skip-timing printed an empty speed table, a row of dashes per case (vcheck1 in
    results/2026-11-29-session20); it says that nothing was timed."""
    results = {"correct": {"a": {"id": "a", "passed": True, "out": {"max_error": 1.0, "allowed": 4.0}}}}
    text = gluon_check.report(results, {}, [], {"device": "NVIDIA H200"})
    assert "## Correctness: 1 of 1 cases passed" in text
    assert "## Speed: not timed" in text and "| - |" not in text and "| case |" not in text
