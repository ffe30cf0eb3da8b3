"""The case sets: which attention problems each suite runs, per profile.

``smoke`` runs in a few minutes on two CPU cores (torch on the CPU, Triton's interpreter), so
its shapes are small but still cover every rule: odd and tiny lengths, decode, seqlen_q !=
seqlen_k both ways (rows that see no key), causal, GQA/MQA, head dims from 32 to 256, all three
dtypes, large logits and non-contiguous inputs. ``default`` is the set for one GPU; ``full``
sweeps the grid. Each set is a plain list, so a reader sees exactly what runs.

Every profile also runs the two layouts (FlashAttention's): varlen packed sequences (zero-length
sequences, a long one beside many short ones, unused tokens at the end, Nq != Nk per sequence) and
paged KV caches (page sizes 1, 16, 64 and 256, decode and chunked prefill, caches shorter than the
queries), alone and with the variants.

Every profile also runs the variants (sliding window, softcap, ALiBi, sinks, the LSE, V head dims
that differ from Q's): each on its own, and combined with causal, GQA, odd lengths, each other and
every dtype. Only implementations that declare a variant are handed its cases; the others skip
them with the reason in words.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

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
        *_smoke_variants(),
        *_smoke_layouts(),
    ]


def _smoke_layouts() -> list[Case]:
    return [
        # Zero-length sequences, GQA, causal per sequence, unused tokens after the last one.
        Case.packed((0, 17, 113, 1, 40), (0, 17, 113, 1, 40), 4, 2, 64, "float16", causal=True, unused_tokens=5),
        # A long sequence beside short ones; Nq != Nk; a sequence with no keys, one with no queries.
        Case.packed((300, 7, 7, 7, 0, 50), (300, 30, 0, 7, 9, 64), 2, 2, 64, "float32"),
        # Causal with more queries than keys in a sequence (rows that see no key), and the longest
        # queries and the longest keys in different sequences (max_seqlen_q != max_seqlen_k).
        Case.packed((513, 7, 40), (100, 1000, 20), 2, 2, 32, "float16", causal=True),
        Case.packed((64, 33, 100), (64, 33, 100), 4, 2, 64, "float16", causal=True, window=(16, 0), softcap=20.0,
                    alibi=True),
        Case.packed((64, 1, 100), (80, 1, 100), 4, 2, 64, "float16", causal=True, sinks=True, return_lse=True),
        # Paged: decode (MQA), chunked prefill with one-token pages, softcap on decode, a window.
        Case.paged(1, (300, 17, 1, 64), 16, 4, 1, 64, "float16"),
        Case.paged(33, (300, 33, 100), 1, 4, 2, 64, "float32", causal=True),
        Case.paged(1, (700, 256, 5), 256, 4, 4, 128, "float16", softcap=30.0),
        Case.paged(20, (200, 129, 64, 7), 64, 4, 2, 64, "float16", causal=True, window=(32, 0)),
    ]


def _smoke_variants() -> list[Case]:
    # Few and small: torch_flex compiles every new shape and score function on the CPU.
    return [
        Case(1, 2, 2, 113, 113, 64, "float16", causal=True, window=(32, 0)),  # sliding window
        Case(2, 4, 2, 113, 203, 64, "bfloat16", window=(32, 16)),  # two-sided, GQA, Nq < Nk
        Case(1, 2, 2, 203, 113, 64, "float16", causal=True, window=(16, 0), return_lse=True),  # rows see no key
        Case(2, 4, 2, 113, 113, 64, "bfloat16", causal=True, softcap=15.0, logit_scale=4.0),  # the cap binds
        Case(1, 4, 1, 127, 127, 128, "float16", alibi=True),  # MQA
        Case(1, 4, 2, 100, 100, 64, "bfloat16", causal=True, sinks=True),
        Case(1, 2, 2, 1, 300, 64, "float16", sinks=True, return_lse=True),  # decode
        Case(1, 2, 2, 64, 64, 64, "float32", return_lse=True),
        Case(1, 2, 2, 64, 64, 192, "bfloat16", causal=True, head_dim_v=128),  # MLA
        Case(1, 2, 2, 33, 33, 64, "float16", head_dim_v=512),
        Case(1, 4, 2, 257, 257, 64, "float16", causal=True, window=(64, 0), softcap=30.0, alibi=True, sinks=True,
             return_lse=True),  # everything at once
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
        # FP8 inputs with descales per (batch, kv head), forward only, judged by FA3's FP8 rule.
        Case(2, 8, 2, 1024, 1024, 128, "float8_e4m3fn", causal=True),
        Case(2, 4, 4, 777, 777, 64, "float8_e4m3fn"),
        Case(2, 4, 4, 513, 513, 128, "float8_e5m2", causal=True),
        *_default_variants(),
        *_default_layouts(),
    ]
    return cases


def _default_layouts() -> list[Case]:
    mixed = (0, 1, 17, 128, 1000, 4096, 3, 0)
    return [
        # varlen: zero-length sequences, a long one among short ones, unused tokens, Nq != Nk both ways.
        Case.packed(mixed, mixed, 8, 2, 128, "bfloat16", causal=True, unused_tokens=100),
        Case.packed((4096, 128, 128, 256, 512, 1024, 0, 77), (4096, 128, 128, 256, 512, 1024, 5, 0), 16, 16, 64,
                    "float16"),
        Case.packed((513, 1000, 17), (700, 1000, 300), 8, 2, 128, "bfloat16", causal=True),
        Case.packed((513, 1000, 17), (700, 1000, 300), 4, 4, 64, "float32", causal=True),
        Case.packed((2000, 64, 300), (128, 3000, 100), 8, 2, 128, "bfloat16", causal=True),
        Case.packed(mixed, mixed, 8, 2, 128, "bfloat16", causal=True, window=(256, 0), unused_tokens=3),
        Case.packed((777, 64, 1), (777, 64, 1), 8, 8, 128, "float16", softcap=30.0, alibi=True),
        Case.packed((1024, 300, 5), (1024, 300, 5), 8, 2, 64, "bfloat16", causal=True, window=(128, 0), sinks=True,
                    return_lse=True),
        Case.packed((1024, 300), (1024, 300), 16, 16, 192, "bfloat16", causal=True, head_dim_v=128),
        # paged KV: decode at each page size, a shuffled cache of mixed lengths (one of a single token).
        *[Case.paged(1, (4096, 1000, 17, 1, 8191), size, 32, 8, 128, "bfloat16") for size in (1, 16, 64, 256)],
        # Chunked prefill, and queries that outnumber a short cache (rows that see no key).
        Case.paged(128, (4096, 500, 128, 2000), 16, 16, 4, 128, "bfloat16", causal=True),
        Case.paged(64, (4096, 32, 1), 64, 8, 8, 64, "float16", causal=True),
        # With the variants: softcap on decode, a window on prefill, sinks and the LSE, MLA's head dims.
        Case.paged(1, (4096, 333, 2048), 64, 32, 8, 128, "bfloat16", softcap=30.0),
        Case.paged(256, (4096, 1024), 16, 8, 2, 128, "float16", causal=True, window=(512, 0)),
        Case.paged(4, (3000, 17, 600), 16, 8, 2, 64, "bfloat16", sinks=True, return_lse=True),
        Case.paged(1, (2048, 700), 64, 16, 16, 192, "bfloat16", head_dim_v=128),
    ]


def _default_variants() -> list[Case]:
    return [
        # Sliding windows: one-sided under causal, two-sided, one side unbounded, a single key.
        *[Case(2, 8, 2, 1023, 1023, 128, dtype, causal=True, window=(left, 0))
          for left in (0, 1, 127, 256) for dtype in ("float16", "bfloat16")],
        *[Case(2, 4, 4, 1000, 1000, 64, "bfloat16", window=window) for window in ((0, 0), (256, 128), (-1, 64), (64, -1))],
        Case(2, 4, 4, 200, 1025, 64, "float16", causal=True, window=(256, 0)),
        Case(2, 4, 4, 1025, 200, 64, "bfloat16", causal=True, window=(100, 0)),
        Case(1, 4, 4, 511, 511, 64, "float32", causal=True, window=(128, 0)),
        # Softcap at FlashAttention-3's, FlashInfer's and FlashAttention-2's values, and one that binds hard.
        *[Case(2, 4, 2, 257, 257, 128, dtype, causal=causal, softcap=cap)
          for cap in (15.0, 30.0, 50.0) for dtype, causal in (("float16", False), ("bfloat16", True))],
        Case(2, 4, 4, 512, 512, 64, "bfloat16", causal=True, softcap=15.0, logit_scale=8.0),
        # ALiBi.
        *[Case(2, 8, 2, 1000, 1000, 64, dtype, causal=causal, alibi=True)
          for dtype in ("float16", "bfloat16") for causal in (False, True)],
        Case(2, 4, 4, 113, 203, 128, "bfloat16", causal=True, alibi=True),
        Case(1, 4, 4, 511, 511, 64, "float32", alibi=True),
        # Sinks: alone, with a sliding window as gpt-oss uses them, and in decode.
        Case(2, 8, 2, 1024, 1024, 64, "bfloat16", causal=True, sinks=True),
        Case(2, 8, 2, 1024, 1024, 64, "bfloat16", causal=True, window=(128, 0), sinks=True),
        Case(2, 4, 4, 777, 777, 128, "float16", sinks=True),
        Case(4, 8, 1, 1, 4096, 128, "bfloat16", sinks=True),
        # The LSE, with rows that see no key and in fp32.
        Case(2, 4, 4, 513, 513, 128, "bfloat16", causal=True, return_lse=True),
        Case(2, 4, 2, 777, 777, 64, "float16", return_lse=True),
        Case(2, 4, 4, 1025, 200, 64, "float16", causal=True, return_lse=True),
        Case(1, 4, 4, 511, 511, 128, "float32", causal=True, return_lse=True),
        # V head dims that differ from Q's (MLA).
        Case(2, 16, 16, 1024, 1024, 192, "bfloat16", causal=True, head_dim_v=128),
        Case(2, 8, 8, 777, 777, 192, "float16", head_dim_v=128),
        Case(2, 8, 8, 511, 511, 64, "bfloat16", causal=True, head_dim_v=512),
        Case(2, 8, 2, 300, 700, 64, "float16", head_dim_v=256),
        # Everything at once.
        Case(2, 8, 2, 1023, 1023, 64, "bfloat16", causal=True, window=(256, 0), softcap=30.0, alibi=True,
             sinks=True, return_lse=True),
        Case(2, 4, 4, 300, 700, 128, "float16", window=(128, 64), softcap=15.0, alibi=True, sinks=True,
             return_lse=True),
    ]


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
    variant_grid = itertools.product(
        ((113, 113), (1025, 1025), (200, 1025), (1025, 200)),  # (seqlen_q, seqlen_k)
        ("float16", "bfloat16"),
        (False, True),  # causal
        ((4, 4), (8, 2)),  # heads
        ({"window": (128, 0)}, {"window": (64, 32)}, {"softcap": 30.0}, {"alibi": True}, {"sinks": True},
         {"return_lse": True}, {"head_dim_v": 512}, {"window": (128, 0), "sinks": True, "return_lse": True}),
    )
    for (seqlen_q, seqlen_k), dtype, causal, (heads_q, heads_kv), variant in variant_grid:
        head_dim = 64 if "head_dim_v" in variant else 128
        cases.append(Case(2, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, dtype, causal=causal, **variant))
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
    window: tuple[int, int] | None = None
    #: "dense"; "varlen" and "paged" step the total tokens (see :func:`memory_layout_sweep`).
    layout: str = "dense"

    def case(self, seqlen: int) -> Case:
        """The sweep's problem at one length (self-attention: seqlen_q == seqlen_k); for the
        layouts, ``seqlen`` tokens in all: one sequence of half of them and 128-token sequences."""
        if self.layout == "dense":
            return Case(self.batch, self.heads, self.heads, seqlen, seqlen, self.head_dim, self.dtype,
                        window=self.window)
        lengths = (seqlen // 2,) + (LAYOUT_SHORT,) * ((seqlen - seqlen // 2) // LAYOUT_SHORT)
        if self.layout == "varlen":
            return Case.packed(lengths, lengths, self.heads, self.heads, self.head_dim, self.dtype)
        return Case.paged(1, lengths, LAYOUT_PAGE_SIZE, self.heads, self.heads, self.head_dim, self.dtype)


def memory_sweep(profile: str) -> MemorySweep:
    """The memory suite's sweep: 1k to 32k tokens on a GPU (``full`` goes to 64k)."""
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r} (known: {', '.join(PROFILES)})")
    if profile == "smoke":
        return MemorySweep(seqlens=(256, 512, 1024, 2048))
    top = 65536 if profile == "full" else 32768
    return MemorySweep(seqlens=tuple(2**p for p in range(10, top.bit_length())))


