"""Launch policy for the kernels in :mod:`.kernels`: input checks, tiles, the decode split and grids.

``flash_fwd``, ``flash_bwd`` and the FP8 forward ``flash_fwd_fp8`` are what :mod:`.autograd`
calls. Tiles are fixed per kernel, head dim, dtype and causal flag (:func:`default_tiles`), so that
every run of a suite times the same code. A tool that wants other tiles installs a chooser with
:func:`set_tile_chooser` (the timing tuner in ``tools/flash_bench/tuner.py`` does); the shipped
package never times anything itself.
Versions, numbers and what limits them: ``NOTES.md`` beside this file.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import torch

from .gluon_common import GLUON_SWITCH, gluon_off, path_setting
from .kernels import UNBOUNDED as _UNBOUNDED
from .kernels import (
    attn_bwd_dkdv,
    attn_bwd_dq,
    attn_bwd_pad_rows,
    attn_bwd_preprocess,
    attn_fwd,
    attn_fwd_combine,
    attn_fwd_fp8,
    attn_fwd_split,
    band,
    transpose_keys,
    triton,
)

_LOG2E = 1.4426950408889634

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MIN_HEAD_DIM, MAX_HEAD_DIM = 16, 256
#: V's head dim may differ from Q's (MLA: 128 with Q's 192, 512 with Q's 64).
MAX_HEAD_DIM_V = 512
#: Decode path: at most this many query rows per kv head (GROUP x Nq) go through the split kernel.
_DECODE_MAX_ROWS = 64
_DECODE_MAX_SEQLEN_Q = 16
#: From this many keys on, the split decode (two launches) takes less GPU time than the plain
#: forward, which reads K/V once per query head of a group and runs few programs: on an H200, b4
#: hq32 hkv8 k2048 0.026 ms against 0.033, k4096 0.038 against 0.072; at k1024 the two are level
#: for b4 (NOTES.md, v6). Its host path is longer (about 115 us a call against 80), which only a
#: host-bound caller (eager decode outside a CUDA graph) sees. A short cache still takes the decode
#: kernel when one slice per kv head already fills the GPU (one launch, no merge).
_DECODE_SPLIT_MIN_KEYS = 2048
#: Paged caches keep the earlier bound: the merge's scratch (a fixed size, set by the SM count) then
#: stays out of small caches, whose peak memory the memory suite fits against the tokens (at 2048 the
#: H200 sweep read 276 KiB at 4k tokens against 1-9 KiB around it: no power law). Their speed
#: between 2k and 8k keys is not measured.
_PAGED_SPLIT_MIN_KEYS = 8192
#: FP8 inputs of the forward: e4m3, as FlashAttention-3's FP8 forward takes (e5m2 is not claimed).
FP8_DTYPES = (torch.float8_e4m3fn,)
#: FP8 head dims: tiled whole (no column masks), each a multiple of FP8 wgmma's K (32).
FP8_HEAD_DIMS = (64, 128)
#: FP8 tensor cores start with Ada (sm89); Hopper (sm90) has FP8 wgmma.
FP8_MIN_CAPABILITY = (8, 9)


def interpreting() -> bool:
    """Whether Triton runs in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


