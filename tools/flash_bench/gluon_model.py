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
  product issues do not alternate (with turns).
- ``schedule``: each CTA's tile range (``n_tiles``, ``n_whole``) and the consumer's loop split (tile
  0 alone, the whole tiles, the masked ones) visit each tile once, in order, and leave a tile
  unmasked only where every row of the CTA sees every key of it.
- ``numerics``: the consumer's arithmetic on one CTA in torch (float32, P rounded to the input
  dtype), with the kernel's tile ranges (``n_tiles``, ``n_whole``), its prologue / whole / masked
  / last-PV sequence, the masks and the shift for rows that have seen no key, against float64
  attention: lengths not multiples of the tile, Nq != Nk both ways, causal rows that see nothing.

A model is not the kernel: a mistake copied into both passes here. What it does catch is a wrong
parity, count, range or mask in the design the kernel follows.

Usage: python3 tools/flash_bench/gluon_model.py [--seeds N]   (about 30 s on 2 cores)
"""

from __future__ import annotations

import argparse
import itertools
import math
import random
import sys

import torch
from gluon_harness import MBarrier, interleave

BLOCK_M, ROWS = 128, 64


# ---------------------------------------------------------------------------------------------
# Barrier protocol
# ---------------------------------------------------------------------------------------------


class Protocol:
    """The kernel's shared state: barriers, the K/V ring's contents, who reads what."""

    def __init__(self, n_tiles: int, stages: int, pingpong: bool, rng: random.Random, consumers: int = 2) -> None:
        self.n_tiles, self.stages, self.pingpong, self.rng = n_tiles, stages, pingpong, rng
        self.consumers = consumers
        self.q_full = [MBarrier(f"q_full{c}", 1) for c in range(consumers)]
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

    def land_one(self) -> None:
        barrier, nbytes, action = self.in_flight.pop(self.rng.randrange(len(self.in_flight)))
        action()
        barrier.complete_tx(nbytes)


def producer(p: Protocol, refill_xor: int = 1):
    # _producer: the Q parts, K_0, then per tile K_{t+1} (one ahead) and V_t; each load waits
    # for its stage's empty barrier on parity ((t // STAGES) & 1) ^ 1 (_load_tile).
    for c in range(p.consumers):
        p.q_full[c].expect(1)
        p.in_flight.append((p.q_full[c], 1, lambda: None))

    def load(kind, t):
        s = t % p.stages
        yield ("wait", p.empty[kind][s], ((t // p.stages) & 1) ^ refill_xor)
        p.full[kind][s].expect(1)
        p.tma_load(kind, s, t)

    if p.n_tiles > 0:
        yield from load("k", 0)
    for t in range(p.n_tiles):
        if t + 1 < p.n_tiles:
            yield from load("k", t + 1)
        yield from load("v", t)


def consumer(p: Protocol, cid: int, eager: bool = False, turn_parity=None, next_turn=None):
    # _consumer: the prologue (QK^T of tile 0), _step for tiles 1.., the last PV. A read is open
    # from its product's issue to the release after the wait that retires that product: K_t in
    # step t; V_{t-1} at the end of step t (eager) or after the first wait of step t+1 (default).
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

    yield ("wait", p.q_full[cid], 0)
    if p.n_tiles == 0:
        return
    yield ("wait", p.full["k"][0], 0)
    yield from take_turn()
    p.read(cid, "k", 0, 0)
    p.issues.append(cid)
    pass_turn()
    yield ("yield",)  # the QK^T product runs; its wait follows
    p.release(cid, "k", 0, 0)
    for t in range(1, p.n_tiles):
        s, sp = t % stages, (t - 1) % stages
        yield ("wait", p.full["k"][s], (t // stages) & 1)
        yield from take_turn()
        p.read(cid, "k", s, t)
        if not eager:
            yield ("yield",)  # wait(1): PV_{t-2} retires
            if t >= 2:
                p.release(cid, "v", (t - 2) % stages, t - 2)
        yield ("wait", p.full["v"][sp], ((t - 1) // stages) & 1)
        p.read(cid, "v", sp, t - 1)
        p.issues.append(cid)
        pass_turn()
        yield ("yield",)
        p.release(cid, "k", s, t)  # after the wait that completes S_t
        yield ("yield",)  # the softmax
        if eager:
            p.release(cid, "v", sp, t - 1)  # after the wait that completes PV_{t-1}
    last = p.n_tiles - 1
    sl = last % stages
    if not eager and last >= 1:
        yield ("yield",)  # wait(0): PV_{last-1} retires
        p.release(cid, "v", (last - 1) % stages, last - 1)
    yield ("wait", p.full["v"][sl], (last // stages) & 1)
    yield from take_turn()
    p.read(cid, "v", sl, last)
    p.issues.append(cid)
    pass_turn()
    yield ("yield",)
    p.release(cid, "v", sl, last)


def _drive(p: Protocol, eager: bool = False, turn_parity=None, refill_xor: int = 1, next_turn=None) -> None:
    """One random interleaving of the partitions (the producer and each consumer) to the end;
    AssertionError on a deadlock (no partition can move and no copy is in flight) or on a race
    (see Protocol)."""
    partitions = {"producer": producer(p, refill_xor),
                  **{f"consumer{c}": consumer(p, c, eager, turn_parity, next_turn) for c in range(p.consumers)}}
    interleave(p, partitions, f"n_tiles={p.n_tiles} stages={p.stages} pingpong={p.pingpong} consumers={p.consumers}")
    if p.pingpong:  # the consumers issue in turn: 0, 1, (2,) 0, 1, ...
        assert all(b == (a + 1) % p.consumers for a, b in zip(p.issues, p.issues[1:])) and p.issues[:1] in ([], [0]), (
            f"turns did not rotate: {p.issues}")
    assert len(p.issues) == p.consumers * (p.n_tiles + 1 if p.n_tiles else 0)


def check_protocol(seeds: int) -> int:
    cases = 0
    for n_tiles, stages, pingpong, eager, consumers in itertools.product(
            (0, 1, 2, 3, 4, 5, 7, 12), (2, 3, 4), (True, False), (False, True), (2, 3)):
        for seed in range(seeds):
            _drive(Protocol(n_tiles, stages, pingpong, random.Random(seed), consumers), eager)
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
    return caught


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


def consumer_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, row0: int, start_m: int,
                  causal: bool, scale: float, block_n: int, dtype: torch.dtype,
                  block_m: int = BLOCK_M) -> tuple[torch.Tensor, torch.Tensor]:
    """One consumer's 64 rows as ``_consumer`` computes them: (output rows, base-2 LSE)."""
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
        return p, alpha, m_new, l_i * alpha + p.sum(1)

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
            o = o * alpha[:, None]
            o = o + p_op @ kv_tile(t - 1)[1]
            p, alpha, m_i, l_i = softmax(qk, m_i, l_i, t, masked)
            p_op = p.to(dtype).float()
        o = o * alpha[:, None]
        o = o + p_op @ kv_tile(n_tiles - 1)[1]
    seen = l_i > 0
    l_safe = torch.where(seen, l_i, torch.ones(()))
    lse = torch.where(seen, m_i + torch.log2(l_safe), torch.tensor(float("inf")))
    return (o / l_safe[:, None]).to(dtype), lse


