"""CPU models of triton_flash's Gluon backward (``gluon_backward.py``): what can be checked without a GPU.

The sibling of ``gluon_model.py`` (the forward's models), with the same caveat: a model mirrors
the kernel's design line by line; a mistake copied into both passes. Three checks:

- ``protocol``: the producer and the two consumers as coroutines issuing the kernel's barrier
  operations in its order (``_bwd_producer``, ``_bwd_step``, the epilogue of ``_bwd_consumer``),
  over mbarriers with the hardware's phase semantics (``gluon_model.MBarrier``), TMA copies that
  land at random later times, and each consumer's wgmma groups in flight from their issue to the
  ``warpgroup_mma_wait`` that retires them (groups retire in order; ``wait(n)`` leaves the newest
  n). A random scheduler interleaves them many times for each query-tile count, group size, ring
  depth and dQ variant (``SPLIT_DQ``, ``DQ_PARTS``; the adds, ``-sum``, ``-tmar``, ``-tmar-pair``).
  The model fails on a deadlock; on a TMA write into a Q/dO stage that a product may still read,
  or that a consumer has not released; on
  a product reading a stage that holds another tile, or one still being written; on the
  consumer's own generic stores (dS^T into its buffer, dK/dV into K_c/V_c for the TMA store)
  while a product that reads that buffer is in flight; for ``-tmar``, on a dQ share written into
  a buffer a TMA reduce still reads (no ``store_wait`` first), a reduce of a buffer missing a
  piece, or a consumer ending with a reduce in flight; for ``-pair``, on consumer 1's share written
  over one consumer 0 has not read whole, or a piece of it read before it was written. Each
  consumer is one coroutine: the barriers among a warp group's own threads (before the reduce,
  after ``store_wait``, before ``-pair``'s and ``-sum``'s one-thread arrivals) are not modelled;
  the SASS shows them (``BAR.SYNC`` of 128 threads around ``UTMAREDG``), and
  ``gluon_bwd_compile.py`` checks that every plain arrival after shared accesses has one.
- ``schedule``: :func:`gluon_backward.query_tiles` (the kernel's integer formulas) skips only
  query tiles where no query sees a key of the block, and leaves a tile unmasked only where every
  valid query of it sees every valid key of the block.
- ``numerics``: the kernel's arithmetic in torch (float32 accumulators, P^T and dS^T rounded to
  the input dtype before their products, as the kernel does), per CTA, per consumer, per query
  tile, with its tile ranges, masks only on masked tiles, zero-filled rows past the ends, L = +inf
  and delta = 0 past Nq, and dQ summed over CTAs, against float64 autograd: lengths not multiples
  of the tiles, Nq != Nk both ways, GQA, causal rows that see no key.

Usage: PYTHONPATH=. python3 tools/flash_bench/gluon_bwd_model.py [--seeds N]   (about 40 s)
"""

from __future__ import annotations

import itertools
import math
import random
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from gluon_harness import MBarrier, interleave, model_args  # noqa: E402

KEYS = 64
BLOCK_N = 2 * KEYS


# ---------------------------------------------------------------------------------------------
# Barrier protocol
# ---------------------------------------------------------------------------------------------