# ---------------------------------------------------------------------------------------------
# Tiles
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tiles:
    """One launch configuration. For the decode kernel ``block_m`` is unused (the tile's rows are
    the query rows of a kv head) and ``waves`` sets how many programs per SM the key split aims
    for."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    waves: int = 0

    def __str__(self) -> str:
        if self.block_m == 0:  # decode
            return f"n{self.block_n} w{self.num_warps} s{self.num_stages} waves{self.waves}"
        return f"{self.block_m}x{self.block_n} w{self.num_warps} s{self.num_stages}"


#: Kernels with tile choices: the forward, the decode forward, the two backward kernels and the
#: FP8 forward.
KERNELS = ("fwd", "decode", "dkdv", "dq", "fp8")


@functools.lru_cache(maxsize=None)
def tile_candidates(kernel: str, block_d: int, dtype: torch.dtype) -> tuple[Tiles, ...]:
    """The few tile shapes worth timing for ``kernel`` at padded head dim ``block_d``, best guess first.

    On the GPU the lists are short on purpose: each entry costs a compilation on first use. They
    keep the pipelined tiles inside Hopper's 228 KB of shared memory per SM up to D = 256. fp32
    is not a speed target: it gets the first guess with halved tiles (each element is twice as
    big), untuned. Under the interpreter each program costs a fixed overhead per operation, so one
    large tile is fastest; its decode split aims at a handful of programs so that CI exercises the
    merge.
    """
    if kernel not in KERNELS:
        raise ValueError(f"unknown kernel {kernel!r} (known: {', '.join(KERNELS)})")
    if interpreting():
        return (Tiles(0, 128, 4, 1, waves=1) if kernel == "decode" else Tiles(128, 128, 4, 1),)
    small, medium = block_d <= 64, block_d <= 128
    # Each list keeps the winners of a tile sweep (NOTES.md), so a tuner has nothing worse to try;
    # without one, default_tiles picks among them, and fp32 gets the first.
    table = {
        "fwd": ([Tiles(64, 64, 4, 3), Tiles(128, 64, 4, 3), Tiles(128, 128, 4, 3)] if small else
                [Tiles(64, 64, 4, 3), Tiles(128, 128, 8, 3), Tiles(128, 64, 8, 3)] if medium else
                [Tiles(128, 64, 8, 2), Tiles(64, 32, 4, 2), Tiles(128, 32, 8, 2)]),
        "decode": ([Tiles(0, 64, 4, 4, waves=4), Tiles(0, 64, 4, 3, waves=8), Tiles(0, 128, 4, 3, waves=4)] if medium else
                   [Tiles(0, 32, 4, 3, waves=4), Tiles(0, 64, 4, 2, waves=4), Tiles(0, 32, 4, 2, waves=8)]),
        "dkdv": ([Tiles(32, 64, 4, 3), Tiles(32, 128, 4, 3), Tiles(64, 64, 4, 3)] if small else
                 [Tiles(64, 64, 4, 2), Tiles(32, 64, 4, 3), Tiles(64, 128, 8, 3)] if medium else
                 [Tiles(32, 64, 4, 2), Tiles(32, 32, 4, 2), Tiles(64, 32, 4, 2)]),
        "dq": ([Tiles(64, 64, 4, 3), Tiles(128, 64, 8, 3)] if small else
               [Tiles(128, 64, 8, 3), Tiles(128, 32, 4, 3), Tiles(64, 32, 4, 3)] if medium else
               [Tiles(64, 32, 4, 2), Tiles(32, 32, 4, 2), Tiles(32, 64, 4, 2)]),
        # FP8 (head dims 64 and 128 only): tiles of one warp group, two or more programs to an
        # SM, whose softmax and products interleave; the Triton tutorial's 128x128 with two warp
        # groups was 15-20% slower at d128 in the H200 sweeps (NOTES.md, v7). A tile is half a
        # 16-bit one's bytes.
        "fp8": ([Tiles(64, 64, 4, 3), Tiles(64, 256, 4, 3), Tiles(64, 128, 4, 3)] if small else
                [Tiles(64, 128, 4, 3), Tiles(64, 64, 4, 3), Tiles(128, 128, 8, 3)]),
    }
    candidates = table[kernel]
    if block_d > 256:  # V's head dim 512 (MLA): a [rows, 512] float32 accumulator; untuned
        candidates = [Tiles(0, 32, 4, 2, waves=4) if kernel == "decode" else Tiles(32, 32, 4, 2)]
    if dtype == torch.float32:
        first = candidates[0]
        return (Tiles(first.block_m and max(16, first.block_m // 2), max(16, first.block_n // 2), first.num_warps,
                      first.num_stages, first.waves),)
    return tuple(candidates)


def default_tiles(kernel: str, block_d: int, dtype: torch.dtype, causal: bool, n_k: int) -> Tiles:
    """The tiles a kernel gets when no chooser is installed: the winners of the tile sweep
    (NOTES.md), fixed so that every run of a suite times the same code, since choosing per process
    by a few timings adds run-to-run noise that the regression gate would have to carry."""
    candidates = tile_candidates(kernel, block_d, dtype)
    if len(candidates) == 1 or block_d > 128:
        return candidates[0]
    small = block_d <= 64
    by_kernel = {
        "fwd": Tiles(64, 64, 4, 3),
        "decode": candidates[0],
        # d128: 64x64 with one warp group and two stages, so two programs share an SM (v7's
        # sweep: 7-12% faster than 64x128/8/3 and 32x64/4/3, causal or not, ALiBi, windows).
        "dkdv": (Tiles(32, 128, 4, 3) if causal else Tiles(32, 64, 4, 3)) if small else Tiles(64, 64, 4, 2),
        "dq": (Tiles(64, 64, 4, 3) if causal else Tiles(128, 64, 8, 3)) if small else Tiles(128, 64, 8, 3),
        "fp8": (Tiles(64, 64, 4, 3) if causal else Tiles(64, 256, 4, 3)) if small else Tiles(64, 128, 4, 3),
    }
    return by_kernel[kernel]


class TileChooser(Protocol):
    """What :func:`set_tile_chooser` installs.

    ``key`` is ``(kernel, dtype, head_dim, causal, size classes...)``; ``candidates`` come from
    :func:`tile_candidates`, best guess first; ``run(tiles)`` launches the kernel once with those
    tiles on the real inputs (its outputs are overwritten by the launch that follows); ``work`` is
    the problem's FLOPs, or bytes when ``memory_bound`` (decode). Returns one of ``candidates``.
    """

    def __call__(self, key: tuple, candidates: tuple[Tiles, ...], run: Callable[[Tiles], Any], *,
                 work: float, memory_bound: bool = False) -> Tiles: ...


class PlanCache:
    """The forward's choice of kernel and tiles per (shapes, dtype, causal, device), made once per
    shape so that a repeated call (decode, where host time shows) pays only a dictionary lookup.

    Owned by this module; :func:`set_tile_chooser` empties it so that no plan outlives the chooser
    that made it. Past ``limit`` entries it starts over, for a long-lived process that sees
    endless shapes.
    """

    def __init__(self, limit: int = 4096) -> None:
        self.limit = limit
        self._plans: dict[tuple, tuple[Callable[..., None], Tiles]] = {}

    def get(self, key: tuple) -> tuple[Callable[..., None], Tiles] | None:
        return self._plans.get(key)

    def put(self, key: tuple, plan: tuple[Callable[..., None], Tiles]) -> None:
        if len(self._plans) >= self.limit:
            self._plans.clear()
        self._plans[key] = plan

    def clear(self) -> None:
        self._plans.clear()

    def __len__(self) -> int:
        return len(self._plans)


_PLANS = PlanCache()
_tile_chooser: TileChooser | None = None


def set_tile_chooser(chooser: TileChooser | None) -> TileChooser | None:
    """Install ``chooser`` to pick every kernel's tiles from then on (``None``: back to
    :func:`default_tiles`); returns the chooser it replaces.

    For tools that measure tiles (``tools/flash_bench/tuner.py``), not for the suite, which times
    the fixed defaults. Cached forward plans are dropped, so the next call of each shape asks the
    new chooser.
    """
    global _tile_chooser
    previous, _tile_chooser = _tile_chooser, chooser
    _PLANS.clear()
    return previous


def _choose(kernel: str, key: tuple, block_d: int, dtype: torch.dtype, causal: bool, n_k: int,
            run: Callable[[Tiles], Any], work: float, memory_bound: bool = False) -> Tiles:
    if _tile_chooser is not None:
        return _tile_chooser((kernel, *key), tile_candidates(kernel, block_d, dtype), run, work=work,
                             memory_bound=memory_bound)
    return default_tiles(kernel, block_d, dtype, causal, n_k)


# ---------------------------------------------------------------------------------------------
# Inputs and shape policy
# ---------------------------------------------------------------------------------------------


def _size_class(n: int) -> int:
    return triton.next_power_of_2(max(n, 1))


#: Each layout's q and k/v: (rank, axes) of each, then the axis of q's heads and of k's.
_SHAPES = {
    "dense": ((4, "[batch, heads, seqlen, head_dim]"), (4, "[batch, heads, seqlen, head_dim]"), 1, 1),
    "varlen": ((3, "[total_q, heads, head_dim]"), (3, "[total_k, heads, head_dim]"), 1, 1),
    "paged": ((4, "[batch, seqlen_q, heads, head_dim]"), (4, "[pages, page_size, heads_kv, head_dim]"), 2, 2),
}


def _check_tensors(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dtype_problem: Callable[[], str | None],
                   device_problem: Callable[[], str | None] = lambda: None, layout: str = "dense",
                   same_v: bool = True) -> tuple[int, int, int, int]:
    """The checks every path shares: tensors of the layout's rank on one supported device with
    matching shapes (V's head dim may differ unless ``same_v``); ``dtype_problem`` and
    ``device_problem`` add each path's own. Returns (batch or 0 for varlen, heads_q, heads_kv,
    head_dim)."""
    (q_dims, q_axes), (kv_dims, kv_axes), q_heads, kv_heads = _SHAPES[layout]
    for name, t, dims, axes in (("q", q, q_dims, q_axes), ("k", k, kv_dims, kv_axes), ("v", v, kv_dims, kv_axes)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != dims:
            raise ValueError(f"{name} must be {dims}-d {axes}, got shape {tuple(t.shape)}")
    problem = dtype_problem()
    if problem is not None:
        raise ValueError(problem)
    if k.device != q.device or v.device != q.device:
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if q.device.type == "cpu" and not interpreting():
        raise ValueError("CPU tensors need Triton's interpreter: set TRITON_INTERPRET=1 before importing triton")
    if q.device.type not in ("cpu", "cuda"):
        raise ValueError(f"device {q.device} is not supported (cuda, or cpu under the interpreter)")
    problem = device_problem()
    if problem is not None:
        raise ValueError(problem)
    if k.shape[:-1] != v.shape[:-1] or (same_v and k.shape[-1] != v.shape[-1]):
        what = "one shape" if same_v else "one shape but for the head dim"
        raise ValueError(f"k and v must have {what}, got {tuple(k.shape)} and {tuple(v.shape)}")
    head_dim = q.shape[-1]
    batch = 0 if layout == "varlen" else q.shape[0]
    if k.shape[-1] != head_dim or (layout == "dense" and k.shape[0] != batch):
        raise ValueError(f"k/v shape {tuple(k.shape)} does not match q's batch and head_dim {tuple(q.shape)}")
    heads_q, heads_kv = q.shape[q_heads], k.shape[kv_heads]
    if heads_kv == 0 or heads_q % heads_kv:
        raise ValueError(f"q heads ({heads_q}) must be a multiple of k/v heads ({heads_kv})")
    return batch, heads_q, heads_kv, head_dim


def _index_tensor(name: str, t: Any, shape: tuple[int | None, ...], device: torch.device) -> None:
    # cu_seqlens, cache_seqlens, block_table: int32 of the given shape (None: any size) on device.
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be an int32 torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.int32:
        raise ValueError(f"{name} must be int32, got {t.dtype}")
    if t.dim() != len(shape) or any(want is not None and got != want for got, want in zip(t.shape, shape)):
        wanted = "[" + ", ".join("any" if want is None else str(want) for want in shape) + "]"
        raise ValueError(f"{name} must have shape {wanted}, got {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}, q on {device}")


def check_variants(variants: "Variants", heads_q: int, batch: int, device: torch.device) -> None:
    """Raise TypeError/ValueError for a window, softcap, ALiBi slopes or sinks the kernels do not take."""
    window = variants.window
    if window is not None and not (isinstance(window, tuple) and len(window) == 2
                                   and all(isinstance(side, int) and side >= -1 for side in window)):
        raise ValueError(f"window_size must be (left, right), two ints >= -1 (-1: unbounded), got {window!r}")
    if not (isinstance(variants.softcap, (int, float)) and 0 <= variants.softcap < float("inf")):
        raise ValueError(f"softcap must be 0 (none) or positive and finite, got {variants.softcap!r}")
    for name, t, shapes in (("alibi_slopes", variants.alibi_slopes, ((heads_q,), (batch, heads_q))),
                            ("sinks", variants.sinks, ((heads_q,),))):
        if t is None:
            continue
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise TypeError(f"{name} must be a float torch.Tensor, got {getattr(t, 'dtype', type(t).__name__)}")
        if tuple(t.shape) not in shapes:
            raise ValueError(f"{name} must have shape {' or '.join(str(list(s)) for s in shapes)}, got {list(t.shape)}")
        if t.device != device:
            raise ValueError(f"{name} is on {t.device}, q on {device}")


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, variants: "Variants | None" = None,
                 layout: "Varlen | Paged | None" = None) -> None:
    """Raise TypeError/ValueError for inputs the kernels do not take (see ``flash_attention``,
    ``flash_attention_varlen`` and ``flash_attention_with_kvcache``)."""

    def dtype_problem() -> str | None:
        if q.dtype not in _DTYPES:
            return f"dtype {q.dtype} is not supported (float16, bfloat16, float32; FP8: float8_e4m3fn)"
        if k.dtype != q.dtype or v.dtype != q.dtype:
            return f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}"
        return None

    kind = "dense" if layout is None else "varlen" if isinstance(layout, Varlen) else "paged"
    batch, heads_q, _, head_dim = _check_tensors(q, k, v, dtype_problem, layout=kind, same_v=False)
    if not MIN_HEAD_DIM <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(f"head_dim={head_dim} is outside {MIN_HEAD_DIM}..{MAX_HEAD_DIM}")
    if not MIN_HEAD_DIM <= v.shape[-1] <= MAX_HEAD_DIM_V:
        raise ValueError(f"V's head_dim={v.shape[-1]} is outside {MIN_HEAD_DIM}..{MAX_HEAD_DIM_V}")
    if isinstance(layout, Varlen):
        _index_tensor("cu_seqlens_q", layout.cu_seqlens_q, (None,), q.device)
        batch = layout.cu_seqlens_q.shape[0] - 1
        if batch < 0:
            raise ValueError("cu_seqlens_q must hold at least one entry (0)")
        _index_tensor("cu_seqlens_k", layout.cu_seqlens_k, (batch + 1,), q.device)
        for name in ("max_seqlen_q", "max_seqlen_k"):
            value = getattr(layout, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    elif isinstance(layout, Paged):
        _index_tensor("cache_seqlens", layout.cache_seqlens, (batch,), q.device)
        _index_tensor("block_table", layout.block_table, (batch, None), q.device)
    if variants is not None:
        check_variants(variants, heads_q, batch, q.device)


def _block_d(head_dim: int) -> int:
    return max(16, triton.next_power_of_2(head_dim))


def _dot_precision(dtype: torch.dtype) -> str:
    # "ieee" keeps fp32 products true fp32 (not tf32); for 16-bit inputs the option is ignored.
    return "ieee" if dtype == torch.float32 else "tf32"


@functools.lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 4  # the interpreter: a few slices, so that the merge runs in CI too
    return torch.cuda.get_device_properties(device).multi_processor_count


def uses_decode_kernel(n_q: int, group: int, n_k: int, batch_heads_kv: int, sm_count: int, waves: int,
                       paged: bool = False) -> bool:
    """Few query rows per kv head (decode, speculative decode) against a long cache, or a short
    cache whose kv heads alone fill the GPU: split the keys instead of the queries. Under the
    interpreter every decode shape takes it, so that CI runs the split and the merge."""
    if n_q > _DECODE_MAX_SEQLEN_Q or n_q * group > _DECODE_MAX_ROWS:
        return False
    min_keys = _PAGED_SPLIT_MIN_KEYS if paged else _DECODE_SPLIT_MIN_KEYS
    return interpreting() or n_k >= min_keys or batch_heads_kv >= waves * sm_count


@functools.lru_cache(maxsize=1024)
def decode_splits(batch_heads_kv: int, n_k: int, block_n: int, waves: int, sm_count: int) -> tuple[int, int]:
    """(number of key slices, keys per slice): enough programs for ``waves`` per SM, each slice a
    whole number of key blocks."""
    blocks = max(1, triton.cdiv(n_k, block_n))
    wanted = max(1, triton.cdiv(waves * sm_count, max(batch_heads_kv, 1)))
    per_split = triton.cdiv(blocks, min(wanted, blocks)) * block_n
    return triton.cdiv(max(n_k, 1), per_split), per_split


# ---------------------------------------------------------------------------------------------
# Problems: the variants and the layouts, as the kernels take them
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Varlen:
    """Packed sequences (``flash_attn_varlen_func``): q, k, v ``[total, H, D]``; sequence ``b`` owns
    rows ``cu_seqlens[b]:cu_seqlens[b + 1]`` (int32, on the inputs' device)."""

    cu_seqlens_q: torch.Tensor
    cu_seqlens_k: torch.Tensor
    max_seqlen_q: int
    max_seqlen_k: int


@dataclass(frozen=True)
class Paged:
    """A paged KV cache (``flash_attn_with_kvcache``): q ``[B, Nq, H, D]``; caches ``[pages,
    page_size, Hkv, D]``; sequence ``b``'s token ``t`` in page ``block_table[b, t // page_size]``."""

    block_table: torch.Tensor
    cache_seqlens: torch.Tensor


@dataclass(frozen=True)
class Variants:
    """What changes the scores (the contract's variants): ``window`` is (left, right) with -1
    unbounded (None: no window); ``alibi_slopes`` float32 [Hq] or [B, Hq]; ``sinks`` float32 [Hq]."""

    causal: bool = False
    window: tuple[int, int] | None = None
    softcap: float = 0.0
    alibi_slopes: torch.Tensor | None = None
    sinks: torch.Tensor | None = None

    def band(self) -> tuple[int, int]:
        """(left, right) of the band ``-right <= i + Nk - Nq - j <= left``, causal folded in, an
        unbounded side :data:`_UNBOUNDED` (:func:`.kernels.band`)."""
        return band(self.causal, self.window)

    @property
    def banded(self) -> bool:
        return self.causal or self.window is not None

    def key(self) -> tuple:
        """What a plan depends on (the tensors' values do not matter to it)."""
        return (self.causal, self.window, bool(self.softcap), self.alibi_slopes is not None,
                self.sinks is not None)


def _bshd(t: torch.Tensor) -> tuple[int, int, int, int]:
    # [B, N, H, D] (paged q and output) or [pages, page_size, H, D] (caches) as the kernels'
    # (batch or page, head, row, dim) strides.
    s = t.stride()
    return s[0], s[2], s[1], s[3]


def _packed(t: torch.Tensor) -> tuple[int, int, int, int]:
    # [total, H, D] as (no batch stride, head, row, dim): the sequence's first row is added in the kernel.
    s = t.stride()
    return 0, s[1], s[0], s[2]


class _Problem:
    """One call's tensors, sizes, strides and scalars in the order the kernels take them."""

    __slots__ = ("q", "k", "v", "variants", "layout", "batch", "heads_q", "heads_kv", "n_q", "n_k",
                 "head_dim", "head_dim_v", "scale", "q_strides", "k_strides", "v_strides", "page_size",
                 "cu_q", "cu_k", "seqlens_k", "table", "table_stride", "slopes", "slope_stride", "sinks",
                 "left", "right", "qk_scale", "cap_scale", "fast_tanh", "raw_max")

    def __init__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, variants: Variants,
                 layout: Varlen | Paged | None) -> None:
        self.q, self.k, self.v, self.variants, self.layout, self.scale = q, k, v, variants, layout, scale
        self.head_dim, self.head_dim_v = q.shape[-1], v.shape[-1]
        self.page_size = 1
        self.cu_q = self.cu_k = self.seqlens_k = self.table = q  # placeholders, never read
        self.table_stride = 0
        if layout is None:
            self.batch, self.heads_q, self.n_q = q.shape[0], q.shape[1], q.shape[2]
            self.heads_kv, self.n_k = k.shape[1], k.shape[2]
            self.q_strides, self.k_strides, self.v_strides = q.stride(), k.stride(), v.stride()
        elif isinstance(layout, Varlen):
            self.batch, self.heads_q, self.heads_kv = layout.cu_seqlens_q.shape[0] - 1, q.shape[1], k.shape[1]
            self.n_q, self.n_k = layout.max_seqlen_q, layout.max_seqlen_k
            self.q_strides, self.k_strides, self.v_strides = _packed(q), _packed(k), _packed(v)
            self.cu_q, self.cu_k = layout.cu_seqlens_q, layout.cu_seqlens_k
        else:
            self.batch, self.n_q, self.heads_q = q.shape[0], q.shape[1], q.shape[2]
            self.heads_kv, self.page_size = k.shape[2], k.shape[1]
            self.n_k = layout.block_table.shape[1] * self.page_size  # the most a sequence can hold
            self.q_strides, self.k_strides, self.v_strides = _bshd(q), _bshd(k), _bshd(v)
            self.seqlens_k, self.table = layout.cache_seqlens, layout.block_table
            self.table_stride = layout.block_table.stride(0)
        self.slopes, self.slope_stride = q, 0
        if variants.alibi_slopes is not None:
            # float32, so that the kernels' bias (slope x log2(e) x distance) is the same bits in
            # every kernel: the Gluon kernels convert, a Triton kernel would multiply in the
            # slopes' dtype (a bf16 forward's L against a Gluon backward's P would differ).
            self.slopes = variants.alibi_slopes.float()
            self.slope_stride = self.slopes.stride(0) if self.slopes.dim() == 2 else 0
        self.sinks = q if variants.sinks is None else variants.sinks
        self.left, self.right = variants.band()
        if variants.softcap:
            self.qk_scale, self.cap_scale = variants.softcap * _LOG2E, scale / variants.softcap
        else:
            self.qk_scale, self.cap_scale = scale * _LOG2E, 1.0
        self.fast_tanh = q.device.type == "cuda" and q.dtype != torch.float32
        # The forward takes the row maximum before scaling when the score is the scaled product
        # alone and the scale keeps the order (> 0): max(c * x) = c * max(x) only then.
        self.raw_max = not variants.softcap and variants.alibi_slopes is None and self.qk_scale > 0

    @property
    def group(self) -> int:
        return self.heads_q // self.heads_kv

    @property
    def layout_code(self) -> int:
        return 0 if self.layout is None else 1 if isinstance(self.layout, Varlen) else 2

    def outputs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(output, base-2 LSE) in the layout's shapes. A packed output starts as zeros and its
        LSE as +inf, so unused rows (no sequence writes them) hold nothing stale."""
        q, dv = self.q, self.head_dim_v
        if self.layout is None:
            o = torch.empty((self.batch, self.heads_q, self.n_q, dv), dtype=q.dtype, device=q.device)
            lse = torch.empty((self.batch, self.heads_q, self.n_q), dtype=torch.float32, device=q.device)
        elif isinstance(self.layout, Varlen):
            o = torch.zeros((q.shape[0], self.heads_q, dv), dtype=q.dtype, device=q.device)
            lse = torch.full((self.heads_q, q.shape[0]), float("inf"), dtype=torch.float32, device=q.device)
        else:
            o = torch.empty((self.batch, self.n_q, self.heads_q, dv), dtype=q.dtype, device=q.device)
            lse = torch.empty((self.batch, self.heads_q, self.n_q), dtype=torch.float32, device=q.device)
        return o, lse

    def strides(self, t: torch.Tensor) -> tuple[int, ...]:
        """An output-like tensor's (batch, head, row, dim) strides (o, do, dq, dk, dv)."""
        if self.layout is None:
            return t.stride()
        return _packed(t) if isinstance(self.layout, Varlen) else _bshd(t)

    def lse_strides(self, lse: torch.Tensor) -> tuple[int, int]:
        """The LSE's (batch, head) strides; its rows are contiguous in every layout (the kernels
        assume it: a row stride the compiler cannot see as 1 costs the loads their vectors)."""
        return (0, lse.stride(0)) if isinstance(self.layout, Varlen) else lse.stride()[:2]

    def constexprs(self, t: Tiles) -> dict[str, Any]:
        variants = self.variants
        return dict(HEAD_DIM=self.head_dim, HEAD_DIM_V=self.head_dim_v, BLOCK_D=_block_d(self.head_dim),
                    BLOCK_DV=_block_d(self.head_dim_v), BLOCK_N=t.block_n, BANDED=variants.banded,
                    SOFTCAP=bool(variants.softcap), ALIBI=variants.alibi_slopes is not None,
                    FAST_TANH=self.fast_tanh, DOT_PRECISION=_dot_precision(self.q.dtype),
                    num_warps=t.num_warps, num_stages=t.num_stages)


