"""CPU models of triton_flash's Gluon forward (``gluon_forward.py``): what can be checked without a GPU.

Triton's interpreter does not run Gluon (warp specialization, mbarriers, TMA), and a
warp-specialized kernel that is wrong tends to hang rather than fail. So two models mirror the
kernel line by line, and each is checked here:

- ``protocol``: the producer and the two (or three) consumers as coroutines that issue the kernel's barrier
  operations in the kernel's order (both consumer orders: the default, which waits for each PV
  product one QK^T later, and ``EAGER``), over mbarriers with the hardware's phase semantics (a
  ``try_wait.parity(P)`` passes once the phase of parity P has completed; a fresh barrier counts as
  having completed the phase before phase 0; TMA bytes complete at a random later time). A random
  scheduler interleaves them many times for each tile count, ring depth and turn setting, and the
  model fails on a deadlock, on a stage refilled while a consumer's product still reads it, on a
  product that reads a stage holding another tile than the one it wants, and on consumers whose
  product issues do not alternate (with turns). The persistent kernel (``Config(persistent=True)``)
  runs as one CTA taking a list of work items (the ring's position and the turns carried on, Q's
  parts handed back on ``q_empty``), with the item lists its snake dealing gives small causal grids.
- ``dealing``: the persistent grid's snake (``_deal``, ``n_mine``, ``_work``) deals every (head,
  row block) to exactly one CTA once, and how even each CTA's work is on the issue's causal cases
  against the one-item grid and the static dealing the gluon-persistent branch had.
- ``schedule``: each CTA's tile range (``n_tiles``, ``n_whole``) and the consumer's loop split (tile
  0 alone, the whole tiles, the masked ones) visit each tile once, in order, and leave a tile
  unmasked only where every row of the CTA sees every key of it; under a sliding window
  (``WINDOW``: the range from ``lo``, the left edge's masked tiles first) the same against the
  contract's ``visibility_mask``, every visible key walked and none past the last.
- ``numerics``: the consumer's arithmetic on one CTA in torch (float32, P rounded to the input
  dtype; with and without ``-sm``'s row sums of that rounded P beside O), with the kernel's tile
  ranges (``n_tiles``, ``n_whole``), its prologue / whole / masked / last-PV sequence, the masks
  and the shift for rows that have seen no key, against float64 attention: lengths not multiples
  of the tile, Nq != Nk both ways, causal rows that see nothing.

A model is not the kernel: a mistake copied into both passes here. What it does catch is a wrong
parity, count, range or mask in the design the kernel follows.

Usage: python3 tools/flash_bench/gluon_model.py [--seeds N]   (about 30 s on 2 cores)
"""

from __future__ import annotations

import itertools
import math
import random
import sys

import torch
from gluon_harness import MBarrier, interleave, model_args

BLOCK_M, ROWS = 128, 64


# ---------------------------------------------------------------------------------------------
# Barrier protocol
# ---------------------------------------------------------------------------------------------


class Protocol:
    """The kernel's shared state: barriers, the K/V ring's contents, who reads what."""

    def __init__(self, n_tiles: "int | list[int]", stages: int, pingpong: bool, rng: random.Random,
                 consumers: int = 2) -> None:
        # A list: the persistent kernel, one CTA taking work items with these tile counts in turn.
        self.persistent = isinstance(n_tiles, list)
        self.items = list(n_tiles) if self.persistent else [n_tiles]
        self.n_tiles, self.stages, self.pingpong, self.rng = n_tiles, stages, pingpong, rng
        self.consumers = consumers
        self.q_full = [MBarrier(f"q_full{c}", 1) for c in range(consumers)]
        self.q_empty = [MBarrier(f"q_empty{c}", 1) for c in range(consumers)]
        self.q_content: list = [None] * consumers  # the item whose Q part a buffer holds (once landed)
        self.q_readers: list[set] = [set() for _ in range(consumers)]
        self.turn = [MBarrier(f"turn{c}", 1) for c in range(consumers)]
        self.full = {kind: [MBarrier(f"{kind}_full{s}", 1) for s in range(stages)] for kind in "kv"}
        self.empty = {kind: [MBarrier(f"{kind}_empty{s}", consumers) for s in range(stages)] for kind in "kv"}
        self.content = {kind: [None] * stages for kind in "kv"}  # tile a stage holds (once landed)
        self.writing = {kind: [False] * stages for kind in "kv"}
        self.readers = {kind: [set() for _ in range(stages)] for kind in "kv"}
        self.in_flight: list[tuple] = []  # TMA copies: (barrier, bytes, action)
        self.issues: list[int] = []  # which consumer issued products, in order

    # -- what the partitions do ------------------------------------------------------------
    def tma_load(self, kind: str, stage: int, tile: int) -> None:
        assert not self.readers[kind][stage], (
            f"{kind} stage {stage} refilled with tile {tile} while consumers {self.readers[kind][stage]} read it")
        self.writing[kind][stage] = True
        self.content[kind][stage] = None

        def land() -> None:
            self.writing[kind][stage] = False
            self.content[kind][stage] = tile

        self.in_flight.append((self.full[kind][stage], 1, land))

    def read(self, consumer: int, kind: str, stage: int, tile: int) -> None:
        assert not self.writing[kind][stage] and self.content[kind][stage] == tile, (
            f"consumer {consumer} reads {kind} stage {stage} for tile {tile}, which holds "
            f"{self.content[kind][stage]} (being written: {self.writing[kind][stage]})")
        self.readers[kind][stage].add(consumer)

    def release(self, consumer: int, kind: str, stage: int, tile: int) -> None:
        assert self.content[kind][stage] == tile, f"{kind} stage {stage} changed under consumer {consumer}"
        self.readers[kind][stage].discard(consumer)
        self.empty[kind][stage].arrive()

    def tma_load_q(self, c: int, item: int) -> None:
        assert not self.q_readers[c], f"Q part {c} refilled with item {item} while consumer {c} reads it"
        self.q_content[c] = None

        def land() -> None:
            self.q_content[c] = item

        self.in_flight.append((self.q_full[c], 1, land))

    def read_q(self, c: int, item: int) -> None:
        assert self.q_content[c] == item, f"consumer {c} reads Q for item {item}, which holds {self.q_content[c]}"
        self.q_readers[c].add(c)

    def land_one(self) -> None:
        barrier, nbytes, action = self.in_flight.pop(self.rng.randrange(len(self.in_flight)))
        action()
        barrier.complete_tx(nbytes)