def model_forward(q, k, v, causal: bool, scale: float, block_n: int,
                  consumers: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """[Nq, D] attention of one head through the model, CTA by CTA, consumer by consumer."""
    n_q = q.shape[0]
    out = torch.empty(n_q, q.shape[1], dtype=q.dtype)
    lse = torch.empty(n_q)
    block_m = consumers * ROWS
    for start_m in range(0, n_q, block_m):
        for cid in range(consumers):
            row0 = start_m + cid * ROWS
            o_rows, lse_rows = consumer_rows(q, k, v, row0, start_m, causal, scale, block_n, q.dtype, block_m)
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
    for (n_q, n_k), causal, block_n, consumers in itertools.product(shapes, (False, True), (128, 64), (2, 3)):
        d = 64
        q, k, v = (torch.randn(n, d).to(torch.float16) for n in (n_q, n_k, n_k))
        scale = d ** -0.5
        out, lse2 = model_forward(q, k, v, causal, scale, block_n, consumers)
        ref, ref_lse = reference(q, k, v, causal, scale)
        err = (out.double() - ref).abs().max().item()
        lse_nat = lse2.double() * math.log(2)
        finite = torch.isfinite(ref_lse)
        assert torch.equal(torch.isfinite(lse_nat), finite), f"LSE infinities differ at {n_q}x{n_k} causal={causal}"
        assert torch.all(out[~finite] == 0), "rows that see no key must be zeros"
        lse_err = (lse_nat[finite] - ref_lse[finite]).abs().max().item() if finite.any() else 0.0
        assert err < 5e-3 and lse_err < 1e-4, (
            f"{n_q}x{n_k} causal={causal} block_n={block_n} consumers={consumers}: max error {err:.2e}, LSE {lse_err:.2e}")
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
    return cases


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=200, help="random interleavings per protocol case")
    args = parser.parse_args()
    print(f"protocol: {check_protocol(args.seeds)} interleavings, no deadlock, no race, turns rotate")
    caught = check_protocol_catches_mistakes()
    print(f"protocol: the model fails on {len(caught)} of 5 planted mistakes: {', '.join(caught)}")
    print(f"schedule: {check_schedule()} CTAs visit tiles 1..n_tiles-1 once, in order, the unmasked ones "
          "whole for every row")
    print(f"numerics: {check_numerics()} shapes match float64 attention (output and LSE); "
          "an unmasked diagonal is caught")
    return 0 if len(caught) == 5 else 1


if __name__ == "__main__":
    sys.exit(main())