# ---------------------------------------------------------------------------------------------
# Forward
# ---------------------------------------------------------------------------------------------


def _launch_fwd(p: _Problem, o: torch.Tensor, lse: torch.Tensor, t: Tiles) -> None:
    attn_fwd[(triton.cdiv(p.n_q, t.block_m), p.batch * p.heads_q)](
        p.q, p.k, p.v, o, lse, p.slopes, p.sinks, p.cu_q, p.cu_k, p.seqlens_k, p.table,
        *p.q_strides, *p.k_strides, *p.v_strides, *p.strides(o), *p.lse_strides(lse),
        p.slope_stride, p.table_stride,
        p.heads_q, p.n_q, p.n_k, p.group, p.qk_scale, p.cap_scale, p.left, p.right,
        BLOCK_M=t.block_m, HAS_SINKS=p.variants.sinks is not None, LAYOUT=p.layout_code,
        PAGE_SIZE=p.page_size, LEADING=p.left < _UNBOUNDED, RAW_MAX=p.raw_max, **p.constexprs(t),
    )


def _launch_decode(p: _Problem, o: torch.Tensor, lse: torch.Tensor, t: Tiles) -> None:
    block_dv = _block_d(p.head_dim_v)
    splits, per_split = decode_splits(p.batch * p.heads_kv, p.n_k, t.block_n, t.waves, _sm_count(p.q.device))
    direct = splits == 1
    if direct:
        o_part = lse_part = lse  # unused placeholders: the kernel writes o and lse itself
    else:  # one allocation for both scratch arrays: each call's host time counts in decode
        parts = p.batch * p.heads_q * p.n_q * splits
        scratch = torch.empty(parts * (block_dv + 1), dtype=torch.float32, device=p.q.device)
        o_part, lse_part = scratch[:parts * block_dv], scratch[parts * block_dv:]
    has_sinks = p.variants.sinks is not None
    o_strides, lse_strides = p.strides(o), p.lse_strides(lse)
    attn_fwd_split[(splits, p.batch * p.heads_kv)](
        p.q, p.k, p.v, o, lse, o_part, lse_part, p.slopes, p.sinks, p.seqlens_k, p.table,
        *p.q_strides, *p.k_strides, *p.v_strides, *o_strides, *lse_strides, p.slope_stride, p.table_stride,
        p.heads_q, p.heads_kv, p.n_q, p.n_k, p.group, per_split, p.qk_scale, p.cap_scale, p.left, p.right,
        BLOCK_R=max(16, triton.next_power_of_2(p.group * p.n_q)), HAS_SINKS=has_sinks, LAYOUT=p.layout_code,
        PAGE_SIZE=p.page_size, DIRECT=direct, RAW_MAX=p.raw_max, **p.constexprs(t),
    )
    if not direct:
        attn_fwd_combine[(p.batch * p.heads_q * p.n_q,)](
            o_part, lse_part, o, lse, p.sinks, *o_strides, *lse_strides, p.heads_q, p.n_q, splits,
            HEAD_DIM_V=p.head_dim_v, BLOCK_DV=block_dv, BLOCK_S=max(2, triton.next_power_of_2(splits)),
            HAS_SINKS=has_sinks, num_warps=4,
        )


