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

from .kernels import (
    attn_bwd_dkdv,
    attn_bwd_dq,
    attn_bwd_preprocess,
    attn_fwd,
    attn_fwd_combine,
    attn_fwd_fp8,
    attn_fwd_split,
    transpose_keys,
    triton,
)

_LOG2E = 1.4426950408889634

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MIN_HEAD_DIM, MAX_HEAD_DIM = 16, 256
#: Decode path: at most this many query rows per kv head (GROUP x Nq) go through the split kernel.
_DECODE_MAX_ROWS = 64
_DECODE_MAX_SEQLEN_Q = 16
#: Below this many keys a split decode loses to the plain forward on the GPU: its two launches cost
#: more host time than the split saves (NOTES.md). A short cache still takes the decode kernel when
#: one slice per kv head already fills the GPU (one launch, no merge).
_DECODE_SPLIT_MIN_KEYS = 8192
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
                [Tiles(64, 32, 4, 2), Tiles(64, 64, 4, 2), Tiles(128, 32, 8, 2)]),
        "decode": ([Tiles(0, 64, 4, 4, waves=4), Tiles(0, 64, 4, 3, waves=8), Tiles(0, 128, 4, 3, waves=4)] if medium else
                   [Tiles(0, 32, 4, 3, waves=4), Tiles(0, 64, 4, 2, waves=4), Tiles(0, 32, 4, 2, waves=8)]),
        "dkdv": ([Tiles(32, 64, 4, 3), Tiles(32, 128, 4, 3), Tiles(64, 64, 4, 3)] if small else
                 [Tiles(32, 64, 4, 3), Tiles(64, 128, 8, 3), Tiles(32, 128, 8, 2)] if medium else
                 [Tiles(32, 32, 4, 2), Tiles(32, 64, 4, 2), Tiles(64, 32, 4, 2)]),
        "dq": ([Tiles(64, 64, 4, 3), Tiles(128, 64, 8, 3)] if small else
               [Tiles(128, 64, 8, 3), Tiles(128, 32, 4, 3), Tiles(64, 32, 4, 3)] if medium else
               [Tiles(32, 32, 4, 2), Tiles(64, 32, 4, 2), Tiles(32, 64, 4, 2)]),
        # FP8 (head dims 64 and 128 only): not yet measured; the first entry is the Triton
        # tutorial's Hopper shape (two warp groups of 64 rows, 128 keys a step), the others what
        # a tuner should compare (NOTES.md). A tile is half a 16-bit one's bytes.
        "fp8": ([Tiles(128, 128, 8, 3), Tiles(128, 64, 8, 3), Tiles(64, 64, 4, 3)] if small else
                [Tiles(128, 128, 8, 3), Tiles(128, 64, 8, 3), Tiles(128, 128, 8, 4)]),
    }
    candidates = table[kernel]
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
        "fwd": Tiles(64, 64, 4, 3) if small or n_k < 4096 else Tiles(128, 128, 8, 3),
        "decode": candidates[0],
        "dkdv": (Tiles(32, 128, 4, 3) if causal else Tiles(32, 64, 4, 3)) if small else
                (Tiles(32, 64, 4, 3) if causal else Tiles(64, 128, 8, 3)),
        "dq": (Tiles(64, 64, 4, 3) if causal else Tiles(128, 64, 8, 3)) if small else Tiles(128, 64, 8, 3),
        "fp8": candidates[0],
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


def _check_tensors(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dtype_problem: Callable[[], str | None],
                   device_problem: Callable[[], str | None] = lambda: None) -> tuple[int, int, int, int]:
    """The checks both forwards share: 4-d tensors on one supported device with matching shapes;
    ``dtype_problem`` and ``device_problem`` add each path's own. Returns (batch, heads_q,
    heads_kv, head_dim)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-d [batch, heads, seqlen, head_dim], got shape {tuple(t.shape)}")
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
    if k.shape != v.shape:
        raise ValueError(f"k and v must have one shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    batch, heads_q, _, head_dim = q.shape
    if k.shape[0] != batch or k.shape[3] != head_dim:
        raise ValueError(f"k/v shape {tuple(k.shape)} does not match q's batch and head_dim {tuple(q.shape)}")
    heads_kv = k.shape[1]
    if heads_kv == 0 or heads_q % heads_kv:
        raise ValueError(f"q heads ({heads_q}) must be a multiple of k/v heads ({heads_kv})")
    return batch, heads_q, heads_kv, head_dim


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Raise TypeError/ValueError for inputs the kernels do not take (see ``flash_attention``)."""

    def dtype_problem() -> str | None:
        if q.dtype not in _DTYPES:
            return f"dtype {q.dtype} is not supported (float16, bfloat16, float32; FP8: float8_e4m3fn)"
        if k.dtype != q.dtype or v.dtype != q.dtype:
            return f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}"
        return None

    head_dim = _check_tensors(q, k, v, dtype_problem)[3]
    if not MIN_HEAD_DIM <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(f"head_dim={head_dim} is outside {MIN_HEAD_DIM}..{MAX_HEAD_DIM}")


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