def producer(p: Protocol, refill_xor: int = 1, q_xor: "int | None" = 1, ring_carries: bool = True):
    # _load_item, per work item: the Q parts (persistent: each once its consumer handed it back, on
    # parity (item & 1) ^ 1), K_0, then per tile K_{t+1} (one ahead) and V_t; each load waits for
    # its stage's empty barrier on parity ((g // STAGES) & 1) ^ 1, g counting the CTA's tiles
    # through the ring over every item (_load_tile). (q_xor None, ring_carries False: planted
    # mistakes, no wait for Q's part; g restarting at each item.)
    def load(kind, t, g, it):
        s = g % p.stages
        yield ("wait", p.empty[kind][s], ((g // p.stages) & 1) ^ refill_xor)
        p.full[kind][s].expect(1)
        p.tma_load(kind, s, (it, t))

    g = 0
    for it, n_tiles in enumerate(p.items):
        for c in range(p.consumers):
            if p.persistent and q_xor is not None:
                yield ("wait", p.q_empty[c], (it & 1) ^ q_xor)
            p.q_full[c].expect(1)
            p.tma_load_q(c, it)
        if n_tiles > 0:
            yield from load("k", 0, g, it)
        for t in range(n_tiles):
            if t + 1 < n_tiles:
                yield from load("k", t + 1, g + t + 1, it)
            yield from load("v", t, g + t, it)
        g += n_tiles if ring_carries else 0


def consumer(p: Protocol, cid: int, eager: bool = False, turn_parity=None, next_turn=None):
    # _consumer_item, per work item: the prologue (QK^T of tile 0), _step for tiles 1.., the last
    # PV, then (persistent) Q handed back. A read is open from its product's issue to the release
    # after the wait that retires that product: K_t in step t; V_{t-1} at the end of step t (eager)
    # or after the first wait of step t+1 (default). Stages and phases follow g, the CTA's tile
    # count over its items; the turns' count carries on from item to item.
    turns = 0
    stages = p.stages
    parity = turn_parity or (lambda c, k: (k & 1) ^ (1 if c == 0 else 0))
    passes_to = next_turn or (lambda c: (c + 1) % p.consumers)

    def take_turn():
        nonlocal turns
        if p.pingpong:
            yield ("wait", p.turn[cid], parity(cid, turns))
        turns += 1

    def pass_turn():
        if p.pingpong:
            p.turn[passes_to(cid)].arrive()

    g = 0
    for it, n_tiles in enumerate(p.items):
        yield ("wait", p.q_full[cid], it & 1)
        p.read_q(cid, it)
        if n_tiles > 0:
            s0 = g % stages
            yield ("wait", p.full["k"][s0], (g // stages) & 1)
            yield from take_turn()
            p.read(cid, "k", s0, (it, 0))
            p.issues.append(cid)
            pass_turn()
            yield ("yield",)  # the QK^T product runs; its wait follows
            p.release(cid, "k", s0, (it, 0))
            for t in range(1, n_tiles):
                gt = g + t
                s, sp = gt % stages, (gt - 1) % stages
                yield ("wait", p.full["k"][s], (gt // stages) & 1)
                yield from take_turn()
                p.read(cid, "k", s, (it, t))
                if not eager:
                    yield ("yield",)  # wait(1): PV_{t-2} retires
                    if t >= 2:
                        p.release(cid, "v", (gt - 2) % stages, (it, t - 2))
                yield ("wait", p.full["v"][sp], ((gt - 1) // stages) & 1)
                p.read(cid, "v", sp, (it, t - 1))
                p.issues.append(cid)
                pass_turn()
                yield ("yield",)
                p.release(cid, "k", s, (it, t))  # after the wait that completes S_t
                yield ("yield",)  # the softmax
                if eager:
                    p.release(cid, "v", sp, (it, t - 1))  # after the wait that completes PV_{t-1}
            last = n_tiles - 1
            gl_ = g + last
            sl = gl_ % stages
            if not eager and last >= 1:
                yield ("yield",)  # wait(0): PV_{last-1} retires
                p.release(cid, "v", (gl_ - 1) % stages, (it, last - 1))
            yield ("wait", p.full["v"][sl], (gl_ // stages) & 1)
            yield from take_turn()
            p.read(cid, "v", sl, (it, last))
            p.issues.append(cid)
            pass_turn()
            yield ("yield",)
            p.release(cid, "v", sl, (it, last))
        p.q_readers[cid].discard(cid)
        if p.persistent:
            p.q_empty[cid].arrive()  # every product that read this Q has completed
        g += n_tiles


def _drive(p: Protocol, eager: bool = False, turn_parity=None, refill_xor: int = 1, next_turn=None,
           q_xor: "int | None" = 1, ring_carries: bool = True) -> None:
    """One random interleaving of the partitions (the producer and each consumer) to the end;
    AssertionError on a deadlock (no partition can move and no copy is in flight) or on a race
    (see Protocol)."""
    partitions = {"producer": producer(p, refill_xor, q_xor, ring_carries),
                  **{f"consumer{c}": consumer(p, c, eager, turn_parity, next_turn) for c in range(p.consumers)}}
    interleave(p, partitions, f"n_tiles={p.n_tiles} stages={p.stages} pingpong={p.pingpong} consumers={p.consumers}")
    if p.pingpong:  # the consumers issue in turn: 0, 1, (2,) 0, 1, ...
        assert all(b == (a + 1) % p.consumers for a, b in zip(p.issues, p.issues[1:])) and p.issues[:1] in ([], [0]), (
            f"turns did not rotate: {p.issues}")
    assert len(p.issues) == sum(p.consumers * (n + 1 if n else 0) for n in p.items)


def check_protocol(seeds: int) -> int:
    cases = 0
    for n_tiles, stages, pingpong, eager, consumers in itertools.product(
            (0, 1, 2, 3, 4, 5, 7, 12), (2, 3, 4), (True, False), (False, True), (2, 3)):
        for seed in range(seeds):
            _drive(Protocol(n_tiles, stages, pingpong, random.Random(seed), consumers), eager)
            cases += 1
    # The persistent kernel: one CTA taking items in turn. The item lists are what _deal gives
    # CTAs of small causal grids (unequal tile counts, none for rows that see no key), and a few
    # by hand.
    lists = [[1, 1, 1], [3, 0, 2], [5, 4, 0, 0, 7], [2] * 6]
    for n_q, n_k, n_bh, n_ctas in ((640, 640, 3, 4), (700, 300, 2, 3), (384, 1000, 5, 4)):
        dealt = deal_items(n_q, n_k, n_bh, n_ctas, 128, 128, True)
        lists += [[tiles for _, _, tiles in items] for items in dealt[:2]]
    for items, stages, pingpong, eager, consumers in itertools.product(lists, (2, 3), (True, False), (False, True),
                                                                     (2, 3)):
        for seed in range(max(1, seeds // 4)):
            _drive(Protocol(list(items), stages, pingpong, random.Random(seed), consumers), eager)
            cases += 1
    return cases


def check_protocol_catches_mistakes() -> list[str]:
    """The model must fail on protocol mistakes the kernel could make: each is planted here."""
    caught = []
    # Empty barriers counting one consumer: a stage is refilled while the other consumer reads it.
    for seed in range(200):
        p = Protocol(6, 2, True, random.Random(seed))
        for kind in "kv":
            for barrier in p.empty[kind]:
                barrier.count = barrier.pending = 1
        try:
            _drive(p)
        except AssertionError:
            caught.append("empty barriers counting one consumer")
            break
    # Both consumers waiting on parity (turns & 1): consumer 0 never gets its first turn.
    try:
        _drive(Protocol(3, 2, True, random.Random(0)), turn_parity=lambda cid, turns: turns & 1)
    except AssertionError:
        caught.append("turn parity not inverted for consumer 0")
    # The producer waiting on its empty barriers' parity without the ^ 1: it never starts.
    try:
        _drive(Protocol(3, 2, True, random.Random(0)), refill_xor=0)
    except AssertionError:
        caught.append("producer's first wait on parity 0")
    # Three consumers passing the turn as two do (to 1 - cid): consumer 2's turns go astray.
    for seed in range(50):
        try:
            _drive(Protocol(4, 3, True, random.Random(seed), consumers=3), eager=True,
                   next_turn=lambda cid: (1 - cid) % 3)
        except AssertionError:
            caught.append("three consumers passing the turn to 1 - cid")
            break
    # Empty barriers counting two of three consumers: a stage is refilled under the third.
    for seed in range(200):
        p = Protocol(6, 2, True, random.Random(seed), consumers=3)
        for kind in "kv":
            for barrier in p.empty[kind]:
                barrier.count = barrier.pending = 2
        try:
            _drive(p, eager=True)
        except AssertionError:
            caught.append("empty barriers counting two of three consumers")
            break
    # Persistent: the producer loading the next item's Q without waiting for its consumer.
    for seed in range(200):
        try:
            _drive(Protocol([3, 2, 4], 2, True, random.Random(seed)), q_xor=None)
        except AssertionError:
            caught.append("next Q loaded before its part was handed back")
            break
    # Persistent: the ring's position restarting at each item (g not carried): phases go wrong.
    for seed in range(200):
        try:
            _drive(Protocol([3, 2, 4], 2, True, random.Random(seed), consumers=3), eager=True, ring_carries=False)
        except AssertionError:
            caught.append("ring position not carried from item to item")
            break
    return caught


# ---------------------------------------------------------------------------------------------
# The persistent grid's dealing
# ---------------------------------------------------------------------------------------------


def deal(r: int, cta: int, n_ctas: int) -> int:
    """``_deal``: the r-th item of CTA ``cta``, a snake over the items in order."""
    return r * n_ctas + cta + (r & 1) * (n_ctas - 1 - 2 * cta)


def items_of(total: int, cta: int, n_ctas: int) -> int:
    """``n_mine`` as ``_attn_fwd_sm90_persistent`` computes it: the items dealt to ``cta``."""
    rounds = total // n_ctas
    last_pos = cta + (rounds & 1) * (n_ctas - 1 - 2 * cta)
    return rounds + int(last_pos < total - rounds * n_ctas)


def work_item(item: int, n_m: int, n_bh: int, causal: bool, n_group: int | None = None) -> tuple[int, int]:
    """``_work``'s (head, row block) of an item: causal, the heads in groups of ``n_group`` (None:
    one group of all), and in each the row blocks with the most key tiles first; otherwise a
    head's row blocks consecutive."""
    if causal:
        group = n_bh if n_group is None else n_group
        first = item // (group * n_m) * group
        within = item - first * n_m
        heads = min(group, n_bh - first)
        return first + within % heads, n_m - 1 - within // heads
    return item // n_m, item % n_m


def grouped_grid(n_m: int, n_bh: int, n_ctas: int) -> tuple[int, int]:
    """``gluon_forward.grouped_grid``, the host's CTAs and group for ``-g`` (imported: the model
    deals with the kernel's own choice)."""
    from gluon_compile import load_gluon_forward

    return load_gluon_forward().grouped_grid(n_m, n_bh, n_ctas)


def deal_items(n_q: int, n_k: int, n_bh: int, n_ctas: int, block_m: int, block_n: int, causal: bool,
               dealer=deal, count=items_of, grouped: bool = False) -> list[list[tuple[int, int, int]]]:
    """Each persistent CTA's items in its order: (head, row block, key tiles); ``grouped``: ``-g``."""
    n_m = -(-n_q // block_m)
    n_group = None
    if grouped and causal:
        n_ctas, n_group = grouped_grid(n_m, n_bh, n_ctas)
    out = []
    for cta in range(n_ctas):
        mine = []
        for r in range(count(n_m * n_bh, cta, n_ctas)):
            bh, pid_m = work_item(dealer(r, cta, n_ctas), n_m, n_bh, causal, n_group)
            mine.append((bh, pid_m, tile_ranges(pid_m * block_m, n_q, n_k, block_n, causal, block_m)[0]))
        out.append(mine)
    return out


def check_dealing(dealer=deal, count=items_of) -> int:
    """Every (head, row block) is dealt to exactly one CTA once, over grids with partial last
    rounds of both directions, fewer items than CTAs, and Nq != Nk."""
    cases = 0
    for n_q, n_k, n_bh, n_ctas, causal, block_m, grouped in itertools.product(
            (1, 128, 300, 1000, 4097), (1, 700, 4097), (1, 3, 16, 37), (1, 4, 7, 132), (False, True), (128, 192),
            (False, True)):
        n_m = -(-n_q // block_m)
        n_ctas = min(n_ctas, n_m * n_bh)  # the host's grid: at most one CTA per item
        dealt = [(bh, m) for items in deal_items(n_q, n_k, n_bh, n_ctas, block_m, 128, causal, dealer, count,
                                                 grouped) for bh, m, _ in items]
        assert sorted(dealt) == [(bh, m) for bh in range(n_bh) for m in range(n_m)], (
            f"n_q={n_q} n_bh={n_bh} n_ctas={n_ctas} causal={causal}: items dealt {len(dealt)} of {n_m * n_bh}, "
            f"{len(set(dealt))} distinct")
        cases += 1
    return cases


def check_dealing_catches_mistakes() -> list[str]:
    caught = []
    for name, dealer, count in (
            ("odd rounds dealt from n_ctas - cta", lambda r, c, n: r * n + (c if r % 2 == 0 else n - c), items_of),
            ("the last round's count from the forward position", deal,
             lambda total, c, n: total // n + int(c < total - total // n * n))):
        try:
            check_dealing(dealer, count)
        except (AssertionError, IndexError):
            caught.append(name)
    return caught


#: The issue's causal cases: (name, Nq = Nk, batch x heads, consumers), on 132 SMs.
DEALING_CASES = (("b8-h16-q1024 d128 causal", 1024, 128, 2), ("b4-h16-q4096 d128 causal", 4096, 64, 2),
                 ("b4-h32-q4096 d64 causal", 4096, 128, 2), ("b1-h16-q16384 d128 causal", 16384, 16, 2))


def dealing_balance(n_ctas: int = 132, per_item: float = 1.0) -> list[tuple[str, float, float, float, float, float]]:
    """Per case, the busiest CTA's work over the mean (work: key tiles, plus ``per_item`` tile's
    worth for each item's prologue and epilogue): the one-item grid (the hardware starts each CTA
    on the first free SM: a greedy list in launch order, a head's row blocks longest first), the
    gluon-persistent branch's static dealing (item j to CTA j % n_ctas, head-major), the snake, and
    the one-item grid with its axes swapped (``-hf``: every head's longest row blocks first), and
    the snake over head groups (``-p-g``), with the heads in flight at once of each."""
    import heapq

    rows = []
    for name, n, n_bh, consumers in DEALING_CASES:
        block_m = 64 * consumers
        n_m = -(-n // block_m)
        cost = [tile_ranges(m * block_m, n, n, 128, True, block_m)[0] + per_item for m in range(n_m)]
        mean = n_bh * sum(cost) / n_ctas
        heap, heavy = [0.0] * n_ctas, [0.0] * n_ctas
        stride = [0.0] * n_ctas
        for j in range(n_m * n_bh):
            m = n_m - 1 - j % n_m  # head-major, longest first within a head
            heapq.heappush(heap, heapq.heappop(heap) + cost[m])
            stride[j % n_ctas] += cost[m]
            heapq.heappush(heavy, heapq.heappop(heavy) + cost[n_m - 1 - j // n_bh])
        snake = [sum(cost[m] for _, m, _ in items) for items in deal_items(n, n, n_bh, n_ctas, block_m, 128, True)]
        grouped = [sum(cost[m] for _, m, _ in items)
                   for items in deal_items(n, n, n_bh, n_ctas, block_m, 128, True, grouped=True)]
        rows.append((name, max(heap) / mean, max(stride) / mean, max(snake) / mean, max(heavy) / mean,
                     max(grouped) / mean))
    return rows


# ---------------------------------------------------------------------------------------------
# Numerics of one CTA
# ---------------------------------------------------------------------------------------------


def tile_ranges(start_m: int, n_q: int, n_k: int, block_n: int, causal: bool,
                block_m: int = BLOCK_M) -> tuple[int, int]:
    """(n_tiles, n_whole) as ``_attn_fwd_sm90`` computes them (``block_m``: 64 x consumers)."""
    diag = n_k - n_q
    if causal:
        last_row = min(start_m + block_m, n_q) - 1
        hi = min(last_row + diag + 1, n_k)
        whole = min(start_m + diag + 1, n_k)
    else:
        hi = whole = n_k
    n_tiles = -(-max(hi, 0) // block_n)
    n_whole = min(max(whole, 0) // block_n, n_tiles)
    return n_tiles, n_whole


def schedule(n_whole: int, n_tiles: int) -> list[tuple[int, bool]]:
    """(tile, masked) in the order ``_consumer``'s two loops visit them after the prologue."""
    return [(t, False) for t in range(1, n_whole)] + [(t, True) for t in range(max(n_whole, 1), n_tiles)]


def check_schedule() -> int:
    cases = 0
    for causal, block_n, block_m in itertools.product((False, True), (64, 128), (BLOCK_M, 3 * ROWS)):
        for n_q, n_k in itertools.product((1, 63, 64, 65, 127, 128, 129, 191, 193, 300, 1000),
                                          (1, 64, 100, 128, 129, 513)):
            for start_m in range(0, n_q, block_m):
                n_tiles, n_whole = tile_ranges(start_m, n_q, n_k, block_n, causal, block_m)
                steps = schedule(n_whole, n_tiles)
                assert [t for t, _ in steps] == list(range(1, n_tiles)), (n_q, n_k, start_m, steps)
                # A tile is unmasked only if every row of the CTA sees every key of it.
                for t, masked in [(0, True)] + steps:
                    keys = range(t * block_n, (t + 1) * block_n)
                    rows = range(start_m, start_m + block_m)
                    whole = all(j < n_k for j in keys) and (not causal or all(
                        j <= i + n_k - n_q for i in rows for j in (keys[-1],)))
                    assert masked or whole, f"tile {t} unmasked but not whole: {n_q}x{n_k} start {start_m}"
                # No tile past the CTA's last visible key, none missing before it.
                last = min(start_m + block_m, n_q) - 1
                hi = min(last + n_k - n_q + 1, n_k) if causal else n_k
                assert n_tiles == max(-(-hi // block_n), 0), (n_q, n_k, start_m)
                cases += 1
    return cases


def window_band(causal: bool, window: tuple[int, int]) -> tuple[int, int]:
    """(win_left, win_right) as the host passes them to the kernel: the host's own function
    (``kernels.band``, which ``gluon_forward`` uses), not a mirror; the model checks the kernel's
    tile ranges, which the host does not compute."""
    from pytest_attnkit.implementations.triton_flash.kernels import band

    return band(causal, window)


def window_tile_ranges(start_m: int, n_q: int, n_k: int, block_n: int, win_left: int, win_right: int,
                       block_m: int = BLOCK_M, w_lo_shift: int = 0) -> tuple[int, int, int, int]:
    """(lo, n_tiles, w_lo, n_whole) as ``_attn_fwd_sm90`` computes them under ``WINDOW``: the key
    tiles [lo, lo + n_tiles), counted from lo, of which [w_lo, n_whole) every row sees whole.
    ``w_lo_shift`` plants a mistake (the whole tiles starting that many tiles early)."""
    diag = n_k - n_q
    last_row = min(start_m + block_m, n_q) - 1
    hi = min(last_row + diag + win_right + 1, n_k)
    whole = min(start_m + diag + win_right + 1, n_k)
    lo = max(start_m + diag - win_left, 0) // block_n
    w_lo = -(-max(last_row + diag - win_left, 0) // block_n) - lo - w_lo_shift
    n_tiles = max(-(-max(hi, 0) // block_n) - lo, 0)
    n_whole = min(max(max(whole, 0) // block_n - lo, 0), n_tiles)
    return lo, n_tiles, w_lo, n_whole


def window_schedule(n_tiles: int, w_lo: int, n_whole: int) -> list[tuple[int, bool]]:
    """(tile, masked) in the order ``_consumer_item`` visits them under ``WINDOW``: tile 0 alone
    (masked), the left edge's masked tiles, the whole ones, the masked rest."""
    if n_tiles == 0:
        return []
    w_first = min(max(w_lo, 1), n_tiles)
    return ([(0, True)] + [(t, True) for t in range(1, w_first)] + [(t, False) for t in range(w_first, n_whole)]
            + [(t, True) for t in range(max(n_whole, w_first), n_tiles)])


def check_window_schedule(w_lo_shift: int = 0) -> int:
    """Against the contract's mask (``pytest_attnkit.masks.visibility_mask``): every CTA visits its
    tiles once, in order, covers every key some row of it sees, walks no tile past the last one
    any row sees, and leaves a tile unmasked only where every row sees every key of it. Windows
    one- and two-sided, a side unbounded either way (and 2**31 - 1), smaller than a tile, causal
    or not, Nq != Nk both ways (rows that see no key). Returns the CTAs checked; raises on the
    first wrong one."""
    from pytest_attnkit.masks import visibility_mask

    cases = 0
    windows = ((0, 0), (1, 0), (16, 0), (100, 0), (256, 0), (16, 4), (256, 128), (-1, 64), (64, -1),
               (-1, -1), (2**31 - 1, 3), (0, 300))
    for causal, block_n, block_m in itertools.product((False, True), (64, 128), (BLOCK_M, 3 * ROWS)):
        for (n_q, n_k), window in itertools.product(((1, 1), (63, 200), (200, 63), (300, 300), (513, 1025),
                                                     (1025, 200), (129, 129)), windows):
            visible = visibility_mask(n_q, n_k, causal=causal, window=window, device="cpu")
            win_left, win_right = window_band(causal, window)
            for start_m in range(0, n_q, block_m):
                lo, n_tiles, w_lo, n_whole = window_tile_ranges(start_m, n_q, n_k, block_n, win_left, win_right,
                                                                block_m, w_lo_shift)
                steps = window_schedule(n_tiles, w_lo, n_whole)
                where = f"{n_q}x{n_k} causal={causal} window={window} block {block_m}x{block_n} start {start_m}"
                assert [t for t, _ in steps] == list(range(n_tiles)), where
                rows = visible[start_m:start_m + block_m]
                seen = rows.any(0).nonzero().flatten().tolist()
                walked = set()
                for t, masked in steps:
                    keys = range((lo + t) * block_n, (lo + t + 1) * block_n)
                    walked.update(keys)
                    if not masked:
                        whole = keys[-1] < n_k and bool(rows[:, keys[0]:keys[-1] + 1].all())
                        assert whole, f"tile {t} not whole: {where}"
                assert set(seen) <= walked, f"a visible key not walked: {where}"
                if seen:
                    assert (lo + n_tiles - 1) * block_n <= seen[-1], f"a tile past the last visible key: {where}"
                cases += 1
    return cases


def consumer_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, row0: int, start_m: int,
                  causal: bool, scale: float, block_n: int, dtype: torch.dtype,
                  block_m: int = BLOCK_M, sum_mma: bool = False,
                  rescale_sum: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """One consumer's 64 rows as ``_consumer`` computes them: (output rows, base-2 LSE).
    ``sum_mma`` (``-sm``): the row sums accumulate beside O, of P as rounded for the PV product,
    rescaled by alpha with O (``rescale_sum=False`` plants the mistake of not rescaling them)."""
    n_q, n_k, d = q.shape[0], k.shape[0], q.shape[1]
    qk_scale = scale * 1.4426950408889634
    rows = torch.arange(row0, row0 + ROWS)
    q_tile = torch.zeros(ROWS, d)  # TMA: rows past Nq read zeros
    valid = rows < n_q
    q_tile[valid] = q[rows[valid]].float()
    n_tiles, n_whole = tile_ranges(start_m, n_q, n_k, block_n, causal, block_m)
    diag = n_k - n_q

    def kv_tile(t):
        kt, vt = torch.zeros(block_n, d), torch.zeros(block_n, d)
        cols = torch.arange(t * block_n, (t + 1) * block_n)
        inside = cols < n_k
        kt[inside], vt[inside] = k[cols[inside]].float(), v[cols[inside]].float()
        return kt, vt

    def softmax(qk, m_i, l_i, t, masked):
        if masked:
            cols = t * block_n + torch.arange(block_n)
            visible = (cols[None, :] < n_k).expand(ROWS, block_n)
            if causal:
                visible = visible & (cols[None, :] <= rows[:, None] + diag)
            qk = torch.where(visible, qk, torch.tensor(float("-inf")))
        m_new = torch.maximum(m_i, qk.max(1).values * qk_scale)
        m_use = torch.where(m_new == float("-inf"), torch.zeros(()), m_new) if masked else m_new
        alpha = torch.exp2(m_i - m_use)
        p = torch.exp2(qk * qk_scale - m_use[:, None])
        return p, alpha, m_new, l_i if sum_mma else l_i * alpha + p.sum(1)

    def product(o, l_i, alpha, p_op, vt):
        # PV (and with -sm, P @ ones) into the accumulators, rescaled by alpha first.
        if sum_mma:
            l_i = (l_i * alpha if rescale_sum else l_i) + p_op.sum(1)
        return o * alpha[:, None] + p_op @ vt, l_i

    m_i = torch.full((ROWS,), float("-inf"))
    l_i = torch.zeros(ROWS)
    o = torch.zeros(ROWS, d)
    if n_tiles > 0:
        kt, _ = kv_tile(0)
        p, alpha, m_i, l_i = softmax(q_tile @ kt.T, m_i, l_i, 0, True)
        p_op = p.to(dtype).float()
        for t, masked in schedule(n_whole, n_tiles):
            kt, _ = kv_tile(t)
            qk = q_tile @ kt.T
            o, l_i = product(o, l_i, alpha, p_op, kv_tile(t - 1)[1])
            p, alpha, m_i, l_i = softmax(qk, m_i, l_i, t, masked)
            p_op = p.to(dtype).float()
        o, l_i = product(o, l_i, alpha, p_op, kv_tile(n_tiles - 1)[1])
    seen = l_i > 0
    l_safe = torch.where(seen, l_i, torch.ones(()))
    lse = torch.where(seen, m_i + torch.log2(l_safe), torch.tensor(float("inf")))
    return (o / l_safe[:, None]).to(dtype), lse


def model_forward(q, k, v, causal: bool, scale: float, block_n: int,
                  consumers: int = 2, **rows_options) -> tuple[torch.Tensor, torch.Tensor]:
    """[Nq, D] attention of one head through the model, CTA by CTA, consumer by consumer
    (``rows_options``: :func:`consumer_rows`'s ``sum_mma`` and ``rescale_sum``)."""
    n_q = q.shape[0]
    out = torch.empty(n_q, q.shape[1], dtype=q.dtype)
    lse = torch.empty(n_q)
    block_m = consumers * ROWS
    for start_m in range(0, n_q, block_m):
        for cid in range(consumers):
            row0 = start_m + cid * ROWS
            o_rows, lse_rows = consumer_rows(q, k, v, row0, start_m, causal, scale, block_n, q.dtype, block_m,
                                             **rows_options)
            keep = slice(row0, min(row0 + ROWS, n_q))  # the TMA store and the LSE mask drop the rest
            count = keep.stop - keep.start
            if count > 0:
                out[keep], lse[keep] = o_rows[:count], lse_rows[:count]
    return out, lse


def reference(q, k, v, causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    s = (q.double() @ k.double().T) * scale
    n_q, n_k = s.shape
    if causal:
        visible = torch.arange(n_k)[None, :] <= torch.arange(n_q)[:, None] + (n_k - n_q)
        s = s.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(s, 1)
    p = torch.exp(s - torch.where(torch.isinf(lse), torch.zeros(()).double(), lse)[:, None])
    out = torch.nan_to_num(p) @ v.double()
    return out, torch.where(torch.isinf(lse), torch.tensor(float("inf")).double(), lse)


def check_numerics() -> int:
    cases = 0
    torch.manual_seed(0)
    shapes = [(113, 113), (1, 1), (1, 300), (300, 1), (200, 1000), (1000, 200), (257, 129), (129, 257),
              (191, 191), (193, 400), (400, 193), (385, 385),
              (256, 256), (64, 700), (700, 64), (384, 130), (130, 384)]
    for (n_q, n_k), causal, block_n, consumers, sum_mma in itertools.product(shapes, (False, True), (128, 64), (2, 3),
                                                                            (False, True)):
        d = 64
        q, k, v = (torch.randn(n, d).to(torch.float16) for n in (n_q, n_k, n_k))
        scale = d ** -0.5
        out, lse2 = model_forward(q, k, v, causal, scale, block_n, consumers, sum_mma=sum_mma)
        ref, ref_lse = reference(q, k, v, causal, scale)
        err = (out.double() - ref).abs().max().item()
        lse_nat = lse2.double() * math.log(2)
        finite = torch.isfinite(ref_lse)
        assert torch.equal(torch.isfinite(lse_nat), finite), f"LSE infinities differ at {n_q}x{n_k} causal={causal}"
        assert torch.all(out[~finite] == 0), "rows that see no key must be zeros"
        lse_err = (lse_nat[finite] - ref_lse[finite]).abs().max().item() if finite.any() else 0.0
        # -sm sums P as rounded to fp16 for the PV product (2**-11 relative a term): its LSE is
        # that sum's, a few 1e-4 off float64's where the float32 sum is within 1e-4.
        assert err < 5e-3 and lse_err < (1e-3 if sum_mma else 1e-4), (
            f"{n_q}x{n_k} causal={causal} block_n={block_n} consumers={consumers} sum_mma={sum_mma}: "
            f"max error {err:.2e}, LSE {lse_err:.2e}")
        cases += 1
    # The model must fail on the mistakes it is here to catch.
    q, k, v = (torch.randn(n, 64).to(torch.float16) for n in (300, 200, 200))
    global tile_ranges
    original = tile_ranges
    try:
        tile_ranges = lambda *a: (original(*a)[0], original(*a)[0])  # noqa: E731 - every tile unmasked
        out, _ = model_forward(q, k, v, True, 0.125, 128)
        assert (out.double() - reference(q, k, v, True, 0.125)[0]).abs().max() > 1e-2, "an unmasked diagonal passed"
    finally:
        tile_ranges = original
    # -sm's row sums not rescaled by alpha with O: wrong once a row's maximum grows after tile 0.
    q, k, v = (torch.randn(n, 64).to(torch.float16) for n in (128, 1000, 1000))
    k[900:] *= 4.0  # later keys score higher: the row maxima grow
    out, _ = model_forward(q, k, v, False, 0.125, 128, sum_mma=True, rescale_sum=False)
    assert (out.double() - reference(q, k, v, False, 0.125)[0]).abs().max() > 1e-2, "unrescaled -sm sums passed"
    return cases


def main() -> int:
    args = model_args(__doc__, 200)
    print(f"protocol: {check_protocol(args.seeds)} interleavings, no deadlock, no race, turns rotate")
    caught = check_protocol_catches_mistakes()
    print(f"protocol: the model fails on {len(caught)} of 7 planted mistakes: {', '.join(caught)}")
    print(f"dealing: {check_dealing()} persistent grids deal every item once")
    caught_dealing = check_dealing_catches_mistakes()
    print(f"dealing: fails on {len(caught_dealing)} of 2 planted mistakes: {', '.join(caught_dealing)}")
    for per_item in (0.0, 1.0):
        print(f"dealing: busiest CTA / mean on 132 SMs (key tiles + {per_item:g} a item): one-item grid, "
              "static (j % 132), snake, one-item grid heaviest first (-hf), snake over head groups (-p-g):")
        for name, grid, stride, snake, heavy, grouped in dealing_balance(132, per_item):
            print(f"  {name}: {grid:.3f} {stride:.3f} {snake:.3f} {heavy:.3f} {grouped:.3f}")
    print(f"schedule: {check_schedule()} CTAs visit tiles 1..n_tiles-1 once, in order, the unmasked ones "
          "whole for every row")
    print(f"window schedule: {check_window_schedule()} CTAs under a window visit their tiles once, in order, "
          "every visible key walked, the unmasked ones whole for every row")
    try:
        check_window_schedule(w_lo_shift=1)
        window_caught = False
    except AssertionError:
        window_caught = True
    print(f"window schedule: whole tiles planted one tile early {'caught' if window_caught else 'NOT caught'}")
    print(f"numerics: {check_numerics()} shapes match float64 attention (output and LSE), with and "
          "without -sm's row sums; an unmasked diagonal and -sm sums not rescaled are caught")
    return 0 if len(caught) == 7 and len(caught_dealing) == 2 and window_caught else 1


if __name__ == "__main__":
    sys.exit(main())