def gluon_path(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, variants: Variants, layout: object,
               scale: float) -> str | None:
    """None where the forward runs the Gluon kernel (:mod:`.gluon_forward`: Hopper, fp16/bf16,
    d64/d128 or MLA's d192 with V's d128, plain or causal, ALiBi, a sliding window, softcap, sinks,
    dense; MLA with those too since the check ran them right, NOTES.md v27), else why it takes
    the Triton kernels. On an H100 it ran 0.86-1.13x cuDNN where this module's kernel ran
    0.73-0.88x (NOTES.md, v13).
    ``ATTNKIT_TRITON_FLASH_GLUON=0`` turns it off."""
    if gluon_off():
        return f"turned off by {GLUON_SWITCH}=0"
    from . import gluon_forward

    return gluon_forward.unsupported_reason(q, k, v, variants.causal, scale, variants=variants, layout=layout)


def path_note(device: torch.device) -> str:
    """The forward's path on ``device``, for the run's header."""
    from . import gluon_forward

    if gluon_off():
        return f"forward: Triton kernels (the Gluon forward is turned off by {GLUON_SWITCH}=0)"
    reason = gluon_forward.device_reason(device)
    if reason is not None:
        return f"forward: Triton kernels (the Gluon forward needs {reason})"
    note = ("forward: Gluon (sm_90) on dense fp16/bf16 d64/d128 and d192/dv128 (MLA), causal or not, ALiBi, "
            "windows, softcap, sinks; " + _gluon_fp8_note())
    from . import gluon_backward

    switch = gluon_backward.ENV_SWITCH
    if not gluon_backward.takes():
        return note + f"; Triton kernels for the rest and the backward ({switch}=0)"
    kinds = ["plain", "causal"] + ["ALiBi"] * gluon_backward.TAKES_ALIBI + ["windowed"] * gluon_backward.TAKES_WINDOW
    covers = ", ".join(kinds[:-1]) + " or " + kinds[-1]
    return (note + f"; Triton kernels for the rest. Backward: Gluon on every dense {covers} call it covers;"
            " Triton kernels for the rest"
            f" ({switch}=0: the Triton backward alone, the same bits run to run)")


