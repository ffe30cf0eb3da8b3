"""A FlashAttention backward for Hopper (sm_90a) in Triton's Gluon dialect (triton 3.6), after FlashAttention-3.

Status: compile-checked for sm_90a (``tools/flash_bench/gluon_bwd_compile.py``), its barrier
protocol, tile ranges and arithmetic modelled on the CPU (``tools/flash_bench/gluon_bwd_model.py``),
and run on an H100 (``tools/flash_bench/gluon_bwd_check.py``): right on every case of the check.
First 0.56-0.63x cuDNN with dQ's float adds (NOTES.md, v15.1); with dQ leaving by TMA reduces
from swizzled buffers (``-tmar-sw``, v17) 0.77-0.88x; with one reduce a tile (``-pair``, the
default at d64 and d128 without causal from v20.8, at d64 alone since v30, d64 without causal since
v37) 0.81-0.86x at d128 and 0.92-0.96x at d64 on an H100, 1.00-1.08x the Triton backward except
1k d128 causal (0.85x) (results/2026-11-28-session15/gluon-bwd-pair); the H200 alike
(results/2026-11-28-session16).
:mod:`.launch` takes it by default where the harness timed it faster than the Triton backward
(:func:`takes`; NOTES.md v27, after v26's fix of a hang when two processes shared the GPU; its dQ
atomics cost the backward's bitwise reproducibility: :data:`ENV_SWITCH`). The design notes and
the prediction below are v15's, from before those runs; ``-tmar`` and ``-pair`` are described
where dQ is. MLA (Q's and K's head dim 192, V's 128;
NOTES.md v24, run on an H200 in v26: 108 of 108 check cases right; v29: 0.73x cuDNN causal, 1.18x
without): Q, K and dK in three chunks of
64 columns (Gluon's shapes are powers of two), S three chained products, dK three accumulators,
and dQ in three pieces through one 64-column float32 buffer a consumer (``_bwd_step_mla``), in
224 KiB of shared memory; its default configuration (``-tmar-sw``) only. Its registers decide its
speed: S and dP are made 32 keys at a time, or ptxas serializes every product (v29). ALiBi and
sliding windows at d64 and d128 (NOTES.md v31, v32; on an H200 in v34 right on the check's 88
cases and 1.15-1.30x the Triton backward with the same variant, so taken since:
:data:`TAKES_ALIBI`, :data:`TAKES_WINDOW`): the bias in :func:`_probabilities`, every tile; a
window's band masked at both ends of the query tiles a key block sees (:func:`band_tiles`). d128's
default since v34 takes L and delta by TMA (``-lt``), the causal mask by row limits (``-rl``) and
dQ's two pieces in flight (``-dqp``): 1.02-1.06x v30's default on an H200, 0.88-0.96x cuDNN in the
main job. d64 causal's default since v37 lays dQ out in 8-column blocks (``-dqb``, v36): 1.06x v30's
in the main job on an H200, 1.00-1.01x cuDNN (1.01-1.04x in the three baseline saves).

The math. For one (batch, query head), with the forward's base-2 LSE ``L_i`` and
``delta_i = rowsum(dO_i * O_i)`` (the Triton path's preprocess kernel, as :mod:`.launch` uses it):

    P_ij  = exp2(c * q_i . k_j - L_i)           c = scale * log2(e)
    dV_j  = sum_i P_ij dO_i
    dP_ij = dO_i . v_j
    dS_ij = P_ij (dP_ij - delta_i)
    dK_j  = scale * sum_i dS_ij q_i
    dQ_i  = scale * sum_j dS_ij k_j

Grid and tiles. A CTA owns ``BLOCK_N = 128`` keys of one (batch, KV head): grid
``(cdiv(Nk, 128), B * Hkv)``. It walks the query tiles of ``BLOCK_M`` rows (64) of each query
head of its group (GQA: dK and dV summed over the group in the accumulators, as the Triton path's
``attn_bwd_dkdv`` does; dQ has its own rows per head). Causal (bottom-right: query ``i`` sees key
``j`` iff ``j <= i + Nk - Nq``): query tiles that see none of the CTA's keys are skipped, those on
the diagonal are masked, the rest run unmasked (:func:`query_tiles`).

Partitions (``gl.warp_specialize``), 12 warps, one CTA per SM (shared memory):

- producer, the default partition, 4 warps (``setmaxnreg`` 24): TMA of the CTA's K and V (two
  64-row halves each, once, barrier ``kv_full``), then ``Q_i`` and ``dO_i`` of each query tile
  into a ring of ``STAGES`` stages (``q_full[s]``: count 1 plus both tiles' bytes; ``q_empty[s]``:
  count 2, one arrive per consumer, the producer waiting parity ``((it // STAGES) & 1) ^ 1``);
- consumers 0 and 1, 4 warps each (``setmaxnreg`` 240), keys ``[64 c, 64 c + 64)`` of the CTA,
  each with its dK_c and dV_c accumulators (64 x d fp32) for the whole CTA. Per query tile, in
  the default layout (queries as the rows of S, FlashAttention-3's at d128):

      wait q_full[s]
      S  = Q_i K_c^T            (async wgmma, 64 x 64; A = Q_i, B = K_c permuted, both shared)
      dP = dO_i V_c^T           (async)
      load L_i, delta_i         (global, under the two products; L = +inf, delta = 0 past Nq)
      wait S:  P = exp2(c S - L) (masked tiles: P = 0 for hidden keys and keys past Nk)
      wait dP: dS = P (dP - delta)
      P, dS -> the consumer's own shared buffers (bf16/fp16), fence
      dV_c += P^T dO_i          (async; A = P's buffer permuted: a transposed A from shared memory)
      dK_c += dS^T Q_i          (async)
      dQ piece h = dS K_c[:, 64 h : 64 h + 64]   (async, one or two pieces of 64 columns)
      wait all: arrive q_empty[s] (no product reads stage s any more)
      scale * dQ piece -> an fp32 shared buffer; then 16 rows at a time,
        red.global.add.v4.f32 into dQ's fp32 [B, Hq, Nq, D] accumulator (rows < Nq)
        (-tmar, the default: store_wait + barrier before the first piece's store, then fence,
        barrier, and one TMA reduce-add of the buffer per 32 columns (-sw) or of all of it,
        issued by one thread; the descriptor drops rows past Nq;
        -pair, d64's default: consumer 1 stores its scaled pieces to a share buffer of its own
        layout and arrives on dq_ready; consumer 0 waits for it, adds each piece of the share
        to its own as it stores that, and arrives on dq_free before its one reduce; consumer 1
        waits on dq_free before the next share;
        -dqp, d128's default since v34: both pieces' products issued together, and the wait
        for all but the newest (dV, dK, piece 0) arrives q_empty[s]; piece 0 is stored while
        piece 1's product runs, then piece 1 waited for and stored;
        -dqb, d64 causal's default since v37 (NOTES.md v36, v37): the buffer and the accumulator
        in 8-column blocks, 4 rows of a block a 128-byte line, one 5-d reduce a tile, put back in
        order by kernels.dq_unblock)

  and at the end dK_c * scale and dV_c go to K_c's and V_c's buffers and out by TMA stores
  (rows past Nk dropped). ``Config(qrows=False)`` (``-krows``) is the other layout (S^T = K_c
  Q_i^T: P^T, dS^T from registers as A operands, L and delta 16 registers a thread each): it
  spilled ~40 instructions a tile at d128, the default 0 (NOTES.md v15).

Without ``-pair``, each consumer adds its own 64 keys' share of dQ: no barrier between the
consumers (``-pair``: two a tile, above). FA3 instead
writes both dS halves to shared memory, syncs the two warp groups, and has a dedicated warp add
dQ with TMA ``reduce-add``. Triton 3.6's Hopper ``tma`` module does not name a reduce, hence v15's
adds from the consumers, twice FA3's dQ traffic (``-noadds``, timing only, measures their cost).
Its Gluon builder does have the op (the Triton path's descriptor atomics lower to it):
``_tma_reduce_add`` issues it, and ``-tmar`` reduces each consumer's share from its fp32 buffer
(still twice FA3's L2 traffic, but no per-thread adds; ``-pair`` halves it). ``-sw`` swizzles
those buffers (128-byte rows, so 32 columns a reduce): unswizzled, a warp's accumulator rows, 512
bytes apart at d128, fall on the same banks, 8-way conflicts on every dQ store. dQ is
summed in whatever order the CTAs arrive: not bit-reproducible run to run (dK, dV are).
``-sum`` (``Config(sum_dq=True)``) is FA3's sum without its TMA reduce: each consumer writes its
share to its fp32 buffer and arrives on ``dq_ready`` (count 2), waits for it (parity ``it & 1``),
adds the sum of both buffers for half the rows, and arrives on ``dq_free`` (count 2), which a
consumer waits for (parity ``(it & 1) ^ 1``) before writing the next tile's share: half the adds,
but the consumers meet twice a tile.

Past the ends: TMA zero-fills rows past a head's end (the 4-d descriptors bound each head). A
query past Nq has L = +inf (loaded so: P = 0) and delta = 0, and its dQ row is not added: no mask
needed. Keys past Nk (only in the last key block, when Nk is not a multiple of 128) are masked:
their K row is 0, so P = exp2(-L) there, which can overflow the input dtype (fp16 once L < -16)
and make inf x 0 = NaN in dQ's product; so the last key block runs every query tile through the
masked path (``query_tiles``). TMA stores drop dK/dV rows past Nk. Causal rows that see no key
(Nq > Nk) have L = +inf from the forward: P = 0 there too.

Counts per (CTA of 128 keys, query tile of 64), d the head dim: five products of 2 x 128 x 64 x d
= 10.5 MFLOP at d128 (5.2 at d64), 3620 clocks of tensor work at 700 TFLOP/s (1.83 GHz, 132 SMs);
8192 exp2 (512 clocks at 16 a clock); the unmasked tile loop is 630 SASS instructions a thread
at d128 (550 at d64), 2 x 630 = 1260 issue cycles per scheduler (35% of the tensor time at d128,
60% at d64). Memory: Q_i + dO_i by TMA, 32 KiB at d128 (16 KiB at d64), read by every key block of
the head (L2); dQ adds 2 x 64 x d x 4 B = 64 KiB at d128: at 700 TFLOP/s that is 4.4 TB/s of L2
reductions plus 2.2 TB/s of Q/dO loads over the GPU. Shared memory: 229,712 B at d128 (STAGES 2,
of 232,448), 147,824 B at d64 (STAGES 3).

Prediction (H100 SXM, bf16; an estimate, not a measurement): if the two consumers drift out of
phase as the forward's did, the issue and exp2 work (35% at d128) hides under the other's
products and the tensor cores stay ~80% busy: ~500 TFLOP/s at 4k-16k d128, 0.9-1.0x cuDNN
(cuDNN: 534 at 16k d128 on an H200, NOTES.md v3's targets). The risk that decides it is the dQ
adds' L2 traffic (4.4 TB/s at that speed, twice FA3's; d64 has the same bytes per FLOP): if L2
reductions cap near 3 TB/s, the backward lands near 0.7-0.8x cuDNN; ``-noadds`` in the check's
timing separates the two. d64 is expected lower than d128 (issue and exp2 are 60% of its tensor
time), as every d64 kernel here. At 1k a CTA walks 16 query tiles (about 8 under causal), so its
prologue (K, V) and epilogue (dK, dV) weigh more; b8-h16 is 1024 CTAs, 7.8 waves.

Not proven until a GPU runs it: that it computes the right numbers (the CPU model mirrors the
design's arithmetic, not the compiled kernel), that the warp-specialized code does not hang (the
protocol model mirrors the barrier calls in the source, not the compiled code), that the
transposed shared-memory A operands (P's and dS's buffers permuted, K_c column pieces) do what
the compile accepted, the atomics' cost, and the speed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# Gluon's names for the kernel, and the host-side checks both Gluon kernels share. The bench tools
# and the tests read GLUON_IMPORT_ERROR, device_reason, HEAD_DIMS, DTYPES and SHARED_LIMIT from
# this module: they stay its names too.
from .gluon_common import (DTYPES, GLUON_IMPORT_ERROR, HEAD_DIMS, LOG2E, SHARED_LIMIT, TensorDescriptor, aligned,
                           dense_reason, descriptor, device_reason, plain_variants, strides_reason)
from .gluon_common import (fence_async_shared, gl, gluon, mbarrier, tma, tma_load, tma_store, thread_barrier,
                           triton, warpgroup_mma, warpgroup_mma_wait)
from . import gluon_common
from .kernels import band

#: Keys a consumer warp group owns: wgmma's M is 64 per warp group.
KEYS_PER_CONSUMER = 64
#: Keys per CTA: two consumer warp groups.
BLOCK_N = 2 * KEYS_PER_CONSUMER
#: Which backward a call this kernel covers takes (:func:`setting`, :func:`takes`). Unset or "1":
#: this kernel for every call it covers (unset meant "where it was timed faster" until v30, when
#: that became every call); "0": the Triton backward. The Triton backward's gradients are the same bits run
#: to run; this kernel's dQ is summed in float atomics in arrival order, so triton_flash declares
#: only its forward deterministic where this kernel can run (:func:`may_run`). It hung when two
#: processes shared the GPU until v26's fix (an unused barrier's word held a live value): on an
#: H200 the kernel before the fix hung at once in two processes, the fixed one ran 6680 calls in
#: each, and the whole main job ran green with it on every call it covers (NOTES.md v27).
ENV_SWITCH = "ATTNKIT_TRITON_FLASH_GLUON_BWD"
#: Whether ALiBi calls (d64, d128) take this kernel (NOTES.md v31). True since an H200 found it
#: right on every ALiBi case of the GPU check and 1.15-1.30x the Triton backward with ALiBi
#: (NOTES.md v34, results/2026-12-01-session24): in the main job 541 TFLOP/s at b1-h16-q16384
#: d128, where the Triton backward had 421 against torch_flex's 424-427. False sends them to the
#: Triton backward.
TAKES_ALIBI = True
#: Whether calls with a sliding window (d64, d128) take this kernel (NOTES.md v32): as
#: :data:`TAKES_ALIBI`, True since v34's H200 check (1.18-1.19x the Triton windowed backward); the
#: main job's windowed case 472 TFLOP/s, where the Triton backward had 399 against torch_flex's 389.
TAKES_WINDOW = True


@dataclass(frozen=True)
class Config:
    """One tile choice: query rows per tile (the N of S^T's product), the Q/dO ring's depth, the
    consumers' register budget (the producer keeps 65536 / 128 - 2 x this)."""

    block_m: int = 64
    stages: int = 2
    consumer_regs: int = 240
    #: dQ's product after dV's and dK's complete (``-split``), instead of all three in flight.
    split_dq: bool = False
    #: Columns of dQ per product (``-qN``): 64 computes d128's dQ share in two halves.
    dq_cols: int = 64
    #: Queries as the rows of S (FlashAttention-3's layout at d128): P and dS through shared
    #: memory. ``-krows``: keys as rows (S^T), P^T and dS^T from registers, L and delta 16
    #: registers a thread each; it spilled at d128 (NOTES.md, v15).
    qrows: bool = True
    #: ``-noadds``: TIMING ONLY, dQ comes out zero: everything but the dQ adds to global memory,
    #: to measure what they cost on the GPU (they are twice FlashAttention-3's traffic).
    dq_adds: bool = True
    #: ``-rot``: each CTA starts its whole query tiles at its own offset (key block index mod
    #: their count), so that the CTAs of a head do not add into the same dQ rows at once.
    rotate: bool = False
    #: ``-sum``: the two consumers' dQ shares summed in shared memory before the adds, each adding
    #: half the rows (half the traffic, FlashAttention-3's sum; two barriers a tile between them).
    sum_dq: bool = False
    #: ``-tmar``: each consumer's dQ share leaves its fp32 shared buffer by one TMA reduce-add
    #: (``cp.reduce.async.bulk.tensor``, issued by one thread) instead of 16-row ``red.global``
    #: adds from every thread: FlashAttention-3's way out, without its sum (NOTES.md, v17).
    tma_dq: bool = False
    #: ``-sw`` (with ``-tmar``): the fp32 dQ buffers 128-byte swizzled, reduced 32 columns at a
    #: time. Unswizzled, a warp's accumulator rows (512 bytes apart at d128) all fall on the same
    #: shared-memory banks: 8-way conflicts on every dQ store.
    dq_swizzle: bool = False
    #: ``-dsr`` (queries as rows only): dQ's product takes dS as its A operand from registers,
    #: where it is computed, instead of from the shared buffer dK's product reads: 8 KiB less
    #: shared-memory reading a consumer a tile at 64 x 64, for 16 more registers held until dQ's
    #: product completes.
    ds_regs: bool = False
    #: ``-pair`` (with ``-tmar``): one reduce a tile instead of two. Consumer 1 stores its scaled
    #: share to its buffer and arrives on ``dq_ready``; consumer 0 waits for it, adds it to its own
    #: share as it stores that, and reduces the sum; its arrival on ``dq_free`` lets consumer 1
    #: write the next tile's share. Half the L2 reductions (cuDNN's way, NOTES.md v20.7), for
    #: consumer 0's loads of the share (in place of the second reduce's read of a buffer) and the
    #: two consumers held at most a tile apart.
    pair_dq: bool = False
    #: ``-ld``: the shared-memory descriptors of the buffers that stay from tile to tile (K_c, V_c,
    #: P, dS, dQ's) made in the tile loop, from a runtime zero the compiler cannot fold, instead of
    #: hoisted out of it and held in registers (where they spilled, and were reloaded before the
    #: products). MLA's kernel always does (NOTES.md v29: 5.4 to 0.9 KiB of spills, 1.17x); d128
    #: causal 1464 to 144 B of spills, the tile loop 847 to 710 instructions; on an H200 1.00-1.08x
    #: the defaults without it (NOTES.md v30), so every d64 and d128 default takes it.
    loop_descriptors: bool = False
    #: ``-lt`` (queries as rows only): each query tile's L and delta come into the Q/dO ring by TMA
    #: with Q and dO, and the consumers read them from shared memory, instead of loading them from
    #: global memory in the step. Loaded in the step, their first use sat between dP's k-steps
    #: and held up its issue: 7.7% of the d128 causal kernel's consumer stall samples (NOTES.md
    #: v30). FlashAttention-3's producer loads them so. Their rows' stride is padded to 16 bytes
    #: where Nq is not a multiple of 4 (a TMA descriptor's rule). d128's default since v34.
    lse_tma: bool = False
    #: ``-rl``: the causal mask compares each key with its row's last visible key (``c <= r +
    #: shift``, two values a thread a tile) instead of ``c - r <= shift``: the ``c - r`` of a
    #: thread's 32 elements do not change from tile to tile, so the compiler hoisted them out of
    #: the loop and held them in 32 registers (the d128 causal kernel's tile loop 710 to 676
    #: instructions compiled; with ``-lt``, 368 B of spills to none; NOTES.md v30). d128's default
    #: since v34 (with ``-lt``, ``-dqp``).
    row_limits: bool = False
    #: ``-dqp`` (d128's two dQ pieces, reduced by TMA, two reduces a tile): both pieces' products
    #: issued at once, the wait for dV's, dK's and the first piece's leaving the second in flight
    #: while the first is stored; the second's wait, then its store. Without it the second
    #: piece's product starts after the first is stored, its latency exposed in each tile.
    #: Compiled (triton 3.6; NOTES.md v33): no serialization, no spill in the tile loops, two
    #: instructions fewer. d128's default since v34 (with ``-lt-rl``). With one piece (d64) it
    #: changes nothing.
    dq_pipe: bool = False
    #: ``-dqs`` (with ``-dqp``): each consumer's two dQ pieces in buffers of their own (the same
    #: shared memory), reduced two each. In one buffer, Triton's shared-memory barrier pass put a
    #: warp-group barrier between the two pieces' stores (disjoint slices, the same threads): one
    #: of the five barriers of d128's tile. Compiled, not yet run on a GPU.
    dq_separate: bool = False
    #: ``-dqb`` (with ``-tmar``, in place of ``-sw``): dQ's fp32 buffer and workspace in blocks of
    #: 8 columns, 4 rows of a block one 128-byte line (:func:`dq_workspace`), so that a half-warp's
    #: accumulator store (4 rows of 32 bytes) is one line: one wavefront, where ``-sw``'s 128-byte
    #: swizzle put rows r and r ^ 1 on the same banks (2-way conflicts on every dQ store: 69M
    #: shared-store wavefronts for 35M ideal in the d128 4k causal kernel, NOTES.md v36). One
    #: reduce a tile (a 5-d box); the blocks are put back in order as dQ is converted. On an H200
    #: 1.14x at 4k causal under Nsight Compute, but timed 0.90x at 4k d128 without causal: d64
    #: causal's default only (1.06x there; NOTES.md v37). With ``-sw`` (``-sw-dqb``) each line's
    #: 16-byte chunks are swizzled as TMA's 128-byte mode does (a line stays one wavefront); on an
    #: H200 no faster than ``-dqb``, its shared-load wavefronts about as many (NOTES.md v37).
    dq_blocked: bool = False
    #: ``-bxN`` (with ``-dqb``): the tile's reduce in N boxes of ``D / 8 / N`` column blocks each,
    #: where ``-dqb`` has one box of all ``D / 8``. ``-bx16`` at d128 (``-bx8`` at d64) makes each box
    #: 2-d (one column block: ``BLOCK_M / 4`` lines of 128 bytes), as ``-sw``'s four are; one
    #: reduce a tile had the TMA unit's reads of the buffer show as 2 shared-load wavefronts a line,
    #: which ``-sw``'s boxes do not (NOTES.md v37, v38).
    dq_boxes: int = 1
    #: ``-flat`` (with ``-dqb``): the blocked workspace seen by the descriptor as 3-d, ``[B * H * D /
    #: 8, N4 / 4, 32]``, where ``-dqb``'s is 5-d: the same boxes and bytes through a 3-d tensor map,
    #: as ``-sw``'s reduces use a 4-d one with two dimensions of one (NOTES.md v38).
    dq_flat: bool = False

    def __post_init__(self) -> None:
        """A configuration the kernel is not written for is refused as it is made, parsed or not."""
        if self.ds_regs and not self.qrows:
            raise ValueError(f"config {self}: -dsr keeps dS as the queries-as-rows layout computes it; "
                             "with keys as rows (-krows) dS^T is in registers already")
        if self.tma_dq and (self.sum_dq or not self.dq_adds):
            raise ValueError(f"config {self}: -tmar is the adds' other way out; not with -sum or -noadds")
        if self.dq_swizzle and not self.tma_dq:
            raise ValueError(f"config {self}: -sw swizzles the buffers -tmar reduces from; it needs -tmar")
        if self.pair_dq and not self.tma_dq:
            raise ValueError(f"config {self}: -pair sums the shares before the TMA reduce; it needs -tmar")
        if (self.lse_tma or self.row_limits) and not self.qrows:
            raise ValueError(f"config {self}: -lt and -rl read L, delta and the mask's limit as a row's each "
                             "(queries as rows); with keys as rows (-krows) they are columns")
        if self.dq_pipe and (not self.qrows or not self.tma_dq or self.pair_dq or self.ds_regs or self.split_dq):
            raise ValueError(f"config {self}: -dqp is written for queries as rows, -tmar with two reduces a tile, "
                             "dS from shared memory and dQ's products beside dV's and dK's")
        if self.dq_blocked and (not self.tma_dq or self.pair_dq):
            raise ValueError(f"config {self}: -dqb lays out the buffer -tmar reduces from; it needs -tmar, and is "
                             "written for two reduces a tile (not -pair)")
        if self.dq_flat and not self.dq_blocked:
            raise ValueError(f"config {self}: -flat is -dqb's workspace seen as 3-d; it needs -dqb")
        if self.dq_boxes != 1 and (not self.dq_blocked or self.dq_boxes not in (2, 4, 8, 16)):
            raise ValueError(f"config {self}: -bxN splits -dqb's one box a tile into N (2, 4, 8 or 16) boxes; it "
                             "needs -dqb")
        if self.dq_separate and (not (self.dq_pipe and self.dq_swizzle) or self.dq_blocked):
            raise ValueError(f"config {self}: -dqs separates -dqp's two pieces, reduced in 32-column boxes "
                             "(-sw's descriptor); it needs -dqp and -sw, without -dqb")

    def __str__(self) -> str:
        return f"m{self.block_m}s{self.stages}{'-split' if self.split_dq else ''}{'' if self.dq_cols == 64 else f'-q{self.dq_cols}'}{'' if self.qrows else '-krows'}{'' if self.dq_adds else '-noadds'}{'-rot' if self.rotate else ''}{'-sum' if self.sum_dq else ''}{'-tmar' if self.tma_dq else ''}{'-sw' if self.dq_swizzle else ''}{'-dqb' if self.dq_blocked else ''}{f'-bx{self.dq_boxes}' if self.dq_boxes != 1 else ''}{'-flat' if self.dq_flat else ''}{'-dsr' if self.ds_regs else ''}{'-pair' if self.pair_dq else ''}{'-ld' if self.loop_descriptors else ''}{'-lt' if self.lse_tma else ''}{'-rl' if self.row_limits else ''}{'-dqp' if self.dq_pipe else ''}{'-dqs' if self.dq_separate else ''}-r{self.consumer_regs}"

    @staticmethod
    def parse(text: str) -> "Config":
        """``m64s2``, ``m128s2``, ``m64s2-split``, ``m64s2-krows``, ``m64s2-q128``, ``m64s3-r232``:
        the form ``str`` writes."""
        parts = text.strip().split("-")
        head = parts[0]
        if not (head.startswith("m") and "s" in head):
            raise ValueError(f"config {text!r}: expected mBLOCKsSTAGES[-split][-qCOLS][-krows][-noadds][-rot][-sum][-tmar[-sw|-dqb[-bxN][-flat]][-pair]][-dsr][-ld][-lt][-rl][-dqp[-dqs]][-rREGS], e.g. m64s2")
        block_m, stages = head[1:].split("s")
        fields = dict(block_m=int(block_m), stages=int(stages))
        for part in parts[1:]:
            if part == "split":
                fields["split_dq"] = True
            elif part == "krows":
                fields["qrows"] = False
            elif part == "noadds":
                fields["dq_adds"] = False
            elif part == "rot":
                fields["rotate"] = True
            elif part == "sum":
                fields["sum_dq"] = True
            elif part == "tmar":
                fields["tma_dq"] = True
            elif part == "sw":
                fields["dq_swizzle"] = True
            elif part == "dqb":
                fields["dq_blocked"] = True
            elif part == "flat":
                fields["dq_flat"] = True
            elif part == "dsr":
                fields["ds_regs"] = True
            elif part == "pair":
                fields["pair_dq"] = True
            elif part == "ld":
                fields["loop_descriptors"] = True
            elif part == "lt":
                fields["lse_tma"] = True
            elif part == "rl":
                fields["row_limits"] = True
            elif part == "dqp":
                fields["dq_pipe"] = True
            elif part == "dqs":
                fields["dq_separate"] = True
            elif part.startswith("bx") and part[2:].isdigit():
                if int(part[2:]) == 1:  # -dqb's own one box: a second name for the same kernel
                    raise ValueError(f"config {text!r}: -bx1 is -dqb as it is (one box a tile); leave it out")
                fields["dq_boxes"] = int(part[2:])
            elif part.startswith("q") and part[1:].isdigit():
                fields["dq_cols"] = int(part[1:])
            elif part.startswith("r") and part[1:].isdigit():
                fields["consumer_regs"] = int(part[1:])
            else:
                raise ValueError(f"config {text!r}: unknown part {part!r}")
        return Config(**fields)  # __post_init__ refuses the combinations the kernel is not written for


def shared_bytes(config: Config, head_dim: int, element_size: int = 2, head_dim_v: int | None = None) -> int:
    """Shared memory the kernel asks for: K and V (128 rows each), the Q/dO ring (with ``-lt``, a
    stage's L and delta too), the two dS buffers, the dQ buffers (MLA, ``head_dim_v`` below
    ``head_dim``: a 64-column piece a consumer), barriers."""
    head_dim_v = head_dim if head_dim_v is None else head_dim_v
    kv = BLOCK_N * (head_dim + head_dim_v) * element_size
    ring = config.stages * config.block_m * ((head_dim + head_dim_v) * element_size + (8 if config.lse_tma else 0))
    ds = (4 if config.qrows else 2) * KEYS_PER_CONSUMER * config.block_m * element_size  # dS (and P)
    dq = 2 * config.block_m * (MLA_CHUNK if head_dim_v != head_dim else head_dim) * 4
    barriers = 8 * (3 + 2 * config.stages)
    return kv + ring + ds + dq + barriers


#: MLA (Q's and K's head dim 192, V's 128: :data:`HEAD_DIM_PAIRS`): Q, K, dK and dQ in chunks of
#: this many columns (Gluon's shapes are powers of two).
MLA_CHUNK = 64
#: (Q's and K's head dim, V's) pairs this backward takes: d64, d128, and MLA's 192 with V's 128.
HEAD_DIM_PAIRS = ((64, 64), (128, 128), (192, 128))


def default_config(head_dim: int, causal: bool) -> Config:
    """64 query rows per tile (FlashAttention-3's tile for d128's backward: 64 x 128); at d64 the
    Q/dO stages are half the size, so a deeper ring costs little. dQ leaves by TMA reduces from
    swizzled buffers (``-tmar-sw``): 1.23-1.48x the adds on an H100 (NOTES.md, v17); one reduce a
    tile (``-pair``) at d64, 1.04-1.11x on an H100 and an H200 (NOTES.md, v20.8, v20.9). The
    buffers' descriptors made in the loop (``-ld``): on an H200 d128 1.00-1.08x its earlier
    defaults (``-pair`` without causal, two reduces with), d64 1.04-1.07x (NOTES.md v30); with
    ``-ld``, d128 with and without ``-pair`` were within 2% of each other, so d128 keeps one way
    causal or not, the one ahead at 16k. d128 adds ``-lt``, ``-rl`` and ``-dqp``: 1.02-1.06x on
    each of the check's six d128 cases on an H200 (NOTES.md v34); at d64 ``-lt``/``-rl`` were
    within 2%, and d64 keeps v30's without causal. d64 causal lays dQ out in blocks (``-dqb``, two
    reduces a tile): 1.06x in two checks on an H200 and 1.02-1.10x the kernel alone at 1k, 4k and
    16k, where without causal it was 0.96-0.97x (NOTES.md v37)."""
    if head_dim == 64:
        if causal:
            return Config(block_m=64, stages=3, tma_dq=True, dq_blocked=True, loop_descriptors=True)
        return Config(block_m=64, stages=3, tma_dq=True, dq_swizzle=True, pair_dq=True, loop_descriptors=True)
    if head_dim == 192:  # MLA: the one way out _bwd_step_mla is written for (two reduces, 224 KiB)
        return Config(block_m=64, stages=2, tma_dq=True, dq_swizzle=True)
    return Config(block_m=64, stages=2, tma_dq=True, dq_swizzle=True, loop_descriptors=True,
                  lse_tma=True, row_limits=True, dq_pipe=True)


def query_tiles(n0: int, n_q: int, n_k: int, block_m: int, causal: bool) -> tuple[int, int, int]:
    """(first, first unmasked, end) query tiles for the key block starting at ``n0``: tiles
    ``[first, whole)`` are masked (the causal diagonal), ``[whole, end)`` are not; the kernel
    computes the same with the same integer formulas (``_attn_bwd_sm90``)."""
    end = -(-n_q // block_m)
    ragged = n0 + BLOCK_N > n_k  # the last key block, past Nk: every tile masked
    if not causal:
        return 0, end if ragged else 0, end
    diag = n_k - n_q
    # Query i sees key j iff j <= i + diag: the block's first key from i >= n0 - diag, its last
    # (n0 + BLOCK_N - 1) from i >= n0 + BLOCK_N - 1 - diag.
    first = min(max(n0 - diag, 0) // block_m, end)
    whole = min(max(-(-max(n0 + BLOCK_N - 1 - diag, 0) // block_m), first), end)
    return first, end if ragged else whole, end


def band_tiles(n0: int, n_q: int, n_k: int, block_m: int, left: int, right: int) -> tuple[int, int, int, int]:
    """(first, first unmasked, first masked again, end) query tiles for the key block starting at
    ``n0`` under a sliding window, the band ``-right <= i + Nk - Nq - j <= left``
    (:func:`.kernels.band`: causal folded into ``right``, an unbounded side 2**30): tiles
    ``[first, whole)`` are masked (the band's upper edge, the causal diagonal's side), ``[whole,
    wend)`` are not, ``[wend, end)`` are masked (its lower edge, the window's far side); tiles
    past ``end`` see none of the block's keys. The kernel computes the same with the same integer
    formulas (``_attn_bwd_sm90``, ``WINDOW``)."""
    limit = -(-n_q // block_m)
    diag = n_k - n_q
    # Query i sees key j iff j - diag - right <= i <= j - diag + left: the block's first key
    # (n0) from i >= n0 - diag - right, its last (n0 + BLOCK_N - 1) up to i <= n0 + BLOCK_N - 1 -
    # diag + left; every key of the block from i >= n0 + BLOCK_N - 1 - diag - right up to
    # i <= n0 - diag + left.
    end = min(-(-max(n0 + BLOCK_N - diag + left, 0) // block_m), limit)
    first = min(max(n0 - diag - right, 0) // block_m, end)
    whole = min(max(-(-max(n0 + BLOCK_N - 1 - diag - right, 0) // block_m), first), end)
    wend = min(max(max(n0 - diag + left + 1, 0) // block_m, whole), end)
    if n0 + BLOCK_N > n_k:  # the last key block, past Nk: every tile masked
        whole = wend = end
    return first, whole, wend, end


def walk_order(t_first: int, t_whole: int, t_end: int, key_block: int, rotate: bool) -> list[int]:
    """The query tiles a CTA walks, in order (``_tile`` in the kernel, the same formulas): the
    masked ones, then the whole ones, rotated by ``key_block mod their count`` with ``rotate``."""
    rot = key_block % max(t_end - t_whole, 1)
    order = []
    for j in range(t_first, t_end):
        t = j
        if rotate and j >= t_whole:
            t = j + rot
            if t >= t_end:
                t -= t_end - t_whole
        order.append(t)
    return order


# ---------------------------------------------------------------------------------------------
# Kernel
# ---------------------------------------------------------------------------------------------

if gl is not None:
    from triton._C.libtriton import ir as _ir
    from triton.experimental.gluon.language._core import builtin as _builtin

    @_builtin
    def _tma_reduce_add(tensor_desc, coord, src, _semantic=None):
        # Triton 3.6's Gluon builds this op (the Triton path's descriptor atomics lower to it)
        # but its Hopper ``tma`` module does not name it: ``cp.reduce.async.bulk.tensor.add``
        # of a shared buffer into global memory, one thread issuing, as TMA stores are.
        coord = _semantic._convert_to_ir_values(coord, require_i64=False)
        _semantic.builder.create_async_tma_reduce(_ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord,
                                                  src.handle)

    @gluon.jit
    def _blocks(x):
        # -dqb: a [rows, cols] accumulator as [cols / 8, rows / 4, 4 x 8], the blocked dQ buffer's
        # shape: each 8-column block of 4 rows one 128-byte line. A relabelling of the same
        # registers (Config.dq_blocked).
        ROWS: gl.constexpr = x.shape[0]
        COLS: gl.constexpr = x.shape[1]
        quads = gl.permute(gl.reshape(x, [ROWS // 4, 4, COLS // 8, 8]), (2, 0, 1, 3))
        return gl.reshape(quads, [COLS // 8, ROWS // 4, 32])

    @gluon.jit
    def _store_dq_piece(dq_buf, x, h: gl.constexpr, DQ_N: gl.constexpr, DQ_PARTS: gl.constexpr,
                        BLOCKED: gl.constexpr):
        # Piece h (DQ_N columns) of a consumer's dQ into its buffer: -dqb's 8-column blocks
        # (_blocks), the whole buffer when the piece is all of dQ, else a column slice.
        if BLOCKED:
            dq_buf.slice(h * (DQ_N // 8), DQ_N // 8, dim=0).store(_blocks(x))
        elif DQ_PARTS == 1:
            dq_buf.store(x)
        else:
            dq_buf.slice(h * DQ_N, DQ_N, dim=1).store(x)

    @gluon.jit
    def _runtime_zero(it):
        # 0 for any tile count a CTA walks (far fewer than 2**30), but not to the compiler: a buffer
        # indexed with it gets its shared-memory descriptor made where it is used, in the tile loop,
        # instead of hoisted out of it and held in registers, where it spilled (NOTES.md v29).
        return it // 1073741824

    @gluon.jit
    def _tile(j, t_whole, t_end, rot, ROTATE: gl.constexpr):
        # The j-th query tile a CTA walks: j itself, or (ROTATE) the whole tiles [t_whole, t_end)
        # started at t_whole + rot and wrapped, so that the CTAs of one head (rot = the key block
        # index mod their count) add into different dQ rows at a time.
        if ROTATE:
            t = j
            if j >= t_whole:
                t = j + rot
                if t >= t_end:
                    t = t - (t_end - t_whole)
        else:
            t = j
        return t

    @gluon.jit
    def _bwd_producer(q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem,
                      kv_full, q_full, q_empty, off_b, off_hkv, n0, GROUP, t_first, t_whole, t_end, rot,
                      BLOCK_M: gl.constexpr, STAGES: gl.constexpr, KEYS: gl.constexpr, ROTATE: gl.constexpr,
                      QK_CHUNKS: gl.constexpr, QK_CHUNK: gl.constexpr, lse_desc, delta_desc, lsd_smem,
                      LSE_TMA: gl.constexpr):
        # K and V: one 64-row half per consumer, once, on one barrier. QK_CHUNKS > 1 (MLA): Q's
        # and K's head dim in chunks of QK_CHUNK columns, a TMA and a buffer each (consumer c's
        # K chunk j in buffer c * QK_CHUNKS + j, stage s's Q chunk j in s * QK_CHUNKS + j).
        # LSE_TMA (-lt): stage s's L and delta too, in lsd_smem's buffers 2 s and 2 s + 1.
        mbarrier.expect(kv_full.index(0), 2 * QK_CHUNKS * k_desc.block_type.nbytes + 2 * v_desc.block_type.nbytes)
        for c in gl.static_range(2):
            for ch in gl.static_range(QK_CHUNKS):
                tma_load(k_desc, [off_b, off_hkv, n0 + c * KEYS, ch * QK_CHUNK],
                         kv_full.index(0), k_smem.index(c * QK_CHUNKS + ch))
            tma_load(v_desc, [off_b, off_hkv, n0 + c * KEYS, 0], kv_full.index(0), v_smem.index(c))
        # Q_i and dO_i of every query tile of every head of the group, into the ring.
        if LSE_TMA:
            tile_bytes: gl.constexpr = (QK_CHUNKS * q_desc.block_type.nbytes + do_desc.block_type.nbytes
                                        + lse_desc.block_type.nbytes + delta_desc.block_type.nbytes)
        else:
            tile_bytes: gl.constexpr = QK_CHUNKS * q_desc.block_type.nbytes + do_desc.block_type.nbytes
        it = 0
        for g in range(GROUP):
            off_h = off_hkv * GROUP + g
            for j in range(t_first, t_end):
                # The consumers' order: the masked tiles, then the whole ones (rotated if ROTATE).
                t = _tile(j, t_whole, t_end, rot, ROTATE)
                s = it % STAGES
                mbarrier.wait(q_empty.index(s), ((it // STAGES) & 1) ^ 1)
                mbarrier.expect(q_full.index(s), tile_bytes)
                for ch in gl.static_range(QK_CHUNKS):
                    tma_load(q_desc, [off_b, off_h, t * BLOCK_M, ch * QK_CHUNK], q_full.index(s),
                             q_smem.index(s * QK_CHUNKS + ch))
                tma_load(do_desc, [off_b, off_h, t * BLOCK_M, 0], q_full.index(s), do_smem.index(s))
                if LSE_TMA:  # rows past Nq read zeros (_ring_lse_delta says why that is right)
                    tma_load(lse_desc, [off_b, off_h, t * BLOCK_M], q_full.index(s), lsd_smem.index(2 * s))
                    tma_load(delta_desc, [off_b, off_h, t * BLOCK_M], q_full.index(s), lsd_smem.index(2 * s + 1))
                it += 1

    @gluon.jit
    def _rows_lse_delta(lse_h, delta_h, t, n_q, sq_layout: gl.constexpr, BLOCK_M: gl.constexpr):
        # Query tile t's L and delta, a row's each (queries as S's rows); rows past Nq: L = +inf
        # (P = 0) and delta = 0.
        qrows = t * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, sq_layout))
        in_q = qrows < n_q
        lse = gl.load(lse_h + qrows, mask=in_q, other=float("inf"))
        delta = gl.load(delta_h + qrows, mask=in_q, other=0.0)
        return lse, delta

    @gluon.jit
    def _ring_lse_delta(lsd_smem, s, sq_layout: gl.constexpr, t, n_q, BLOCK_M: gl.constexpr, ALIBI: gl.constexpr):
        # -lt: the tile's L and delta from stage s of the ring, where the producer's TMA put them.
        # Rows past Nq read zeros there (not _rows_lse_delta's L = +inf): their Q and dO rows are
        # zeros too, so S = 0, P = exp2(0) = 1, dP = 0 and dS = 1 x (0 - 0) = 0, and dV's and dK's
        # products add nothing from them; their dQ rows the TMA reduce drops. With ALiBi, P there
        # would be exp2(-slope |d|), which a negative slope (the contract allows any sign)
        # overflows into inf, and inf x 0 is NaN: those rows take L = +inf (P = 0), two selects.
        rows_layout: gl.constexpr = gl.SliceLayout(1, sq_layout)
        lse = lsd_smem.index(2 * s).load(rows_layout)
        delta = lsd_smem.index(2 * s + 1).load(rows_layout)
        if ALIBI:
            rows = t * BLOCK_M + gl.arange(0, BLOCK_M, layout=rows_layout)
            lse = gl.where(rows < n_q, lse, float("inf"))
        return lse, delta

    @gluon.jit
    def _probabilities(sc, lse, t, key0, n_k, diag, qk_scale, sq_layout: gl.constexpr, BLOCK_M: gl.constexpr,
                       KEYS: gl.constexpr, CAUSAL: gl.constexpr, MASKED: gl.constexpr, ROW_LIMITS: gl.constexpr = False,
                       ALIBI: gl.constexpr = False, slope=0.0, WINDOW: gl.constexpr = False, win_left=0, win_right=0):
        # P = exp2(c S - L), queries as rows. MASKED: keys past Nk (the last key block), and under
        # causal key j = key0 + c seen by query i = t * BLOCK_M + r iff c - r <= shift: local
        # indices only, which ptxas derives from the lane (no 16 key registers). ROW_LIMITS (-rl):
        # as c <= r + shift, whose right side changes with the tile (Config.row_limits).
        # ALIBI: the base-2 scores take ``- slope * |i + Nk - Nq - j|`` (``slope`` times log2(e)),
        # in every tile, as the forward's do (gluon_forward._softmax): the positions in float32,
        # exact below 2**24, so the bias is the forward's bit for bit and L (which holds it) fits.
        # The distance is float(r_all - (c & 6)) - float(c - (c & 6)): in the wgmma accumulator a
        # thread's 16 columns are 2 (lane % 4) + {0, 1} + 8 n, so c & 6 is the lane's and the rest
        # a constant of each element; written as float(row) - float(col), the 16 key positions were
        # hoisted into registers and the d128 kernel spilled in its loops (NOTES.md v31).
        if ALIBI:
            c_all = gl.arange(0, KEYS, layout=gl.SliceLayout(0, sq_layout))
            c_lane = c_all & 6
            r_all = t * BLOCK_M + diag - key0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, sq_layout))
            dist = (r_all[:, None] - c_lane[None, :]).to(gl.float32) - (c_all - c_lane).to(gl.float32)[None, :]
            pq = gl.exp2((sc * qk_scale - lse[:, None]) - slope * gl.abs(dist))
        else:
            pq = gl.exp2(sc * qk_scale - lse[:, None])
        if MASKED:
            c_idx = gl.arange(0, KEYS, layout=gl.SliceLayout(0, sq_layout))
            visible = c_idx[None, :] < n_k - key0
            if WINDOW:
                # WINDOW: the band -win_right <= i + diag - j <= win_left (causal folded into
                # win_right by the host; CAUSAL is not read), as c - r against the tile's shift.
                shift = t * BLOCK_M + diag - key0
                r_idx = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, sq_layout))
                visible = (visible & (c_idx[None, :] <= (r_idx + (shift + win_right))[:, None])
                           & (c_idx[None, :] >= (r_idx + (shift - win_left))[:, None]))
            elif CAUSAL:
                shift = t * BLOCK_M + diag - key0
                r_idx = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, sq_layout))
                if ROW_LIMITS:
                    visible = visible & (c_idx[None, :] <= (r_idx + shift)[:, None])
                else:
                    visible = visible & (c_idx[None, :] - r_idx[:, None] <= shift)
            pq = gl.where(visible, pq, 0.0)
        return pq

    @gluon.jit
    def _bwd_step(it, t, q_smem, do_smem, k_smem, v_smem, ds_smem, p_smem, dq_smem, share_smem, dq_ready, dq_free, q_full, q_empty,
                  dk, dv,
                  lse_h, delta_h, dq_h, off_b, off_h, key0, n_q, n_k, diag, qk_scale, sm_scale,
                  kv_layout: gl.constexpr, add_layout: gl.constexpr, BLOCK_M: gl.constexpr,
                  HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, KEYS: gl.constexpr, CAUSAL: gl.constexpr,
                  MASKED: gl.constexpr, SPLIT_DQ: gl.constexpr, DQ_PARTS: gl.constexpr, QROWS: gl.constexpr,
                  DQ_ADDS: gl.constexpr, CID: gl.constexpr, SUM_DQ: gl.constexpr, TMA_DQ: gl.constexpr,
                  DQ_SWIZZLE: gl.constexpr, DS_REGS: gl.constexpr, PAIR_DQ: gl.constexpr,
                  LOOP_DESC: gl.constexpr, lsd_smem, LSE_TMA: gl.constexpr, ROW_LIMITS: gl.constexpr,
                  ALIBI: gl.constexpr = False, slope=0.0, WINDOW: gl.constexpr = False, win_left=0, win_right=0,
                  DQ_PIPE: gl.constexpr = False):
        # One query tile for this consumer's 64 keys: see the module docstring for the order.
        # LOOP_DESC (-ld): the buffers' descriptors made here, as MLA's step makes them (v29).
        if LOOP_DESC:
            zero = _runtime_zero(it)
        else:
            zero = 0
        k_c = k_smem.index(CID + zero)
        v_c = v_smem.index(CID + zero)
        ds_buf = ds_smem.index(CID + zero)
        p_buf = p_smem.index(CID + zero)
        if PAIR_DQ:  # one buffer to reduce from, consumer 0's; consumer 1's share goes to share_smem
            dq_buf = dq_smem.index(0 + zero)
        else:
            dq_buf = dq_smem.index(CID + zero)
        s = it % STAGES
        q_s = q_smem.index(s)
        do_s = do_smem.index(s)
        mbarrier.wait(q_full.index(s), (it // STAGES) & 1)
        if QROWS:
            # FlashAttention-3's layout at d128: S = Q_i K_c^T with the queries as rows, so that
            # L and delta are 2 registers a thread (a row's), and P, dS go to shared memory, the
            # A operands (transposed) of dV's and dK's products and (as is) of dQ's.
            sq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                                instr_shape=[16, KEYS, 16])
            sc = gl.zeros([BLOCK_M, KEYS], gl.float32, layout=sq_layout)
            dp = gl.zeros([BLOCK_M, KEYS], gl.float32, layout=sq_layout)
            sc = warpgroup_mma(q_s, k_c.permute((1, 0)), sc, use_acc=False, is_async=True)
            dp = warpgroup_mma(do_s, v_c.permute((1, 0)), dp, use_acc=False, is_async=True)
            if LSE_TMA:
                lse, delta = _ring_lse_delta(lsd_smem, s, sq_layout, t, n_q, BLOCK_M, ALIBI)
            else:
                lse, delta = _rows_lse_delta(lse_h, delta_h, t, n_q, sq_layout, BLOCK_M)
            sc = warpgroup_mma_wait(num_outstanding=1, deps=(sc, ))
            pq = _probabilities(sc, lse, t, key0, n_k, diag, qk_scale, sq_layout, BLOCK_M, KEYS, CAUSAL, MASKED,
                                ROW_LIMITS, ALIBI, slope, WINDOW, win_left, win_right)
            dp = warpgroup_mma_wait(num_outstanding=0, deps=(dp, ))
            dsq = pq * (dp - delta[:, None])
            # The previous tile's products that read these buffers completed at its last wait.
            p_buf.store(pq.to(q_s.dtype))
            ds_buf.store(dsq.to(q_s.dtype))
            fence_async_shared()
            dv = warpgroup_mma(p_buf.permute((1, 0)), do_s, dv, is_async=True)
            dk = warpgroup_mma(ds_buf.permute((1, 0)), q_s, dk, is_async=True)
            if DS_REGS:
                # dQ's A operand from registers (the layout of dQ's accumulator below, as its parent).
                dsr_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                                     instr_shape=[16, HEAD_DIM // DQ_PARTS, 16])
                ds_a = gl.convert_layout(dsq.to(q_s.dtype),
                                         gl.DotOperandLayout(operand_index=0, parent=dsr_layout, k_width=2))
            else:
                ds_a = ds_buf
            if SPLIT_DQ:
                dv, dk = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk))
        else:
            # Keys as rows (S^T = K_c Q_i^T): P^T and dS^T stay in registers as the A operands of
            # dV's and dK's products; L and delta are 16 registers a thread each (columns).
            s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                               instr_shape=[16, BLOCK_M, 16])
            a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2)
            # Fresh accumulators (use_acc=False): carried through the loop they would hold 2 x 32
            # registers across the dV/dK/dQ products.
            st = gl.zeros([KEYS, BLOCK_M], gl.float32, layout=s_layout)
            dpt = gl.zeros([KEYS, BLOCK_M], gl.float32, layout=s_layout)
            st = warpgroup_mma(k_c, q_s.permute((1, 0)), st, use_acc=False, is_async=True)
            dpt = warpgroup_mma(v_c, do_s.permute((1, 0)), dpt, use_acc=False, is_async=True)
            # The tile's L and delta, along S^T's columns (queries); rows past Nq: L = +inf (P = 0).
            cols = t * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, s_layout))
            in_q = cols < n_q
            lse = gl.load(lse_h + cols, mask=in_q, other=float("inf"))
            delta = gl.load(delta_h + cols, mask=in_q, other=0.0)
            st = warpgroup_mma_wait(num_outstanding=1, deps=(st, ))
            pt = gl.exp2(st * qk_scale - lse[None, :])
            if MASKED:
                # As in the QROWS branch, transposed.
                r_idx = gl.arange(0, KEYS, layout=gl.SliceLayout(1, s_layout))
                visible = r_idx[:, None] < n_k - key0
                if CAUSAL:
                    shift = t * BLOCK_M + diag - key0
                    c_idx = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, s_layout))
                    visible = visible & (r_idx[:, None] - c_idx[None, :] <= shift)
                pt = gl.where(visible, pt, 0.0)
            dpt = warpgroup_mma_wait(num_outstanding=0, deps=(dpt, ))
            dst = pt * (dpt - delta[None, :])
            p_op = gl.convert_layout(pt.to(q_s.dtype), a_layout)
            ds_lo = dst.to(q_s.dtype)
            ds_op = gl.convert_layout(ds_lo, a_layout)
            dv = warpgroup_mma(p_op, do_s, dv, is_async=True)
            dk = warpgroup_mma(ds_op, q_s, dk, is_async=True)
            # dS^T to this consumer's buffer (the previous tile's dQ product that read it has
            # completed: the wait at the end of the previous step), for dQ's product.
            ds_buf.store(ds_lo)
            fence_async_shared()
            ds_a = ds_buf.permute((1, 0))
            if SPLIT_DQ:
                # dV and dK complete before dQ's product starts.
                dv, dk, p_op, ds_op = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk, p_op, ds_op))
        # dQ_i's share of these keys, DQ_PARTS column pieces of K_c at a time (d128: two of 64, so
        # that its accumulator is 32 registers a thread, not 64, beside dK's and dV's 128), each
        # through shared memory (scaled) to the adds below.
        DQ_N: gl.constexpr = HEAD_DIM // DQ_PARTS
        dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                            instr_shape=[16, DQ_N, 16])
        PIPE: gl.constexpr = DQ_PIPE and DQ_PARTS == 2
        if PIPE:
            # -dqp: both pieces in flight; the wait for all but the newest group retires dV's,
            # dK's and piece 0's products (groups complete in order), so stage s goes back and
            # piece 0 is stored while piece 1's product runs. Then piece 1 (Config.dq_pipe).
            dq0 = gl.zeros([BLOCK_M, DQ_N], gl.float32, layout=dq_layout)
            dq1 = gl.zeros([BLOCK_M, DQ_N], gl.float32, layout=dq_layout)
            dq0 = warpgroup_mma(ds_a, k_c.slice(0, DQ_N, dim=1), dq0, use_acc=False, is_async=True)
            dq1 = warpgroup_mma(ds_a, k_c.slice(DQ_N, DQ_N, dim=1), dq1, use_acc=False, is_async=True)
            dv, dk, dq0 = warpgroup_mma_wait(num_outstanding=1, deps=(dv, dk, dq0))
            mbarrier.arrive(q_empty.index(s), count=1)
            # The previous tile's reduce has read the buffer: its issuing thread waits, and the
            # warp group waits for that thread.
            tma.store_wait(pendings=0)
            thread_barrier()
            if DQ_PIPE == 2:
                # -dqs: the pieces in buffers of their own (piece 1's in share_smem), so Triton's
                # shared-memory barrier pass puts no barrier between their stores (Config.dq_separate).
                dq_buf.store(dq0 * sm_scale)
                dq1 = warpgroup_mma_wait(num_outstanding=0, deps=(dq1, ))
                share_smem.index(CID + zero).store(dq1 * sm_scale)
            else:
                _store_dq_piece(dq_buf, dq0 * sm_scale, 0, DQ_N, DQ_PARTS, DQ_SWIZZLE >= 2)
                dq1 = warpgroup_mma_wait(num_outstanding=0, deps=(dq1, ))
                _store_dq_piece(dq_buf, dq1 * sm_scale, 1, DQ_N, DQ_PARTS, DQ_SWIZZLE >= 2)
        for h in gl.static_range(0 if PIPE else DQ_PARTS):
            dq = gl.zeros([BLOCK_M, DQ_N], gl.float32, layout=dq_layout)
            if DQ_PARTS == 1:
                k_part = k_c
            else:
                k_part = k_c.slice(h * DQ_N, DQ_N, dim=1)
            dq = warpgroup_mma(ds_a, k_part, dq, use_acc=False, is_async=True)
            if h == 0:
                # wgmma groups complete in order: dV's and dK's too (and the registers they read).
                if QROWS and DS_REGS:  # dS's registers too, until dQ's product has read them
                    dv, dk, dq, ds_a = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk, dq, ds_a))
                elif QROWS:
                    dv, dk, dq = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk, dq))
                else:
                    dv, dk, dq, p_op, ds_op = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk, dq, p_op, ds_op))
                # Every product that read stage s has completed: it goes back to the producer.
                mbarrier.arrive(q_empty.index(s), count=1)
            elif DS_REGS:
                dq, ds_a = warpgroup_mma_wait(num_outstanding=0, deps=(dq, ds_a))
            else:
                dq = warpgroup_mma_wait(num_outstanding=0, deps=(dq, ))
            if SUM_DQ:
                if h == 0:
                    # Both consumers have read the previous tile's two buffers (a fresh barrier
                    # passes parity 1: tile 0 goes straight in).
                    mbarrier.wait(dq_free.index(0), (it & 1) ^ 1)
            if TMA_DQ:
                if h == 0:
                    if PAIR_DQ and CID == 1:
                        # -pair: consumer 0 has read the previous tile's share from this buffer (a
                        # fresh barrier passes parity 1: tile 0 goes straight in).
                        mbarrier.wait(dq_free.index(0), (it & 1) ^ 1)
                    else:
                        if PAIR_DQ:
                            # Consumer 1's share of this tile is in its buffer.
                            mbarrier.wait(dq_ready.index(0), it & 1)
                        # The previous tile's reduce has read the buffer: its issuing thread waits,
                        # and the warp group waits for that thread.
                        tma.store_wait(pendings=0)
                        thread_barrier()
            if PAIR_DQ and CID == 1:
                share_smem.index(h).store(dq * sm_scale)
            else:
                if PAIR_DQ:
                    dq = dq * sm_scale + share_smem.index(h).load(dq_layout)
                else:
                    dq = dq * sm_scale
                _store_dq_piece(dq_buf, dq, h, DQ_N, DQ_PARTS, DQ_SWIZZLE >= 2)
        if SUM_DQ:
            # FlashAttention-3's sum: both consumers' shares meet in shared memory, and each adds
            # half the rows of their sum (half the adds of the default, the consumers in step).
            mbarrier.arrive(dq_ready.index(0), count=1)
            mbarrier.wait(dq_ready.index(0), it & 1)
            HALF: gl.constexpr = BLOCK_M // 2
            for r in gl.static_range(HALF // 16 if DQ_ADDS else 0):
                part = (dq_smem.index(0).slice(CID * HALF + r * 16, 16, dim=0).load(add_layout)
                        + dq_smem.index(1).slice(CID * HALF + r * 16, 16, dim=0).load(add_layout))
                rows = t * BLOCK_M + CID * HALF + r * 16 + gl.arange(0, 16, layout=gl.SliceLayout(1, add_layout))
                dcols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, add_layout))
                offsets = rows[:, None] * HEAD_DIM + dcols[None, :]
                gl.atomic_add(dq_h + offsets, part, mask=(rows < n_q)[:, None], sem="relaxed", scope="gpu")
            mbarrier.arrive(dq_free.index(0), count=1)
        elif TMA_DQ and PAIR_DQ and CID == 1:
            # -pair: every thread's share is in the buffer (the barrier) before the one thread's
            # arrival (a release) lets consumer 0 read it. Triton's shared-memory barrier pass
            # would put this barrier here too (gluon_bwd_compile.py checks the PTX for it).
            thread_barrier()
            mbarrier.arrive(dq_ready.index(0), count=1)
        elif TMA_DQ:
            # Every thread's share is in the buffer (the barrier), seen by the async proxy (the
            # fence); the descriptor bounds the head, so rows past Nq are dropped (-dqb: rows up to
            # N4, the workspace's padding, are added into and never read back).
            fence_async_shared()
            thread_barrier()
            if PAIR_DQ:
                # Consumer 1's share has been read (it is in the sum): its buffer is free.
                mbarrier.arrive(dq_free.index(0), count=1)
            if DQ_PIPE == 2 and PIPE:  # -dqs: piece 0's two reduces from dq_buf, piece 1's from its own
                for c in gl.static_range(HEAD_DIM // 32):
                    piece = dq_buf if c < DQ_N // 32 else share_smem.index(CID + zero)
                    _tma_reduce_add(dq_h, [off_b, off_h, t * BLOCK_M, c * 32],
                                    piece.slice((c * 32) % DQ_N, 32, dim=1))
            elif DQ_SWIZZLE >= 4:  # -dqb-flat: the same boxes through a 3-d descriptor, off_b is the
                # (batch, head)'s first block row (_bwd_consumer)
                BOX: gl.constexpr = dq_h.block_shape[0]
                for c in gl.static_range(HEAD_DIM // 8 // BOX):
                    _tma_reduce_add(dq_h, [off_b + c * BOX, t * (BLOCK_M // 4), 0], dq_buf.slice(c * BOX, BOX, dim=0))
            elif DQ_SWIZZLE >= 2:  # -dqb: the [D / 8, BLOCK_M / 4, 32] buffer in boxes of the descriptor's
                # column blocks: all D / 8 (one 5-d box a tile), or fewer (-bxN)
                BOX: gl.constexpr = dq_h.block_shape[2]
                for c in gl.static_range(HEAD_DIM // 8 // BOX):
                    _tma_reduce_add(dq_h, [off_b, off_h, c * BOX, t * (BLOCK_M // 4), 0],
                                    dq_buf.slice(c * BOX, BOX, dim=0))
            elif DQ_SWIZZLE:
                for c in gl.static_range(HEAD_DIM // 32):
                    _tma_reduce_add(dq_h, [off_b, off_h, t * BLOCK_M, c * 32], dq_buf.slice(c * 32, 32, dim=1))
            else:
                _tma_reduce_add(dq_h, [off_b, off_h, t * BLOCK_M, 0], dq_buf)
        else:
            for r in gl.static_range(BLOCK_M // 16 if DQ_ADDS else 0):
                part = dq_buf.slice(r * 16, 16, dim=0).load(add_layout)
                rows = t * BLOCK_M + r * 16 + gl.arange(0, 16, layout=gl.SliceLayout(1, add_layout))
                dcols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, add_layout))
                offsets = rows[:, None] * HEAD_DIM + dcols[None, :]
                gl.atomic_add(dq_h + offsets, part, mask=(rows < n_q)[:, None], sem="relaxed", scope="gpu")
        return dk, dv

    @gluon.jit
    def _bwd_consumer(q_smem, do_smem, k_smem, v_smem, ds_smem, p_smem, dq_smem, share_smem, kv_full, q_full, q_empty,
                      dq_ready, dq_free,
                      lse_ptr, delta_ptr, dq_ptr, dk_desc, dv_desc,
                      off_b, off_hkv, n0, H_Q, GROUP, n_q, n_k, t_first, t_whole, t_end, rot, qk_scale, sm_scale,
                      HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr,
                      KEYS: gl.constexpr, CID: gl.constexpr, CAUSAL: gl.constexpr, SPLIT_DQ: gl.constexpr,
                      DQ_PARTS: gl.constexpr, QROWS: gl.constexpr, DQ_ADDS: gl.constexpr, ROTATE: gl.constexpr,
                      SUM_DQ: gl.constexpr, TMA_DQ: gl.constexpr, DQ_SWIZZLE: gl.constexpr,
                      DS_REGS: gl.constexpr, PAIR_DQ: gl.constexpr, LOOP_DESC: gl.constexpr, lsd_smem,
                      LSE_TMA: gl.constexpr, ROW_LIMITS: gl.constexpr, slopes_ptr, ALIBI: gl.constexpr,
                      t_wend, win_left, win_right, WINDOW: gl.constexpr, DQ_PIPE: gl.constexpr):
        kv_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                            instr_shape=[16, HEAD_DIM, 16])
        k_c = k_smem.index(CID)  # dK's and dV's way out; the step takes this consumer's buffers itself
        v_c = v_smem.index(CID)
        # The dQ adds: each thread 4 (d128) or 2 (d64) consecutive floats of a row, a warp a row.
        add_layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, HEAD_DIM // 32], threads_per_warp=[1, 32],
                                                    warps_per_cta=[4, 1], order=[1, 0])
        key0 = n0 + CID * KEYS
        diag = n_k - n_q
        dk = gl.zeros([KEYS, HEAD_DIM], gl.float32, layout=kv_layout)
        dv = gl.zeros([KEYS, HEAD_DIM], gl.float32, layout=kv_layout)
        mbarrier.wait(kv_full.index(0), 0)
        it = 0
        for g in range(GROUP):
            off_h = off_hkv * GROUP + g
            row_base = (off_b * H_Q + off_h).to(gl.int64) * n_q
            if LSE_TMA:  # descriptors, which the producer loads from (_ring_lse_delta reads the ring)
                lse_h = lse_ptr
                delta_h = delta_ptr
            else:
                lse_h = lse_ptr + row_base
                delta_h = delta_ptr + row_base
            if TMA_DQ:
                dq_h = dq_ptr  # dQ's descriptor: the reduce addresses (batch, head, row)
            else:
                dq_h = dq_ptr + row_base * HEAD_DIM
            if DQ_SWIZZLE >= 4:  # -flat: the step's reduce addresses block rows, from this head's first
                dq_b = (off_b * H_Q + off_h) * (HEAD_DIM // 8)
            else:
                dq_b = off_b
            if ALIBI:  # this (batch, query head)'s slope, times log2(e) ([B, Hq] contiguous)
                slope = gl.load(slopes_ptr + off_b * H_Q + off_h)
            else:
                slope = 0.0
            # The causal diagonal's tiles (masked), then the tiles every key of the CTA sees whole.
            for t in range(t_first, t_whole):
                dk, dv = _bwd_step(it, t, q_smem, do_smem, k_smem, v_smem, ds_smem, p_smem, dq_smem, share_smem, dq_ready, dq_free,
                                   q_full, q_empty, dk, dv,
                                   lse_h, delta_h, dq_h, dq_b, off_h, key0, n_q, n_k, diag, qk_scale, sm_scale,
                                   kv_layout, add_layout, BLOCK_M, HEAD_DIM, STAGES, KEYS, CAUSAL,
                                   True, SPLIT_DQ, DQ_PARTS, QROWS, DQ_ADDS, CID, SUM_DQ, TMA_DQ, DQ_SWIZZLE,
                                   DS_REGS, PAIR_DQ, LOOP_DESC, lsd_smem, LSE_TMA, ROW_LIMITS, ALIBI, slope,
                                   WINDOW, win_left, win_right, DQ_PIPE)
                it += 1
            if WINDOW:  # the whole tiles end where the window's far edge starts masking again
                t_stop = t_wend
            else:
                t_stop = t_end
            for j in range(t_whole, t_stop):
                t = _tile(j, t_whole, t_end, rot, ROTATE)
                dk, dv = _bwd_step(it, t, q_smem, do_smem, k_smem, v_smem, ds_smem, p_smem, dq_smem, share_smem, dq_ready, dq_free,
                                   q_full, q_empty, dk, dv,
                                   lse_h, delta_h, dq_h, dq_b, off_h, key0, n_q, n_k, diag, qk_scale, sm_scale,
                                   kv_layout, add_layout, BLOCK_M, HEAD_DIM, STAGES, KEYS, CAUSAL,
                                   False, SPLIT_DQ, DQ_PARTS, QROWS, DQ_ADDS, CID, SUM_DQ, TMA_DQ, DQ_SWIZZLE,
                                   DS_REGS, PAIR_DQ, LOOP_DESC, lsd_smem, LSE_TMA, ROW_LIMITS, ALIBI, slope,
                                   False, 0, 0, DQ_PIPE)
                it += 1
            if WINDOW:  # the window's far edge (band_tiles: [wend, end)), masked
                for t in range(t_wend, t_end):
                    dk, dv = _bwd_step(it, t, q_smem, do_smem, k_smem, v_smem, ds_smem, p_smem, dq_smem, share_smem,
                                       dq_ready, dq_free, q_full, q_empty, dk, dv,
                                       lse_h, delta_h, dq_h, dq_b, off_h, key0, n_q, n_k, diag, qk_scale, sm_scale,
                                       kv_layout, add_layout, BLOCK_M, HEAD_DIM, STAGES, KEYS, CAUSAL,
                                       True, SPLIT_DQ, DQ_PARTS, QROWS, DQ_ADDS, CID, SUM_DQ, TMA_DQ, DQ_SWIZZLE,
                                       DS_REGS, PAIR_DQ, LOOP_DESC, lsd_smem, LSE_TMA, ROW_LIMITS, ALIBI, slope,
                                       WINDOW, win_left, win_right, DQ_PIPE)
                    it += 1
        # dK (times the softmax scale) and dV of this consumer's keys, through K_c's and V_c's
        # buffers (no product reads them any more: every wait above was for 0 outstanding) and
        # TMA stores, which drop rows past Nk. Plain stores from the wgmma layout needed 64-bit
        # addresses beside both accumulators, and spilled at d128.
        k_c.store(gl.convert_layout((dk * sm_scale).to(k_c.dtype), kv_layout))
        v_c.store(gl.convert_layout(dv.to(v_c.dtype), kv_layout))
        fence_async_shared()
        tma_store(dk_desc, [off_b, off_hkv, key0, 0], k_c)
        tma_store(dv_desc, [off_b, off_hkv, key0, 0], v_c)
        tma.store_wait(pendings=0)

    @gluon.jit
    def _bwd_step_mla(it, t, q_smem, do_smem, k_smem, v_smem, ds_smem, p_smem, dq_smem, q_full, q_empty,
                      dk0, dk1, dk2, dv, lse_h, delta_h, dq_h, off_b, off_h, key0, n_q, n_k, diag, qk_scale, sm_scale,
                      BLOCK_M: gl.constexpr, STAGES: gl.constexpr, KEYS: gl.constexpr, CAUSAL: gl.constexpr,
                      MASKED: gl.constexpr, CID: gl.constexpr, QK_CHUNK: gl.constexpr):
        # One query tile for this consumer's 64 keys, MLA (Q's and K's head dim 3 x QK_CHUNK, V's
        # and dO's whole): _bwd_step's order with queries as rows and dQ by TMA reduces from a
        # swizzled buffer, but S and dK over the three chunks (S three chained products, dK three
        # accumulators dk0-dk2, a chunk each) and dQ in three pieces of QK_CHUNK columns through
        # one piece-sized buffer (shared memory has no room for a whole [BLOCK_M, 192] float32 one
        # a consumer): each piece waits until the reduce of the one before has read it.
        #
        # Registers decide this kernel's speed (NOTES.md v29). dK's 96 and dV's 64 a thread are
        # held throughout; S and dP over all 64 keys at once took 64 more, 224 of the 240, and
        # ptxas then serialized every product (a wait after each, its info C7512): 0.61x cuDNN.
        # So S and dP are made in two halves of HALF keys, one after the other (32 a thread at a
        # time). And the shared-memory descriptors of the buffers that do not change from tile to
        # tile (K's chunks, V_c, P, dS, the dQ piece) are made where they are used, from a runtime
        # zero the compiler cannot fold: hoisted out of the loop, they were 64-bit values held in
        # registers, and spilled (5.4 KiB, reloaded before the products). Both: 0.73x.
        s = it % STAGES
        zero = _runtime_zero(it)
        do_s = do_smem.index(s)
        ds_buf = ds_smem.index(CID + zero)
        p_buf = p_smem.index(CID + zero)
        dq_buf = dq_smem.index(CID + zero)
        mbarrier.wait(q_full.index(s), (it // STAGES) & 1)
        HALF: gl.constexpr = KEYS // 2
        sq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                            instr_shape=[16, HALF, 16])
        lse, delta = _rows_lse_delta(lse_h, delta_h, t, n_q, sq_layout, BLOCK_M)
        for hh in gl.static_range(2):
            sc = gl.zeros([BLOCK_M, HALF], gl.float32, layout=sq_layout)
            dp = gl.zeros([BLOCK_M, HALF], gl.float32, layout=sq_layout)
            for j in gl.static_range(3):
                sc = warpgroup_mma(q_smem.index(s * 3 + j),
                                   k_smem.index(CID * 3 + j + zero).slice(hh * HALF, HALF, dim=0).permute((1, 0)), sc,
                                   use_acc=j > 0, is_async=True)
            dp = warpgroup_mma(do_s, v_smem.index(CID + zero).slice(hh * HALF, HALF, dim=0).permute((1, 0)), dp,
                               use_acc=False, is_async=True)
            sc = warpgroup_mma_wait(num_outstanding=1, deps=(sc, ))  # the three S products; dP may run on
            pq = _probabilities(sc, lse, t, key0 + hh * HALF, n_k, diag, qk_scale, sq_layout, BLOCK_M, HALF, CAUSAL,
                                MASKED)
            dp = warpgroup_mma_wait(num_outstanding=0, deps=(dp, ))
            dsq = pq * (dp - delta[:, None])
            # The previous tile's products that read these buffers completed at its last wait.
            p_buf.slice(hh * HALF, HALF, dim=1).store(pq.to(do_s.dtype))
            ds_buf.slice(hh * HALF, HALF, dim=1).store(dsq.to(do_s.dtype))
        fence_async_shared()
        dv = warpgroup_mma(p_buf.permute((1, 0)), do_s, dv, is_async=True)
        dk0 = warpgroup_mma(ds_buf.permute((1, 0)), q_smem.index(s * 3), dk0, is_async=True)
        dk1 = warpgroup_mma(ds_buf.permute((1, 0)), q_smem.index(s * 3 + 1), dk1, is_async=True)
        dk2 = warpgroup_mma(ds_buf.permute((1, 0)), q_smem.index(s * 3 + 2), dk2, is_async=True)
        dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                            instr_shape=[16, QK_CHUNK, 16])
        for h in gl.static_range(3):
            dq = gl.zeros([BLOCK_M, QK_CHUNK], gl.float32, layout=dq_layout)
            dq = warpgroup_mma(ds_buf, k_smem.index(CID * 3 + h + zero), dq, use_acc=False, is_async=True)
            if h == 0:
                # wgmma groups complete in order: dV's and dK's too; stage s is read no more.
                dv, dk0, dk1, dk2, dq = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk0, dk1, dk2, dq))
                mbarrier.arrive(q_empty.index(s), count=1)
            else:
                dq = warpgroup_mma_wait(num_outstanding=0, deps=(dq, ))
            # The previous piece's (or tile's) reduce has read the buffer: its issuing thread
            # waits, and the warp group waits for that thread.
            tma.store_wait(pendings=0)
            thread_barrier()
            dq_buf.store(dq * sm_scale)
            # Every thread's piece is in the buffer, seen by the async proxy; the descriptor bounds
            # the head (rows past Nq dropped), 32 columns a reduce (128-byte swizzled rows).
            fence_async_shared()
            thread_barrier()
            for c in gl.static_range(QK_CHUNK // 32):
                _tma_reduce_add(dq_h, [off_b, off_h, t * BLOCK_M, h * QK_CHUNK + c * 32],
                                dq_buf.slice(c * 32, 32, dim=1))
        return dk0, dk1, dk2, dv

    @gluon.jit
    def _bwd_consumer_mla(q_smem, do_smem, k_smem, v_smem, ds_smem, p_smem, dq_smem, kv_full, q_full, q_empty,
                          lse_ptr, delta_ptr, dq_ptr, dk_desc, dv_desc,
                          off_b, off_hkv, n0, H_Q, GROUP, n_q, n_k, t_first, t_whole, t_end, rot, qk_scale, sm_scale,
                          HEAD_DIM_V: gl.constexpr, QK_CHUNK: gl.constexpr, BLOCK_M: gl.constexpr,
                          STAGES: gl.constexpr, KEYS: gl.constexpr, CID: gl.constexpr, CAUSAL: gl.constexpr,
                          ROTATE: gl.constexpr):
        # _bwd_consumer for MLA (_bwd_step_mla): dK in three accumulators of QK_CHUNK columns,
        # leaving through K's three chunk buffers by a TMA store each (dk_desc's boxes are chunks).
        dk_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                            instr_shape=[16, QK_CHUNK, 16])
        dv_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                            instr_shape=[16, HEAD_DIM_V, 16])
        v_c = v_smem.index(CID)  # its dV's way out; the step takes this consumer's buffers itself
        key0 = n0 + CID * KEYS
        diag = n_k - n_q
        dk0 = gl.zeros([KEYS, QK_CHUNK], gl.float32, layout=dk_layout)
        dk1 = gl.zeros([KEYS, QK_CHUNK], gl.float32, layout=dk_layout)
        dk2 = gl.zeros([KEYS, QK_CHUNK], gl.float32, layout=dk_layout)
        dv = gl.zeros([KEYS, HEAD_DIM_V], gl.float32, layout=dv_layout)
        mbarrier.wait(kv_full.index(0), 0)
        it = 0
        for g in range(GROUP):
            off_h = off_hkv * GROUP + g
            row_base = (off_b * H_Q + off_h).to(gl.int64) * n_q
            lse_h = lse_ptr + row_base
            delta_h = delta_ptr + row_base
            for t in range(t_first, t_whole):
                dk0, dk1, dk2, dv = _bwd_step_mla(it, t, q_smem, do_smem, k_smem, v_smem, ds_smem, p_smem, dq_smem, q_full,
                                                  q_empty, dk0, dk1, dk2, dv, lse_h, delta_h, dq_ptr, off_b, off_h,
                                                  key0, n_q, n_k, diag, qk_scale, sm_scale, BLOCK_M, STAGES, KEYS,
                                                  CAUSAL, True, CID, QK_CHUNK)
                it += 1
            for j in range(t_whole, t_end):
                t = _tile(j, t_whole, t_end, rot, ROTATE)
                dk0, dk1, dk2, dv = _bwd_step_mla(it, t, q_smem, do_smem, k_smem, v_smem, ds_smem, p_smem, dq_smem, q_full,
                                                  q_empty, dk0, dk1, dk2, dv, lse_h, delta_h, dq_ptr, off_b, off_h,
                                                  key0, n_q, n_k, diag, qk_scale, sm_scale, BLOCK_M, STAGES, KEYS,
                                                  CAUSAL, False, CID, QK_CHUNK)
                it += 1
        # dK (times the softmax scale) and dV through K's chunk buffers and V_c's (no product reads
        # them any more), TMA stores dropping rows past Nk; and the last dQ reduce's read.
        k_smem.index(CID * 3).store((dk0 * sm_scale).to(v_c.dtype))
        k_smem.index(CID * 3 + 1).store((dk1 * sm_scale).to(v_c.dtype))
        k_smem.index(CID * 3 + 2).store((dk2 * sm_scale).to(v_c.dtype))
        v_c.store(dv.to(v_c.dtype))
        fence_async_shared()
        for j in gl.static_range(3):
            tma_store(dk_desc, [off_b, off_hkv, key0, j * QK_CHUNK], k_smem.index(CID * 3 + j))
        tma_store(dv_desc, [off_b, off_hkv, key0, 0], v_c)
        tma.store_wait(pendings=0)

    # Lengths and head counts as plain integers, as the forward does.
    @gluon.jit(do_not_specialize=("H_Q", "GROUP", "n_q", "n_k", "win_left", "win_right"))
    def _attn_bwd_sm90(q_desc, do_desc, k_desc, v_desc, dk_desc, dv_desc, lse_ptr, delta_ptr, dq_ptr, H_Q, GROUP, n_q, n_k, qk_scale, sm_scale,
                       slopes_ptr, win_left, win_right,
                       HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr,
                       CAUSAL: gl.constexpr, CONSUMER_REGS: gl.constexpr, SPLIT_DQ: gl.constexpr,
                       DQ_PARTS: gl.constexpr, QROWS: gl.constexpr, DQ_ADDS: gl.constexpr, ROTATE: gl.constexpr,
                       SUM_DQ: gl.constexpr, TMA_DQ: gl.constexpr, DQ_SWIZZLE: gl.constexpr,
                       DS_REGS: gl.constexpr = False, PAIR_DQ: gl.constexpr = False, HEAD_DIM_V: gl.constexpr = 0,
                       QK_CHUNK: gl.constexpr = 0, LOOP_DESC: gl.constexpr = False, LSE_TMA: gl.constexpr = False,
                       ROW_LIMITS: gl.constexpr = False, ALIBI: gl.constexpr = False, WINDOW: gl.constexpr = False,
                       DQ_PIPE: gl.constexpr = False):
        # MLA (HEAD_DIM_V below HEAD_DIM, 0: the same): Q and K in chunks of QK_CHUNK columns
        # (HEAD_DIM itself otherwise; 192 is no power of two, as Gluon's shapes must be), the
        # consumers' _bwd_consumer_mla, with queries as rows and dQ by TMA reduces from swizzled
        # piece buffers only (-tmar-sw; the other ways out are d64/d128's).
        DV: gl.constexpr = HEAD_DIM if HEAD_DIM_V == 0 else HEAD_DIM_V
        CHUNK: gl.constexpr = HEAD_DIM if QK_CHUNK == 0 else QK_CHUNK
        QK_CHUNKS: gl.constexpr = HEAD_DIM // CHUNK
        MLA: gl.constexpr = QK_CHUNKS > 1
        gl.static_assert(QK_CHUNKS * CHUNK == HEAD_DIM and (QK_CHUNKS == 1 or QK_CHUNKS == 3),
                         "Q's and K's chunks tile their head dim, in one chunk or three")
        gl.static_assert(not MLA or (QROWS and TMA_DQ and DQ_SWIZZLE and not PAIR_DQ and not SUM_DQ and not DS_REGS
                                     and not SPLIT_DQ and DQ_ADDS),
                         "MLA's backward is written for -tmar-sw with queries as rows only")
        gl.static_assert(MLA or DV == HEAD_DIM, "V's head dim differs from Q's only for MLA")
        gl.static_assert(not (MLA and (LSE_TMA or ROW_LIMITS)), "-lt and -rl are d64's and d128's")
        gl.static_assert(not LSE_TMA or QROWS, "-lt reads L and delta as rows")
        gl.static_assert(not ALIBI or (QROWS and not MLA), "ALiBi is d64's and d128's, with queries as rows")
        gl.static_assert(not DQ_PIPE or (QROWS and TMA_DQ and not PAIR_DQ and not SUM_DQ and not DS_REGS
                                         and not SPLIT_DQ), "-dqp is written for -tmar with two reduces a tile")
        gl.static_assert(DQ_PIPE != 2 or DQ_SWIZZLE == 1, "-dqs reduces 32-column boxes: -sw's descriptor")
        gl.static_assert(DQ_SWIZZLE < 2 or (TMA_DQ and not PAIR_DQ and not MLA), "-dqb is d64's and d128's, "
                         "with two reduces a tile")
        gl.static_assert(not WINDOW or (QROWS and not MLA and not ROTATE),
                         "windows are d64's and d128's, with queries as rows, walked in order")
        KEYS: gl.constexpr = 64
        n0 = gl.program_id(0) * (2 * KEYS)
        off_bkv = gl.program_id(1)
        H_KV = H_Q // GROUP
        off_b = off_bkv // H_KV
        off_hkv = off_bkv % H_KV

        # Query tiles [t_first, t_end), of which [t_first, t_whole) are masked (query_tiles()).
        # The last key block, when Nk is not a multiple of 128, masks every tile: its keys past
        # Nk load as zeros, and P = exp2(-L) there could overflow (fp16 past L < -16) into inf
        # and then NaN in dS x K's zero row.
        t_end = gl.cdiv(n_q, BLOCK_M)
        t_wend = t_end
        if WINDOW:
            # band_tiles(), the same formulas: [t_first, t_whole) masked, [t_whole, t_wend) whole,
            # [t_wend, t_end) masked (the window's far edge); the host folded causal into win_right.
            diag = n_k - n_q
            t_end = gl.minimum(gl.cdiv(gl.maximum(n0 + 2 * KEYS - diag + win_left, 0), BLOCK_M), t_end)
            t_first = gl.minimum(gl.maximum(n0 - diag - win_right, 0) // BLOCK_M, t_end)
            t_whole = gl.minimum(gl.maximum(gl.cdiv(gl.maximum(n0 + 2 * KEYS - 1 - diag - win_right, 0), BLOCK_M),
                                            t_first), t_end)
            t_wend = gl.minimum(gl.maximum(gl.maximum(n0 - diag + win_left + 1, 0) // BLOCK_M, t_whole), t_end)
        elif CAUSAL:
            diag = n_k - n_q
            t_first = gl.minimum(gl.maximum(n0 - diag, 0) // BLOCK_M, t_end)
            t_whole = gl.minimum(gl.maximum(gl.cdiv(gl.maximum(n0 + 2 * KEYS - 1 - diag, 0), BLOCK_M), t_first),
                                 t_end)
        else:
            t_first = t_end * 0
            t_whole = t_end * 0
        if n0 + 2 * KEYS > n_k:
            t_whole = t_end
            t_wend = t_end
        rot = gl.program_id(0) % gl.maximum(t_end - t_whole, 1)

        kv_smem_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        ds_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        k_smem = gl.allocate_shared_memory(k_desc.dtype, [2 * QK_CHUNKS, KEYS, CHUNK], kv_smem_layout)
        v_smem = gl.allocate_shared_memory(v_desc.dtype, [2, KEYS, DV], kv_smem_layout)
        q_smem = gl.allocate_shared_memory(q_desc.dtype, [STAGES * QK_CHUNKS, BLOCK_M, CHUNK], kv_smem_layout)
        do_smem = gl.allocate_shared_memory(do_desc.dtype, [STAGES, BLOCK_M, DV], kv_smem_layout)
        if QROWS:
            # P and dS, queries as rows (each consumer's own).
            ds_smem = gl.allocate_shared_memory(q_desc.dtype, [2, BLOCK_M, KEYS], ds_layout)
            p_smem = gl.allocate_shared_memory(q_desc.dtype, [2, BLOCK_M, KEYS], ds_layout)
        else:
            # dS^T, keys as rows; P^T stays in registers (p_smem is an alias, never used).
            ds_smem = gl.allocate_shared_memory(q_desc.dtype, [2, KEYS, BLOCK_M], ds_layout)
            p_smem = ds_smem
        if DQ_SWIZZLE >= 2 and DQ_SWIZZLE % 2 == 1:  # -sw-dqb: [D / 8, BLOCK_M / 4, 32], lines' chunks swizzled
            dq_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=3)
        elif DQ_SWIZZLE >= 2:  # -dqb: [D / 8, BLOCK_M / 4, 32] a buffer, unswizzled: the 5-d box's order
            dq_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=3)
        elif DQ_SWIZZLE:
            dq_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=2)
        elif TMA_DQ:
            dq_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)
        else:
            dq_layout: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])
        if PAIR_DQ:
            # Consumer 0's buffer, which the reduce reads, and consumer 1's share, which only
            # consumer 0 reads: one piece of DQ_N columns a slot, its 32-byte units XORed with the
            # row, so that a warp's accumulator rows (8 of 32 bytes) fall on every bank: two
            # wavefronts a store or load, where the 128-byte swizzle conflicted (NOTES.md v20.8).
            dq_smem = gl.allocate_shared_memory(gl.float32, [1, BLOCK_M, HEAD_DIM], dq_layout)
            share_layout: gl.constexpr = gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=8, order=[1, 0])
            share_smem = gl.allocate_shared_memory(gl.float32, [DQ_PARTS, BLOCK_M, HEAD_DIM // DQ_PARTS], share_layout)
        elif MLA:  # a piece of CHUNK columns a consumer (_bwd_step_mla)
            dq_smem = gl.allocate_shared_memory(gl.float32, [2, BLOCK_M, CHUNK], dq_layout)
            share_smem = dq_smem  # an alias, never used
        elif DQ_PIPE == 2 and DQ_PARTS == 2:
            # -dqs: each consumer's two dQ pieces in separate allocations, piece 1's in share_smem.
            dq_smem = gl.allocate_shared_memory(gl.float32, [2, BLOCK_M, HEAD_DIM // 2], dq_layout)
            share_smem = gl.allocate_shared_memory(gl.float32, [2, BLOCK_M, HEAD_DIM // 2], dq_layout)
        elif DQ_SWIZZLE >= 2:
            dq_smem = gl.allocate_shared_memory(gl.float32, [2, HEAD_DIM // 8, BLOCK_M // 4, 32], dq_layout)
            share_smem = dq_smem  # an alias, never used
        else:
            dq_smem = gl.allocate_shared_memory(gl.float32, [2, BLOCK_M, HEAD_DIM], dq_layout)
            share_smem = dq_smem  # an alias, never used
        if LSE_TMA:  # stage s's L in buffer 2 s, its delta in 2 s + 1 (_bwd_producer)
            lsd_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=1)
            lsd_smem = gl.allocate_shared_memory(gl.float32, [2 * STAGES, BLOCK_M], lsd_layout)
        else:
            lsd_smem = dq_smem  # an alias, never used
        kv_full = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
        q_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        q_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(kv_full.index(0), count=1)
        # dQ's two barriers only where a configuration waits on them (-pair, -sum). Allocated and
        # initialized but never used, they were dead to Triton's allocator, which gave dq_ready's
        # word to the value gl.warp_specialize passes the consumers (t_whole, their tile count).
        # The PTX ISA leaves a barrier's memory reused without mbarrier.inval undefined: the likely
        # cause of the kernel's hang when two processes shared the GPU (NOTES.md v26;
        # gluon_compile.barrier_aliases now fails such a kernel).
        if PAIR_DQ or SUM_DQ:
            dq_ready = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
            dq_free = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
            # -pair: one consumer arrives on each; -sum: both do.
            mbarrier.init(dq_ready.index(0), count=1 if PAIR_DQ else 2)
            mbarrier.init(dq_free.index(0), count=1 if PAIR_DQ else 2)
        else:
            dq_ready = kv_full  # placeholders the consumers never touch without -pair or -sum
            dq_free = kv_full
        for s in gl.static_range(STAGES):
            mbarrier.init(q_full.index(s), count=1)
            mbarrier.init(q_empty.index(s), count=2)
        fence_async_shared()

        if MLA:
            gl.warp_specialize([
                (_bwd_producer, (q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, kv_full, q_full,
                                 q_empty, off_b, off_hkv, n0, GROUP, t_first, t_whole, t_end, rot, BLOCK_M, STAGES,
                                 KEYS, ROTATE, QK_CHUNKS, CHUNK, lse_ptr, delta_ptr, lsd_smem, False)),
                (_bwd_consumer_mla, (q_smem, do_smem, k_smem, v_smem, ds_smem, p_smem, dq_smem, kv_full, q_full,
                                     q_empty, lse_ptr, delta_ptr, dq_ptr, dk_desc, dv_desc,
                                     off_b, off_hkv, n0, H_Q, GROUP, n_q, n_k, t_first, t_whole, t_end, rot, qk_scale,
                                     sm_scale, DV, CHUNK, BLOCK_M, STAGES, KEYS, 0, CAUSAL, ROTATE)),
                (_bwd_consumer_mla, (q_smem, do_smem, k_smem, v_smem, ds_smem, p_smem, dq_smem, kv_full, q_full,
                                     q_empty, lse_ptr, delta_ptr, dq_ptr, dk_desc, dv_desc,
                                     off_b, off_hkv, n0, H_Q, GROUP, n_q, n_k, t_first, t_whole, t_end, rot, qk_scale,
                                     sm_scale, DV, CHUNK, BLOCK_M, STAGES, KEYS, 1, CAUSAL, ROTATE)),
            ], [4, 4], [CONSUMER_REGS, CONSUMER_REGS])
        else:
            gl.warp_specialize([
                (_bwd_producer, (q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, kv_full, q_full,
                                 q_empty, off_b, off_hkv, n0, GROUP, t_first, t_whole, t_end, rot, BLOCK_M, STAGES,
                                 KEYS, ROTATE, 1, CHUNK, lse_ptr, delta_ptr, lsd_smem, LSE_TMA)),
                (_bwd_consumer, (q_smem, do_smem, k_smem, v_smem, ds_smem, p_smem, dq_smem, share_smem, kv_full, q_full,
                                 q_empty,
                                 dq_ready, dq_free,
                                 lse_ptr, delta_ptr, dq_ptr, dk_desc, dv_desc,
                                 off_b, off_hkv, n0, H_Q, GROUP, n_q, n_k, t_first, t_whole, t_end, rot, qk_scale,
                                 sm_scale,
                                 HEAD_DIM, BLOCK_M, STAGES, KEYS, 0, CAUSAL, SPLIT_DQ, DQ_PARTS, QROWS, DQ_ADDS, ROTATE,
                                 SUM_DQ, TMA_DQ, DQ_SWIZZLE, DS_REGS, PAIR_DQ, LOOP_DESC, lsd_smem, LSE_TMA, ROW_LIMITS,
                                 slopes_ptr, ALIBI, t_wend, win_left, win_right, WINDOW, DQ_PIPE)),
                (_bwd_consumer, (q_smem, do_smem, k_smem, v_smem, ds_smem, p_smem, dq_smem, share_smem, kv_full, q_full,
                                 q_empty,
                                 dq_ready, dq_free,
                                 lse_ptr, delta_ptr, dq_ptr, dk_desc, dv_desc,
                                 off_b, off_hkv, n0, H_Q, GROUP, n_q, n_k, t_first, t_whole, t_end, rot, qk_scale,
                                 sm_scale,
                                 HEAD_DIM, BLOCK_M, STAGES, KEYS, 1, CAUSAL, SPLIT_DQ, DQ_PARTS, QROWS, DQ_ADDS, ROTATE,
                                 SUM_DQ, TMA_DQ, DQ_SWIZZLE, DS_REGS, PAIR_DQ, LOOP_DESC, lsd_smem, LSE_TMA, ROW_LIMITS,
                                 slopes_ptr, ALIBI, t_wend, win_left, win_right, WINDOW, DQ_PIPE)),
            ], [4, 4], [CONSUMER_REGS, CONSUMER_REGS])


# ---------------------------------------------------------------------------------------------
# Host side
# ---------------------------------------------------------------------------------------------


def setting() -> str | None:
    """:data:`ENV_SWITCH` as read (:func:`.gluon_common.path_setting`): "1" every call this
    kernel covers, "0" none, None :func:`takes` decides."""
    return gluon_common.path_setting(ENV_SWITCH)


def takes() -> bool:
    """Whether the calls this kernel covers (:func:`unsupported_reason` None) go to it rather than
    to the Triton backward: unless :data:`ENV_SWITCH` is "0", every one. Until v30, d128 causal
    below 8k keys took the Triton backward (this kernel was 0.93x at 1k, 0.99x at 4k); with ``-ld``
    it was at least as fast as the Triton backward on every case the check times on an H200 (d128
    causal 1.00x at 1k, 1.06x at 4k; NOTES.md v30)."""
    return setting() != "0"


def may_run(device: torch.device) -> bool:
    """Whether some call on ``device`` can take this kernel (then triton_flash's backward is not
    the same bits run to run)."""
    return takes() and gluon_common.device_reason(device) is None


def unsupported_reason(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                       scale: float | None = None, *, variants: object | None = None,
                       layout: object | None = None, dlse: object | None = None) -> str | None:
    """Why this backward does not take the call (None: it does). Covered: dense ``[B, H, N, D]``
    float16/bfloat16 on Hopper, head dim 64 or 128 (V's the same), GQA/MQA, causal or not, any
    lengths >= 1, a positive scale, the gradient of the returned LSE too (it folds into delta);
    ALiBi and sliding windows at d64 and d128 while :data:`TAKES_ALIBI` and :data:`TAKES_WINDOW`
    say so (they do since v34). Not: varlen, paged, softcap, sinks, float32, FP8, other head dims."""
    if layout is not None:
        return "packed sequences take the existing backward"
    if not plain_variants(causal, variants, alibi=TAKES_ALIBI, window=TAKES_WINDOW):
        named = ["a window"] * (not TAKES_WINDOW) + ["softcap"] + ["ALiBi"] * (not TAKES_ALIBI) + ["sinks"]
        return f"variants ({', '.join(named)}) take the existing backward"
    if (reason := dense_reason(q, k, v, head_dims=HEAD_DIM_PAIRS)) is not None:
        return reason
    if (getattr(variants, "alibi_slopes", None) is not None or getattr(variants, "window", None) is not None) and (
            v.shape[-1] != q.shape[-1]):
        return "ALiBi or a window with MLA's head dims takes the existing backward"
    if scale is not None and not (math.isfinite(scale) and scale > 0):
        return "a positive finite scale"
    if (reason := strides_reason(q, k, v)) is not None:
        return reason
    batch = q.shape[0]
    if batch * k.shape[1] > 65535:
        return "batch x KV heads above 65535 (the grid's second axis)"
    return None


def launch_arguments(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lse: torch.Tensor,
                     delta: torch.Tensor, dq_acc: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor,
                     causal: bool, scale: float, config: Config,
                     slopes: torch.Tensor | None = None,
                     window: tuple[int, int] | None = None) -> tuple[tuple, dict, tuple[int, int]]:
    """(positional arguments, keyword arguments, grid) of one launch: what :func:`flash_bwd` runs
    and what ``tools/flash_bench/gluon_bwd_compile.py`` compiles without a GPU. ``lse``, ``delta``
    contiguous float32 [B, Hq, Nq]; ``dq_acc`` :func:`dq_workspace`'s; ``dk``, ``dv``
    contiguous like k; ``slopes`` ALiBi's, times log2(e), float32 [B, Hq] contiguous (None: no
    ALiBi); ``window`` (left, right), a side -1 unbounded, the contract's (None: none; causal is
    folded into its right side, :func:`.kernels.band`)."""
    batch, heads_q, n_q, head_dim = q.shape
    heads_kv, n_k, head_dim_v = k.shape[1], k.shape[2], v.shape[-1]
    mla = head_dim_v != head_dim
    if mla and config != default_config(head_dim, causal):
        raise ValueError(f"config {config}: MLA's backward is written for {default_config(head_dim, causal)} only")
    if slopes is not None and (mla or not config.qrows):
        raise ValueError(f"ALiBi's backward is written for d64 and d128 with queries as rows, not {config} "
                         f"at d{head_dim}/dv{head_dim_v}")
    if window is not None and (mla or not config.qrows or config.rotate):
        raise ValueError(f"a window's backward is written for d64 and d128 with queries as rows walked in order, "
                         f"not {config} at d{head_dim}/dv{head_dim_v}")
    if tuple(dq_acc.shape) != workspace_shape(q.shape, config):
        raise ValueError(f"dq_acc {tuple(dq_acc.shape)} is not dq_workspace's for q {tuple(q.shape)} and "
                         f"config {config}")
    left, right = band(causal, window) if window is not None else (0, 0)
    chunk = MLA_CHUNK if mla else None  # Q's, K's and dK's boxes: MLA's chunks, else whole rows
    slopes_arg = lse if slopes is None else slopes  # the slopes' pointer: any float32 tensor without ALiBi
    if config.lse_tma:
        lse, delta = (row_descriptor(lse, config.block_m), row_descriptor(delta, config.block_m))
    args = (descriptor(q, config.block_m, cols=chunk), descriptor(do, config.block_m),
            descriptor(k, KEYS_PER_CONSUMER, cols=chunk), descriptor(v, KEYS_PER_CONSUMER),
            descriptor(dk, KEYS_PER_CONSUMER, cols=chunk), descriptor(dv, KEYS_PER_CONSUMER), lse, delta,
            (blocked_descriptor(dq_acc, config.block_m, 128 if config.dq_swizzle else 0, config.dq_boxes,
                                config.dq_flat)
             if config.dq_blocked
             else descriptor(dq_acc, config.block_m, 128, 32) if config.dq_swizzle
             else descriptor(dq_acc, config.block_m, swizzle=0) if config.tma_dq else dq_acc),
            heads_q, heads_q // heads_kv, n_q, n_k, scale * LOG2E, scale,
            slopes_arg, left, right)
    # With a window, causal is in its right side (band()): one kernel for both.
    kwargs = dict(HEAD_DIM=head_dim, BLOCK_M=config.block_m, STAGES=config.stages, CAUSAL=bool(causal) and window is None,
                  CONSUMER_REGS=config.consumer_regs, SPLIT_DQ=config.split_dq,
                  DQ_PARTS=max(1, head_dim // config.dq_cols), QROWS=config.qrows,
                  DQ_ADDS=config.dq_adds, ROTATE=config.rotate,
                  SUM_DQ=config.sum_dq, TMA_DQ=config.tma_dq,
                  # DQ_SWIZZLE: 0 plain, 1 -sw, 2 -dqb, 3 -sw-dqb, 4 and 5 the same with -flat (one
                  # constexpr for the buffer's layout and its descriptor's)
                  DQ_SWIZZLE=(2 + config.dq_swizzle + 2 * config.dq_flat) if config.dq_blocked else config.dq_swizzle,
                  DS_REGS=config.ds_regs, PAIR_DQ=config.pair_dq,
                  LOOP_DESC=config.loop_descriptors, LSE_TMA=config.lse_tma, ROW_LIMITS=config.row_limits, num_warps=4)
    if slopes is not None:
        kwargs["ALIBI"] = True
    if window is not None:
        kwargs["WINDOW"] = True
    if config.dq_pipe:
        kwargs["DQ_PIPE"] = 2 if config.dq_separate else True
    if mla:
        kwargs.update(HEAD_DIM_V=head_dim_v, QK_CHUNK=MLA_CHUNK, DQ_PARTS=head_dim // MLA_CHUNK)
    return args, kwargs, (triton.cdiv(n_k, BLOCK_N), batch * heads_kv)


def workspace_shape(q_shape: tuple[int, ...], config: Config) -> tuple[int, ...]:
    """The shape of :func:`dq_workspace`'s tensor for q's shape ``[B, H, N, D]``: like q, or
    (``-dqb``) ``[B, H, D / 8, N4, 8]``, N4 = N rounded up to a multiple of 4."""
    batch, heads, n, head_dim = q_shape
    return (batch, heads, head_dim // 8, -(-n // 4) * 4, 8) if config.dq_blocked else tuple(q_shape)


def dq_workspace(q: torch.Tensor, config: Config) -> torch.Tensor:
    """dQ's zeroed float32 workspace, which the kernel's reduces add into (:func:`workspace_shape`;
    ``-dqb``'s holds each row's 8-column blocks apart: :func:`blocked_descriptor` addresses 4 rows
    of a block as one line, :func:`dq_result` puts the blocks back)."""
    return torch.zeros(workspace_shape(q.shape, config), dtype=torch.float32, device=q.device)


def dq_result(dq_acc: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """dQ in q's dtype and shape, contiguous, from :func:`dq_workspace`'s tensor: one converting
    copy either way (-dqb's by a Triton kernel, kernels.dq_unblock: 0.053-0.056 ms at b4-h16-q4096
    d128 on an H200, against 0.049 for the plain conversion, NOTES.md v36)."""
    if dq_acc.dim() == 4:
        return dq_acc.to(q.dtype)
    from .kernels import dq_unblock

    batch, heads, n, head_dim = q.shape
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dq_unblock[(triton.cdiv(n, 64), batch * heads)](dq_acc, dq, n, dq_acc.shape[3], HEAD_DIM=head_dim,
                                                    BLOCK_M=64, num_warps=4)
    return dq


def blocked_descriptor(t: torch.Tensor, rows: int, swizzle: int = 0, boxes: int = 1,
                       flat: bool = False) -> "TensorDescriptor":
    """``-dqb``'s TMA descriptor on :func:`dq_workspace`'s ``[B, H, D / 8, N4, 8]`` seen as
    ``[B, H, D / 8, N4 / 4, 32]`` (4 rows of an 8-column block a 128-byte line): boxes ``[1, 1,
    D / 8 / boxes, rows / 4, 32]`` (``-bxN``: N boxes a tile), unswizzled or (``swizzle`` 128,
    ``-sw-dqb``) each line's 16-byte chunks swizzled, bounded at each (batch, head)'s N4 (lines
    past it dropped; the rows from N to N4 are padding, never read back). ``flat`` (``-flat``):
    the same as ``[B * H * D / 8, N4 / 4, 32]``, boxes ``[D / 8 / boxes, rows / 4, 32]`` (a box
    never crosses a head's blocks)."""
    batch, heads, blocks, n4, _ = t.shape
    if blocks % boxes:
        raise ValueError(f"-bx{boxes}: {blocks} column blocks (d{blocks * 8}) do not split into {boxes} boxes")
    if flat:
        layout = gl.NVMMASharedLayout(swizzle_byte_width=swizzle, element_bitwidth=32, rank=3)
        return TensorDescriptor.from_tensor(t.view(batch * heads * blocks, n4 // 4, 32),
                                            [blocks // boxes, rows // 4, 32], layout)
    lines = t.view(batch, heads, blocks, n4 // 4, 32)
    layout = gl.NVMMASharedLayout(swizzle_byte_width=swizzle, element_bitwidth=32, rank=5)
    return TensorDescriptor.from_tensor(lines, [1, 1, blocks // boxes, rows // 4, 32], layout)


def row_descriptor(t: torch.Tensor, rows: int) -> "TensorDescriptor":
    """A TMA descriptor of blocks ``[1, 1, rows]`` on a float32 ``[B, H, N]`` (L or delta; ``-lt``),
    bounded at each (batch, head)'s N. A TMA descriptor's strides are multiples of 16 bytes: where
    N is not a multiple of 4, the rows are copied into a tensor whose stride is (the descriptor
    keeps it alive; the copy is stream-ordered before the kernel)."""
    batch, heads, n = t.shape
    if t.stride() != (heads * n, n, 1) or n % 4:
        padded = torch.empty((batch, heads, -(-n // 4) * 4), dtype=t.dtype, device=t.device)
        padded[..., :n] = t
        t = padded[..., :n]
    layout = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=3)
    return TensorDescriptor.from_tensor(t, [1, 1, rows], layout)


def warmup(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float,
           config: Config | None = None, alibi: bool = False, window: tuple[int, int] | None = None):
    """Compile (without launching) the kernel :func:`flash_bwd` would run (``alibi``: with ALiBi
    slopes; ``window``: with a sliding window, one kernel for every window), and return Triton's
    compiled kernel (``asm``, ``metadata``): for the compile check without a GPU."""
    batch, heads_q, n_q, head_dim = q.shape
    config = default_config(head_dim, causal) if config is None else config
    lse = torch.empty((batch, heads_q, n_q), dtype=torch.float32, device=q.device)
    dq_acc = dq_workspace(q, config)
    do = torch.empty((batch, heads_q, n_q, v.shape[-1]), dtype=q.dtype, device=q.device)  # like O: V's head dim
    slopes = torch.empty((batch, heads_q), dtype=torch.float32, device=q.device) if alibi else None
    args, kwargs, grid = launch_arguments(do, q, k, v, lse, torch.empty_like(lse), dq_acc,
                                          torch.empty_like(k), torch.empty_like(v), causal, scale, config, slopes,
                                          window)
    return _attn_bwd_sm90.warmup(*args, **kwargs, grid=grid)


def _delta(o: torch.Tensor, do: torch.Tensor) -> torch.Tensor:
    # rowsum(dO * O) in float32 [B, H, N]: the Triton path's preprocess kernel.
    from .kernels import attn_bwd_preprocess

    batch, heads, n, head_dim_v = o.shape
    delta = torch.empty((batch, heads, n), dtype=torch.float32, device=o.device)
    attn_bwd_preprocess[(triton.cdiv(n, 64), batch * heads)](
        o, do, delta, *o.stride(), *do.stride(), heads, n,
        HEAD_DIM_V=head_dim_v, BLOCK_DV=max(16, triton.next_power_of_2(head_dim_v)), BLOCK_M=64, num_warps=4,
    )
    return delta


def flash_bwd(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
              lse: torch.Tensor, causal: bool, scale: float, config: Config | None = None, *,
              dlse: torch.Tensor | None = None, alibi_slopes: torch.Tensor | None = None,
              window: tuple[int, int] | None = None,
              out: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) as :func:`.launch.flash_bwd` returns them for a dense call that
    :func:`unsupported_reason` takes: from the forward's output ``o`` and base-2 LSE ``lse``
    (float32 [B, Hq, Nq]); ``dlse`` is the gradient of the natural LSE the caller returned (None:
    unused); ``alibi_slopes`` float32 [Hq] or [B, Hq] (the contract's; the forward's LSE holds
    the bias); ``window`` (left, right), a side -1 unbounded (the contract's sliding window).
    ``out`` hands in dk and dv, contiguous like k (a check poisons them first). The caller checks
    :func:`unsupported_reason` first: this function does not (it runs ALiBi and windows whatever
    :data:`TAKES_ALIBI` and :data:`TAKES_WINDOW` say: the GPU check calls it so)."""
    batch, heads_q, n_q, head_dim = q.shape
    config = default_config(head_dim, causal) if config is None else config
    need = shared_bytes(config, head_dim, head_dim_v=v.shape[-1])
    if need > SHARED_LIMIT:
        raise ValueError(f"config {config} needs {need} B of shared memory at d{head_dim}")
    if not aligned(do):
        do = do.contiguous()
    delta = _delta(o, do)
    if dlse is not None:  # d lse / d s = p: joins dS = P (dP - delta + dlse), as launch.flash_bwd does
        delta -= dlse
    lse = lse.contiguous()
    dq_acc = dq_workspace(q, config)
    if out is None:
        dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
        dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    else:
        dk, dv = out
        if dk.shape != k.shape or dv.shape != v.shape or not (dk.is_contiguous() and dv.is_contiguous()):
            raise ValueError("out must be contiguous dk, dv shaped like k, v")
    slopes = None
    if alibi_slopes is not None:
        slopes = (alibi_slopes.float() * LOG2E).expand(batch, heads_q).contiguous()
    args, kwargs, grid = launch_arguments(do, q, k, v, lse, delta, dq_acc, dk, dv, causal, scale, config, slopes,
                                          window)
    _attn_bwd_sm90[grid](*args, **kwargs)
    return dq_result(dq_acc, q), dk, dv
