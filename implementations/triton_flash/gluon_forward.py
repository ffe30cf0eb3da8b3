"""A FlashAttention forward for Hopper (sm_90a) in Triton's Gluon dialect (triton 3.6), after FlashAttention-3.

:mod:`.launch` takes it on Hopper for the calls :func:`supports` accepts (dense fp16/bf16, d64 and
d128, and MLA's d192 with V's d128; plain or causal, ALiBi or not, a sliding window or not;
``ATTNKIT_TRITON_FLASH_GLUON=0`` turns it off); the kernels in :mod:`.kernels` stay the path for
every other GPU, case and variant (ALiBi: NOTES.md, v19; windows: v22, the one-item grid walking
only the key tiles its rows see, the window's left edge masked as the diagonal is), softcap (the
SFU's tanh before ALiBi and the masks) and sinks (joined in the epilogue; v23, run on an H200 in
v25: every harness case right, softcap at 16k 1.24x the Triton kernel). MLA with any of those
variants too since ``tools/flash_bench/gluon_check.py`` ran its 40 cases right on an H200
(NOTES.md v27; its speed not yet measured). On H100s it ran right on 168 of 168 checked
cases, three times bit-identical, at 0.87-1.24x cuDNN (NOTES.md, v13 and v13.1;
results/2026-11-25-h100-session3, results/2026-11-26-gpus). MLA (NOTES.md, v21): Q and K reach the products in three chunks of 64
columns (:func:`qk_chunk`; Gluon's shapes are powers of two), three chained ``wgmma`` a QK^T
(``_issue_qk``), and O leaves through a slot inside the consumer's own part of Q; the one-item grid
only (the persistent grid's own O buffer does not fit). On an H200: 132 of 132 check cases right
and the harness's MLA forward (b4-h16-q4096 causal) 1.10x cuDNN, 1.85x the Triton kernel
(results/2026-11-29-session18).

The math. For one (batch, query head) pair, ``o_i = sum_j softmax_j(s_ij) v_j`` with
``s_ij = scale * q_i . k_j``. A CTA owns 128 query rows and walks the keys in tiles of
``BLOCK_N``. Per row it keeps the running maximum ``m`` (base 2: of ``x_ij = q_i . k_j * c`` with
``c = scale * log2(e)``, so each exponential is one ``exp2``) and the running sum ``l``. For a new
tile: ``m' = max(m, c * max_j(q_i . k_j))`` (the maximum of the raw products, scaled once a row:
``c > 0`` keeps the order), ``p_ij = exp2(c * q_i . k_j - m')`` (one FFMA and one MUFU a score),
``alpha = exp2(m - m')``, ``l' = alpha * l + sum_j p_ij`` and ``O' = alpha * O + P V``. At the end
``o = O / l`` and the log-sum-exp, base 2 as :func:`.launch.flash_fwd` returns it (the caller's
natural one is this times ln 2), is ``m + log2(l)``. Causal is bottom-right: row ``i`` of ``Nq``
sees key ``j`` iff ``j <= i + Nk - Nq``. A row that sees no key (causal with ``Nq > Nk``) has
``l = 0``: it writes zeros and ``lse = +inf``, as the existing kernels do; while such a row's
``m`` is still ``-inf``, the shift uses 0 instead, so that ``exp2(-inf - -inf)`` never makes a NaN.

Masks. The key tiles ``[0, n_tiles)`` of a CTA split into a prefix that every one of its 128 rows
sees whole (no mask: ``start + BLOCK_N <= min(Nk, first_row + Nk - Nq + 1)``) and the rest (the
causal diagonal and the ragged end past ``Nk``), where scores become ``-inf`` by an explicit mask.
Both consumers walk the same tiles (the CTA's union), so that their turns alternate strictly; a
consumer whose rows see none of a tile gets ``p = 0`` there. TMA loads past the end of a head
(rows ``>= N``) come back as zeros (the 4-d descriptors bound each head), and the O store through
TMA drops rows past ``Nq``: no row of another head is read or written.

Partitions (``gl.warp_specialize``), 12 warps per CTA (16 with three consumers), one CTA per SM:

- producer, the default partition, 4 warps (``setmaxnreg`` cuts them to 24 registers): TMA loads
  of the two Q halves, then K and V tile by tile into a ring of ``STAGES`` shared-memory stages,
  K one tile ahead of V (a K stage frees after QK^T, a V stage only after its PV product);
- consumer 0 and consumer 1, 4 warps each (``CONSUMER_REGS`` registers, 240 by default), rows
  ``[0, 64)`` and ``[64, 128)`` of the tile: the two products on ``wgmma`` and the softmax, then
  the epilogue (O through Q's shared-memory buffer and a TMA store; the LSE by plain stores).
- ``Config(consumers=3)`` (``-c3``, for d64): a third consumer, rows ``[128, 192)``, 16 warps, 160
  registers a consumer thread. At d64 a score costs half the MMA work of d128 and the same
  softmax, so the consumers' softmax, not the tensor cores, sets the pace (NOTES.md, v13.1); with
  three taking turns, two softmaxes run under each one's products (FlashAttention-3's 192-row
  tile at d64). The turn passes 0 -> 1 -> 2 -> 0; everything else is the same code. It is the
  default at d64 without causal (:func:`default_config`: 1.11x two consumers on an H100).

Inside a consumer, tile ``t`` (products asynchronous, ``wait(n)`` = until n groups remain):

    wait K_t; [turn] issue S_t = Q K_t^T; wait(1): PV_{t-2} done, release V_{t-2};
    O *= alpha_{t-1}; wait V_{t-1}; issue O += P_{t-1} V_{t-1}; [pass the turn];
    wait(1): S_t done, release K_t; softmax(S_t) -> P_t, alpha_t, l

so the softmax of tile ``t`` runs while the tensor cores do ``P_{t-1} V_{t-1}``, and the turns
(``PINGPONG``) make the two consumers issue their products alternately, so that one's softmax
also runs under the other's products. That is the order v12 designed; FlashAttention-3 waits for
``PV_{t-1}`` at the end of step ``t`` instead (``EAGER``), which v12 expected ptxas to hoist above
the softmax. On the GPU it was the other way round: the eager order ran 1.3-1.6x the one above at
4k and 16k, and is the default (:func:`default_config`; NOTES.md, v13). The one-QK^T-later order
stays as a configuration (``Config(eager=False)``) for comparison.

Barrier protocol (all ``mbarrier``; an arrive is one elected thread of the arriving partition,
after a partition-wide ``bar.sync`` the compiler inserts):

- ``q_full[c]`` (count 1): the producer's ``expect`` + TMA of Q's part ``c``; consumer ``c`` waits
  phase 0 (also when it has no key tile: the buffer later takes O).
- ``k_full[s]``, ``v_full[s]`` (count 1): ``expect`` + TMA of tile ``t`` into stage
  ``s = t % STAGES``; consumers wait parity ``(t // STAGES) & 1``.
- ``k_empty[s]``, ``v_empty[s]`` (count ``CONSUMERS``, one arrive per consumer): a consumer
  releases K_t after the wait that completes S_t, and V_t after the wait that completes the
  product that read it (releasing while a ``wgmma`` still reads a stage is a race). The producer
  waits parity ``((t // STAGES) & 1) ^ 1`` before refilling: a fresh barrier counts as having
  completed the phase before phase 0, so the first ``STAGES`` tiles go straight in.
- ``turn[c]`` (count 1): consumer ``c`` waits on ``turn[c]`` before issuing its products and
  arrives on ``turn[(c + 1) % CONSUMERS]`` after (``turn[1 - c]`` with two); its k-th wait is on
  parity ``(k & 1) ^ (c == 0)``, so consumer 0 goes first. Every consumer takes the same number
  of turns (the same tiles, plus the last PV), and an arrive can only follow the previous
  consumer's wait, so a barrier is never two phases ahead of its waiter.

Persistent (``Config(persistent=True)``, ``-p``; the default without causal over at most 2k keys,
and with ``-g`` under causal over at most 4k: NOTES.md, v14, v16, v16.1 and v18). Its own
kernel, ``_attn_fwd_sm90_persistent``: one CTA per SM (or per item, if fewer), each looping over
work items (a row block of one head) with the one-item kernel's code (``_load_item``,
``_consumer_item``). The K/V ring's stages and phases follow ``g``, the CTA's tile count over its
items, and the turns' count carries on. Q's part ``c`` goes back to the producer on ``q_empty[c]``
(count 1) once every product that read it has completed (the producer waits parity
``(item & 1) ^ 1``; ``q_full``'s phase is ``item & 1``), and O leaves through a buffer of its own,
so the next item's Q and K/V load during this item's epilogue. Causal items come heaviest first
and are dealt in a snake (``_deal``: forwards in even rounds, backwards in odd), so that every
CTA's sum of key tiles is about the mean; v14's static dealing lost 9-28% causal. Heaviest first
over all heads at once overflowed the L2 at 1k (v16.1); ``-g`` (``Config(grouped=True)``) takes
the heads in groups of two whole rounds each (:func:`grouped_grid`), heaviest first within a
group.
``Config(heavy_first=True)`` (``-hf``) is the one-item grid's causal order with the grid's axes
swapped: every head's longest row block starts first.

``tools/flash_bench/gluon_model.py`` simulates this protocol under random interleavings (and the
tile ranges and masks against float64); ``tools/flash_bench/gluon_compile.py`` compiles for sm_90a
and checks the SASS for instructions that touch registers of an in-flight ``wgmma``.

FP8 (``FP8=True``, the one-item grid only; NOTES.md, v20): e4m3 Q, K and V^T (keys contiguous:
FP8 ``wgmma`` reads its B operand K-major, so V is transposed on the host, ``launch.keys_contiguous``),
wgmma's K of 32, the scale (it carries q's and k's descales, of either sign) in the exp2's FFMA
on whole tiles, the sign picking the raw scores' maximum or minimum, and before the maximum on
masked ones (NOTES.md, v20.2), P through a shared buffer per consumer (triton 3.6 cannot keep an in-flight
``wgmma``'s 8-bit register operand alive: "Unexpected bitwidth in WGMMAWaitGroupOp"), stored once
the previous PV product has read it, and O in bf16 times V's descale through a buffer of its own.
Compile-checked for sm_90a (``gluon_compile.py --fp8``: no spills; the bf16 kernels' SASS
unchanged). Run on an H200 (NOTES.md, v20.1 and v20.4): right on the harness's FP8 shapes; with
V^T from the Triton path's copy, its call in the harness's speed suite at d128 was 0.95x (4k) and
0.97-1.02x (16k) the Triton FP8 forward's with two consumers. With three (:func:`fp8_config`,
NOTES.md v20.5, v20.6) the speed suite timed it 1.10x (4k) and 1.14x (16k) at d128 on an H200,
1.09x and 1.15x on an H100, and 1.04-1.06x at d64 16k, 0.96-0.98x at d64 4k. So the forward takes
it at d128 from 4k keys (causal from 16k) and at d64 from 16k (:func:`.launch._gluon_fp8_takes`;
``ATTNKIT_TRITON_FLASH_GLUON_FP8=1`` or ``0`` takes it always or never).

``-sm`` (``Config.sum_mma``, the one-item grid only, off by default; NOTES.md, v20.3): each row's
sum of P from the tensor cores, a ``P @ ones`` product beside each PV product, instead of 64 adds
a tile in registers. bf16 only: with FP8 its outputs were wrong on an H200 (NOTES.md, v20.4), and
the FP8 launch refuses it. The bf16 kernel with it is compile-checked, not yet run on a GPU.

The host side: :func:`supports` (which calls this kernel takes), :func:`flash_fwd` (the launcher,
with :func:`.launch.flash_fwd`'s signature for the dense case), :class:`Config` (tiles: the default,
or one a bench tool passes), :func:`warmup` (compile without launching).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# Gluon's names for the kernel, and the host-side checks both Gluon kernels share. launch, the
# bench tools and the tests read GLUON_IMPORT_ERROR, device_reason, HEAD_DIMS, DTYPES and
# SHARED_LIMIT from this module: they stay its names too.
from .gluon_common import (DTYPES, GLUON_IMPORT_ERROR, HEAD_DIMS, LOG2E, PUBLIC_REINTERPRET, SHARED_LIMIT,
                           dense_reason, descriptor, device_reason, plain_variants, strides_reason)
from .gluon_common import (fence_async_shared, gl, gluon, mbarrier, tma, tma_load, tma_store, thread_barrier,
                           triton, warpgroup_mma, warpgroup_mma_init, warpgroup_mma_wait)
# The band a window gives the kernel's WINDOW, and its unbounded side: the Triton kernels' own.
from .kernels import UNBOUNDED, band

#: (Q's and K's head dim, V's) pairs the forward takes: d64, d128, and MLA's 192 with V's 128
#: (DeepSeek's shapes; the harness's MLA cases). V's head dim sets O's registers (S's do not
#: depend on it), so MLA's consumers hold what d128's hold; its Q and K tiles are 1.5x in
#: shared memory.
HEAD_DIM_PAIRS = ((64, 64), (128, 128), (192, 128))
#: Rows a consumer warp group owns: wgmma's M is 64 per warp group.
ROWS_PER_CONSUMER = 64
#: Query rows per CTA: two consumer warp groups.
BLOCK_M = 2 * ROWS_PER_CONSUMER
#: ``-sm``: columns of the ``P @ ones`` product that gives the row sums (wgmma's N; each column
#: the same sum). Written as the literal 16 in the kernel.
SUM_COLS = 16


@dataclass(frozen=True)
class Config:
    """One tile choice: keys per tile, K/V ring depth, whether the consumers take turns, and the
    consumers' register budget (the producer keeps what is left: 65536 / 128 - 2 x this)."""

    block_n: int = 128
    stages: int = 2
    pingpong: bool = True
    consumer_regs: int = 240
    eager: bool = False
    #: Consumer warp groups, 64 query rows each: 2 (128-row CTAs) or 3 (192 rows, FlashAttention-3's
    #: choice at d64, where the softmax, not the tensor cores, sets the pace: a third consumer keeps
    #: two softmaxes under one's products). Three need ``consumer_regs`` <= 160 (:func:`register_reason`).
    consumers: int = 2
    #: One CTA per SM walking work items (a row block of one head each): the next item's Q and K/V
    #: load during this one's epilogue, O leaves through a buffer of its own, and causal items are
    #: dealt heaviest first in a snake so that every CTA gets about the same work (module docstring).
    persistent: bool = False
    #: Causal, one-item grid: the grid's axes swapped, heads on the first (the fastest the hardware
    #: starts CTAs along), so every head's longest row blocks start before any shorter one
    #: (FlashAttention-3's order); without it each head's are longest first, head after head.
    heavy_first: bool = False
    #: ``-g`` (with ``-p``, causal): the heads dealt in groups (:func:`grouped_grid`), heaviest first
    #: within each group, not over every head at once: every head's K and V in flight at once
    #: overflowed the L2 at 1k (NOTES.md, v16.1).
    grouped: bool = False
    #: ``-sm`` (one-item grid, bf16/fp16 only): each row's sum of P from the tensor cores, a
    #: product ``P @ ones`` issued beside PV (B a constant tile of ones in shared memory), instead
    #: of a sum of each score in registers: 8 instructions a tile for 64 adds (NOTES.md, v20.3;
    #: with FP8 it was wrong on an H200, v20.4, and the FP8 launch refuses it).
    sum_mma: bool = False

    def __post_init__(self) -> None:
        """A configuration the kernel is not written for is refused as it is made, parsed or not."""
        if self.sum_mma and self.persistent:
            raise ValueError(f"config {self}: -sm is written for the one-item grid only, not -p")

    def __str__(self) -> str:
        return (f"n{self.block_n}s{self.stages}{'' if self.pingpong else '-nopp'}"
                f"{'-eager' if self.eager else ''}{f'-c{self.consumers}' if self.consumers != 2 else ''}"
                f"{'-p' if self.persistent else ''}{'-g' if self.grouped else ''}{'-hf' if self.heavy_first else ''}"
                f"{'-sm' if self.sum_mma else ''}-r{self.consumer_regs}")

    @staticmethod
    def parse(text: str) -> "Config":
        """``n128s2``, ``n64s3``, ``n128s2-nopp``, ``n128s2-eager``, ``n128s2-r232``, ``n128s3-c3``,
        ``n128s2-eager-p``: the form ``str`` writes (``-nopp``: no turns; ``-eager``: each PV product
        waited for in its own step, FlashAttention-3's order, instead of one QK^T later; ``-c3``:
        three consumers, with 160 registers each unless ``-rREGS`` says otherwise; ``-p``:
        persistent; ``-g``: its causal heads in groups; ``-hf``: causal row blocks heaviest first
        over all heads; ``-sm``: the row sums from the tensor cores, one-item grid only)."""
        parts = text.strip().split("-")
        head = parts[0]
        if not (head.startswith("n") and "s" in head):
            raise ValueError(f"config {text!r}: expected nBLOCKsSTAGES[-nopp][-eager][-c3][-p[-g]][-hf][-rREGS], "
                             "e.g. n128s2")
        block_n, stages = head[1:].split("s")
        fields = dict(block_n=int(block_n), stages=int(stages))
        for part in parts[1:]:
            if part == "nopp":
                fields["pingpong"] = False
            elif part == "eager":
                fields["eager"] = True
            elif part.startswith("r") and part[1:].isdigit():
                fields["consumer_regs"] = int(part[1:])
            elif part in ("c2", "c3"):
                fields["consumers"] = int(part[1:])
            elif part == "p":
                fields["persistent"] = True
            elif part == "hf":
                fields["heavy_first"] = True
            elif part == "g":
                fields["grouped"] = True
            elif part == "sm":
                fields["sum_mma"] = True
            else:
                raise ValueError(f"config {text!r}: unknown part {part!r}")
        if fields.get("consumers") == 3:
            fields.setdefault("consumer_regs", MAX_REGS_THREE_CONSUMERS)
        if fields.get("grouped") and not fields.get("persistent"):
            raise ValueError(f"config {text!r}: -g groups the persistent grid's heads; it needs -p")
        return Config(**fields)

    @property
    def block_m(self) -> int:
        """Query rows per CTA."""
        return ROWS_PER_CONSUMER * self.consumers