#: Below these key counts the Triton FP8 forward is the faster one, so the Gluon FP8 forward is
#: taken from here up (:func:`_gluon_fp8_takes`): (head dim, causal) -> keys.
GLUON_FP8_MIN_KEYS = {(128, False): 4096, (128, True): 16384, (64, False): 16384, (64, True): 16384}


def _gluon_fp8_setting() -> str | None:
    """``ATTNKIT_TRITON_FLASH_GLUON_FP8``: "1" always takes the Gluon FP8 forward where it runs,
    "0" never does; unset (or anything else), :data:`GLUON_FP8_MIN_KEYS` decides. The Gluon
    switch (``ATTNKIT_TRITON_FLASH_GLUON=0``) turns it off too (:func:`.gluon_common.path_setting`)."""
    return path_setting("ATTNKIT_TRITON_FLASH_GLUON_FP8")


def _gluon_fp8_takes(head_dim: int, causal: bool, n_k: int) -> bool:
    """Whether an FP8 call the Gluon kernel can run goes to it. The speed suite timed the two FP8
    forwards on the same machine, Gluon's call against Triton's (results/2026-11-27-session12/fp8,
    results/2026-11-27-session13/fp8-h100): d128 16k 1.14x on an H200 and 1.15x on an H100, d128
    4k 1.10x and 1.09x, d64 16k 1.04x and 1.06x, d64 4k 0.96x and 0.98x. Causal, from
    ``fp8_check`` on an H200 (results/2026-11-27-session12/i42): d128 16k 1.18x, d128 4k 0.95x,
    d64 16k 1.07x, d64 4k 0.79x. So d128 from 4k keys (causal from 16k), d64 from 16k; below 4k
    neither GPU timed it, and the Triton kernel keeps those calls (NOTES.md, v20.6)."""
    setting = _gluon_fp8_setting()
    if setting is not None:
        return setting == "1"
    least = GLUON_FP8_MIN_KEYS.get((head_dim, causal))
    return least is not None and n_k >= least


