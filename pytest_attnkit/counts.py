"""What one speed case counts: the FLOPs it computes and the fewest bytes it must move.

FLOPs follow FlashAttention's convention: ``4 * B * Hq * Nq * Nk * D`` for the forward, halved
for causal attention when ``Nq == Nk`` (with ``Nq != Nk`` the visible query-key pairs are counted
exactly, since decode with a causal mask sees every key), and 2.5 times the forward for the
backward. A sliding window counts the pairs inside its band only, exactly (a kernel that skips
the masked blocks is credited with the work it had to do, not with the dense problem's). With a V
head dim that differs from Q's, QK^T costs ``2 * D`` per pair and PV ``2 * Dv``, so the forward
is ``2 * B * Hq * pairs * (D + Dv)`` (FlashAttention's formula when ``Dv == D``). Bytes are the fewest an implementation must move: each input read once and each output
written once; for decode that is essentially the KV cache, and GB/s against the measured copy
bandwidth is its figure of merit. Varlen and paged cases count sequence by sequence, from the
actual lengths (never the batch times the longest); a paged cache's bytes are those of the pages
a sequence reads (whole pages: ``ceil(length / page_size) * page_size`` tokens). FP8 inputs are one
byte an element, their output bf16. Pure functions of a :class:`~pytest_attnkit.contract.Case`,
read by both processes.
"""

from __future__ import annotations

from pytest_attnkit.contract import Case

MODES: tuple[str, ...] = ("forward", "backward")
DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float8_e4m3fn": 1, "float8_e5m2": 1}


def visible_pairs(case: Case) -> int:
    """Query-key pairs that attention computes per (batch, head) of a dense case."""
    return _pairs(case, case.seqlen_q, case.seqlen_k)


def total_pairs(case: Case) -> int:
    """Query-key pairs per head over the whole batch, sequence by sequence."""
    if case.kind == "dense":
        return case.batch * visible_pairs(case)
    return sum(_pairs(case, queries, keys) for queries, keys in case.sequences)


def _pairs(case: Case, seqlen_q: int, seqlen_k: int) -> int:
    if case.window is not None:
        return _band_pairs(case, seqlen_q, seqlen_k)
    if not case.causal:
        return seqlen_q * seqlen_k
    if seqlen_q == seqlen_k:
        return seqlen_q * seqlen_k // 2  # FlashAttention's convention
    offset = seqlen_k - seqlen_q
    return sum(min(seqlen_k, max(0, i + offset + 1)) for i in range(seqlen_q))


def _band_pairs(case: Case, seqlen_q: int, seqlen_k: int) -> int:
    """Exact count of the pairs a window (and causal) leaves visible: query i sees keys
    ``i + Nk - Nq - left`` to ``i + Nk - Nq + right``, clipped to the keys there are."""
    left, right = case.window or (-1, -1)
    if case.causal:
        right = 0 if right < 0 else min(right, 0)
    offset = seqlen_k - seqlen_q
    total = 0
    for i in range(seqlen_q):
        first = 0 if left < 0 else max(0, i + offset - left)
        last = seqlen_k - 1 if right < 0 else min(seqlen_k - 1, i + offset + right)
        total += max(0, last - first + 1)
    return total


def flop_count(case: Case, mode: str) -> int:
    forward = 2 * case.heads_q * (case.head_dim + case.value_dim) * total_pairs(case)
    return int(forward * 2.5) if mode == "backward" else forward


def byte_count(case: Case, mode: str) -> int:
    """The fewest bytes through device memory: inputs read once, outputs written once."""
    element = DTYPE_BYTES[case.dtype]
    out_element = DTYPE_BYTES["bfloat16"] if element == 1 else element
    keys = case.total_k
    if case.kind == "paged":
        assert case.page_size is not None
        keys = sum(-(-length // case.page_size) * case.page_size for _, length in case.sequences)
    q = case.total_q * case.heads_q * case.head_dim * element
    o = case.total_q * case.heads_q * case.value_dim * out_element
    k = keys * case.heads_kv * case.head_dim * element
    v = keys * case.heads_kv * case.value_dim * element
    if mode == "backward":  # read q, k, v, o, dO; write dq, dk, dv
        return (q + k + v + 2 * o) + (q + k + v)
    return q + k + v + o