def shared_bytes(config: Config, head_dim: int, element_size: int = 2, head_dim_v: int | None = None) -> int:
    """Shared memory the kernel asks for: Q (a part per consumer, reused for O), the K/V ring (K
    tiles of ``head_dim``, V tiles of ``head_dim_v``, None: the same), barriers (``q_full`` and
    ``turn`` per consumer, four per stage); persistent: O's own buffer and ``q_empty`` per
    consumer."""
    head_dim_v = head_dim if head_dim_v is None else head_dim_v
    q = config.block_m * head_dim * element_size
    o = config.block_m * head_dim_v * element_size if config.persistent else 0
    kv = config.stages * config.block_n * (head_dim + head_dim_v) * element_size
    barriers = 8 * ((3 if config.persistent else 2) * config.consumers + 4 * config.stages)
    ones = config.consumers * config.block_n * SUM_COLS * element_size if config.sum_mma else 0
    return q + o + kv + barriers + ones


def fp8_shared_bytes(config: Config, head_dim: int) -> int:
    """Shared memory the FP8 kernel asks for: e4m3 Q, the K/V^T ring and P (a tile per consumer),
    O's bf16 buffer and the barriers."""
    q = config.block_m * head_dim
    o = 2 * config.block_m * head_dim
    kv = 2 * config.stages * config.block_n * head_dim
    p = config.block_m * config.block_n
    barriers = 8 * (2 * config.consumers + 4 * config.stages)
    return q + o + kv + p + barriers


#: The fewest registers the producer warp group keeps: it gets what the consumers leave of the
#: SM's 65,536 (``setmaxnreg``): 24 with two consumers at 240, 32 with three at 160 (as
#: gluon_compile.py reads them in the PTX).
PRODUCER_REGS = 24
#: Three consumers at 160 registers leave the producer 32: 128 x 32 + 3 x 128 x 160 = 65,536; at
#: 168 it would keep 8. ``setmaxnreg`` can deadlock when the budget does not work out (triton #9786).
MAX_REGS_THREE_CONSUMERS = 160


def register_reason(config: Config) -> str | None:
    """Why ``config``'s register split does not fit an SM's 65,536 registers (None: it fits)."""
    if config.consumers not in (2, 3):
        return f"config {config}: 2 or 3 consumers, got {config.consumers}"
    total = 128 * PRODUCER_REGS + config.consumers * 128 * config.consumer_regs
    if total > 65536 or config.consumer_regs % 8:
        return (f"config {config}: {config.consumers} consumers at {config.consumer_regs} registers need "
                f"{total} of 65,536 registers (a multiple of 8, at most "
                f"{(65536 - 128 * PRODUCER_REGS) // (128 * config.consumers) // 8 * 8} each)")
    return None


#: Key lengths up to which calls without causal take the persistent grid (``-p``): each CTA's row
#: block has at most 16 key tiles, so its prologue and epilogue, which a persistent CTA overlaps
#: with the next item's loads, are a large part of it.
PERSISTENT_MAX_KEYS = 2048
#: Key lengths up to which causal calls take the persistent grid over head groups (``-p-g``):
#: measured better than the one-item grid at 1k, 2k and 4k (d64 and d128, 64-512 batch x heads);
#: not measured beyond.
GROUPED_MAX_KEYS = 4096


def default_config(head_dim: int, causal: bool, n_k: int | None = None, head_dim_v: int | None = None,
                   one_item: bool = False) -> Config:
    """The tiles used when none is given: FlashAttention-3's 128 x 128 for d128; at d64 the K/V
    tiles are half the size, so a deeper ring costs little. FlashAttention-3's wait order
    (``eager``): on an H100 it ran 1.3-1.6x the one-QK^T-later order at 4k and 16k (NOTES.md, v13;
    results/2026-11-25-h100-session3).

    d64 without causal takes three consumers (``n128s3-eager-c3``, 160 registers each): on an H100
    at b4-h32-q4096 bf16 it ran 486 TFLOP/s against 438 for two (``n128s3-eager``) and 453 for
    cuDNN. Causal d64 keeps two: there c3 ran 366 against 396 (cuDNN 406). d128 keeps two: c3 ran
    about half as fast there (326 against 629 at 16k). NOTES.md, v14.2;
    results/2026-11-26-session4/gluon (forward-c3).

    Without causal over at most :data:`PERSISTENT_MAX_KEYS` keys (``n_k``) the persistent grid
    (``n128s2-eager-p``; d64 ``n128s3-eager-p``, two consumers): on an H100 at b8/b16-h16-q1024
    d128, GPU time alone (CUDA graph replay), 564 and 532 TFLOP/s against 540 and 505 (+4-5%;
    cuDNN 598, 583); at 4k and 16k it gained nothing measurable (NOTES.md, v16.1;
    results/2026-11-26-session5/gluon). At b8/b16-h32-q1024 d64, 394 and 395 against the three
    consumers' 369 and 367 (+7%; cuDNN 437, 448; session6/gluon-fwd-grouped/d64_1k.txt).

    Causal over at most :data:`GROUPED_MAX_KEYS` keys takes the persistent grid dealing heaviest
    first within groups of heads (``-p-g``, :func:`grouped_grid`): on an H100, GPU time alone,
    b8/b16-h16-q1024 d128 406 and 409 TFLOP/s against 358 and 333 (cuDNN 406, 443), 1k d64 +13%,
    2k +1%, 4k d128 548 against 522 (cuDNN 500), 4k d64 +3% (NOTES.md, v18;
    results/2026-11-26-session6/gluon-fwd-grouped).

    MLA (``head_dim`` 192, ``head_dim_v`` 128) takes the one-item grid with d128's tiles
    (``n128s2-eager``) at every length: 128 x 128 tiles two deep are 208 KiB of the 227 with O
    over Q's buffer, and the persistent grid's own O buffer (32 KiB more) does not fit. FlashAttention-3
    takes 128-row tiles there too (its 112 keys a tile are no power of two, which Gluon's tensors need).

    A sliding window, softcap or sinks (``one_item``) take the one-item grid (the persistent grid's
    items do not walk a window's tile range, nor cap or join a sink), with the tiles of its head
    dim and causal flag at long lengths."""
    if head_dim_v is not None and head_dim_v != head_dim:
        return Config(block_n=128, stages=2, eager=True)
    if one_item:
        return default_config(head_dim, causal)
    if causal and n_k is not None and n_k <= GROUPED_MAX_KEYS:
        return Config(block_n=128, stages=3 if head_dim == 64 else 2, eager=True, persistent=True, grouped=True)
    if not causal and n_k is not None and n_k <= PERSISTENT_MAX_KEYS:
        return Config(block_n=128, stages=3 if head_dim == 64 else 2, eager=True, persistent=True)
    if head_dim == 64:
        if not causal:
            return Config(block_n=128, stages=3, eager=True, consumers=3, consumer_regs=MAX_REGS_THREE_CONSUMERS)
        return Config(block_n=128, stages=3, eager=True)
    return Config(block_n=128, stages=2, eager=True)


# ---------------------------------------------------------------------------------------------
# Kernel
# ---------------------------------------------------------------------------------------------