def _gluon_fp8_note() -> str:
    setting = _gluon_fp8_setting()
    if setting == "1":
        return "FP8 too (ATTNKIT_TRITON_FLASH_GLUON_FP8=1)"
    if setting == "0":
        return "FP8 on the Triton kernel (ATTNKIT_TRITON_FLASH_GLUON_FP8=0)"
    parts = []
    for head_dim in sorted({head_dim for head_dim, _ in GLUON_FP8_MIN_KEYS}, reverse=True):
        plain, causal = GLUON_FP8_MIN_KEYS[(head_dim, False)], GLUON_FP8_MIN_KEYS[(head_dim, True)]
        parts.append(f"d{head_dim} from {plain // 1024}k keys"
                     + ("" if causal == plain else f" (causal from {causal // 1024}k)"))
    return "FP8 at " + " and ".join(parts)


def _launch_gluon(p: _Problem, o: torch.Tensor, lse: torch.Tensor, tiles: Tiles | None) -> None:
    from . import gluon_forward

    gluon_forward.flash_fwd(p.q, p.k, p.v, p.variants.causal, p.scale, alibi_slopes=p.variants.alibi_slopes,
                            window=p.variants.window, softcap=p.variants.softcap, sinks=p.variants.sinks,
                            out=(o, lse))


def _plan_fwd(p: _Problem, o: torch.Tensor, lse: torch.Tensor) -> tuple[Callable[..., None], Tiles]:
    block_d = max(_block_d(p.head_dim), _block_d(p.head_dim_v))
    waves = tile_candidates("decode", block_d, p.q.dtype)[0].waves
    decode = not isinstance(p.layout, Varlen) and uses_decode_kernel(
        p.n_q, p.group, p.n_k, p.batch * p.heads_kv, _sm_count(p.q.device), waves, isinstance(p.layout, Paged))
    if not decode and gluon_path(p.q, p.k, p.v, p.variants, p.layout, p.scale) is None:
        return _launch_gluon, None
    kernel, launch = ("decode", _launch_decode) if decode else ("fwd", _launch_fwd)
    key = (p.q.dtype, p.head_dim, p.head_dim_v, p.variants.key(), p.layout_code, p.page_size,
           _size_class(p.n_q), _size_class(p.n_k), _size_class(p.batch * p.heads_kv) if decode else p.group > 1)
    if decode:  # memory bound: the work that matters is the KV cache's bytes
        work = 1.0 * p.batch * p.heads_kv * p.n_k * (p.head_dim + p.head_dim_v) * p.q.element_size()
    else:
        work = 2.0 * p.batch * p.heads_q * p.n_q * p.n_k * (p.head_dim + p.head_dim_v)
    tiles = _choose(kernel, key, block_d, p.q.dtype, p.variants.causal, p.n_k,
                    lambda t: launch(p, o, lse, t), work, memory_bound=decode)
    return launch, tiles


def flash_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float,
              tiles: Tiles | None = None, *, variants: Variants | None = None,
              layout: Varlen | Paged | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(output, base-2 log-sum-exp per row) for checked inputs. ``variants`` adds the window,
    softcap, ALiBi and sinks (``causal`` is the one in it when given); ``layout`` makes the inputs
    packed sequences or a paged cache. The LSE is [B, Hq, Nq] ([Hq, total_q] for varlen). ``tiles``
    forces a configuration (for benchmarks): ``block_m == 0`` selects the decode kernel."""
    variants = Variants(causal=causal) if variants is None else variants
    p = _Problem(q, k, v, scale, variants, layout)
    o, lse = p.outputs()
    if o.numel() == 0 or p.batch * p.heads_q * p.n_q == 0:
        return o, lse
    if p.n_k == 0 and layout is None:  # nothing to attend to: zeros, and the LSE of no key
        o.zero_()
        if variants.sinks is not None:
            return o, lse.copy_((variants.sinks * _LOG2E)[None, :, None].expand_as(lse))
        return o, lse.fill_(float("inf"))
    if tiles is not None:  # forced: the tiles say which kernel
        launch = _launch_decode if tiles.block_m == 0 else _launch_fwd
    else:
        # The Gluon switch is read when planning: a process that sets it between calls (a test,
        # a bench tool) gets a plan of its own for the new setting.
        plan_key = (q.shape, k.shape, v.shape, q.dtype, variants.key(), q.device,
                    None if layout is None else (type(layout), getattr(layout, "max_seqlen_q", 0),
                                                 getattr(layout, "max_seqlen_k", 0), p.n_k),
                    os.environ.get(GLUON_SWITCH))
        plan = _PLANS.get(plan_key)
        if plan is None:
            plan = _plan_fwd(p, o, lse)
            _PLANS.put(plan_key, plan)
        launch, tiles = plan
    launch(p, o, lse, tiles)
    return o, lse


# ---------------------------------------------------------------------------------------------
# FP8 forward
# ---------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _capability(device: torch.device) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device)


def fp8_unsupported_reason(device: torch.device) -> str | None:
    """Why the FP8 forward cannot run on ``device``, or None. The CPU runs it in Triton's
    interpreter (whose float32 -> fp8 cast the kernel works around, NOTES.md)."""
    if device.type == "cuda":
        capability = _capability(device)
        if capability < FP8_MIN_CAPABILITY:
            return (f"FP8 tensor cores need sm89+ (this GPU is sm{capability[0]}{capability[1]})")
    return None


def check_inputs_fp8(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     descales: tuple[torch.Tensor | None, ...]) -> None:
    """Raise TypeError/ValueError for FP8 inputs the FP8 forward does not take."""

    def dtype_problem() -> str | None:
        if q.dtype not in FP8_DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
            return f"the FP8 forward takes q, k, v in float8_e4m3fn, got {q.dtype}, {k.dtype}, {v.dtype}"
        return None

    batch, _, heads_kv, head_dim = _check_tensors(q, k, v, dtype_problem, lambda: fp8_unsupported_reason(q.device))
    if head_dim not in FP8_HEAD_DIMS:
        raise ValueError(f"head_dim={head_dim}: the FP8 forward takes {', '.join(map(str, FP8_HEAD_DIMS))}")
    for name, descale in zip(("q_descale", "k_descale", "v_descale"), descales):
        if descale is None:
            continue
        if not isinstance(descale, torch.Tensor) or tuple(descale.shape) != (batch, heads_kv):
            shape = tuple(descale.shape) if isinstance(descale, torch.Tensor) else type(descale).__name__
            raise ValueError(f"{name} must be a tensor of shape [batch, heads_kv] = {(batch, heads_kv)}, got {shape}")
        if descale.device != q.device:
            raise ValueError(f"{name} is on {descale.device}, q on {q.device}")


def _head_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    # Q and K feed the first product K-major: head dim on the contiguous axis (as given by
    # [B, H, N, D] and [B, N, H, D] layouts alike; anything else is copied).
    return t if t.stride(3) == 1 else t.contiguous()


def keys_contiguous(v: torch.Tensor) -> torch.Tensor:
    """``v`` [B, H, N, D] as a view of the same shape whose key axis is the contiguous one, the
    layout the FP8 kernel's PV product reads (K-major for FP8 wgmma); ``v`` itself when it is
    already so. The copy's rows are padded to 16 keys, so every row starts 16-byte aligned."""
    batch, heads, n_k, head_dim = v.shape
    if v.stride(2) == 1 and (n_k == 1 or v.stride(3) % 16 == 0):
        return v
    padded = triton.cdiv(n_k, 16) * 16
    v_t = torch.empty((batch, heads, head_dim, padded), dtype=v.dtype, device=v.device)
    v_t = v_t[..., :n_k].transpose(2, 3)
    if v.numel():
        block_n = 64
        transpose_keys[(triton.cdiv(n_k, block_n), batch * heads)](
            v, v_t, *v.stride(), *v_t.stride(), heads, n_k,
            HEAD_DIM=head_dim, BLOCK_N=block_n, num_warps=4,
        )
    return v_t