class Protocol:
    """The kernel's shared state: barriers, the Q/dO ring's contents, the products in flight."""

    def __init__(self, n_iters: int, stages: int, rng: random.Random) -> None:
        self.n_iters, self.stages, self.rng = n_iters, stages, rng
        self.kv_full = MBarrier("kv_full", 1)
        self.q_full = [MBarrier(f"q_full{s}", 1) for s in range(stages)]
        self.q_empty = [MBarrier(f"q_empty{s}", 2) for s in range(stages)]
        self.content: list[int | None] = [None] * stages  # iteration a stage holds (once landed)
        self.writing = [False] * stages
        self.kv_landed = False
        # Per consumer: wgmma groups in flight, oldest first, each the set of buffers it reads.
        self.groups: list[list[set]] = [[], []]
        # Per consumer: the stages it has read and not released.
        self.holding: list[set] = [set(), set()]
        self.in_flight: list[tuple] = []  # TMA copies: (barrier, bytes, action)
        # SUM_DQ: the two fp32 dQ buffers' tiles, the consumers reading them, the two barriers.
        self.dq_ready = MBarrier("dq_ready", 2)
        self.dq_free = MBarrier("dq_free", 2)
        self.dq_content: list[int | None] = [None, None]
        self.dq_reading: set = set()
        # TMA_DQ: per consumer, the tile whose dQ share a TMA reduce is reading from its buffer
        # (until the consumer's store_wait), and the pieces of the tile the buffer holds.
        self.reducing: list[int | None] = [None, None]
        self.dq_pieces: list[tuple[int, int]] = [(-1, 0), (-1, 0)]
        # PAIR_DQ: consumer 1's buffer (tile, pieces written) and the last tile consumer 0 has
        # read from it whole; the two barriers then count one consumer each.
        self.share: tuple[int, int] = (-1, 0)
        self.share_read = -1

    def pair(self) -> None:
        for barrier in (self.dq_ready, self.dq_free):
            barrier.count = barrier.pending = 1

    def share_piece(self, it: int) -> None:
        tile, done = self.share
        assert tile == it or self.share_read == tile, (
            f"consumer 1 writes tile {it}'s dQ share over tile {tile}'s, which consumer 0 has not read")
        self.share = (it, done + 1 if tile == it else 1)

    def share_load(self, it: int, piece: int, pieces: int) -> None:
        assert self.share[0] == it and self.share[1] > piece, (
            f"consumer 0 adds piece {piece} of tile {it}'s share from a buffer holding {self.share} (tile, pieces)")
        if piece == pieces - 1:
            self.share_read = it

    def dq_piece(self, cid: int, it: int) -> None:
        assert self.reducing[cid] is None, (
            f"consumer {cid} writes tile {it}'s dQ into its buffer while the reduce of tile {self.reducing[cid]} "
            "reads it")
        done = self.dq_pieces[cid][1] if self.dq_pieces[cid][0] == it else 0
        self.dq_pieces[cid] = (it, done + 1)

    def reduce(self, cid: int, it: int, pieces: int) -> None:
        assert self.dq_pieces[cid] == (it, pieces), (
            f"consumer {cid} reduces tile {it}'s dQ from a buffer holding {self.dq_pieces[cid]} (tile, pieces)")
        self.reducing[cid] = it

    def store_wait(self, cid: int) -> None:
        self.reducing[cid] = None

    def dq_store(self, cid: int, it: int) -> None:
        assert not self.dq_reading, f"consumer {cid} writes dQ buffer {cid} (tile {it}) while {self.dq_reading} read"
        self.dq_content[cid] = it

    def dq_read(self, cid: int, it: int) -> None:
        assert self.dq_content == [it, it], f"consumer {cid} sums dQ for tile {it} from buffers {self.dq_content}"
        self.dq_reading.add(cid)

    def tma_load(self, stage: int, it: int) -> None:
        for c in range(2):
            busy = [g for g in self.groups[c] if ("stage", stage) in g]
            assert not busy, f"stage {stage} refilled with iteration {it} while consumer {c}'s product reads it"
            assert stage not in self.holding[c], f"stage {stage} refilled before consumer {c} released it"
        self.writing[stage] = True
        self.content[stage] = None

        def land() -> None:
            self.writing[stage] = False
            self.content[stage] = it

        self.in_flight.append((self.q_full[stage], 1, land))

    def issue(self, cid: int, reads: set, it: int | None = None) -> None:
        for item in reads:
            if item[0] == "stage":
                s = item[1]
                assert not self.writing[s] and self.content[s] == it, (
                    f"consumer {cid} reads stage {s} for iteration {it}, which holds {self.content[s]} "
                    f"(being written: {self.writing[s]})")
                self.holding[cid].add(s)
            if item[0] == "kv":
                assert self.kv_landed, f"consumer {cid} reads K/V before they landed"
        self.groups[cid].append(set(reads))

    def wait(self, cid: int, outstanding: int) -> None:
        groups = self.groups[cid]
        self.groups[cid] = groups[len(groups) - outstanding:] if outstanding else []

    def store(self, cid: int, buffer: tuple) -> None:
        busy = [g for g in self.groups[cid] if buffer in g]
        assert not busy, f"consumer {cid} writes {buffer} while its product reads it"

    def release(self, cid: int, stage: int, it: int) -> None:
        assert self.content[stage] == it, f"stage {stage} changed under consumer {cid}"
        self.holding[cid].discard(stage)
        self.q_empty[stage].arrive()

    def land_one(self) -> None:
        barrier, nbytes, action = self.in_flight.pop(self.rng.randrange(len(self.in_flight)))
        action()
        barrier.complete_tx(nbytes)