#: The windowed sweep's window: every query sees at most this many keys, so an implementation that
#: declares windows and a linear memory class must not grow with N x N.
MEMORY_WINDOW = (256, 0)


def memory_window_sweep(profile: str) -> MemorySweep:
    """The memory sweep with a sliding window, for implementations that declare windows: the
    extra memory must stay linear in N although the dense problem's scores would not."""
    return replace(memory_sweep(profile), window=MEMORY_WINDOW)


#: The layout sweeps: every step holds one sequence of half the tokens and the rest in sequences of
#: this many, so the total grows as N while the longest squared (N^2 / 4) and the batch times the
#: longest (about N^2 / 256) grow as N^2: an implementation that pads to either fails "linear".
LAYOUT_SHORT = 128
LAYOUT_PAGE_SIZE = 16


def memory_layout_sweep(profile: str, layout: str) -> MemorySweep:
    """The memory sweep over total tokens for "varlen" (packed sequences) or "paged" (decode
    against a paged cache): extra memory must grow with the tokens, not with the longest."""
    if layout not in ("varlen", "paged"):
        raise ValueError(f"unknown layout {layout!r} (known: varlen, paged)")
    return replace(memory_sweep(profile), layout=layout)


def property_cases(profile: str) -> list[Case]:
    """The properties suite's cases (determinism, batch invariance, CUDA graphs, torch.compile):
    a few small ones, each in a batch of several sequences of different lengths, so that a batch's
    composition can change. On a GPU: a causal GQA prefill, decode against a long cache (the case
    where split heuristics follow the batch), packed sequences and a paged decode; on the CPU, a
    prefill and packed sequences."""
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r} (known: {', '.join(PROFILES)})")
    if profile == "smoke":
        return [Case(3, 4, 2, 65, 65, 64, "float16", causal=True),
                Case.packed((65, 17, 1), (65, 30, 3), 4, 2, 64, "float16", causal=True)]
    return [
        Case(4, 8, 2, 1000, 1000, 128, "bfloat16", causal=True),
        Case(8, 32, 8, 1, 4096, 128, "bfloat16"),
        Case.packed((1024, 17, 300, 1), (1024, 30, 300, 64), 8, 2, 128, "bfloat16", causal=True),
        Case.paged(1, (4096, 1000, 17, 8191), 64, 32, 8, 128, "bfloat16"),
    ]