def _descales(descales: tuple[torch.Tensor | None, ...], batch: int, heads_kv: int,
              device: torch.device) -> tuple[torch.Tensor, ...]:
    # float32 [B, Hkv] contiguous, as the kernel indexes them; None stands for 1 (FA3's default).
    ones = None
    out = []
    for descale in descales:
        if descale is None:
            if ones is None:
                ones = torch.ones((batch, heads_kv), dtype=torch.float32, device=device)
            out.append(ones)
        else:
            out.append(descale.to(torch.float32).contiguous())
    return tuple(out)


def _launch_fwd_fp8(q, k, v_t, o, descales, causal: bool, scale: float, t: Tiles) -> None:
    batch, heads_q, n_q, head_dim = q.shape
    heads_kv, n_k = k.shape[1], k.shape[2]
    attn_fwd_fp8[(triton.cdiv(n_q, t.block_m), batch * heads_q)](
        q, k, v_t, o, *descales,
        *q.stride(), *k.stride(), *v_t.stride(), *o.stride(),
        heads_q, heads_kv, n_q, n_k, heads_q // heads_kv, scale * _LOG2E,
        HEAD_DIM=head_dim, BLOCK_M=t.block_m, BLOCK_N=t.block_n, CAUSAL=causal,
        EXACT_CAST=interpreting(), num_warps=t.num_warps, num_stages=t.num_stages,
    )


def flash_fwd_fp8(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  descales: tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None],
                  causal: bool, scale: float, tiles: Tiles | None = None) -> torch.Tensor:
    """The bf16 output of attention over FP8 inputs checked by :func:`check_inputs_fp8`, whose
    values are ``x.float() * descale`` (``descales`` = q's, k's, v's, each [B, Hkv] or None for
    1). ``tiles`` forces a configuration (for benchmarks)."""
    batch, heads_q, n_q, head_dim = q.shape
    heads_kv, n_k = k.shape[1], k.shape[2]
    o = torch.empty((batch, heads_q, n_q, head_dim), dtype=torch.bfloat16, device=q.device)
    if o.numel() == 0:
        return o
    if n_k == 0:
        return o.zero_()
    q, k = _head_dim_contiguous(q), _head_dim_contiguous(k)
    v_t = keys_contiguous(v)
    if tiles is None and _gluon_fp8_takes(head_dim, causal, n_k):
        from . import gluon_common, gluon_forward

        # TMA needs V^T's base and strides 16-byte aligned: a copy's are; a V handed in with its
        # keys contiguous already (returned as it is) may be any slice of a larger tensor.
        v_keys_last = v_t.transpose(2, 3)
        if gluon_forward.fp8_unsupported_reason(q, k, v, causal) is None and gluon_common.aligned(v_keys_last):
            return gluon_forward.flash_fwd_fp8(q, k, v_keys_last, causal, scale, descales)
    descales = _descales(descales, batch, heads_kv, q.device)
    if tiles is None:
        plan_key = (q.shape, k.shape, q.dtype, causal, q.device)
        plan = _PLANS.get(plan_key)
        if plan is None:
            key = (q.dtype, head_dim, causal, _size_class(n_q), _size_class(n_k), heads_q > heads_kv)
            work = 4.0 * batch * heads_q * n_q * n_k * head_dim
            chosen = _choose("fp8", key, head_dim, q.dtype, causal, n_k,
                             lambda t: _launch_fwd_fp8(q, k, v_t, o, descales, causal, scale, t), work)
            plan = (_launch_fwd_fp8, chosen)
            _PLANS.put(plan_key, plan)
        tiles = plan[1]
    _launch_fwd_fp8(q, k, v_t, o, descales, causal, scale, tiles)
    return o


# ---------------------------------------------------------------------------------------------
# Backward
# ---------------------------------------------------------------------------------------------


#: Rows per sequence in the backward's padded copies of a packed LSE and delta: each sequence
#: starts at a multiple of it and holds a whole number of them, so it must be a multiple of every
#: dK/dV ``block_m``. Sequences shorter than it on average skip the copies (:func:`pads_rows`).
PACKED_ROWS = 128


def pads_rows(rows: int, sequences: int) -> bool:
    """Whether the dK/dV kernel gets padded copies of a packed LSE and delta (``rows`` packed
    rows, ``sequences`` sequences): only when the sequences average at least :data:`PACKED_ROWS`
    rows, so the copies hold at most twice the rows of the originals (many short sequences
    would pay up to that many padding rows each, for a loop of a block or two)."""
    return rows >= PACKED_ROWS * sequences


