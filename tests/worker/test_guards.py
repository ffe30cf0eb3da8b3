"""The guarded inputs of the sanitize suite (pytest_attnkit/worker/guards.py), on the CPU: each
copy has the input's values, shape, strides and 256-byte alignment inside poison (NaN for floats,
FP8 included; a huge offset for integers), a write past its end shows in the guard, and every
tensor of a case's inputs is guarded, integer offsets and block tables too."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from pytest_attnkit.contract import Case  # noqa: E402
from pytest_attnkit.worker.guards import (GUARD_BYTES, INT_POISON, guard_inputs, guarded_copy,  # noqa: E402
                                          input_names, newly_not_finite)
from pytest_attnkit.worker.inputs import make_inputs  # noqa: E402


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.int32])
def test_a_guarded_copy_keeps_values_strides_and_alignment_inside_poison(dtype) -> None:
    values = torch.randn(2, 7, 3, 8)
    tensor = (values * 100 if not dtype.is_floating_point else values).to(dtype).transpose(1, 2)  # bshd-like view
    copy, guard = guarded_copy("q", tensor, 4096)
    assert copy.shape == tensor.shape and copy.stride() == tensor.stride()
    assert torch.equal(copy.view(torch.uint8) if dtype.itemsize == 1 else copy, tensor.view(torch.uint8)
                       if dtype.itemsize == 1 else tensor)
    assert copy.data_ptr() % 256 == guard.buffer.data_ptr() % 256
    assert guard.before * tensor.element_size() == 4096 and guard.poison_kept()
    head = guard.buffer[: guard.before]
    if dtype.is_floating_point:
        assert torch.isnan(head.float()).all()
    else:
        assert (head == INT_POISON).all()


def test_a_write_past_the_end_or_before_the_start_shows_in_the_guard() -> None:
    for where in (-1, 1):
        copy, guard = guarded_copy("k", torch.randn(5, 4), 1024)
        index = guard.before - 1 if where < 0 else guard.before + guard.span
        guard.buffer[index] = 0.5
        assert not guard.poison_kept()


def test_a_read_past_the_end_reaches_a_result_as_nan() -> None:
    copy, guard = guarded_copy("v", torch.randn(6, 4), 1024)
    past = guard.buffer[guard.before + guard.span: guard.before + guard.span + 4]  # one row past the end
    assert torch.isnan((copy.sum(0) + 0 * past).sum())
    plain = {"out": torch.ones(3)}
    assert newly_not_finite(plain, {"out": torch.tensor([1.0, float("nan"), 1.0])}) == {"out": 1}
    assert newly_not_finite({"out": torch.tensor([float("nan")])}, {"out": torch.tensor([float("nan")])}) == {}


@pytest.mark.parametrize("case", [
    Case.packed((0, 17, 113, 1, 40), (0, 17, 113, 1, 40), 4, 2, 64, "float16", causal=True),
    Case.paged(1, (300, 17, 1, 64), 16, 4, 1, 64, "float16"),
    Case(1, 4, 4, 33, 33, 64, "float32", alibi=True),
], ids=["varlen", "paged", "alibi"])
def test_every_tensor_of_a_case_is_guarded(case: Case) -> None:
    inputs = make_inputs(case, "cpu", 7)
    guarded, guards = guard_inputs(inputs)
    names = input_names(inputs)
    assert sorted(guard.name for guard in guards) == sorted(names)
    assert {"q", "k", "v", "dout"} <= set(names)
    if case.kind == "varlen":
        assert {"cu_seqlens_q", "cu_seqlens_k"} <= set(names)
        assert torch.equal(guarded.layout_keywords["cu_seqlens_k"], inputs.layout_keywords["cu_seqlens_k"])
        assert guarded.layout_keywords["max_seqlen_q"] == inputs.layout_keywords["max_seqlen_q"]
    if case.kind == "paged":
        assert {"block_table", "cache_seqlens"} <= set(names)
    if case.alibi:
        assert "alibi_slopes" in names
    for guard in guards:
        assert guard.before * guard.buffer.element_size() == GUARD_BYTES
    only, [one] = guard_inputs(inputs, "v")
    assert one.name == "v" and only.q is inputs.q
