"""What one speed case counts: the FLOPs it computes and the fewest bytes it must move.

FLOPs follow FlashAttention's convention: ``4 * B * Hq * Nq * Nk * D`` for the forward, halved
for causal attention when ``Nq == Nk`` (with ``Nq != Nk`` the visible query-key pairs are counted
exactly, since decode with a causal mask sees every key), and 2.5 times the forward for the
backward. Bytes are the fewest an implementation must move: each input read once and each output
written once; for decode that is essentially the KV cache, and GB/s against the measured copy
bandwidth is its figure of merit. Pure functions of a :class:`~pytest_attnkit.contract.Case`,
read by both processes.
"""

from __future__ import annotations

from pytest_attnkit.contract import Case

MODES: tuple[str, ...] = ("forward", "backward")
DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}


def visible_pairs(case: Case) -> int:
    """Query-key pairs that attention computes per (batch, head)."""
    if not case.causal:
        return case.seqlen_q * case.seqlen_k
    if case.seqlen_q == case.seqlen_k:
        return case.seqlen_q * case.seqlen_k // 2  # FlashAttention's convention
    offset = case.seqlen_k - case.seqlen_q
    return sum(min(case.seqlen_k, max(0, i + offset + 1)) for i in range(case.seqlen_q))


def flop_count(case: Case, mode: str) -> int:
    forward = 4 * case.batch * case.heads_q * case.head_dim * visible_pairs(case)
    return int(forward * 2.5) if mode == "backward" else forward


def byte_count(case: Case, mode: str) -> int:
    """The fewest bytes through device memory: inputs read once, outputs written once."""
    element = DTYPE_BYTES[case.dtype]
    q_or_o = case.batch * case.heads_q * case.seqlen_q * case.head_dim * element
    k_or_v = case.batch * case.heads_kv * case.seqlen_k * case.head_dim * element
    if mode == "backward":  # read q, k, v, o, dO; write dq, dk, dv
        return 3 * q_or_o + 2 * k_or_v + q_or_o + 2 * k_or_v
    return 2 * q_or_o + 2 * k_or_v