def _padded_rows(p: _Problem, lse: torch.Tensor, delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A packed LSE and delta [H, total] laid out for the dK/dV kernel: each sequence's rows from
    a multiple of :data:`PACKED_ROWS`, padded to a multiple of it with lse = +inf and delta = 0
    (``kernels._padded_start``). The kernel then loads whole blocks, aligned and unmasked, where
    masked loads from a sequence's own rows cost its loop 80% more instructions (NOTES v8)."""
    width = -(-(lse.shape[1] + PACKED_ROWS * p.batch) // 16) * 16
    # Filled, not empty: a caller whose max_seqlen_q undercounts a sequence leaves rows the pad
    # kernel's grid does not reach, and those must still read as p = 0, not as stale memory.
    lse_p = torch.full((p.heads_q, width), float("inf"), dtype=lse.dtype, device=lse.device)
    delta_p = torch.zeros_like(lse_p)
    attn_bwd_pad_rows[(triton.cdiv(p.n_q, PACKED_ROWS), p.batch * p.heads_q)](
        lse, delta, lse_p, delta_p, p.cu_q, lse.stride(0), width, p.heads_q, BLOCK_M=PACKED_ROWS, num_warps=4)
    return lse_p, delta_p


def _launch_dkdv(p: _Problem, do, lse, delta, dk, dv, t: Tiles, padded: bool = False) -> None:
    # ``padded``: lse and delta are the padded copies (:func:`_padded_rows`).
    if padded and PACKED_ROWS % t.block_m:
        raise ValueError(f"padded dK/dV rows need a block_m that divides {PACKED_ROWS}, got {t}")
    attn_bwd_dkdv[(triton.cdiv(p.n_k, t.block_n), p.batch * p.heads_kv)](
        p.q, p.k, p.v, do, lse, delta, dk, dv, p.slopes, p.cu_q, p.cu_k,
        *p.q_strides, *p.k_strides, *p.v_strides, *p.strides(do), *p.strides(dk), *p.strides(dv),
        *p.lse_strides(lse), p.slope_stride,
        p.heads_q, p.heads_kv, p.n_q, p.n_k, p.group, p.scale, p.qk_scale, p.cap_scale, p.left, p.right,
        BLOCK_M=t.block_m, LAYOUT=p.layout_code, LEADING=p.right < _UNBOUNDED, TRAILING=p.left < _UNBOUNDED,
        EVEN_Q=padded or (p.layout is None and p.n_q % t.block_m == 0), ROW_ALIGN=PACKED_ROWS, PADDED=padded,
        **p.constexprs(t),
    )


def _launch_dq(p: _Problem, do, lse, delta, dq, t: Tiles) -> None:
    attn_bwd_dq[(triton.cdiv(p.n_q, t.block_m), p.batch * p.heads_q)](
        p.q, p.k, p.v, do, lse, delta, dq, p.slopes, p.cu_q, p.cu_k,
        *p.q_strides, *p.k_strides, *p.v_strides, *p.strides(do), *p.strides(dq),
        *p.lse_strides(lse), p.slope_stride,
        p.heads_q, p.n_q, p.n_k, p.group, p.scale, p.qk_scale, p.cap_scale, p.left, p.right,
        BLOCK_M=t.block_m, LAYOUT=p.layout_code, LEADING=p.left < _UNBOUNDED, **p.constexprs(t),
    )


def flash_bwd(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              o: torch.Tensor, lse: torch.Tensor, causal: bool, scale: float,
              tiles: dict[str, Tiles] | None = None, *, variants: Variants | None = None,
              layout: Varlen | None = None, dlse: torch.Tensor | None = None, gluon: bool | None = None,
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(dq, dk, dv, dsinks) from the forward's output and base-2 LSE; ``dlse`` is the gradient of
    the natural LSE the caller returned (None: not used). ``dsinks`` is None without sinks.
    ``tiles`` may force the "dkdv" and "dq" kernels' configurations (for benchmarks). A call the
    Gluon backward covers takes it unless :func:`.gluon_backward.takes` says no (NOTES.md v30);
    ``gluon=False`` keeps it on the Triton kernels (the benchmarks' Triton column)."""
    variants = Variants(causal=causal) if variants is None else variants
    from . import gluon_backward

    # takes() reads the backward's switch (0: never); unsupported_reason() the call's shape and device.
    if (tiles is None and layout is None and gluon is not False
            and gluon_backward.takes()
            and gluon_backward.unsupported_reason(q, k, v, causal, scale, variants=variants, layout=layout) is None):
        dq, dk, dv = gluon_backward.flash_bwd(do, q, k, v, o, lse, causal, scale, dlse=dlse,
                                              alibi_slopes=variants.alibi_slopes, window=variants.window)
        return dq, dk, dv, None
    p = _Problem(q, k, v, scale, variants, layout)
    packed = layout is not None
    # Packed gradients start at zero: rows past the last sequence belong to no program.
    alloc = torch.zeros if packed else torch.empty
    dq = alloc(q.shape, dtype=q.dtype, device=q.device)
    dk = alloc(k.shape, dtype=k.dtype, device=k.device)
    dv = alloc(v.shape, dtype=v.dtype, device=v.device)
    sinks = variants.sinks
    if p.n_q == 0 or p.n_k == 0 or p.batch * p.heads_q == 0:
        # No query or no key: nothing attends, so every key gradient is zero; a sink's is its
        # share of each row, which is all of it (lse = sink, out = 0): sum of dlse.
        dsinks = None
        if sinks is not None:
            dsinks = (torch.zeros_like(sinks) if dlse is None
                      else _rows_per_head(dlse, lse, packed).to(sinks.dtype))
        return dq.zero_(), dk.zero_(), dv.zero_(), dsinks

    # delta = rowsum(dO * O), in the LSE's layout (a packed tensor is one long sequence).
    delta = torch.empty_like(lse)
    if packed:
        o4, do4 = o.permute(1, 0, 2)[None], do.permute(1, 0, 2)[None]
    else:
        o4, do4 = o, do
    rows = o4.shape[2]
    attn_bwd_preprocess[(triton.cdiv(rows, 64), o4.shape[0] * p.heads_q)](
        o4, do4, delta, *o4.stride(), *do4.stride(), p.heads_q, rows,
        HEAD_DIM_V=p.head_dim_v, BLOCK_DV=_block_d(p.head_dim_v), BLOCK_M=64, num_warps=4,
    )
    if dlse is not None:  # d lse / d s = p: the LSE's gradient joins dS = P (dP - delta + dlse)
        delta -= dlse
    dsinks = None
    if sinks is not None:
        # d out / d sink = -p_sink out and d lse / d sink = p_sink, so d sink = -sum p_sink delta,
        # p_sink = 2^(sink * log2(e) - lse), over the rows of a sequence (_rows_per_head).
        heads = (slice(None), None) if packed else (None, slice(None), None)
        # In float64: a head's sum runs over every row of every sequence, and summed in float32 it
        # drifted 3.4 ulp from the oracle where the plain float32 reference drifted 0.7 (varlen,
        # window 16,4, sinks); the [H, rows] vector costs nothing next to the kernels.
        p_sink = torch.exp2(sinks.double()[heads] * _LOG2E - lse.double())
        dsinks = -_rows_per_head(p_sink * delta.double(), lse, packed).to(sinks.dtype)

    block_d = max(_block_d(p.head_dim), _block_d(p.head_dim_v))
    tiles = tiles or {}
    key = (q.dtype, p.head_dim, p.head_dim_v, variants.key(), p.layout_code, _size_class(p.n_q),
           _size_class(p.n_k), p.group > 1)
    work = 2.0 * p.batch * p.heads_q * p.n_q * p.n_k * (p.head_dim + p.head_dim_v)  # compared with a floor only
    padded = packed and pads_rows(lse.shape[-1], p.batch)
    lse_kv, delta_kv = _padded_rows(p, lse, delta) if padded else (lse, delta)
    t = tiles.get("dkdv") or _choose(
        "dkdv", key, block_d, q.dtype, variants.causal, p.n_k,
        lambda t: _launch_dkdv(p, do, lse_kv, delta_kv, dk, dv, t, padded), work)
    _launch_dkdv(p, do, lse_kv, delta_kv, dk, dv, t, padded)
    t = tiles.get("dq") or _choose(
        "dq", key, block_d, q.dtype, variants.causal, p.n_k,
        lambda t: _launch_dq(p, do, lse, delta, dq, t), work)
    _launch_dq(p, do, lse, delta, dq, t)
    return dq, dk, dv, dsinks


def _rows_per_head(values: torch.Tensor, lse: torch.Tensor, packed: bool) -> torch.Tensor:
    # ``values`` per LSE row, [B, H, N] (or packed [H, total]), summed to [H] over the rows of a
    # sequence. A packed layout's rows past the last sequence (where the LSE keeps its +inf fill)
    # are left out: their dO and dlse are whatever the caller's buffer held, and 0 * NaN would be
    # NaN. With finite sinks, every row of a sequence has a finite LSE.
    if packed:
        values = torch.where(lse == float("inf"), 0.0, values)
    return values.sum(dim=1) if packed else values.sum(dim=(0, 2))