def producer(p: Protocol, refill_xor: int = 1):
    # _bwd_producer: K and V once (one barrier, four copies), then Q_i + dO_i per iteration
    # (one expect of both tiles' bytes), each after its stage's empty barrier on parity
    # ((it // STAGES) & 1) ^ 1.
    p.kv_full.expect(4)

    def land_kv() -> None:
        p.kv_landed = True

    for _ in range(3):
        p.in_flight.append((p.kv_full, 1, lambda: None))
    p.in_flight.append((p.kv_full, 1, land_kv))
    for it in range(p.n_iters):
        s = it % p.stages
        yield ("wait", p.q_empty[s], ((it // p.stages) & 1) ^ refill_xor)
        p.q_full[s].expect(2)
        p.tma_load(s, it)
        p.in_flight.append((p.q_full[s], 1, lambda: None))  # dO_i, same barrier


def consumer(p: Protocol, cid: int, split_dq: bool, dq_parts: int, plant: str = "", qrows: bool = True,
             sum_dq: bool = False, tma_dq: bool = False, pair_dq: bool = False, dq_pipe: bool = False):
    # _bwd_consumer / _bwd_step, in the kernel's order. Buffers: ("stage", s) = Q_s and dO_s,
    # ("kv",) = K_c and V_c, ("ds",) and ("p",) = this consumer's dS and P buffers (QROWS: both
    # written before dV's and dK's products read them; keys as rows: only dS^T, after).
    stage = lambda s: ("stage", s)  # noqa: E731
    yield ("wait", p.kv_full, 0)
    for it in range(p.n_iters):
        s = it % p.stages
        yield ("wait", p.q_full[s], (it // p.stages) & 1)
        p.issue(cid, {stage(s), ("kv",)}, it)  # S^T = K_c Q_i^T
        p.issue(cid, {stage(s), ("kv",)}, it)  # dP^T = V_c dO_i^T
        yield ("yield",)  # L, delta loads
        p.wait(cid, 1)  # S^T
        yield ("yield",)  # exp2, mask
        p.wait(cid, 0)  # dP^T
        yield ("yield",)  # dS^T, conversions
        if qrows:
            if plant != "ds store before its reader retired" or it == 0:
                p.store(cid, ("p",))
                p.store(cid, ("ds",))
            yield ("yield",)  # fence
            p.issue(cid, {stage(s), ("p",)}, it)  # dV += P^T dO_i (P from shared memory)
            p.issue(cid, {stage(s), ("ds",)}, it)  # dK += dS^T Q_i
        else:
            p.issue(cid, {stage(s)}, it)  # dV += P^T dO_i (P^T from registers)
            p.issue(cid, {stage(s)}, it)  # dK += dS^T Q_i
            if plant != "ds store before its reader retired" or it == 0:
                p.store(cid, ("ds",))  # dS^T into the consumer's buffer
            yield ("yield",)
        if split_dq:
            p.wait(cid, 0)
        pipe = dq_pipe and dq_parts == 2
        if pipe:  # -dqp: both pieces in flight, piece 0 stored under piece 1's product
            p.issue(cid, {("ds",), ("kv",)}, it)  # dQ's piece 0
            p.issue(cid, {("ds",), ("kv",)}, it)  # dQ's piece 1
            p.wait(cid, 3 if plant == "dqp: release while dK's product runs" else 1)
            if plant != "no release":
                p.release(cid, s, it)
            if plant != "no store_wait before the dQ store":
                p.store_wait(cid)
            p.dq_piece(cid, it)
            yield ("yield",)  # piece 0 to shared memory
            p.wait(cid, 0)
            p.dq_piece(cid, it)
            yield ("yield",)  # piece 1 to shared memory
        for h in range(0 if pipe else dq_parts):
            p.issue(cid, {("ds",), ("kv",)}, it)  # dQ's piece h = dS K_c[:, piece h]
            if h == 0:
                if plant == "release before the wait":
                    p.release(cid, s, it)
                    yield ("yield",)
                    p.wait(cid, 0)
                else:
                    p.wait(cid, 0)
                    if plant != "no release":
                        p.release(cid, s, it)
            else:
                p.wait(cid, 0)
            if sum_dq and h == 0 and plant != "dq_free not waited":
                yield ("wait", p.dq_free, (it & 1) ^ 1)
            if sum_dq:
                p.dq_store(cid, it)
            if pair_dq and cid == 1:
                if h == 0 and plant != "pair: dq_free not waited":
                    yield ("wait", p.dq_free, (it & 1) ^ 1)
                p.share_piece(it)  # the share, scaled, into buffer 1
                if plant == "pair: dq_ready before the last piece" and h == 0:
                    p.dq_ready.arrive()
            elif tma_dq:
                if pair_dq and h == 0 and plant != "pair: dq_ready not waited":
                    yield ("wait", p.dq_ready, it & 1)
                if h == 0 and plant != "no store_wait before the dQ store":
                    p.store_wait(cid)  # tma.store_wait(0), then the warp group's barrier
                if pair_dq:
                    p.share_load(it, h, dq_parts)  # consumer 1's piece h, added as this one's is stored
                    if plant == "pair: dq_free at the first piece" and h == 0:
                        p.dq_free.arrive()
                p.dq_piece(cid, it)
                if plant == "reduce after the first piece" and h == 0:
                    p.reduce(cid, it, dq_parts)
            yield ("yield",)  # dQ piece to shared memory
        if sum_dq:
            p.dq_ready.arrive()
            if plant != "dq_ready not waited":
                yield ("wait", p.dq_ready, it & 1)
            p.dq_read(cid, it)
            yield ("yield",)  # the sums and the atomic adds of half the rows
            p.dq_reading.discard(cid)
            p.dq_free.arrive()
        if pair_dq and cid == 1:
            if plant != "pair: dq_ready before the last piece":
                p.dq_ready.arrive()  # after the warp group's barrier
        elif tma_dq and plant != "reduce after the first piece":
            if pair_dq and plant != "pair: dq_free at the first piece":
                p.dq_free.arrive()  # fence, barrier: consumer 1's share is in the sum
            p.reduce(cid, it, dq_parts)  # the reduce
        yield ("yield",)  # the atomic adds (TMA_DQ: the reduce runs on)
        if plant == "ds store before its reader retired":
            # The mistake: the next tile's dS^T written while this tile's dQ product may run
            # (the wait moved after the store): modelled by reissuing a reader first.
            p.issue(cid, {("ds",), ("kv",)}, it)
            p.store(cid, ("ds",))
            p.wait(cid, 0)
            # (for QROWS the same mistake on P: the next tile's P written under this dV product)
    # The epilogue: dK, dV into K_c, V_c, then TMA stores.
    if plant == "epilogue before the last wait" and p.n_iters:
        p.issue(cid, {("kv",)}, p.n_iters - 1)
    p.store(cid, ("kv",))
    yield ("yield",)
    if tma_dq and plant != "no last store_wait":
        p.store_wait(cid)  # the epilogue's store_wait(0): the CTA may not end under a reduce
    assert not tma_dq or p.reducing[cid] is None, f"consumer {cid} ends with tile {p.reducing[cid]}'s reduce in flight"


def _drive(p: Protocol, split_dq: bool = False, dq_parts: int = 1, refill_xor: int = 1, plant: str = "",
           qrows: bool = True, sum_dq: bool = False, tma_dq: bool = False, pair_dq: bool = False,
           dq_pipe: bool = False) -> None:
    if pair_dq:
        p.pair()
    partitions = {"producer": producer(p, refill_xor),
                  "consumer0": consumer(p, 0, split_dq, dq_parts, plant, qrows, sum_dq, tma_dq, pair_dq, dq_pipe),
                  "consumer1": consumer(p, 1, split_dq, dq_parts, plant, qrows, sum_dq, tma_dq, pair_dq, dq_pipe)}
    interleave(p, partitions, f"n_iters={p.n_iters} stages={p.stages}")
    assert all(not g for g in p.groups), "products left in flight at the end"
    assert all(not h for h in p.holding), "stages never released"


def check_protocol(seeds: int) -> int:
    cases = 0
    # n_iters = GROUP x query tiles of the CTA (0: a causal key block no query sees).
    for n_iters, stages, split_dq, dq_parts, qrows, dq_out in itertools.product(
            (0, 1, 2, 3, 5, 8, 13), (2, 3, 4), (False, True), (1, 2), (True, False),
            ("adds", "sum", "tma", "pair", "tma-dqp")):
        if dq_out == "tma-dqp" and (split_dq or not qrows or dq_parts == 1):
            continue  # -dqp: queries as rows, two pieces, beside dV's and dK's products (Config)
        for seed in range(seeds):
            _drive(Protocol(n_iters, stages, random.Random(seed)), split_dq, dq_parts, qrows=qrows,
                   sum_dq=dq_out == "sum", tma_dq=dq_out in ("tma", "pair", "tma-dqp"), pair_dq=dq_out == "pair",
                   dq_pipe=dq_out == "tma-dqp")
            cases += 1
    return cases


PLANTED = ("empty barriers counting one consumer", "producer's first wait on parity 0",
           "release before the wait", "no release", "ds store before its reader retired",
           "epilogue before the last wait")


SUM_PLANTED = ("dq_free not waited", "dq_ready not waited")
TMA_PLANTED = ("no store_wait before the dQ store", "reduce after the first piece", "no last store_wait")
PAIR_PLANTED = ("pair: dq_free not waited", "pair: dq_ready not waited", "pair: dq_ready before the last piece",
                "pair: dq_free at the first piece")
DQP_PLANTED = ("dqp: release while dK's product runs", "no store_wait before the dQ store", "no release")


def check_dq_out_catches_mistakes(mistakes: tuple[str, ...], **drive) -> list[str]:
    """A dQ way out's own waits and order (``-sum``: ``sum_dq=True``; ``-tmar``: ``tma_dq=True``;
    ``-tmar-pair``: both and ``pair_dq=True``): each mistake planted must fail."""
    caught = []
    for mistake in mistakes:
        for seed in range(300):
            try:
                _drive(Protocol(6, 2, random.Random(seed)), dq_parts=2, plant=mistake, **drive)
            except AssertionError:
                caught.append(mistake)
                break
    return caught


def check_protocol_catches_mistakes() -> list[str]:
    """The model must fail on protocol mistakes the kernel could make: each is planted here."""
    caught = []
    for mistake, qrows in itertools.product(PLANTED, (True, False)):
        for seed in range(300):
            p = Protocol(6, 2, random.Random(seed))
            kwargs = {}
            if mistake == "empty barriers counting one consumer":
                for barrier in p.q_empty:
                    barrier.count = barrier.pending = 1
            elif mistake == "producer's first wait on parity 0":
                kwargs["refill_xor"] = 0
            else:
                kwargs["plant"] = mistake
            try:
                _drive(p, dq_parts=2, qrows=qrows, **kwargs)
            except AssertionError:
                caught.append(f"{mistake} ({'queries' if qrows else 'keys'} as rows)")
                break
    return caught


# ---------------------------------------------------------------------------------------------
# Tile ranges
# ---------------------------------------------------------------------------------------------


def load_backward():
    from gluon_compile import ensure_package
    import importlib

    ensure_package()
    return importlib.import_module("pytest_attnkit.implementations.triton_flash.gluon_backward")


def check_schedule(gb) -> int:
    cases = 0
    for n_q, n_k, block_m in itertools.product((1, 5, 63, 64, 65, 127, 128, 200, 257), (1, 7, 64, 128, 129, 300),
                                               (64, 128)):
        for n0 in range(0, n_k, BLOCK_N):
            first, whole, end = gb.query_tiles(n0, n_q, n_k, block_m, True)
            assert 0 <= first <= whole <= end == -(-n_q // block_m)
            keys = range(n0, min(n0 + BLOCK_N, n_k))
            diag = n_k - n_q
            for t in range(end):
                queries = range(t * block_m, min(t * block_m + block_m, n_q))
                sees = [[j <= i + diag for j in keys] for i in queries]
                anything = any(any(row) for row in sees)
                everything = all(all(row) for row in sees)
                if t < first:
                    assert not anything, f"tile {t} skipped but seen: n_q={n_q} n_k={n_k} n0={n0} bm={block_m}"
                if t >= whole:
                    assert everything, f"tile {t} unmasked but partly hidden: n_q={n_q} n_k={n_k} n0={n0}"
                    assert n0 + BLOCK_N <= n_k, f"tile {t} unmasked in a ragged key block: n_k={n_k} n0={n0}"
            for rotate in (False, True):  # every tile once, the masked ones first, in order
                order = gb.walk_order(first, whole, end, n0 // BLOCK_N, rotate)
                assert order[:whole - first] == list(range(first, whole)) and sorted(order) == list(range(first, end))
            cases += 1
            ragged = n0 + BLOCK_N > n_k
            assert gb.query_tiles(n0, n_q, n_k, block_m, False) == (0, end if ragged else 0, end)
    return cases + check_band_schedule(gb)


#: Sliding windows (left, right) for the band's tile ranges, the contract's (-1: unbounded),
#: causal ones with right 0: narrower and wider than a tile and a key block, one-sided, (0, 0).
WINDOWS = ((0, 0), (1, 0), (63, 0), (64, 0), (100, 0), (300, 0), (-1, 0), (5, 3), (64, 64), (100, 37), (-1, 20),
           (20, -1), (0, 200), (-1, -1))


def check_band_schedule(gb) -> int:
    """``band_tiles`` (the kernel's window formulas): every tile with a query that sees a key of
    the block is walked, a tile is unmasked only where every valid query sees every valid key,
    the masked tiles are at the two ends ([first, whole) and [wend, end)), and a causal or
    unbounded band gives ``query_tiles``' ranges."""
    from pytest_attnkit.implementations.triton_flash.kernels import band

    cases = 0
    rng = random.Random(5)
    for n_q, n_k, block_m in itertools.product((1, 63, 65, 128, 200, 257), (1, 7, 128, 129, 300, 520), (64, 128)):
        diag = n_k - n_q
        end_all = -(-n_q // block_m)
        # And random sides, so that each edge's off-by-one meets a tile boundary somewhere.
        drawn = [(rng.randrange(-1, 400), rng.randrange(-1, 400)) for _ in range(12)]
        for window in WINDOWS + tuple(drawn):
            for causal in (False, True):
                left, right = band(causal, window)
                for n0 in range(0, n_k, BLOCK_N):
                    first, whole, wend, end = gb.band_tiles(n0, n_q, n_k, block_m, left, right)
                    where = f"n_q={n_q} n_k={n_k} n0={n0} bm={block_m} window={window} causal={causal}"
                    assert 0 <= first <= whole <= wend <= end <= end_all, where
                    keys = range(n0, min(n0 + BLOCK_N, n_k))
                    for t in range(end_all):
                        queries = range(t * block_m, min(t * block_m + block_m, n_q))
                        sees = [[-right <= i + diag - j <= left for j in keys] for i in queries]
                        if not first <= t < end:
                            assert not any(any(row) for row in sees), f"tile {t} skipped but seen: {where}"
                        if whole <= t < wend:
                            assert all(all(row) for row in sees), f"tile {t} unmasked but partly hidden: {where}"
                            assert n0 + BLOCK_N <= n_k, f"tile {t} unmasked in a ragged key block: {where}"
                    if window == (-1, 0) or window == (-1, -1):  # the same band as causal or none
                        plain = gb.query_tiles(n0, n_q, n_k, block_m, causal or window == (-1, 0))
                        assert (first, whole, end) == plain and wend == end, where
                    cases += 1
    return cases


# ---------------------------------------------------------------------------------------------
# Numerics
# ---------------------------------------------------------------------------------------------


def model_backward(gb, q, k, v, do, lse2, delta, causal: bool, scale: float, block_m: int, dtype, slopes=None,
                   window=None):
    """dQ, dK, dV as the kernel computes them (float32; inputs already rounded to dtype).
    ``slopes``: ALiBi's, [B, Hq] natural (the kernel's are times log2(e)), its bias computed in
    the kernel's form (``_probabilities``: the distance as the float of the row's part less the
    lane's column base, less the float of the rest of the column). ``window``: the contract's
    (left, right), its band (``kernels.band``) walked by ``band_tiles`` (masked at both ends) and
    masked in the kernel's form."""
    from pytest_attnkit.implementations.triton_flash.kernels import band

    band_lr = band(causal, window) if window is not None else None
    batch, heads_q, n_q, d = q.shape
    heads_kv, n_k = k.shape[1], k.shape[2]
    group = heads_q // heads_kv
    c = scale / math.log(2.0)
    diag = n_k - n_q
    dq = torch.zeros(q.shape, dtype=torch.float32)
    dk = torch.zeros(k.shape, dtype=torch.float32)
    dv = torch.zeros(v.shape, dtype=torch.float32)
    pad_q = -(-n_q // block_m) * block_m

    def rows(t: torch.Tensor, n: int, size: int) -> torch.Tensor:  # zero-filled past the end (TMA)
        out = torch.zeros(size, t.shape[-1], dtype=torch.float32)
        out[:n] = t
        return out

    for b in range(batch):
        for hk in range(heads_kv):
            for n0 in range(0, n_k, BLOCK_N):
                if band_lr is None:
                    first, whole, end = gb.query_tiles(n0, n_q, n_k, block_m, causal)
                    wend = end
                else:
                    first, whole, wend, end = gb.band_tiles(n0, n_q, n_k, block_m, *band_lr)
                kb = rows(k[b, hk, n0:n0 + BLOCK_N], min(BLOCK_N, n_k - n0), BLOCK_N)
                vb = rows(v[b, hk, n0:n0 + BLOCK_N], min(BLOCK_N, n_k - n0), BLOCK_N)
                for cid in range(2):
                    k_c, v_c = kb[cid * KEYS:(cid + 1) * KEYS], vb[cid * KEYS:(cid + 1) * KEYS]
                    keys = n0 + cid * KEYS + torch.arange(KEYS)
                    acc_k = torch.zeros(KEYS, d)
                    acc_v = torch.zeros(KEYS, d)
                    for g in range(group):
                        h = hk * group + g
                        qh = rows(q[b, h], n_q, pad_q)
                        doh = rows(do[b, h], n_q, pad_q)
                        lse_h = torch.full((pad_q,), float("inf"))
                        lse_h[:n_q] = lse2[b, h]
                        delta_h = torch.zeros(pad_q)
                        delta_h[:n_q] = delta[b, h]
                        for t in range(first, end):
                            sl = slice(t * block_m, (t + 1) * block_m)
                            q_i, do_i = qh[sl], doh[sl]
                            cols = t * block_m + torch.arange(block_m)
                            st = k_c @ q_i.T
                            if slopes is not None:
                                key0 = n0 + cid * KEYS
                                c_all = torch.arange(KEYS)  # keys: the kernel's columns
                                c_lane = c_all & 6
                                r_all = t * block_m + diag - key0 + torch.arange(block_m)
                                dist = ((r_all[None, :] - c_lane[:, None]).float()
                                        - (c_all - c_lane).float()[:, None])
                                slope2 = (slopes[b, h].float() * (1 / math.log(2.0))).float()
                                pt = torch.exp2((st * c - lse_h[sl][None, :]) - slope2 * dist.abs())
                            else:
                                pt = torch.exp2(st * c - lse_h[sl][None, :])
                            if t < whole or t >= wend:  # the masked tiles, the kernel's formula (local indices)
                                key0 = n0 + cid * KEYS
                                r_idx, c_idx = torch.arange(KEYS), torch.arange(block_m)
                                visible = (r_idx < n_k - key0)[:, None].expand(KEYS, block_m)
                                shift = t * block_m + diag - key0
                                if band_lr is not None:  # keys as rows here: the kernel's c is r_idx
                                    left, right = band_lr
                                    visible = (visible & (r_idx[:, None] <= c_idx[None, :] + (shift + right))
                                               & (r_idx[:, None] >= c_idx[None, :] + (shift - left)))
                                elif causal:
                                    visible = visible & (r_idx[:, None] - c_idx[None, :] <= shift)
                                pt = torch.where(visible, pt, 0.0)
                            dpt = v_c @ do_i.T
                            dst = pt * (dpt - delta_h[sl][None, :])
                            p_lo = pt.to(dtype).float()
                            ds_lo = dst.to(dtype).float()
                            acc_v += p_lo @ do_i
                            acc_k += ds_lo @ q_i
                            part = (ds_lo.T @ k_c) * scale
                            valid = cols < n_q
                            dq[b, h, cols[valid]] += part[valid]
                    keep = keys < n_k
                    dk[b, hk, keys[keep]] = (acc_k * scale)[keep]
                    dv[b, hk, keys[keep]] = acc_v[keep]
    return dq, dk.to(dtype), dv.to(dtype)


def reference(q, k, v, do, causal: bool, scale: float, slopes=None, window=None):
    """float64 attention's gradients (q, k, v, do float64), the output and the base-2 LSE;
    ``slopes`` ALiBi's [B, Hq] (the bias ``- slope |i + Nk - Nq - j|``); ``window`` the
    contract's (left, right), -1 unbounded."""
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = q @ kk.transpose(-1, -2) * scale
    n_q, n_k = q.shape[2], k.shape[2]
    if slopes is not None:
        distance = (torch.arange(n_q)[:, None] + n_k - n_q - torch.arange(n_k)[None, :]).abs().double()
        s = s - slopes.double()[:, :, None, None] * distance
    i = torch.arange(n_q)[:, None]
    j = torch.arange(n_k)[None, :]
    if causal:
        s = s.masked_fill(j > i + n_k - n_q, float("-inf"))
    if window is not None:
        left, right = window
        if left >= 0:
            s = s.masked_fill(i + n_k - n_q - j > left, float("-inf"))
        if right >= 0:
            s = s.masked_fill(j - (i + n_k - n_q) > right, float("-inf"))
    lse = torch.logsumexp(s, -1)
    seen = torch.isfinite(lse)
    p = torch.where(seen[..., None], torch.exp(s - torch.where(seen, lse, 0.0)[..., None]), 0.0)
    o = p @ vv
    o.backward(do)
    lse2 = torch.where(seen, lse / math.log(2.0), float("inf"))
    return q.grad, k.grad, v.grad, o.detach(), lse2.detach()


def check_numerics(gb) -> int:
    torch.manual_seed(0)
    cases = 0
    worst = 0.0
    shapes = [  # (B, Hq, Hkv, Nq, Nk, D, causal)
        (1, 2, 2, 200, 200, 64, False),
        (1, 2, 2, 200, 200, 64, True),
        (1, 4, 2, 130, 70, 64, True),   # GQA, Nq > Nk: rows that see no key
        (2, 2, 1, 70, 300, 64, True),   # MQA, Nq < Nk
        (1, 2, 1, 65, 129, 128, False),
        (1, 1, 1, 1, 1, 64, True),
    ]
    # ALiBi (the last field): the bias's diagonal moves with Nk - Nq both ways; slopes per batch.
    shapes = [shape + (False, None) for shape in shapes] + [
        (2, 4, 2, 130, 70, 64, False, True, None),
        (1, 2, 2, 70, 300, 64, True, True, None),
        (1, 2, 1, 200, 200, 128, True, True, None),
        # Windows (the last field): causal, two-sided, one-sided, with ALiBi, Nq != Nk both ways.
        (1, 2, 2, 300, 300, 64, True, False, (70, -1)),
        (1, 4, 2, 130, 290, 64, False, False, (40, 90)),
        (2, 2, 1, 290, 130, 64, False, True, (-1, 33)),
        (1, 2, 2, 200, 200, 128, True, True, (64, 0)),
        (1, 2, 2, 70, 300, 64, False, False, (20, 0)),  # the first key block seen by no query: dK, dV 0
    ]
    for batch, hq, hkv, n_q, n_k, d, causal, alibi, window in shapes:
        slopes = (2.0 ** (-torch.arange(1, hq + 1) * 8 / hq))[None, :] * (1 + torch.arange(batch))[:, None] if alibi else None
        for block_m in (64, 128):
            dtype = torch.bfloat16
            scale = d ** -0.5
            q = torch.randn(batch, hq, n_q, d).to(dtype).double()
            k = torch.randn(batch, hkv, n_k, d).to(dtype).double()
            v = torch.randn(batch, hkv, n_k, d).to(dtype).double()
            do = torch.randn(batch, hq, n_q, d).to(dtype).double()
            dq_ref, dk_ref, dv_ref, o, lse2 = reference(q, k, v, do, causal, scale, slopes, window)
            # What the kernel gets: the forward's O in dtype, its float32 LSE, delta from them.
            o_lo = o.to(dtype).float()
            delta = (o_lo * do.float()).sum(-1)
            dq, dk, dv = model_backward(gb, q.float(), k.float(), v.float(), do.float(), lse2.float(), delta,
                                        causal, scale, block_m, dtype, slopes, window)
            for name, got, want in (("dq", dq.double(), dq_ref), ("dk", dk.double(), dk_ref),
                                    ("dv", dv.double(), dv_ref)):
                err = (got - want).abs().max().item()
                size = want.abs().max().item() + 1e-6
                worst = max(worst, err / size)
                assert err <= 0.02 * size + 1e-3, (
                    f"{name}: max error {err:.3g} against {size:.3g}: B{batch} Hq{hq} Hkv{hkv} Nq{n_q} Nk{n_k} "
                    f"d{d} causal={causal} alibi={alibi} window={window} block_m={block_m}")
            cases += 1
    return cases, worst


def _far_scores(gb, dtype) -> bool:
    """Rows whose every score is far below 0 (L about -180 in base 2) over a ragged key block
    (Nk = 70): a key past Nk (K = 0) would get P = 2^180, inf, and dS x 0 = NaN in dQ, unless
    the key mask holds. True when dQ, dK, dV come out finite and right."""
    n_q, n_k, d = 50, 70, 64
    q = torch.full((1, 1, n_q, d), 4.0) + 0.1 * torch.randn(1, 1, n_q, d)
    k = torch.full((1, 1, n_k, d), -4.0) + 0.1 * torch.randn(1, 1, n_k, d)
    v, do = torch.randn(1, 1, n_k, d), torch.randn(1, 1, n_q, d)
    q, k, v, do = (t.to(dtype).double() for t in (q, k, v, do))
    dq_ref, dk_ref, dv_ref, o, lse2 = reference(q, k, v, do, False, 0.125)
    delta = (o.to(dtype).float() * do.float()).sum(-1)
    grads = model_backward(gb, q.float(), k.float(), v.float(), do.float(), lse2.float(), delta, False, 0.125, 64,
                           dtype)
    # Finite is the point; the bound is loose because near-equal scores make dS a cancellation
    # that bf16's rounding of O (delta) and dS shows (5.7% of dQ's largest for bf16 here).
    return all(bool(torch.isfinite(g).all()) and (g.double() - r).abs().max().item() <= 0.1 * r.abs().max().item()
               for g, r in zip(grads, (dq_ref, dk_ref, dv_ref)))


def check_far_scores(gb) -> tuple[bool, bool]:
    """(the kernel's ranges pass the far-scores case, the same without the ragged block's mask
    fails it)."""
    torch.manual_seed(2)
    ok = _far_scores(gb, torch.float16) and _far_scores(gb, torch.bfloat16)
    original = gb.query_tiles
    gb.query_tiles = lambda n0, n_q, n_k, block_m, causal: (0, 0, -(-n_q // block_m)) if not causal else original(
        n0, n_q, n_k, block_m, causal)
    try:
        caught = not _far_scores(gb, torch.float16)
    finally:
        gb.query_tiles = original
    return ok, caught


def check_numerics_catches_a_mistake(gb) -> bool:
    """With every tile unmasked (query_tiles' `whole` forced to `first`), causal must fail."""
    original = gb.query_tiles

    def unmasked(n0, n_q, n_k, block_m, causal):
        first, _, end = original(n0, n_q, n_k, block_m, causal)
        return first, first, end

    gb.query_tiles = unmasked
    try:
        torch.manual_seed(1)
        q = torch.randn(1, 1, 100, 64).to(torch.bfloat16).double()
        k, v, do = (torch.randn(1, 1, 100, 64).to(torch.bfloat16).double() for _ in range(3))
        dq_ref, _, _, o, lse2 = reference(q, k, v, do, True, 0.125)
        delta = (o.to(torch.bfloat16).float() * do.float()).sum(-1)
        dq, _, _ = model_backward(gb, q.float(), k.float(), v.float(), do.float(), lse2.float(), delta, True, 0.125,
                                  64, torch.bfloat16)
        return (dq.double() - dq_ref).abs().max().item() > 0.02 * dq_ref.abs().max().item()
    finally:
        gb.query_tiles = original


def check_harness_rule(gb) -> list[str]:
    """``gluon_bwd_check._check_case`` (the GPU tool's correctness case, the harness's rule) on
    the CPU, with this model standing in for the kernel and the float64 reference for the
    forward: that the design's roundings pass the rule the GPU run applies, and that the check
    itself runs. Returns the failures (empty: all passed)."""
    import gluon_bwd_check

    class ModelKernel:
        Config = gb.Config

        @staticmethod
        def unsupported_reason(*args, **kwargs):
            return None

        @staticmethod
        def flash_bwd(do, q, k, v, o, lse, causal, scale, config, out=None, alibi_slopes=None, window=None):
            delta = (o.float() * do.float()).sum(-1)
            dq, dk, dv = model_backward(gb, q.float(), k.float(), v.float(), do.float(), lse.float(), delta,
                                        causal, scale, config.block_m, q.dtype, alibi_slopes, window)
            if out is not None:
                out[0].copy_(dk)
                out[1].copy_(dv)
                dk, dv = out
            return dq.to(q.dtype), dk, dv

    class ReferenceForward:
        class Variants:  # launch.Variants as the check builds it: causal, ALiBi's slopes, the window
            def __init__(self, causal: bool, alibi_slopes=None, window=None) -> None:
                self.causal, self.alibi_slopes, self.window = causal, alibi_slopes, window

        @staticmethod
        def flash_fwd(q, k, v, causal, scale, variants=None):
            slopes = None if variants is None else variants.alibi_slopes
            window = None if variants is None else variants.window
            _, _, _, o, lse2 = reference(q.double(), k.double(), v.double(), torch.zeros_like(q, dtype=torch.float64),
                                         causal, scale, slopes, window)
            return o.to(q.dtype), lse2.float()

        @staticmethod
        def flash_bwd(*args, **kwargs):
            raise NotImplementedError("not on the CPU")

    failures = []
    headroom = 0.0
    for dtype in ("bfloat16", "float16"):
        for shape, causal, head_dim, alibi, window in (((1, 2, 2, 200, 200), False, 64, False, None),
                                                       ((1, 4, 2, 130, 70), True, 64, False, None),
                                                       ((2, 2, 1, 70, 300), True, 64, False, None),
                                                       ((1, 2, 2, 65, 129), True, 128, False, None),
                                                       ((2, 4, 2, 130, 70), False, 64, True, None),
                                                       ((1, 2, 2, 70, 300), True, 128, True, None),
                                                       ((1, 2, 2, 300, 300), True, 64, False, [70, -1]),
                                                       ((2, 4, 2, 130, 290), False, 64, True, [40, 90])):
            case = {"id": f"{dtype} {shape} causal={causal} d{head_dim} alibi={alibi} window={window}", "dtype": dtype,
                    "head_dim": head_dim, "causal": causal, "config": "m64s2", "shape": list(shape), "seed": 7,
                    "alibi": alibi, "window": window}
            result = gluon_bwd_check._check_case(case, ModelKernel, ReferenceForward, device="cpu")
            if not result["passed"]:
                failures.append(f"{case['id']}: {result}")
            headroom = max([headroom] + [result[n]["max_error"] / result[n]["allowed"] for n in ("dq", "dk", "dv")])
    return failures, headroom


def main() -> int:
    args = model_args(__doc__, 100)
    print(f"protocol: {check_protocol(args.seeds)} interleavings, no deadlock, no race, every stage released")
    caught = check_protocol_catches_mistakes()
    print(f"protocol: the model fails on {len(caught)} of {2 * len(PLANTED)} planted mistakes: {', '.join(caught)}")
    missed = [f"{m} ({w} as rows)" for m in PLANTED for w in ("queries", "keys")
              if f"{m} ({w} as rows)" not in caught]
    if missed:
        print(f"protocol: NOT caught: {', '.join(missed)}")
    sum_caught = check_dq_out_catches_mistakes(SUM_PLANTED, sum_dq=True)
    print(f"protocol (-sum): the model fails on {len(sum_caught)} of {len(SUM_PLANTED)} planted mistakes: "
          f"{', '.join(sum_caught)}")
    missed += [m for m in SUM_PLANTED if m not in sum_caught]
    tma_caught = check_dq_out_catches_mistakes(TMA_PLANTED, tma_dq=True)
    print(f"protocol (-tmar): the model fails on {len(tma_caught)} of {len(TMA_PLANTED)} planted mistakes: "
          f"{', '.join(tma_caught)}")
    missed += [m for m in TMA_PLANTED if m not in tma_caught]
    pair_caught = check_dq_out_catches_mistakes(PAIR_PLANTED, tma_dq=True, pair_dq=True)
    print(f"protocol (-tmar-pair): the model fails on {len(pair_caught)} of {len(PAIR_PLANTED)} planted mistakes: "
          f"{', '.join(pair_caught)}")
    missed += [m for m in PAIR_PLANTED if m not in pair_caught]
    dqp_caught = check_dq_out_catches_mistakes(DQP_PLANTED, tma_dq=True, dq_pipe=True)
    print(f"protocol (-tmar-dqp): the model fails on {len(dqp_caught)} of {len(DQP_PLANTED)} planted mistakes: "
          f"{', '.join(dqp_caught)}")
    missed += [m for m in DQP_PLANTED if m not in dqp_caught]
    gb = load_backward()
    print(f"schedule: {check_schedule(gb)} (key block, lengths, BLOCK_M, window) cases: no seen tile skipped, no "
          "unmasked tile partly hidden, every tile walked once (rotated or not), a window's masked at both ends")
    cases, worst = check_numerics(gb)
    print(f"numerics: {cases} shapes match float64 autograd (dQ, dK, dV within 2% of the largest; worst "
          f"{100 * worst:.2f}%)")
    mask_caught = check_numerics_catches_a_mistake(gb)
    print(f"numerics: an unmasked causal diagonal is {'caught' if mask_caught else 'NOT caught'}")
    far_ok, far_caught = check_far_scores(gb)
    print(f"numerics: rows with every score far below 0 over a ragged key block: "
          f"{'finite and right' if far_ok else 'WRONG'}; without the last block's key mask "
          f"{'NaN/wrong (caught)' if far_caught else 'NOT caught'}")
    harness, headroom = check_harness_rule(gb)
    print(f"harness rule: gluon_bwd_check's correctness case on the CPU with the model as the kernel: "
          f"{'16 of 16 passed' if not harness else 'FAILED: ' + '; '.join(harness)} (worst error / allowed "
          f"{headroom:.2f})")
    return 0 if not missed and mask_caught and far_ok and far_caught and not harness else 1


if __name__ == "__main__":
    sys.exit(main())