def uses_decode_kernel(n_q: int, group: int, n_k: int, batch_heads_kv: int, sm_count: int, waves: int) -> bool:
    """Few query rows per kv head (decode, speculative decode) against a long cache, or a short
    cache whose kv heads alone fill the GPU: split the keys instead of the queries. Under the
    interpreter every decode shape takes it, so that CI runs the split and the merge."""
    if n_q > _DECODE_MAX_SEQLEN_Q or n_q * group > _DECODE_MAX_ROWS:
        return False
    return interpreting() or n_k >= _DECODE_SPLIT_MIN_KEYS or batch_heads_kv >= waves * sm_count


@functools.lru_cache(maxsize=1024)
def decode_splits(batch_heads_kv: int, n_k: int, block_n: int, waves: int, sm_count: int) -> tuple[int, int]:
    """(number of key slices, keys per slice): enough programs for ``waves`` per SM, each slice a
    whole number of key blocks."""
    blocks = max(1, triton.cdiv(n_k, block_n))
    wanted = max(1, triton.cdiv(waves * sm_count, max(batch_heads_kv, 1)))
    per_split = triton.cdiv(blocks, min(wanted, blocks)) * block_n
    return triton.cdiv(max(n_k, 1), per_split), per_split


# ---------------------------------------------------------------------------------------------
# Forward
# ---------------------------------------------------------------------------------------------


def _launch_fwd(q, k, v, o, lse, causal: bool, scale: float, t: Tiles) -> None:
    batch, heads_q, n_q, head_dim = q.shape
    heads_kv, n_k = k.shape[1], k.shape[2]
    attn_fwd[(triton.cdiv(n_q, t.block_m), batch * heads_q)](
        q, k, v, o, lse,
        *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        heads_q, n_q, n_k, heads_q // heads_kv, scale * _LOG2E,
        HEAD_DIM=head_dim, BLOCK_D=_block_d(head_dim), BLOCK_M=t.block_m, BLOCK_N=t.block_n,
        CAUSAL=causal, DOT_PRECISION=_dot_precision(q.dtype),
        num_warps=t.num_warps, num_stages=t.num_stages,
    )


def _launch_decode(q, k, v, o, lse, causal: bool, scale: float, t: Tiles) -> None:
    batch, heads_q, n_q, head_dim = q.shape
    heads_kv, n_k = k.shape[1], k.shape[2]
    group = heads_q // heads_kv
    block_d = _block_d(head_dim)
    splits, per_split = decode_splits(batch * heads_kv, n_k, t.block_n, t.waves, _sm_count(q.device))
    direct = splits == 1
    if direct:
        o_part = lse_part = lse  # unused placeholders: the kernel writes o and lse itself
    else:  # one allocation for both scratch arrays: each call's host time counts in decode
        parts = batch * heads_q * n_q * splits
        scratch = torch.empty(parts * (block_d + 1), dtype=torch.float32, device=q.device)
        o_part, lse_part = scratch[:parts * block_d], scratch[parts * block_d:]
    attn_fwd_split[(splits, batch * heads_kv)](
        q, k, v, o, lse, o_part, lse_part,
        *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        heads_q, heads_kv, n_q, n_k, group, per_split, scale * _LOG2E,
        HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_R=max(16, triton.next_power_of_2(group * n_q)),
        BLOCK_N=t.block_n, CAUSAL=causal, DIRECT=direct, DOT_PRECISION=_dot_precision(q.dtype),
        num_warps=t.num_warps, num_stages=t.num_stages,
    )
    if not direct:
        attn_fwd_combine[(batch * heads_q * n_q,)](
            o_part, lse_part, o, lse, *o.stride(), heads_q, n_q, splits,
            HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_S=max(2, triton.next_power_of_2(splits)),
            num_warps=4,
        )


def _plan_fwd(q, k, v, o, lse, causal: bool, scale: float) -> tuple[Callable[..., None], Tiles]:
    batch, heads_q, n_q, head_dim = q.shape
    heads_kv, n_k = k.shape[1], k.shape[2]
    group = heads_q // heads_kv
    block_d = _block_d(head_dim)
    waves = tile_candidates("decode", block_d, q.dtype)[0].waves
    decode = uses_decode_kernel(n_q, group, n_k, batch * heads_kv, _sm_count(q.device), waves)
    kernel, launch = ("decode", _launch_decode) if decode else ("fwd", _launch_fwd)
    key = (q.dtype, head_dim, causal, _size_class(n_q), _size_class(n_k),
           _size_class(batch * heads_kv) if decode else group > 1)
    if decode:  # memory bound: the work that matters is the KV cache's bytes
        work = 2.0 * batch * heads_kv * n_k * head_dim * q.element_size()
    else:
        work = 4.0 * batch * heads_q * n_q * n_k * head_dim
    tiles = _choose(kernel, key, block_d, q.dtype, causal, n_k,
                    lambda t: launch(q, k, v, o, lse, causal, scale, t), work, memory_bound=decode)
    return launch, tiles