if gl is not None:

    @gluon.jit
    def _producer(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem,
                  q_full, k_full, v_full, k_empty, v_empty,
                  off_b, off_h, off_hkv, start_m, n_tiles,
                  BLOCK_N: gl.constexpr, STAGES: gl.constexpr, ROWS: gl.constexpr, CONSUMERS: gl.constexpr,
                  FP8: gl.constexpr = False, QK_CHUNKS: gl.constexpr = 1, QK_CHUNK: gl.constexpr = 0, lo=0):
        # The one item of this CTA; Q stays for the whole CTA (q_full stands in for q_empty, unused).
        # lo: the first key tile (a window's left edge; 0 otherwise).
        _load_item(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_full, q_full, k_full, v_full, k_empty, v_empty,
                   off_b, off_h, off_hkv, start_m, n_tiles, 0, 0, BLOCK_N, STAGES, ROWS, CONSUMERS, False, FP8,
                   QK_CHUNKS, QK_CHUNK, lo)

    @gluon.jit
    def _load_item(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem,
                   q_full, q_empty, k_full, v_full, k_empty, v_empty,
                   off_b, off_h, off_hkv, start_m, n_tiles, g, it,
                   BLOCK_N: gl.constexpr, STAGES: gl.constexpr, ROWS: gl.constexpr, CONSUMERS: gl.constexpr,
                   PERSISTENT: gl.constexpr, FP8: gl.constexpr = False, QK_CHUNKS: gl.constexpr = 1,
                   QK_CHUNK: gl.constexpr = 0, lo=0):
        # One work item's loads. g: K/V tiles this CTA loaded before the item (the ring's position);
        # it: items before it (Q's phase). Both 0 in the one-item grid. The item's key tiles are
        # [lo, lo + n_tiles) (lo: a window's left edge, 0 otherwise).
        # Q: one part per consumer, each on its own barrier; persistent, into a part its consumer
        # handed back (every product that read the last item's Q has completed). QK_CHUNKS > 1
        # (MLA): Q's and K's head dim in chunks of QK_CHUNK columns, a TMA and a buffer each.
        q_bytes: gl.constexpr = q_desc.block_type.nbytes * QK_CHUNKS
        for c in gl.static_range(CONSUMERS):
            if PERSISTENT:
                mbarrier.wait(q_empty.index(c), (it & 1) ^ 1)
            mbarrier.expect(q_full.index(c), q_bytes)
            for j in gl.static_range(QK_CHUNKS):
                tma_load(q_desc, [off_b, off_h, start_m + c * ROWS, j * QK_CHUNK],
                         q_full.index(c), q_smem.index(c * QK_CHUNKS + j))
        # K runs one tile ahead of V: a K stage frees after QK^T, a V stage only after the PV
        # product that reads it, which is later; V waiting for its stage must not hold up K.
        if n_tiles > 0:
            _load_tile(k_desc, k_smem, k_full, k_empty, off_b, off_hkv, lo, g, BLOCK_N, STAGES, False, QK_CHUNKS,
                       QK_CHUNK)
        for t in range(n_tiles):
            if t + 1 < n_tiles:
                _load_tile(k_desc, k_smem, k_full, k_empty, off_b, off_hkv, lo + t + 1, g + t + 1, BLOCK_N, STAGES,
                           False, QK_CHUNKS, QK_CHUNK)
            _load_tile(v_desc, v_smem, v_full, v_empty, off_b, off_hkv, lo + t, g + t, BLOCK_N, STAGES, FP8)

    @gluon.jit
    def _load_tile(desc, smem, full, empty, off_b, off_hkv, t, g, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                   KEYS_LAST: gl.constexpr = False, CHUNKS: gl.constexpr = 1, CHUNK: gl.constexpr = 0):
        # Key tile t, the g-th tile through the ring: wait until every consumer released the
        # stage's previous tile, then TMA tile t into it. KEYS_LAST: the tensor is [B, H, D, N]
        # (FP8's V^T), its tile t the columns [t * BLOCK_N, (t + 1) * BLOCK_N). CHUNKS > 1 (MLA's
        # K): the head dim in chunks of CHUNK columns, stage s's chunk j in buffer s * CHUNKS + j.
        s = g % STAGES
        mbarrier.wait(empty.index(s), ((g // STAGES) & 1) ^ 1)
        mbarrier.expect(full.index(s), desc.block_type.nbytes * CHUNKS)
        if KEYS_LAST:
            tma_load(desc, [off_b, off_hkv, 0, t * BLOCK_N], full.index(s), smem.index(s))
        else:
            for j in gl.static_range(CHUNKS):
                tma_load(desc, [off_b, off_hkv, t * BLOCK_N, j * CHUNK], full.index(s), smem.index(s * CHUNKS + j))

    @gluon.jit
    def _issue_qk(q_smem, k_smem, qk, cid, s, QK_CHUNKS: gl.constexpr):
        # S = Q K^T for consumer cid's rows and the K tile in stage s, async; use_acc=False: the old
        # scores are only the registers the product overwrites. QK_CHUNKS > 1 (MLA's 192 as three
        # chunks of 64: Gluon's shapes are powers of two): one product a chunk, chained on the
        # accumulator. A wait that leaves only later products in flight retires them all.
        qk = warpgroup_mma(q_smem.index(cid * QK_CHUNKS), k_smem.index(s * QK_CHUNKS).permute((1, 0)), qk,
                           use_acc=False, is_async=True)
        for j in gl.static_range(1, QK_CHUNKS):
            qk = warpgroup_mma(q_smem.index(cid * QK_CHUNKS + j), k_smem.index(s * QK_CHUNKS + j).permute((1, 0)), qk,
                               is_async=True)
        return qk

    @gluon.jit
    def _softmax(qk, m_i, l_i, rows, start_n, n_k, diag, qk_scale, slope, row_pos,
                 s_layout: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr, MASKED: gl.constexpr,
                 ALIBI: gl.constexpr, FP8: gl.constexpr = False, SUM_MMA: gl.constexpr = False,
                 WINDOW: gl.constexpr = False, win_left=0, win_right=0, SOFTCAP: gl.constexpr = False,
                 cap_scale=1.0):
        # One tile's online-softmax update: (p, alpha, m', l'). In masked tiles, keys past Nk and
        # (causal) keys past the row's diagonal become -inf before the maximum. ALiBi: the base-2
        # scores take ``- slope * |i + Nk - Nq - j|`` (``slope`` times log2(e); ``row_pos`` the
        # rows' i + Nk - Nq in float32, exact below 2**24, as the Triton kernel's float form).
        # FP8: the scale carries q's and k's descales, of either sign. In a masked tile the scores
        # are scaled before the maximum, as ALiBi's are; in a whole tile the scale goes into the
        # exp2's multiply-add, as bf16's does, and its sign picks the raw scores' maximum or
        # minimum (one branch a tile, the same in every thread): 64 multiplies a thread fewer in a
        # loop of 552 instructions at d128 (NOTES.md, v20.2). WINDOW: row i sees keys
        # [i + Nk - Nq - win_left, i + Nk - Nq + win_right] too (causal folded into win_right by the
        # host, an unbounded side 2**30): masked tiles only; whole tiles are inside every row's band.
        # SOFTCAP: the base-2 score is tanh(q . k * cap_scale) * qk_scale (the host passes
        # cap_scale = scale / cap and qk_scale = cap * log2(e)), by the SFU's tanh (relative error
        # about 2**-11, as the Triton kernels' for 16-bit inputs), before ALiBi's bias and the masks:
        # the scores are explicit then, as ALiBi's (a masked score must be -inf after the tanh).
        EXPLICIT: gl.constexpr = ALIBI or SOFTCAP or (FP8 and MASKED)
        cols = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        if SOFTCAP:
            qk = gl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=r,r", [qk * cap_scale], dtype=gl.float32,
                                           is_pure=True, pack=1) * qk_scale
            if ALIBI:
                qk = qk - slope * gl.abs(row_pos[:, None] - cols.to(gl.float32)[None, :])
        elif ALIBI:
            qk = qk * qk_scale - slope * gl.abs(row_pos[:, None] - cols.to(gl.float32)[None, :])
        if FP8 and MASKED:
            qk = qk * qk_scale
        if MASKED:
            visible = cols[None, :] < n_k
            if CAUSAL:
                visible = visible & (cols[None, :] <= rows[:, None] + diag)
            if WINDOW:
                visible = (visible & (cols[None, :] >= (rows + (diag - win_left))[:, None])
                           & (cols[None, :] <= (rows + (diag + win_right))[:, None]))
            qk = gl.where(visible, qk, float("-inf"))
        if EXPLICIT:
            m_new = gl.maximum(m_i, gl.max(qk, 1))
        elif FP8:
            if qk_scale >= 0:
                extreme = gl.max(qk, 1)
            else:
                extreme = gl.min(qk, 1)
            m_new = gl.maximum(m_i, extreme * qk_scale)
        else:
            m_new = gl.maximum(m_i, gl.max(qk, 1) * qk_scale)
        if MASKED:
            m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
        else:
            m_use = m_new
        alpha = gl.exp2(m_i - m_use)
        if EXPLICIT:
            p = gl.exp2(qk - m_use[:, None])
        else:
            p = gl.exp2(qk * qk_scale - m_use[:, None])
        if not SUM_MMA:  # -sm: the row sums come from the tensor cores (_step), l_i passes through
            l_i = l_i * alpha + gl.sum(p, 1)
        return p, alpha, m_new, l_i

    @gluon.jit
    def _take_turn(turn, turns, CID: gl.constexpr, PINGPONG: gl.constexpr):
        # Wait until the consumer before this one (CID - 1, or the last for consumer 0) has issued
        # its products (consumer 0 goes first).
        if PINGPONG:
            mbarrier.wait(turn.index(CID), (turns & 1) ^ (1 if CID == 0 else 0))
        return turns + 1

    @gluon.jit
    def _pass_turn(turn, CID: gl.constexpr, PINGPONG: gl.constexpr, CONSUMERS: gl.constexpr):
        if PINGPONG:
            mbarrier.arrive(turn.index((CID + 1) % CONSUMERS), count=1)

    @gluon.jit
    def _rescale(o, l_i, alpha, o_layout: gl.constexpr, l_layout: gl.constexpr, SUM_MMA: gl.constexpr):
        # O, and with SUM_MMA the accumulator of P @ ones, to the new maximum (no product into
        # them in flight).
        o = o * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
        if SUM_MMA:
            l_i = l_i * gl.convert_layout(alpha, gl.SliceLayout(1, l_layout))[:, None]
        return o, l_i

    @gluon.jit
    def _issue_pv(o, l_i, p_op, p_buf, v_tile, ones_buf, FP8: gl.constexpr, SUM_MMA: gl.constexpr):
        # PV into O, and with SUM_MMA (not FP8) P @ ones into l_i right after it, both async. FP8:
        # P from its shared buffer and V^T's tile [D, BLOCK_N] (keys contiguous: K-major, as FP8
        # wgmma reads B); else P from registers.
        if FP8:
            o = warpgroup_mma(p_buf, v_tile.permute((1, 0)), o, is_async=True)
        else:
            o = warpgroup_mma(p_op, v_tile, o, is_async=True)
            if SUM_MMA:
                l_i = warpgroup_mma(p_op, ones_buf, l_i, is_async=True)
        return o, l_i

    @gluon.jit
    def _step(t, g, q_smem, k_smem, v_smem, k_full, v_full, k_empty, v_empty, turn, turns,
              qk, o, p_prev, p_op, alpha, m_i, l_i, rows, n_k, diag, qk_scale, slope, row_pos,
              s_layout: gl.constexpr, o_layout: gl.constexpr, p_layout: gl.constexpr,
              BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CID: gl.constexpr, CAUSAL: gl.constexpr,
              MASKED: gl.constexpr, PINGPONG: gl.constexpr, EAGER: gl.constexpr, CONSUMERS: gl.constexpr,
              ALIBI: gl.constexpr, FP8: gl.constexpr = False, p_buf=None, SUM_MMA: gl.constexpr = False,
              ones_buf=None, l_layout: gl.constexpr = None, QK_CHUNKS: gl.constexpr = 1, col0=0,
              WINDOW: gl.constexpr = False, win_left=0, win_right=0, SOFTCAP: gl.constexpr = False,
              cap_scale=1.0):
        # Tile t's QK^T and tile t-1's PV on the tensor cores, tile t's softmax under the PV.
        # FP8 (eager only): P goes to the PV product from p_buf, the consumer's shared buffer,
        # stored once PV_{t-1} has read the last one (triton 3.6 cannot keep 8-bit registers of
        # an in-flight wgmma alive: "Unexpected bitwidth in WGMMAWaitGroupOp"); p_op is a
        # placeholder then.
        # Coming in: P_{t-1} (p_op) and alpha_{t-1}; unless EAGER, PV_{t-2} still in flight, its
        # P (p_prev) kept alive until the wait that retires it. g: the tile's position in the ring
        # (t, or in a persistent CTA, t plus the tiles of its earlier items).
        # SUM_MMA (-sm): l_i is the [ROWS, 16] accumulator of P @ ones, issued right after each PV
        # and retired by the same waits; with two products behind QK^T_t, its wait allows two.
        # t counts the item's tiles from 0; its keys start at col0 + t * BLOCK_N (col0: a window's
        # first tile's first key, 0 otherwise).
        s = g % STAGES
        sp = (g - 1) % STAGES
        mbarrier.wait(k_full.index(s), (g // STAGES) & 1)
        turns = _take_turn(turn, turns, CID, PINGPONG)
        qk = _issue_qk(q_smem, k_smem, qk, CID, s, QK_CHUNKS)
        if not EAGER:
            # PV_{t-2} completes (QK^T_t may still run); tile t-2's V stage goes back (none at t = 1).
            if SUM_MMA:
                o, p_prev, l_i = warpgroup_mma_wait(num_outstanding=1, deps=(o, p_prev, l_i))
            else:
                o, p_prev = warpgroup_mma_wait(num_outstanding=1, deps=(o, p_prev))
            mbarrier.arrive(v_empty.index((g + STAGES - 2) % STAGES), count=1, pred=t >= 2)
        o, l_i = _rescale(o, l_i, alpha, o_layout, l_layout, SUM_MMA)
        mbarrier.wait(v_full.index(sp), ((g - 1) // STAGES) & 1)
        o, l_i = _issue_pv(o, l_i, p_op, p_buf, v_smem.index(sp), ones_buf, FP8, SUM_MMA)
        _pass_turn(turn, CID, PINGPONG, CONSUMERS)
        if SUM_MMA:
            qk = warpgroup_mma_wait(num_outstanding=2, deps=(qk, ))
        else:
            qk = warpgroup_mma_wait(num_outstanding=1, deps=(qk, ))
        mbarrier.arrive(k_empty.index(s), count=1)
        p, alpha, m_i, l_i = _softmax(qk, m_i, l_i, rows, col0 + t * BLOCK_N, n_k, diag, qk_scale, slope, row_pos,
                                      s_layout, BLOCK_N, CAUSAL, MASKED, ALIBI, FP8, SUM_MMA, WINDOW, win_left,
                                      win_right, SOFTCAP, cap_scale)
        if FP8:
            p8 = p.to(q_smem.dtype)
            o = warpgroup_mma_wait(num_outstanding=0, deps=(o, ))
            p_buf.store(p8)  # PV_{t-1} has read the buffer
            fence_async_shared()
            mbarrier.arrive(v_empty.index(sp), count=1)
            p_next = p_op  # the placeholder
        else:
            p_next = gl.convert_layout(p.to(q_smem.dtype), p_layout)
            if EAGER:
                # FlashAttention-3's order. ptxas 12.8 hoists this wait above the softmax (NOTES v12).
                # The new P is a dependency too: computed before the wait, in other registers.
                if SUM_MMA:
                    o, p_op, p_next, l_i = warpgroup_mma_wait(num_outstanding=0, deps=(o, p_op, p_next, l_i))
                else:
                    o, p_op, p_next = warpgroup_mma_wait(num_outstanding=0, deps=(o, p_op, p_next))
                mbarrier.arrive(v_empty.index(sp), count=1)
        return qk, o, p_op, p_next, alpha, m_i, l_i, turns

    @gluon.jit
    def _consumer(o_desc, q_smem, o_smem, p_smem, k_smem, v_smem, q_full, k_full, v_full, k_empty, v_empty, turn,
                  lse_ptr, off_b, off_h, start_m, n_q, n_k, n_tiles, n_whole, qk_scale, slopes_ptr, H_Q, v_scale,
                  HEAD_DIM: gl.constexpr, HEAD_DIM_V: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                  ROWS: gl.constexpr, CID: gl.constexpr, CAUSAL: gl.constexpr, PINGPONG: gl.constexpr,
                  EAGER: gl.constexpr, CONSUMERS: gl.constexpr, ALIBI: gl.constexpr, FP8: gl.constexpr = False,
                  ones_smem=None, SUM_MMA: gl.constexpr = False, QK_CHUNKS: gl.constexpr = 1,
                  WINDOW: gl.constexpr = False, lo=0, w_lo=0, win_left=0, win_right=0,
                  SOFTCAP: gl.constexpr = False, cap_scale=1.0, SINKS: gl.constexpr = False, sinks_ptr=None):
        # The one item of this CTA: O leaves through Q's buffer (o_smem is q_smem), or FP8's bf16
        # O through a buffer of its own (q_full stands in for q_empty, unused).
        # MLA (V's head dim below Q's, Q in QK_CHUNKS chunks a consumer): O's [ROWS, HEAD_DIM_V]
        # inside this consumer's own part of Q, which no other consumer reads: the whole buffer
        # seen as O-sized slots (2 x 192 columns = 3 slots of 128), consumer c's the first slot
        # that starts in its part (slot 0 for consumer 0, slot 2 for consumer 1, which ends where
        # its part ends).
        if HEAD_DIM_V == HEAD_DIM:
            o_buf = o_smem.index(CID)
        else:
            PART: gl.constexpr = HEAD_DIM  # a consumer's columns of Q, its chunks back to back
            gl.static_assert((CONSUMERS * PART) % HEAD_DIM_V == 0, "Q's buffer is whole O slots")
            SLOT: gl.constexpr = (CID * PART + HEAD_DIM_V - 1) // HEAD_DIM_V
            gl.static_assert((SLOT + 1) * HEAD_DIM_V <= (CID + 1) * PART, "O's slot inside the consumer's part")
            if PUBLIC_REINTERPRET:
                slots = q_smem.reinterpret(q_smem.dtype, [CONSUMERS * PART // HEAD_DIM_V, ROWS, HEAD_DIM_V],
                                           q_smem.layout)
            else:
                slots = q_smem._reinterpret(q_smem.dtype, [CONSUMERS * PART // HEAD_DIM_V, ROWS, HEAD_DIM_V],
                                            q_smem.layout)
            o_buf = slots.index(SLOT)
        # SUM_MMA: this consumer's tile of ones, B of P @ ones ([BLOCK_N, 16]), written once,
        # fenced for the async proxy, and the warp group's barrier after it: every thread's stores
        # are in before the first product reads the tile (triton 3.6 inserts none for it; a
        # barrier that comes later anyway is no proof).
        if SUM_MMA:
            fill: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [4, 1], [1, 0])
            ones_smem.index(CID).store(gl.full([BLOCK_N, 16], 1.0, q_smem.dtype, layout=fill))
            fence_async_shared()
            thread_barrier()
        _consumer_item(o_desc, q_smem, o_buf, k_smem, v_smem, q_full, q_full, k_full, v_full,
                       k_empty, v_empty, turn, lse_ptr, off_b, off_h, start_m, n_q, n_k, n_tiles, n_whole, qk_scale,
                       slopes_ptr, H_Q, 0, 0, 0,
                       HEAD_DIM_V, BLOCK_N, STAGES, ROWS, CID, CAUSAL, PINGPONG, EAGER, CONSUMERS, False, ALIBI,
                       FP8, v_scale, p_smem.index(CID), SUM_MMA, ones_smem.index(CID), QK_CHUNKS, WINDOW, lo, w_lo,
                       win_left, win_right, SOFTCAP, cap_scale, SINKS, sinks_ptr)
        tma.store_wait(pendings=0)

    @gluon.jit
    def _consumer_item(o_desc, q_smem, o_buf, k_smem, v_smem, q_full, q_empty, k_full, v_full, k_empty, v_empty, turn,
                       lse_ptr, off_b, off_h, start_m, n_q, n_k, n_tiles, n_whole, qk_scale, slopes_ptr, H_Q,
                       g, it, turns,
                       HEAD_DIM_V: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, ROWS: gl.constexpr,
                       CID: gl.constexpr, CAUSAL: gl.constexpr, PINGPONG: gl.constexpr, EAGER: gl.constexpr,
                       CONSUMERS: gl.constexpr, PERSISTENT: gl.constexpr, ALIBI: gl.constexpr,
                       FP8: gl.constexpr = False, v_scale=1.0, p_buf=None, SUM_MMA: gl.constexpr = False,
                       ones_buf=None, QK_CHUNKS: gl.constexpr = 1, WINDOW: gl.constexpr = False, lo=0, w_lo=0,
                       win_left=0, win_right=0, SOFTCAP: gl.constexpr = False, cap_scale=1.0,
                       SINKS: gl.constexpr = False, sinks_ptr=None):
        # One work item of consumer CID; returns the turns taken so far. g: K/V tiles the CTA took
        # before the item (the ring's position), it: items before it (Q's phase); both 0 in the
        # one-item grid, where o_buf is Q's part (or, MLA, inside it) and q_empty is unused. q_smem:
        # every consumer's Q, this one's part in chunks [CID * QK_CHUNKS, (CID + 1) * QK_CHUNKS).
        # lse_ptr: this head's LSE row. The item's key tiles: [lo, lo + n_tiles), counted from 0
        # here; of those, [w_lo, n_whole) every row sees whole (WINDOW: tiles before w_lo are a
        # window's left edge, masked; otherwise w_lo is 0 and lo is 0).
        col0 = lo * BLOCK_N
        # HEAD_DIM_V: O's columns, V's head dim (Q's and K's never show here: they live in shared
        # memory and only the products read them).
        # FP8: wgmma's K is 32 (8-bit operands), and P as its register A operand holds 4 keys a
        # thread where 16-bit holds 2 (k_width).
        K_INSTR: gl.constexpr = 32 if FP8 else 16
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, BLOCK_N, K_INSTR])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, HEAD_DIM_V, K_INSTR])
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=4 if FP8 else 2)
        # SUM_MMA: P @ ones's accumulator, 16 columns each holding the row's sum (SUM_COLS).
        l_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, 16, K_INSTR])
        row0 = start_m + CID * ROWS
        rows = row0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, s_layout))
        diag = n_k - n_q
        turns = gl.to_tensor(turns)  # the one-item grid passes 0, a constexpr; the turns come back int32
        if ALIBI:
            # This (batch, head)'s slope (times log2(e), [B, Hq] contiguous) and rows' positions.
            slope = gl.load(slopes_ptr + off_b * H_Q + off_h)
            row_pos = (rows + diag).to(gl.float32)
        else:
            slope = qk_scale
            row_pos = rows

        m_i = gl.full([ROWS], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
        if SUM_MMA:
            l_i = gl.zeros([ROWS, 16], gl.float32, layout=l_layout)
        else:
            l_i = gl.zeros([ROWS], gl.float32, layout=gl.SliceLayout(1, s_layout))
        o = gl.zeros([ROWS, HEAD_DIM_V], gl.float32, layout=o_layout)
        # Q is waited for even with no key tile: its load is in flight (and the buffer may take O).
        mbarrier.wait(q_full.index(CID), it & 1)
        if n_tiles > 0:
            qk = gl.zeros([ROWS, BLOCK_N], gl.float32, layout=s_layout)
            # Tile 0: QK^T alone; the general mask (it is exact on a whole tile too).
            s0 = g % STAGES
            mbarrier.wait(k_full.index(s0), (g // STAGES) & 1)
            turns = _take_turn(turn, turns, CID, PINGPONG)
            qk = _issue_qk(q_smem, k_smem, qk, CID, s0, QK_CHUNKS)
            _pass_turn(turn, CID, PINGPONG, CONSUMERS)
            qk = warpgroup_mma_wait(num_outstanding=0, deps=(qk, ))
            mbarrier.arrive(k_empty.index(s0), count=1)
            p, alpha, m_i, l_i = _softmax(qk, m_i, l_i, rows, col0, n_k, diag, qk_scale, slope, row_pos,
                                          s_layout, BLOCK_N, CAUSAL, True, ALIBI, FP8, SUM_MMA, WINDOW, win_left,
                                          win_right, SOFTCAP, cap_scale)
            if FP8:  # P through p_buf (see _step); p_op a placeholder
                p_buf.store(p.to(q_smem.dtype))
                fence_async_shared()
                p_op = m_i
            else:
                p_op = gl.convert_layout(p.to(q_smem.dtype), p_layout)
            p_prev = p_op  # no product in flight yet; the first step's wait passes at once
            if not EAGER:
                o = warpgroup_mma_init(o)  # o is carried as a product in flight
                if SUM_MMA:
                    l_i = warpgroup_mma_init(l_i)
            # WINDOW: the masked tiles of the left edge first; then the tiles every row sees whole,
            # then the masked ones (the diagonal, the ragged end, a window's right edge).
            if WINDOW:
                w_first = gl.minimum(gl.maximum(w_lo, 1), n_tiles)
                for t in range(1, w_first):
                    qk, o, p_prev, p_op, alpha, m_i, l_i, turns = _step(
                        t, g + t, q_smem, k_smem, v_smem, k_full, v_full, k_empty, v_empty, turn, turns,
                        qk, o, p_prev, p_op, alpha, m_i, l_i, rows, n_k, diag, qk_scale, slope, row_pos,
                        s_layout, o_layout, p_layout, BLOCK_N, STAGES, CID, CAUSAL, True, PINGPONG, EAGER, CONSUMERS,
                        ALIBI, FP8, p_buf, SUM_MMA, ones_buf, l_layout, QK_CHUNKS, col0, WINDOW, win_left, win_right,
                        SOFTCAP, cap_scale)
            else:
                w_first = 1
            for t in range(w_first, n_whole):
                qk, o, p_prev, p_op, alpha, m_i, l_i, turns = _step(
                    t, g + t, q_smem, k_smem, v_smem, k_full, v_full, k_empty, v_empty, turn, turns,
                    qk, o, p_prev, p_op, alpha, m_i, l_i, rows, n_k, diag, qk_scale, slope, row_pos,
                    s_layout, o_layout, p_layout, BLOCK_N, STAGES, CID, CAUSAL, False, PINGPONG, EAGER, CONSUMERS,
                    ALIBI, FP8, p_buf, SUM_MMA, ones_buf, l_layout, QK_CHUNKS, col0, WINDOW, win_left, win_right,
                    SOFTCAP, cap_scale)
            for t in range(gl.maximum(n_whole, w_first), n_tiles):
                qk, o, p_prev, p_op, alpha, m_i, l_i, turns = _step(
                    t, g + t, q_smem, k_smem, v_smem, k_full, v_full, k_empty, v_empty, turn, turns,
                    qk, o, p_prev, p_op, alpha, m_i, l_i, rows, n_k, diag, qk_scale, slope, row_pos,
                    s_layout, o_layout, p_layout, BLOCK_N, STAGES, CID, CAUSAL, True, PINGPONG, EAGER, CONSUMERS,
                    ALIBI, FP8, p_buf, SUM_MMA, ones_buf, l_layout, QK_CHUNKS, col0, WINDOW, win_left, win_right,
                    SOFTCAP, cap_scale)
            # The last tile's PV.
            last = n_tiles - 1
            sl = (g + last) % STAGES
            if not EAGER:
                if SUM_MMA:
                    o, p_prev, l_i = warpgroup_mma_wait(num_outstanding=0, deps=(o, p_prev, l_i))
                else:
                    o, p_prev = warpgroup_mma_wait(num_outstanding=0, deps=(o, p_prev))
                mbarrier.arrive(v_empty.index((g + last + STAGES - 1) % STAGES), count=1, pred=last >= 1)
            o, l_i = _rescale(o, l_i, alpha, o_layout, l_layout, SUM_MMA)
            mbarrier.wait(v_full.index(sl), ((g + last) // STAGES) & 1)
            turns = _take_turn(turn, turns, CID, PINGPONG)
            o, l_i = _issue_pv(o, l_i, p_op, p_buf, v_smem.index(sl), ones_buf, FP8, SUM_MMA)
            _pass_turn(turn, CID, PINGPONG, CONSUMERS)
            if FP8:
                o = warpgroup_mma_wait(num_outstanding=0, deps=(o, ))
            else:
                if SUM_MMA:
                    o, p_op, l_i = warpgroup_mma_wait(num_outstanding=0, deps=(o, p_op, l_i))
                else:
                    o, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(o, p_op))
            mbarrier.arrive(v_empty.index(sl), count=1)
        if PERSISTENT:
            # Every product that read this Q has completed: the producer may load the next item's.
            mbarrier.arrive(q_empty.index(CID), count=1)

        # Epilogue: o / l and the base-2 LSE; a row that saw no key writes 0 and +inf. SINKS: the
        # head's sink (a base-2 logit) joins the denominator and adds no value, as the Triton
        # kernels' _join_sink: O shrinks by 2^(lse - new lse), and a row that saw no key keeps
        # zeros with the sink's LSE.
        if SUM_MMA:  # every column of P @ ones holds the row's sum
            l_i = gl.convert_layout(gl.max(l_i, 1), gl.SliceLayout(1, s_layout))
        seen = l_i > 0.0
        l_safe = gl.where(seen, l_i, 1.0)
        if SINKS:
            sink = gl.load(sinks_ptr + off_h) * 1.4426950408889634
            lse_keys = gl.where(seen, m_i + gl.log2(l_safe), float("-inf"))
            top = gl.maximum(lse_keys, sink)
            lse = top + gl.log2(gl.exp2(lse_keys - top) + gl.exp2(sink - top))
            inv_l = gl.convert_layout(gl.exp2(lse_keys - lse) / l_safe, gl.SliceLayout(1, o_layout))
        else:
            lse = gl.where(seen, m_i + gl.log2(l_safe), float("inf"))
            if FP8:  # V's descale, and O in bf16 (o_buf's dtype)
                inv_l = gl.convert_layout(v_scale / l_safe, gl.SliceLayout(1, o_layout))
            else:
                inv_l = gl.convert_layout(1.0 / l_safe, gl.SliceLayout(1, o_layout))
        out = (o * inv_l[:, None]).to(o_buf.dtype)
        gl.store(lse_ptr + rows, lse, mask=rows < n_q)
        if PERSISTENT:
            # O's own buffer, once the last item's store has read it; this store runs on while
            # the next item starts (the caller waits for it at the end).
            tma.store_wait(pendings=0)
        # One-item grid: Q's buffer holds O on its way out (every product that read Q has completed).
        fence_async_shared()
        o_buf.store(out)
        fence_async_shared()
        tma_store(o_desc, [off_b, off_h, row0, 0], o_buf)
        return turns

    @gluon.jit
    def _deal(r, cta, n_ctas):
        # The r-th item of persistent CTA `cta` of `n_ctas`: a snake over the items in order, round
        # r taking items [r * n_ctas, (r + 1) * n_ctas), forwards in even rounds, backwards in odd.
        # The items come heaviest first (causal), so a CTA that got a heavier one in one round gets
        # a lighter one in the next: every CTA's sum is about the mean.
        return r * n_ctas + cta + (r & 1) * (n_ctas - 1 - 2 * cta)

    @gluon.jit
    def _work(item, n_m, n_bh, n_group, H_Q, GROUP, n_q, n_k,
              BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
        # Work item -> (off_b, off_h, off_hkv, start_m, n_tiles, n_whole). Causal: the heads in
        # groups of n_group, group after group, and in each group the row blocks with the most key
        # tiles first (item j of a group of g heads: row block n_m - 1 - j // g of its head j % g);
        # n_group = n_bh is one group, heaviest first over every head. Not causal (all items
        # equal): a head's row blocks are consecutive, so the CTAs that run at once share its K
        # and V in L2.
        if CAUSAL:
            per_group = n_group * n_m
            first = (item // per_group) * n_group
            within = item - first * n_m
            heads = gl.minimum(n_group, n_bh - first)
            pid_m = n_m - 1 - within // heads
            off_bh = first + within % heads
        else:
            pid_m = item % n_m
            off_bh = item // n_m
        start_m = pid_m * BLOCK_M
        off_b = off_bh // H_Q
        off_h = off_bh % H_Q
        off_hkv = off_h // GROUP
        # Key tiles of this item: [0, n_tiles), of which [0, n_whole) every row sees whole (as the
        # one-item kernel computes them).
        diag = n_k - n_q
        if CAUSAL:
            last_row = gl.minimum(start_m + BLOCK_M, n_q) - 1
            hi = gl.minimum(last_row + diag + 1, n_k)
            whole = gl.minimum(start_m + diag + 1, n_k)
        else:
            hi = n_k
            whole = n_k
        n_tiles = gl.cdiv(gl.maximum(hi, 0), BLOCK_N)
        n_whole = gl.minimum(gl.maximum(whole, 0) // BLOCK_N, n_tiles)
        return off_b, off_h, off_hkv, start_m, n_tiles, n_whole

    @gluon.jit
    def _producer_persistent(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem,
                             q_full, q_empty, k_full, v_full, k_empty, v_empty,
                             cta, n_ctas, n_mine, n_m, n_bh, n_group, H_Q, GROUP, n_q, n_k,
                             BLOCK_N: gl.constexpr, STAGES: gl.constexpr, ROWS: gl.constexpr,
                             CONSUMERS: gl.constexpr, CAUSAL: gl.constexpr):
        g = 0  # K/V tiles this CTA loaded before the item: the rings' position
        for r in range(n_mine):
            off_b, off_h, off_hkv, start_m, n_tiles, n_whole = _work(
                _deal(r, cta, n_ctas), n_m, n_bh, n_group, H_Q, GROUP, n_q, n_k, CONSUMERS * ROWS, BLOCK_N, CAUSAL)
            _load_item(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_full, q_empty, k_full, v_full, k_empty,
                       v_empty, off_b, off_h, off_hkv, start_m, n_tiles, g, r, BLOCK_N, STAGES, ROWS, CONSUMERS,
                       True)
            g += n_tiles

    @gluon.jit
    def _consumer_persistent(o_desc, q_smem, o_smem, k_smem, v_smem, q_full, q_empty, k_full, v_full, k_empty,
                             v_empty, turn, lse_ptr, stride_lb, stride_lh,
                             cta, n_ctas, n_mine, n_m, n_bh, n_group, H_Q, GROUP, n_q, n_k, qk_scale, slopes_ptr,
                             HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                             ROWS: gl.constexpr, CID: gl.constexpr, CAUSAL: gl.constexpr, PINGPONG: gl.constexpr,
                             EAGER: gl.constexpr, CONSUMERS: gl.constexpr, ALIBI: gl.constexpr):
        g = 0  # K/V tiles this CTA took before the item (as the producer counts them)
        turns = 0  # every consumer takes as many turns per item, so the parity carries on
        for r in range(n_mine):
            off_b, off_h, off_hkv, start_m, n_tiles, n_whole = _work(
                _deal(r, cta, n_ctas), n_m, n_bh, n_group, H_Q, GROUP, n_q, n_k, CONSUMERS * ROWS, BLOCK_N, CAUSAL)
            lse_item = lse_ptr + off_b.to(gl.int64) * stride_lb + off_h.to(gl.int64) * stride_lh
            turns = _consumer_item(o_desc, q_smem, o_smem.index(CID), k_smem, v_smem, q_full, q_empty,
                                   k_full, v_full, k_empty, v_empty, turn, lse_item, off_b, off_h, start_m, n_q,
                                   n_k, n_tiles, n_whole, qk_scale, slopes_ptr, H_Q, g, r, turns,
                                   HEAD_DIM, BLOCK_N, STAGES, ROWS, CID, CAUSAL, PINGPONG, EAGER, CONSUMERS, True,
                                   ALIBI)
            g += n_tiles
        tma.store_wait(pendings=0)

    # The persistent grid (Config(persistent=True)): one CTA per SM (or per item, if fewer), each
    # taking its items by _deal. Its own kernel, so the one-item kernel's code stays as measured.
    @gluon.jit(do_not_specialize=("stride_lb", "stride_lh", "H_Q", "GROUP", "n_q", "n_k", "n_bh", "n_group"))
    def _attn_fwd_sm90_persistent(q_desc, k_desc, v_desc, o_desc, lse_ptr, stride_lb, stride_lh,
                                  H_Q, GROUP, n_q, n_k, n_bh, n_group, qk_scale, slopes_ptr,
                                  HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                                  CAUSAL: gl.constexpr, PINGPONG: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                                  EAGER: gl.constexpr, CONSUMERS: gl.constexpr, ALIBI: gl.constexpr = False):
        ROWS: gl.constexpr = 64
        BLOCK_M: gl.constexpr = CONSUMERS * ROWS
        n_m = gl.cdiv(n_q, BLOCK_M)
        cta = gl.program_id(0)
        n_ctas = gl.num_programs(0)
        # Items dealt to this CTA: a full round each, and in the last, partial round the snake's
        # position `cta` (forwards) or `n_ctas - 1 - cta` (backwards) if it is below what is left.
        total = n_m * n_bh
        rounds = total // n_ctas
        last_pos = cta + (rounds & 1) * (n_ctas - 1 - 2 * cta)
        n_mine = rounds + (last_pos < total - rounds * n_ctas).to(gl.int32)

        smem_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        q_smem = gl.allocate_shared_memory(q_desc.dtype, [CONSUMERS, ROWS, HEAD_DIM], smem_layout)
        o_smem = gl.allocate_shared_memory(q_desc.dtype, [CONSUMERS, ROWS, HEAD_DIM], smem_layout)
        k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BLOCK_N, HEAD_DIM], smem_layout)
        v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BLOCK_N, HEAD_DIM], smem_layout)
        q_full = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
        q_empty = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
        # The consumers' turn barriers only where they take turns: without (-nopp) q_full stands
        # in, never waited on. Initialized and never used, a barrier is dead to Triton's allocator,
        # which may give its word to other data (undefined without mbarrier.inval): the likely
        # cause of the Gluon backward's hang (NOTES.md v26); gluon_compile.barrier_aliases found
        # it here in -nopp.
        if PINGPONG:
            turn = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
        else:
            turn = q_full
        k_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for c in gl.static_range(CONSUMERS):
            mbarrier.init(q_full.index(c), count=1)
            mbarrier.init(q_empty.index(c), count=1)
            if PINGPONG:
                mbarrier.init(turn.index(c), count=1)
        for s in gl.static_range(STAGES):
            mbarrier.init(k_full.index(s), count=1)
            mbarrier.init(v_full.index(s), count=1)
            mbarrier.init(k_empty.index(s), count=CONSUMERS)
            mbarrier.init(v_empty.index(s), count=CONSUMERS)
        fence_async_shared()

        # The argument tuples stay inline (see _attn_fwd_sm90).
        if CONSUMERS == 3:
            gl.warp_specialize([
                (_producer_persistent, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_full, q_empty, k_full,
                                        v_full, k_empty, v_empty, cta, n_ctas, n_mine, n_m, n_bh, n_group, H_Q, GROUP, n_q,
                                        n_k, BLOCK_N, STAGES, ROWS, CONSUMERS, CAUSAL)),
                (_consumer_persistent, (o_desc, q_smem, o_smem, k_smem, v_smem, q_full, q_empty, k_full, v_full,
                                        k_empty, v_empty, turn, lse_ptr, stride_lb, stride_lh, cta, n_ctas, n_mine,
                                        n_m, n_bh, n_group, H_Q, GROUP, n_q, n_k, qk_scale, slopes_ptr, HEAD_DIM, BLOCK_N,
                                        STAGES, ROWS, 0, CAUSAL, PINGPONG, EAGER, CONSUMERS, ALIBI)),
                (_consumer_persistent, (o_desc, q_smem, o_smem, k_smem, v_smem, q_full, q_empty, k_full, v_full,
                                        k_empty, v_empty, turn, lse_ptr, stride_lb, stride_lh, cta, n_ctas, n_mine,
                                        n_m, n_bh, n_group, H_Q, GROUP, n_q, n_k, qk_scale, slopes_ptr, HEAD_DIM, BLOCK_N,
                                        STAGES, ROWS, 1, CAUSAL, PINGPONG, EAGER, CONSUMERS, ALIBI)),
                (_consumer_persistent, (o_desc, q_smem, o_smem, k_smem, v_smem, q_full, q_empty, k_full, v_full,
                                        k_empty, v_empty, turn, lse_ptr, stride_lb, stride_lh, cta, n_ctas, n_mine,
                                        n_m, n_bh, n_group, H_Q, GROUP, n_q, n_k, qk_scale, slopes_ptr, HEAD_DIM, BLOCK_N,
                                        STAGES, ROWS, 2, CAUSAL, PINGPONG, EAGER, CONSUMERS, ALIBI)),
            ], [4, 4, 4], [CONSUMER_REGS, CONSUMER_REGS, CONSUMER_REGS])
        else:
            gl.warp_specialize([
                (_producer_persistent, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_full, q_empty, k_full,
                                        v_full, k_empty, v_empty, cta, n_ctas, n_mine, n_m, n_bh, n_group, H_Q, GROUP, n_q,
                                        n_k, BLOCK_N, STAGES, ROWS, CONSUMERS, CAUSAL)),
                (_consumer_persistent, (o_desc, q_smem, o_smem, k_smem, v_smem, q_full, q_empty, k_full, v_full,
                                        k_empty, v_empty, turn, lse_ptr, stride_lb, stride_lh, cta, n_ctas, n_mine,
                                        n_m, n_bh, n_group, H_Q, GROUP, n_q, n_k, qk_scale, slopes_ptr, HEAD_DIM, BLOCK_N,
                                        STAGES, ROWS, 0, CAUSAL, PINGPONG, EAGER, CONSUMERS, ALIBI)),
                (_consumer_persistent, (o_desc, q_smem, o_smem, k_smem, v_smem, q_full, q_empty, k_full, v_full,
                                        k_empty, v_empty, turn, lse_ptr, stride_lb, stride_lh, cta, n_ctas, n_mine,
                                        n_m, n_bh, n_group, H_Q, GROUP, n_q, n_k, qk_scale, slopes_ptr, HEAD_DIM, BLOCK_N,
                                        STAGES, ROWS, 1, CAUSAL, PINGPONG, EAGER, CONSUMERS, ALIBI)),
            ], [4, 4], [CONSUMER_REGS, CONSUMER_REGS])

    # Lengths and head counts as plain integers: specializing them (== 1, % 16) only multiplies
    # compilations; nothing here loads along them with pointer arithmetic.
    @gluon.jit(do_not_specialize=("stride_lb", "stride_lh", "H_Q", "GROUP", "n_q", "n_k", "win_left", "win_right"))
    def _attn_fwd_sm90(q_desc, k_desc, v_desc, o_desc, lse_ptr, stride_lb, stride_lh,
                       H_Q, GROUP, n_q, n_k, qk_scale, slopes_ptr, descale_ptr, win_left, win_right, cap_scale,
                       sinks_ptr,
                       HEAD_DIM: gl.constexpr, HEAD_DIM_V: gl.constexpr, QK_CHUNK: gl.constexpr, BLOCK_N: gl.constexpr,
                       STAGES: gl.constexpr, CAUSAL: gl.constexpr, PINGPONG: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                       EAGER: gl.constexpr, CONSUMERS: gl.constexpr, HEAVY_FIRST: gl.constexpr = False,
                       ALIBI: gl.constexpr = False, FP8: gl.constexpr = False, SUM_MMA: gl.constexpr = False,
                       WINDOW: gl.constexpr = False, SOFTCAP: gl.constexpr = False, SINKS: gl.constexpr = False):
        # SOFTCAP: scores tanh(q . k * cap_scale) * qk_scale (_softmax). SINKS: a sink logit per
        # query head, float32 at sinks_ptr[head], joins each row's denominator (the epilogue).
        gl.static_assert(not (FP8 and (SOFTCAP or SINKS or WINDOW)), "the FP8 kernel takes no variant")
        # WINDOW: a sliding window, row i seeing keys [i + Nk - Nq - win_left, i + Nk - Nq + win_right]
        # (causal folded into win_right by the host, an unbounded side 2**30): the CTA walks only
        # the key tiles some row of it sees. QK_CHUNK: the columns of Q's and K's TMA boxes and
        # shared buffers, HEAD_DIM itself but for MLA's 192 (no power of two, as Gluon's shapes
        # must be): 64, three chunks (_issue_qk).
        QK_CHUNKS: gl.constexpr = HEAD_DIM // QK_CHUNK
        gl.static_assert(QK_CHUNKS * QK_CHUNK == HEAD_DIM and (QK_CHUNKS == 1 or not FP8),
                         "Q's chunks tile its head dim")
        gl.static_assert(not (FP8 and SUM_MMA), "-sm is not for FP8: its sums came out wrong on an H200 (NOTES v20.4)")
        gl.static_assert(HEAD_DIM_V == HEAD_DIM or (not FP8 and HEAD_DIM_V < HEAD_DIM),
                         "V's head dim differs from Q's only below it (MLA: O over Q's buffer), bf16/fp16 only")
        ROWS: gl.constexpr = 64
        BLOCK_M: gl.constexpr = CONSUMERS * ROWS
        n_m = gl.cdiv(n_q, BLOCK_M)
        if HEAVY_FIRST:
            # Causal, grid (B * Hq, n_m): every head's longest row block, then every head's next.
            pid_m = n_m - 1 - gl.program_id(1)
            off_bh = gl.program_id(0)
        else:
            # Causal: the longest row blocks first, so that the grid's tail is short ones.
            pid_m = gl.program_id(0)
            if CAUSAL:
                pid_m = n_m - 1 - pid_m
            off_bh = gl.program_id(1)
        start_m = pid_m * BLOCK_M
        off_b = off_bh // H_Q
        off_h = off_bh % H_Q
        off_hkv = off_h // GROUP

        # Key tiles of this CTA: [0, n_tiles), of which [0, n_whole) every row sees whole. WINDOW:
        # [lo, lo + n_tiles), counted from lo: [w_lo, n_whole) whole, the masked left edge before.
        diag = n_k - n_q
        lo = 0
        w_lo = 0
        if WINDOW:
            last_row = gl.minimum(start_m + BLOCK_M, n_q) - 1
            hi = gl.minimum(last_row + diag + win_right + 1, n_k)
            whole = gl.minimum(start_m + diag + win_right + 1, n_k)
            lo = gl.maximum(start_m + diag - win_left, 0) // BLOCK_N
            w_lo = gl.cdiv(gl.maximum(last_row + diag - win_left, 0), BLOCK_N) - lo
        elif CAUSAL:
            last_row = gl.minimum(start_m + BLOCK_M, n_q) - 1
            hi = gl.minimum(last_row + diag + 1, n_k)
            whole = gl.minimum(start_m + diag + 1, n_k)
        else:
            hi = n_k
            whole = n_k
        n_tiles = gl.maximum(gl.cdiv(gl.maximum(hi, 0), BLOCK_N) - lo, 0)
        n_whole = gl.minimum(gl.maximum(gl.maximum(whole, 0) // BLOCK_N - lo, 0), n_tiles)

        if FP8:
            # e4m3 Q, K and V^T (keys contiguous, [D, BLOCK_N] tiles: FP8 wgmma reads B K-major),
            # rows of HEAD_DIM bytes (Q, K) and BLOCK_N bytes (V^T), each swizzled by its width;
            # O in bf16 through a buffer of its own. descale_ptr: float32 [B, Hkv, 3], q's, k's
            # and v's descales; q's and k's go into the scores' scale, v's into O's.
            row_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=min(HEAD_DIM, 128),
                                                            element_bitwidth=8, rank=2)
            vt_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=min(BLOCK_N, 128),
                                                           element_bitwidth=8, rank=2)
            o_layout16: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
            q_smem = gl.allocate_shared_memory(q_desc.dtype, [CONSUMERS, ROWS, HEAD_DIM], row_layout)
            o_smem = gl.allocate_shared_memory(o_desc.dtype, [CONSUMERS, ROWS, HEAD_DIM], o_layout16)
            k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BLOCK_N, HEAD_DIM], row_layout)
            v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES, HEAD_DIM, BLOCK_N], vt_layout)
            p_smem = gl.allocate_shared_memory(q_desc.dtype, [CONSUMERS, ROWS, BLOCK_N], vt_layout)
            which = (off_b * (H_Q // GROUP) + off_hkv) * 3
            qk_scale = qk_scale * gl.load(descale_ptr + which) * gl.load(descale_ptr + which + 1)
            v_scale = gl.load(descale_ptr + which + 2)
        else:
            smem_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
            q_smem = gl.allocate_shared_memory(q_desc.dtype, [CONSUMERS * QK_CHUNKS, ROWS, QK_CHUNK], smem_layout)
            o_smem = q_smem
            k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES * QK_CHUNKS, BLOCK_N, QK_CHUNK], smem_layout)
            v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BLOCK_N, HEAD_DIM_V], smem_layout)
            p_smem = q_smem  # unused
            v_scale = qk_scale  # unused
        if SUM_MMA:  # -sm: each consumer's tile of ones, B of P @ ones
            ones_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=32, element_bitwidth=16, rank=2)
            ones_smem = gl.allocate_shared_memory(q_desc.dtype, [CONSUMERS, BLOCK_N, 16], ones_layout)
        else:
            ones_smem = q_smem  # unused
        q_full = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
        # The consumers' turn barriers only where they take turns: without (-nopp) q_full stands
        # in, never waited on. Initialized and never used, a barrier is dead to Triton's allocator,
        # which may give its word to other data (undefined without mbarrier.inval): the likely
        # cause of the Gluon backward's hang (NOTES.md v26); gluon_compile.barrier_aliases found
        # it here in -nopp.
        if PINGPONG:
            turn = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
        else:
            turn = q_full
        k_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for c in gl.static_range(CONSUMERS):
            mbarrier.init(q_full.index(c), count=1)
            if PINGPONG:
                mbarrier.init(turn.index(c), count=1)
        for s in gl.static_range(STAGES):
            mbarrier.init(k_full.index(s), count=1)
            mbarrier.init(v_full.index(s), count=1)
            mbarrier.init(k_empty.index(s), count=CONSUMERS)
            mbarrier.init(v_empty.index(s), count=CONSUMERS)
        fence_async_shared()

        lse_ptr = lse_ptr + off_b.to(gl.int64) * stride_lb + off_h.to(gl.int64) * stride_lh
        # The argument tuples stay inline: stored in a variable first, their constexprs became
        # tensors in triton 3.6 (found by the session that probed Gluon on the H200, NOTES v12).
        # One list per consumer count: the tuples must be written out (see above).
        if CONSUMERS == 3:
            gl.warp_specialize([
                (_producer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_full, k_full, v_full, k_empty,
                             v_empty, off_b, off_h, off_hkv, start_m, n_tiles, BLOCK_N, STAGES, ROWS, CONSUMERS,
                             FP8, QK_CHUNKS, QK_CHUNK, lo)),
                (_consumer, (o_desc, q_smem, o_smem, p_smem, k_smem, v_smem, q_full, k_full, v_full, k_empty, v_empty,
                             turn, lse_ptr, off_b, off_h, start_m, n_q, n_k, n_tiles, n_whole, qk_scale, slopes_ptr,
                             H_Q, v_scale, HEAD_DIM, HEAD_DIM_V, BLOCK_N, STAGES, ROWS, 0, CAUSAL, PINGPONG, EAGER,
                             CONSUMERS,
                             ALIBI, FP8, ones_smem, SUM_MMA, QK_CHUNKS, WINDOW, lo, w_lo, win_left,
                             win_right, SOFTCAP, cap_scale, SINKS, sinks_ptr)),
                (_consumer, (o_desc, q_smem, o_smem, p_smem, k_smem, v_smem, q_full, k_full, v_full, k_empty, v_empty,
                             turn, lse_ptr, off_b, off_h, start_m, n_q, n_k, n_tiles, n_whole, qk_scale, slopes_ptr,
                             H_Q, v_scale, HEAD_DIM, HEAD_DIM_V, BLOCK_N, STAGES, ROWS, 1, CAUSAL, PINGPONG, EAGER,
                             CONSUMERS,
                             ALIBI, FP8, ones_smem, SUM_MMA, QK_CHUNKS, WINDOW, lo, w_lo, win_left,
                             win_right, SOFTCAP, cap_scale, SINKS, sinks_ptr)),
                (_consumer, (o_desc, q_smem, o_smem, p_smem, k_smem, v_smem, q_full, k_full, v_full, k_empty, v_empty,
                             turn, lse_ptr, off_b, off_h, start_m, n_q, n_k, n_tiles, n_whole, qk_scale, slopes_ptr,
                             H_Q, v_scale, HEAD_DIM, HEAD_DIM_V, BLOCK_N, STAGES, ROWS, 2, CAUSAL, PINGPONG, EAGER,
                             CONSUMERS,
                             ALIBI, FP8, ones_smem, SUM_MMA, QK_CHUNKS, WINDOW, lo, w_lo, win_left,
                             win_right, SOFTCAP, cap_scale, SINKS, sinks_ptr)),
            ], [4, 4, 4], [CONSUMER_REGS, CONSUMER_REGS, CONSUMER_REGS])
        else:
            gl.warp_specialize([
                (_producer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_full, k_full, v_full, k_empty,
                             v_empty, off_b, off_h, off_hkv, start_m, n_tiles, BLOCK_N, STAGES, ROWS, CONSUMERS,
                             FP8, QK_CHUNKS, QK_CHUNK, lo)),
                (_consumer, (o_desc, q_smem, o_smem, p_smem, k_smem, v_smem, q_full, k_full, v_full, k_empty, v_empty,
                             turn, lse_ptr, off_b, off_h, start_m, n_q, n_k, n_tiles, n_whole, qk_scale, slopes_ptr,
                             H_Q, v_scale, HEAD_DIM, HEAD_DIM_V, BLOCK_N, STAGES, ROWS, 0, CAUSAL, PINGPONG, EAGER,
                             CONSUMERS,
                             ALIBI, FP8, ones_smem, SUM_MMA, QK_CHUNKS, WINDOW, lo, w_lo, win_left,
                             win_right, SOFTCAP, cap_scale, SINKS, sinks_ptr)),
                (_consumer, (o_desc, q_smem, o_smem, p_smem, k_smem, v_smem, q_full, k_full, v_full, k_empty, v_empty,
                             turn, lse_ptr, off_b, off_h, start_m, n_q, n_k, n_tiles, n_whole, qk_scale, slopes_ptr,
                             H_Q, v_scale, HEAD_DIM, HEAD_DIM_V, BLOCK_N, STAGES, ROWS, 1, CAUSAL, PINGPONG, EAGER,
                             CONSUMERS,
                             ALIBI, FP8, ones_smem, SUM_MMA, QK_CHUNKS, WINDOW, lo, w_lo, win_left,
                             win_right, SOFTCAP, cap_scale, SINKS, sinks_ptr)),
            ], [4, 4], [CONSUMER_REGS, CONSUMER_REGS])


