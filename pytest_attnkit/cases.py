"""The case sets: which attention problems each suite runs, per profile.

``smoke`` runs in a few minutes on two CPU cores (torch on the CPU, Triton's interpreter), so
its shapes are small but still cover every rule: odd and tiny lengths, decode, seqlen_q !=
seqlen_k both ways (rows that see no key), causal, GQA/MQA, head dims from 32 to 256, all three
dtypes, large logits and non-contiguous inputs. ``default`` is the set for one GPU; ``full``
sweeps the grid. Each set is a plain list, so a reader sees exactly what runs.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from pytest_attnkit.contract import Case

PROFILES: tuple[str, ...] = ("smoke", "default", "full")


def _smoke() -> list[Case]:
    return [
        Case(1, 2, 2, 1, 1, 64, "float16"),
        Case(1, 2, 2, 17, 17, 32, "float16", causal=True),
        Case(2, 4, 2, 113, 113, 64, "float16", causal=True),  # GQA
        Case(1, 4, 1, 1, 300, 64, "float16"),  # decode, MQA
        Case(1, 2, 2, 113, 203, 40, "float32", causal=True),  # Nq < Nk, odd head dim
        Case(1, 2, 2, 203, 113, 64, "float16", causal=True),  # Nq > Nk: rows that see no key
        Case(1, 2, 2, 127, 127, 128, "bfloat16", causal=True),
        Case(1, 2, 2, 64, 64, 64, "float16", logit_scale=8.0),  # large logits
        Case(1, 2, 2, 100, 100, 64, "float16", causal=True, layout="bshd"),  # non-contiguous
        Case(1, 1, 1, 33, 33, 256, "float32"),
        Case(1, 1, 1, 1000, 1000, 64, "float16", causal=True),
    ]


def _default() -> list[Case]:
    cases = [
        # Tiny and odd lengths.
        *[Case(2, 4, 4, n, n, 64, "float16", causal=causal) for n in (1, 17, 113, 127, 1000, 1023) for causal in (False, True)],
        # Head dims, bf16.
        *[Case(2, 4, 4, 257, 257, d, "bfloat16", causal=True) for d in (32, 40, 64, 80, 96, 128, 160, 192, 256)],
        # fp32.
        *[Case(1, 4, 4, 511, 511, d, "float32", causal=causal) for d in (64, 128) for causal in (False, True)],
        # seqlen_q != seqlen_k, both ways, and decode against a long cache.
        Case(2, 4, 4, 113, 203, 64, "float16", causal=True),
        Case(2, 4, 4, 203, 113, 64, "float16", causal=True),
        Case(2, 4, 4, 200, 1025, 128, "bfloat16", causal=True),
        Case(4, 8, 8, 1, 4096, 128, "float16"),
        Case(4, 8, 1, 1, 4096, 128, "bfloat16", causal=True),
        # GQA and MQA.
        Case(2, 8, 2, 1024, 1024, 128, "bfloat16", causal=True),
        Case(2, 8, 1, 777, 777, 64, "float16"),
        # Large logits, non-contiguous inputs.
        Case(2, 4, 4, 512, 512, 64, "float16", logit_scale=8.0),
        Case(2, 4, 4, 512, 512, 128, "bfloat16", causal=True, logit_scale=8.0),
        Case(2, 4, 2, 999, 999, 128, "float16", causal=True, layout="bshd"),
        Case(2, 4, 4, 300, 700, 64, "bfloat16", layout="bshd"),
        # One larger problem, to exercise many tiles and programs.
        Case(2, 16, 16, 4096, 4096, 128, "bfloat16", causal=True),
    ]
    return cases


def _full() -> list[Case]:
    cases = list(_default())
    grid = itertools.product(
        (1, 63, 128, 1025, 2048),  # seqlen_q
        (1, 128, 1000, 2049),  # seqlen_k
        (32, 64, 128, 256),  # head_dim
        ("float16", "bfloat16"),
        (False, True),  # causal
        ((4, 4), (8, 2), (8, 1)),  # heads
    )
    for seqlen_q, seqlen_k, head_dim, dtype, causal, (heads_q, heads_kv) in grid:
        cases.append(Case(2, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, dtype, causal=causal))
    return _unique(cases)


def _unique(cases: list[Case]) -> list[Case]:
    seen: dict[str, Case] = {}
    for case in cases:
        seen.setdefault(case.id, case)
    return list(seen.values())


_BUILDERS = {"smoke": _smoke, "default": _default, "full": _full}


def correctness_cases(profile: str) -> list[Case]:
    """The correctness cases of ``profile`` (one of :data:`PROFILES`)."""
    try:
        builder = _BUILDERS[profile]
    except KeyError:
        raise ValueError(f"unknown profile {profile!r} (known: {', '.join(PROFILES)})") from None
    return _unique(builder())


@dataclass(frozen=True)
class MemorySweep:
    """Fixed batch, heads, head dim and dtype; the sequence length doubles along the sweep."""

    seqlens: tuple[int, ...]
    batch: int = 1
    heads: int = 16
    head_dim: int = 128
    dtype: str = "float16"

    def case(self, seqlen: int) -> Case:
        """The sweep's problem at one length (self-attention: seqlen_q == seqlen_k)."""
        return Case(self.batch, self.heads, self.heads, seqlen, seqlen, self.head_dim, self.dtype)


def memory_sweep(profile: str) -> MemorySweep:
    """The memory suite's sweep: 1k to 32k tokens on a GPU (``full`` goes to 64k)."""
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r} (known: {', '.join(PROFILES)})")
    if profile == "smoke":
        return MemorySweep(seqlens=(256, 512, 1024, 2048))
    top = 65536 if profile == "full" else 32768
    return MemorySweep(seqlens=tuple(2**p for p in range(10, top.bit_length())))


def speed_cases(profile: str) -> list[tuple[str, Case]]:
    """(mode, case) pairs for the speed suite.

    On a GPU: FlashAttention's shapes (batch x seqlen = 16k tokens, heads x head_dim = 2048) at
    head dims 128 and 64, causal and not, forward and backward; decode (one query against a KV
    cache of 4k to 128k tokens); and the design notes' memory-bound case, a short KV with a large
    head dim. On the CPU (smoke), a few small shapes whose numbers are CPU numbers.
    """
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r} (known: {', '.join(PROFILES)})")
    if profile == "smoke":
        small = [Case(1, 2, 2, 256, 256, 64, "float32", causal=causal) for causal in (False, True)]
        return [(mode, case) for mode in ("forward", "backward") for case in small]
    seqlens = (1024, 4096, 16384) if profile == "default" else (512, 1024, 2048, 4096, 8192, 16384)
    dense = []
    for head_dim, lengths in ((128, seqlens), (64, seqlens[1:])):
        heads = 2048 // head_dim
        for seqlen in lengths:
            for causal in (False, True):
                dense.append(Case(16384 // seqlen, heads, heads, seqlen, seqlen, head_dim, "bfloat16", causal=causal))
    decode_lengths = (4096, 32768, 131072) if profile == "default" else (4096, 16384, 32768, 65536, 131072)
    decode = [Case(4, 32, 8, 1, n, 128, "bfloat16") for n in decode_lengths]
    decode.append(Case(64, 32, 32, 1, 256, 256, "bfloat16"))  # short KV, large head dim: memory bound
    pairs = [(mode, case) for mode in ("forward", "backward") for case in dense]
    return pairs + [("forward", case) for case in decode]
