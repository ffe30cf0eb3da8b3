"""FLOP and byte counts of the speed suite (FlashAttention's convention)."""

from __future__ import annotations

from pytest_attnkit.contract import Case
from pytest_attnkit.counts import byte_count, flop_count, visible_pairs


def test_forward_flops_and_causal_halving() -> None:
    case = Case(4, 16, 16, 4096, 4096, 128, "bfloat16")
    assert flop_count(case, "forward") == 4 * 4 * 16 * 4096 * 4096 * 128
    causal = Case(4, 16, 16, 4096, 4096, 128, "bfloat16", causal=True)
    assert flop_count(causal, "forward") * 2 == flop_count(case, "forward")
    assert flop_count(case, "backward") == int(2.5 * flop_count(case, "forward"))


def test_causal_decode_sees_every_key() -> None:
    assert visible_pairs(Case(1, 1, 1, 1, 4096, 64, causal=True)) == 4096
    assert visible_pairs(Case(1, 1, 1, 3, 5, 64, causal=True)) == 3 + 4 + 5
    assert visible_pairs(Case(1, 1, 1, 5, 3, 64, causal=True)) == 0 + 0 + 1 + 2 + 3


def test_decode_bytes_are_the_kv_cache() -> None:
    case = Case(4, 32, 8, 1, 32768, 128, "bfloat16")
    kv_cache = 2 * 4 * 8 * 32768 * 128 * 2
    assert kv_cache < byte_count(case, "forward") < 1.01 * kv_cache



def test_timed_calls_rotate_over_input_copies_within_a_memory_cap() -> None:
    from pytest_attnkit.worker.speed import INPUT_SETS, INPUT_SETS_BYTES, input_set_count

    small = Case(4, 16, 16, 4096, 4096, 128, "bfloat16")
    assert input_set_count(small, "backward", "cuda") == INPUT_SETS
    assert input_set_count(small, "forward", "cpu") == 1
    decode = Case(4, 32, 8, 1, 131072, 128, "bfloat16")  # a 2 GiB KV cache
    assert input_set_count(decode, "forward", "cuda") == 2
    assert input_set_count(decode, "forward", "cuda") * byte_count(decode, "forward") <= INPUT_SETS_BYTES
    assert input_set_count(decode, "backward", "cuda") == 1  # over 4 GiB: one copy, never zero