def sanitize_cases(profile: str) -> list[Case]:
    """The sanitize suite's cases: few and small (a kernel under compute-sanitizer runs tens of
    times slower), each with edges where a read goes astray: odd lengths and ragged tiles, more
    queries than keys, GQA, a sliding window, packed sequences of zero, one and odd lengths, and a
    paged cache with odd lengths and a page that is partly used."""
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r} (known: {', '.join(PROFILES)})")
    return [
        Case(2, 4, 2, 113, 203, 64, "float16", causal=True),
        Case(1, 4, 4, 203, 113, 128, "bfloat16", causal=True, window=(32, 0)),
        Case.packed((0, 17, 113, 1, 40), (0, 17, 113, 1, 40), 4, 2, 64, "float16", causal=True),
        Case.paged(1, (300, 17, 1, 64), 16, 4, 1, 64, "float16"),
    ]


#: The memory suite's sweeps by name: each memory test names its own (MemoryCheck.tests, controller/memory.py).
MEMORY_SWEEPS: tuple[str, ...] = ("dense", "window", "varlen", "paged")


def named_memory_sweep(profile: str, name: str) -> MemorySweep:
    """The sweep a memory test names: "dense", "window" (:func:`memory_window_sweep`), or a layout."""
    if name == "dense":
        return memory_sweep(profile)
    if name == "window":
        return memory_window_sweep(profile)
    if name in ("varlen", "paged"):
        return memory_layout_sweep(profile, name)
    raise ValueError(f"unknown memory sweep {name!r} (known: {', '.join(MEMORY_SWEEPS)})")