# ---------------------------------------------------------------------------------------------
# Host side
# ---------------------------------------------------------------------------------------------


def unsupported_reason(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                       scale: float | None = None, *, variants: object | None = None,
                       layout: object | None = None) -> str | None:
    """Why this kernel does not take the call (None: it does). Covered: dense ``[B, H, N, D]``
    float16/bfloat16 q, k, v on a Hopper GPU (sm_90), head dim 64 or 128 (V's the same) or MLA's
    192 with V's 128 (:data:`HEAD_DIM_PAIRS`), GQA/MQA
    (Hq a multiple of Hkv), causal or not, any lengths >= 1, a positive scale, strides TMA can
    address (head dim contiguous, the rest multiples of 16 bytes), ALiBi, sliding windows, softcap,
    sinks (:func:`.launch.gluon_path` sends MLA with a variant, which no GPU has run yet, only with
    its untried switch). Not: varlen, paged KV, float32, FP8, other head dims."""
    if layout is not None:
        return "packed sequences and paged KV caches take the existing kernels"
    if not plain_variants(causal, variants, alibi=True, window=True, softcap=True, sinks=True):
        return "variants the Gluon forward does not know take the existing kernels"
    if (reason := dense_reason(q, k, v, head_dims=HEAD_DIM_PAIRS)) is not None:
        return reason
    if scale is not None and not (math.isfinite(scale) and scale > 0):
        return "a positive finite scale (the row maximum is taken before scaling)"
    if (reason := strides_reason(q, k, v)) is not None:
        return reason
    batch, heads_q = q.shape[:2]
    if batch * heads_q > 65535:
        return "batch x heads above 65535 (the grid's second axis)"
    return None