def flash_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float,
              tiles: Tiles | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(output, base-2 log-sum-exp per row) for checked inputs. ``tiles`` forces a configuration
    (for benchmarks): ``block_m == 0`` selects the decode kernel."""
    batch, heads_q, n_q, head_dim = q.shape
    heads_kv, n_k = k.shape[1], k.shape[2]
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((batch, heads_q, n_q), dtype=torch.float32, device=q.device)
    if o.numel() == 0:
        return o, lse
    if n_k == 0:  # nothing to attend to: zeros, and lse = +inf as for any row that sees no key
        return o.zero_(), lse.fill_(float("inf"))
    if tiles is not None:  # forced: the tiles say which kernel
        launch = _launch_decode if tiles.block_m == 0 else _launch_fwd
    else:
        plan_key = (q.shape, k.shape, q.dtype, causal, q.device)
        plan = _PLANS.get(plan_key)
        if plan is None:
            plan = _plan_fwd(q, k, v, o, lse, causal, scale)
            _PLANS.put(plan_key, plan)
        launch, tiles = plan
    launch(q, k, v, o, lse, causal, scale, tiles)
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


def _launch_dkdv(q, k, v, do, lse, delta, dk, dv, causal: bool, scale: float, t: Tiles) -> None:
    batch, heads_q, n_q, head_dim = q.shape
    heads_kv, n_k = k.shape[1], k.shape[2]
    attn_bwd_dkdv[(triton.cdiv(n_k, t.block_n), batch * heads_kv)](
        q, k, v, do, lse, delta, dk, dv,
        *q.stride(), *k.stride(), *v.stride(), *do.stride(), *dk.stride(), *dv.stride(),
        heads_q, heads_kv, n_q, n_k, heads_q // heads_kv, scale, scale * _LOG2E,
        HEAD_DIM=head_dim, BLOCK_D=_block_d(head_dim), BLOCK_M=t.block_m, BLOCK_N=t.block_n,
        CAUSAL=causal, DOT_PRECISION=_dot_precision(q.dtype),
        num_warps=t.num_warps, num_stages=t.num_stages,
    )


def _launch_dq(q, k, v, do, lse, delta, dq, causal: bool, scale: float, t: Tiles) -> None:
    batch, heads_q, n_q, head_dim = q.shape
    heads_kv, n_k = k.shape[1], k.shape[2]
    attn_bwd_dq[(triton.cdiv(n_q, t.block_m), batch * heads_q)](
        q, k, v, do, lse, delta, dq,
        *q.stride(), *k.stride(), *v.stride(), *do.stride(), *dq.stride(),
        heads_q, n_q, n_k, heads_q // heads_kv, scale, scale * _LOG2E,
        HEAD_DIM=head_dim, BLOCK_D=_block_d(head_dim), BLOCK_M=t.block_m, BLOCK_N=t.block_n,
        CAUSAL=causal, DOT_PRECISION=_dot_precision(q.dtype),
        num_warps=t.num_warps, num_stages=t.num_stages,
    )


def flash_bwd(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              o: torch.Tensor, lse: torch.Tensor, causal: bool, scale: float,
              tiles: dict[str, Tiles] | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) from the forward's output and log-sum-exp. ``tiles`` may force the "dkdv"
    and "dq" kernels' configurations (for benchmarks)."""
    batch, heads_q, n_q, head_dim = q.shape
    heads_kv, n_k = k.shape[1], k.shape[2]
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    if n_q == 0 or n_k == 0 or batch * heads_q == 0:
        # No query or no key: nothing attends, so every gradient is zero.
        return dq.zero_(), dk.zero_(), dv.zero_()
    block_d = _block_d(head_dim)
    tiles = tiles or {}

    delta = torch.empty_like(lse)
    attn_bwd_preprocess[(triton.cdiv(n_q, 64), batch * heads_q)](
        o, do, delta, *o.stride(), *do.stride(), heads_q, n_q,
        HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_M=64, num_warps=4,
    )
    key = (q.dtype, head_dim, causal, _size_class(n_q), _size_class(n_k), heads_q > heads_kv)
    work = 4.0 * batch * heads_q * n_q * n_k * head_dim  # the forward's FLOPs: only compared with a floor
    t = tiles.get("dkdv") or _choose(
        "dkdv", key, block_d, q.dtype, causal, n_k,
        lambda t: _launch_dkdv(q, k, v, do, lse, delta, dk, dv, causal, scale, t), work)
    _launch_dkdv(q, k, v, do, lse, delta, dk, dv, causal, scale, t)
    t = tiles.get("dq") or _choose(
        "dq", key, block_d, q.dtype, causal, n_k,
        lambda t: _launch_dq(q, k, v, do, lse, delta, dq, causal, scale, t), work)
    _launch_dq(q, k, v, do, lse, delta, dq, causal, scale, t)
    return dq, dk, dv