#: The longest call a profile times with the GPU alone (milliseconds; a profile not named here
#: has no limit). The speed suite times a call at least eight times (the first, a warm-up and the
#: six samples the gate needs), so one call of 2.3 s (the naive kernel at 16k tokens on an H200)
#: holds the GPU for 18 s: more than all other implementations' cases of its size together. Such a
#: case says how long its call took and is not timed. The default profile is the gate a pull
#: request waits for; ``full`` times everything.
CALL_LIMIT_MS: dict[str, float] = {"default": 1000.0}
#: The longest call after which a memory sweep goes on to its next point (two calls, each four
#: times longer where time grows as N^2: the naive kernel's 32k point held the GPU alone for 19 s).
#: Twice the speed suite's limit, because sweeps run beside other requests: on an H200 the naive
#: kernel's 8k call took 0.58 s alone and 1.55 s beside others, its 16k call 2.3 s alone
#: (results/2026-11-25-h200-main-job), and where a sweep ends should not depend on its neighbours.
MEMORY_CALL_LIMIT_MS: dict[str, float] = {"default": 2000.0}
#: The points a memory sweep measures before a long call may end it (its fit wants three or more).
MIN_SWEEP_POINTS = 4


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
    variants = [
        Case(1, 16, 16, 16384, 16384, 128, "bfloat16", causal=True, window=(4096, 0)),
        Case(1, 16, 16, 16384, 16384, 128, "bfloat16", softcap=30.0),
        Case(1, 16, 16, 16384, 16384, 128, "bfloat16", alibi=True),
        Case(4, 16, 16, 4096, 4096, 192, "bfloat16", causal=True, head_dim_v=128),
    ]
    # Packed sequences of mixed lengths (16k tokens, 128 to 8k each), timed forward and backward.
    mixed = (8192, 4096, 2048, 1024, 512, 256, 128, 128)
    varlen = [Case.packed(mixed, mixed, 16, 16, 128, "bfloat16", causal=causal) for causal in (False, True)]
    # Paged decode: 32 sequences with 4k to 32k cached tokens, pages of 16 and 64; chunked prefill.
    cache = tuple(4096 + (28672 * i) // 31 for i in range(32))
    paged = [Case.paged(1, cache, size, 32, 8, 128, "bfloat16") for size in (16, 64)]
    paged.append(Case.paged(512, (4096, 8192, 12288, 16384), 64, 32, 8, 128, "bfloat16", causal=True))
    # FP8 e4m3 forward beside the bf16 cases of the same shapes (forward only, as FA3's FP8).
    fp8 = [Case(16384 // n, 2048 // d, 2048 // d, n, n, d, "float8_e4m3fn") for d in (128, 64) for n in (4096, 16384)]
    pairs = [(mode, case) for mode in ("forward", "backward") for case in dense + variants + varlen]
    return pairs + [("forward", case) for case in decode + paged + fp8]