def supports(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float | None = None, *,
             variants: object | None = None, layout: object | None = None) -> bool:
    """Whether :func:`flash_fwd` takes this call (:func:`unsupported_reason` says why not)."""
    return unsupported_reason(q, k, v, causal, scale, variants=variants, layout=layout) is None


def launch_arguments(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                     causal: bool, scale: float, config: Config, slopes: torch.Tensor | None = None,
                     window: tuple[int, int] | None = None, softcap: float = 0.0,
                     sinks: torch.Tensor | None = None) -> tuple[tuple, dict, tuple[int, int]]:
    """(positional arguments, keyword arguments, grid) of one launch: what :func:`flash_fwd` runs
    and what ``tools/flash_bench/gluon_compile.py`` compiles without a GPU. ``slopes``: ALiBi's,
    times log2(e), float32 [B, Hq] contiguous (None: no ALiBi). ``window``: (left, right), a side of
    -1 unbounded (None: no window); ``softcap``: the cap (0: none); ``sinks``: float32 [Hq]
    contiguous, each head's sink logit (None: none). The three take the one-item grid only."""
    batch, heads_q, n_q, head_dim = q.shape
    heads_kv, n_k, head_dim_v = k.shape[1], k.shape[2], v.shape[-1]
    chunk = qk_chunk(head_dim)
    # Softcap: scores tanh(q . k * scale / cap) * cap, in base 2 (the Triton kernels' split).
    qk_scale, cap_scale = (softcap * LOG2E, scale / softcap) if softcap else (scale * LOG2E, 1.0)
    args = (descriptor(q, ROWS_PER_CONSUMER, cols=chunk), descriptor(k, config.block_n, cols=chunk),
            descriptor(v, config.block_n),
            descriptor(o, ROWS_PER_CONSUMER), lse, lse.stride(0), lse.stride(1),
            heads_q, heads_q // heads_kv, n_q, n_k, qk_scale, slopes)
    kwargs = dict(HEAD_DIM=head_dim, BLOCK_N=config.block_n, STAGES=config.stages, CAUSAL=bool(causal),
                  PINGPONG=config.pingpong, CONSUMER_REGS=config.consumer_regs, EAGER=config.eager,
                  CONSUMERS=config.consumers, num_warps=4)
    if slopes is not None:
        kwargs["ALIBI"] = True
    if config.sum_mma:
        kwargs["SUM_MMA"] = True
    if config.persistent:  # _attn_fwd_sm90_persistent: n_bh, n_group before the scale, a CTA per SM
        if window is not None or softcap or sinks is not None:
            raise ValueError(f"config {config}: windows, softcap and sinks take the one-item grid (default_config)")
        if head_dim_v != head_dim:
            raise ValueError(f"config {config}: the persistent grid keeps V's head dim equal to Q's (MLA takes the "
                             "one-item grid: default_config)")
        n_m, n_bh = triton.cdiv(n_q, config.block_m), batch * heads_q
        n_ctas = min(n_m * n_bh, sm_count(q.device))
        n_ctas, n_group = grouped_grid(n_m, n_bh, n_ctas) if config.grouped and causal else (n_ctas, n_bh)
        args = args[:-2] + (n_bh, n_group) + args[-2:]
        return args, kwargs, (n_ctas, )
    # The one-item kernel's descale_ptr (FP8's only: launch_arguments_fp8), then the window's band.
    args = args + (None, *band(causal, window), cap_scale, sinks)
    if window is not None:
        kwargs["WINDOW"] = True
    if softcap:
        kwargs["SOFTCAP"] = True
    if sinks is not None:
        kwargs["SINKS"] = True
    kwargs["HEAD_DIM_V"] = head_dim_v
    kwargs["QK_CHUNK"] = chunk
    if config.heavy_first and causal:
        kwargs["HEAVY_FIRST"] = True
        return args, kwargs, (batch * heads_q, triton.cdiv(n_q, config.block_m))
    return args, kwargs, (triton.cdiv(n_q, config.block_m), batch * heads_q)


def qk_chunk(head_dim: int) -> int:
    """Columns of Q's and K's TMA boxes and shared buffers: the head dim where it is a power of two,
    else 64 (MLA's 192 in three chunks; Gluon's shapes are powers of two)."""
    return head_dim if head_dim & (head_dim - 1) == 0 else 64


def grouped_grid(n_m: int, n_bh: int, n_ctas: int) -> tuple[int, int]:
    """(CTAs, heads per group) for ``-g`` with at most ``n_ctas`` CTAs: a group is exactly two
    rounds of the snake (``2 x CTAs`` items of ``n_m`` row blocks each), so that each round's
    heavy items pair with the next round's light ones inside the group; a group that is not a
    whole number of rounds drifts the pairing from group to group (1.5-1.7x the mean work on the
    busiest CTA at 2k-4k, gluon_model.py). So the CTAs are the most, at most ``n_ctas``, whose
    double is a multiple of ``n_m``: 132 at 1k (33 heads a group, 16.5 MiB of K and V at d128),
    128 at 2k-16k (16 to 2 heads). Where no such count exists, or all heads fit in one group,
    one group: ``-p``'s order."""
    step = n_m // math.gcd(n_m, 2)
    ctas = n_ctas // step * step
    if ctas == 0 or 2 * ctas // n_m >= n_bh:
        return n_ctas, n_bh
    return ctas, 2 * ctas // n_m


def kernel(config: Config):
    """The Gluon kernel a configuration launches: the one-item grid's or the persistent one."""
    return _attn_fwd_sm90_persistent if config.persistent else _attn_fwd_sm90


def sm_count(device: torch.device) -> int:
    """SMs of the GPU (one persistent CTA each); an H100 SXM's 132 where no GPU answers (the
    compile tools)."""
    try:
        return torch.cuda.get_device_properties(device).multi_processor_count
    except Exception:
        return 132


def warmup(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float,
           config: Config | None = None, alibi: bool = False, window: tuple[int, int] | None = None,
           softcap: float = 0.0, sinks: bool = False):
    """Compile (without launching) the kernel :func:`flash_fwd` would run on these inputs, and
    return Triton's compiled kernel (its ``asm``: ``ptx``, ``cubin``...; its ``metadata``). Lengths
    and head counts are not specialized: one kernel serves every shape of a dtype, head dim, causal
    flag and configuration (``alibi``: the kernel with ALiBi; ``window``: with a sliding window, one
    kernel for every window; ``softcap``, ``sinks``: with those). The bench tools use it to compile
    ahead, or for a GPU not present."""
    batch, heads_q, n_q, head_dim = q.shape
    if config is None:
        config = default_config(head_dim, causal, k.shape[2], v.shape[-1],
                                one_item=window is not None or bool(softcap) or sinks)
    o = torch.empty((batch, heads_q, n_q, v.shape[-1]), dtype=q.dtype, device=q.device)
    lse = torch.empty((batch, heads_q, n_q), dtype=torch.float32, device=q.device)
    slopes = torch.empty((batch, heads_q), dtype=torch.float32, device=q.device) if alibi else None
    sink_logits = torch.empty((heads_q, ), dtype=torch.float32, device=q.device) if sinks else None
    args, kwargs, grid = launch_arguments(q, k, v, o, lse, causal, scale, config, slopes, window, softcap,
                                          sink_logits)
    return kernel(config).warmup(*args, **kwargs, grid=grid)


def flash_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float,
              config: Config | None = None, *, alibi_slopes: torch.Tensor | None = None,
              window: tuple[int, int] | None = None, softcap: float = 0.0, sinks: torch.Tensor | None = None,
              out: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(output ``[B, Hq, Nq, Dv]`` in q's dtype, base-2 LSE float32 ``[B, Hq, Nq]``) for a call that
    :func:`supports` takes, as :func:`.launch.flash_fwd` returns them (its backward reads this LSE;
    the natural one is it times ln 2). ``scale`` multiplies q . k (``1/sqrt(D)`` is the caller's
    default); ``causal`` is bottom-right. ``config`` forces tiles (bench tools); by default
    :func:`default_config`. ``alibi_slopes``: float32 [Hq] or [B, Hq] (the contract's), the bias
    ``- slope * |i + Nk - Nq - j|`` on the scores. ``window``: (left, right), row ``i`` seeing keys
    ``j`` with ``-right <= i + Nk - Nq - j <= left`` (a side of -1 unbounded; with causal too, the
    contract's sliding window). ``softcap`` (> 0; 0: none): scores ``cap * tanh(scale q . k / cap)``.
    ``sinks``: float [Hq], each query head's sink logit, joining every row's denominator (the
    contract's attention sinks; the LSE includes it). ``out`` hands in the two outputs, contiguous (a
    check poisons them first). The caller checks :func:`supports` first: this function does not."""
    batch, heads_q, n_q, head_dim = q.shape
    head_dim_v = v.shape[-1]
    if config is None:
        config = default_config(head_dim, causal, k.shape[2], head_dim_v,
                                one_item=window is not None or bool(softcap) or sinks is not None)
    need = shared_bytes(config, head_dim, head_dim_v=head_dim_v)
    if need > SHARED_LIMIT:
        raise ValueError(f"config {config} needs {need} B of shared memory at d{head_dim}"
                         + (f"/dv{head_dim_v}" if head_dim_v != head_dim else ""))
    if (reason := register_reason(config)) is not None:
        raise ValueError(reason)
    if out is None:
        o = torch.empty((batch, heads_q, n_q, head_dim_v), dtype=q.dtype, device=q.device)
        lse = torch.empty((batch, heads_q, n_q), dtype=torch.float32, device=q.device)
    else:
        o, lse = out
        if (o.shape != (batch, heads_q, n_q, head_dim_v) or o.dtype != q.dtype or not o.is_contiguous()
                or lse.shape != (batch, heads_q, n_q) or lse.dtype != torch.float32 or not lse.is_contiguous()):
            raise ValueError("out must be a contiguous [B, Hq, Nq, Dv] output in q's dtype and a contiguous float32 "
                             "[B, Hq, Nq] LSE")
    slopes = None
    if alibi_slopes is not None:
        slopes = (alibi_slopes.float() * LOG2E).expand(batch, heads_q).contiguous()
    sink_logits = None if sinks is None else sinks.to(torch.float32).contiguous()
    args, kwargs, grid = launch_arguments(q, k, v, o, lse, causal, scale, config, slopes, window, softcap,
                                          sink_logits)
    kernel(config)[grid](*args, **kwargs)
    return o, lse


# ---------------------------------------------------------------------------------------------
# FP8 (e4m3) forward: the one-item kernel with FP8=True. Compile-checked for sm_90a
# (tools/flash_bench/gluon_compile.py --fp8) and run on a GPU (NOTES.md, v20.1, v20.4-v20.6);
# faster than the Triton FP8 forward on an H200 and an H100 at d128 from 4k keys and d64 at 16k,
# where launch._gluon_fp8_takes sends the calls.
# ---------------------------------------------------------------------------------------------

#: FP8 inputs this kernel takes: e4m3, as the Triton FP8 forward (:data:`.launch.FP8_DTYPES`).
FP8_DTYPES = (torch.float8_e4m3fn, )


def fp8_unsupported_reason(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                           variants: object | None = None) -> str | None:
    """Why the FP8 kernel does not take the call (None: it does): dense ``[B, H, N, D]`` e4m3 q, k,
    v on a Hopper GPU, head dim 64 or 128 (V's the same), GQA, causal or not, strides TMA can
    address. Not: variants, other dtypes or head dims."""
    if not plain_variants(causal, variants):
        return "variants take the existing FP8 kernel"
    if (reason := dense_reason(q, k, v, FP8_DTYPES, "float8_e4m3fn")) is not None:
        return reason
    batch, heads_q = q.shape[:2]
    if batch * heads_q > 65535:
        return "batch x heads above 65535 (the grid's second axis)"
    return strides_reason(q, k)


#: Causal FP8 calls over fewer keys than this keep two consumers (see :func:`fp8_config`).
FP8_CAUSAL_C3_MIN_KEYS = 16384


def fp8_config(head_dim: int, causal: bool = False, n_k: int | None = None) -> Config:
    """The FP8 kernel's tiles: the one-item grid, 128 keys a tile, the ring three deep at both
    head dims (the tiles are half the bytes of bf16's); three consumers (``c3-r160``, 192 rows a
    program) except for causal calls over fewer than :data:`FP8_CAUSAL_C3_MIN_KEYS` keys, which
    keep two (``n128s3-eager``).

    On an H200, timed as the speed suite times (``fp8_check.py``, results/2026-11-27-session12/
    i42), three consumers against two, TFLOP/s: d128 16k 948 / 804, causal 891 / 774, 4k 840 /
    723, causal 543 / 595; d64 16k 600 / 452, causal 547 / 456, 4k 506 / 416, causal 332 / 361.
    Causal 4k loses: 192-row programs leave its grid short of work. FP8's S and O take 128 of the
    160 registers with P in shared memory, so d128 fits three consumers, as bf16 does not (NOTES.md,
    v20.4, v20.5). Causal lengths between 4k and 16k are not measured; they keep two."""
    if causal and (n_k is None or n_k < FP8_CAUSAL_C3_MIN_KEYS):
        return Config(block_n=128, stages=3, eager=True)
    return Config(block_n=128, stages=3, eager=True, consumers=3, consumer_regs=MAX_REGS_THREE_CONSUMERS)


def keys_last_like(v: torch.Tensor) -> torch.Tensor:
    """An empty ``[B, H, D, N]`` of ``v``'s (``[B, H, N, D]``) dtype with the keys contiguous and
    rows padded to 16 keys, the layout :func:`flash_fwd_fp8` takes V in (for a warm-up, which
    compiles without reading it)."""
    batch, heads, n_k, head_dim = v.shape
    padded = triton.cdiv(n_k, 16) * 16
    return torch.empty((batch, heads, head_dim, padded), dtype=v.dtype, device=v.device)[..., :n_k]


def launch_arguments_fp8(q: torch.Tensor, k: torch.Tensor, v_t: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                         descales: torch.Tensor, causal: bool, scale: float,
                         config: Config) -> tuple[tuple, dict, tuple[int, int]]:
    """(positional arguments, keyword arguments, grid) of one FP8 launch: ``v_t`` from
    ``flash_fwd_fp8``'s, ``o`` bf16 ``[B, Hq, Nq, D]``, ``descales`` float32 ``[B, Hkv, 3]`` (q's, k's,
    v's)."""
    if not config.eager:
        raise ValueError(f"config {config}: the FP8 kernel is eager only (P's shared buffer is refilled "
                         "once the PV product before has read it)")
    if config.sum_mma:
        raise ValueError(f"config {config}: -sm is not for FP8 (its outputs were wrong on 40 of 44 shapes, right only "
                         "where a row sees one key, on an H200, 2026-11-27; NOTES.md, v20.4)")
    batch, heads_q, n_q, head_dim = q.shape
    heads_kv, n_k = k.shape[1], k.shape[2]
    swizzle = min(head_dim, 128)
    args = (descriptor(q, ROWS_PER_CONSUMER, swizzle), descriptor(k, config.block_n, swizzle),
            descriptor(v_t, head_dim, min(config.block_n, 128), cols=config.block_n),
            descriptor(o, ROWS_PER_CONSUMER), lse, lse.stride(0), lse.stride(1),
            heads_q, heads_q // heads_kv, n_q, n_k, scale * LOG2E, None, descales, 0, 0, 1.0, None)
    kwargs = dict(HEAD_DIM=head_dim, HEAD_DIM_V=head_dim, QK_CHUNK=head_dim, BLOCK_N=config.block_n,
                  STAGES=config.stages, CAUSAL=bool(causal), PINGPONG=config.pingpong, CONSUMER_REGS=config.consumer_regs,
                  EAGER=config.eager, CONSUMERS=config.consumers, FP8=True, num_warps=4)
    return args, kwargs, (triton.cdiv(n_q, config.block_m), batch * heads_q)


def fp8_descales(descales: tuple[torch.Tensor | None, ...], batch: int, heads_kv: int,
                 device: torch.device) -> torch.Tensor:
    """q's, k's and v's descales (each float [B, Hkv] or None for 1) as one float32 [B, Hkv, 3]."""
    ones = torch.ones((batch, heads_kv), dtype=torch.float32, device=device)
    return torch.stack([ones if d is None else d.to(torch.float32) for d in descales], dim=-1).contiguous()


def warmup_fp8(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float,
               config: Config | None = None):
    """Compile (without launching) the FP8 kernel for these inputs (see :func:`warmup`)."""
    batch, heads_q, n_q, head_dim = q.shape
    config = fp8_config(head_dim, causal, k.shape[2]) if config is None else config
    o = torch.empty(q.shape, dtype=torch.bfloat16, device=q.device)
    lse = torch.empty((batch, heads_q, n_q), dtype=torch.float32, device=q.device)
    v_t = keys_last_like(v)
    descales = torch.empty((batch, k.shape[1], 3), dtype=torch.float32, device=q.device)
    args, kwargs, grid = launch_arguments_fp8(q, k, v_t, o, lse, descales, causal, scale, config)
    return _attn_fwd_sm90.warmup(*args, **kwargs, grid=grid)


def flash_fwd_fp8(q: torch.Tensor, k: torch.Tensor, v_t: torch.Tensor, causal: bool, scale: float,
                  descales: tuple[torch.Tensor | None, ...] = (None, None, None),
                  config: Config | None = None) -> torch.Tensor:
    """The FP8 forward's output, bf16 ``[B, Hq, Nq, D]``, for a call :func:`fp8_unsupported_reason`
    takes: ``softmax(scale * q_descale * k_descale * q k^T) v * v_descale`` (descales float
    ``[B, Hkv]`` or None for 1; FlashAttention-3's), as :func:`.launch.flash_fwd_fp8` returns it.

    ``v_t`` is V as ``[B, H, D, N]`` with the keys contiguous (FP8 wgmma reads its B operand
    K-major) and each row 16-byte aligned, as TMA needs: the Triton FP8 kernel's copy
    (``launch.keys_contiguous(v).transpose(2, 3)``). torch's own strided copy of an e4m3
    ``v.transpose(2, 3)`` took 222 us a call at 16k tokens x 2048 on an H100, against 21 us for that
    one, and made this forward slower than the Triton one (NOTES.md, v20.1)."""
    batch, heads_q, n_q, head_dim = q.shape
    config = fp8_config(head_dim, causal, k.shape[2]) if config is None else config
    o = torch.empty(q.shape, dtype=torch.bfloat16, device=q.device)
    lse = torch.empty((batch, heads_q, n_q), dtype=torch.float32, device=q.device)  # written, not returned
    args, kwargs, grid = launch_arguments_fp8(q, k, v_t, o, lse,
                                              fp8_descales(descales, batch, k.shape[1], q.device),
                                              causal, scale, config)
    _attn_fwd_sm90[grid](*args, **kwargs)
    return o
