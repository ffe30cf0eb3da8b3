"""torch_flex: PyTorch's FlexAttention, compiled by ``torch.compile`` into one fused kernel.

FlexAttention (``torch.nn.attention.flex_attention``) takes the mask as a Python function
(``mask_mod``) and has Inductor generate a fused attention kernel from it: a Triton template on
CUDA, a C++ template on the CPU. It is here as the compiler-generated baseline beside torch_sdpa
(hand-written kernels) and triton_flash (a hand-written Triton kernel): it shows what a kernel
written by torch.compile from a mask function gets, in speed and memory, on the same cases.

The contract's bottom-right causal mask is the ``mask_mod`` ``kv_idx <= q_idx + Nk - Nq``, turned
into a block mask by ``create_block_mask`` once per (Nq, Nk, device, window) and kept in a small LRU cache;
key blocks wholly above the diagonal are then never visited. Without causal masking no block
mask is passed. Grouped kv heads go through ``enable_gqa``. A row that sees no key (causal with
Nq > Nk) comes out of FlexAttention as zeros, with zero gradients: the kernels turn its empty
softmax sum into 1 and its ``-inf`` log-sum-exp into 0 (seen on the CPU with torch 2.13; the
CUDA templates say so in their source), so nothing is zeroed here.

The variants are FlexAttention's own tools. A sliding window joins the causal condition in the
``mask_mod`` (``-right <= q_idx + Nk - Nq - kv_idx <= left``), so its block mask skips the key
blocks outside the band; softcap and ALiBi are a ``score_mod``, applied to the scaled score in
float32 inside the kernel. The LSE comes from FlexAttention (``return_aux=AuxRequest(lse=True)``,
or ``return_lse`` on an older torch). Sinks are exact through the LSE: with ``s`` the sink's logit,
the sink-free output and LSE become ``out * sigmoid(lse - s)`` and ``logaddexp(lse, s)``, one
rescale per row, differentiable. V's head dim may differ from Q's. On the CPU the compiled kernel
returns no LSE (torch: "return_lse is not supported yet"), so the LSE and sinks are refused there.

Packed sequences (varlen) and paged KV caches are a document mask over one long row of tokens
(:func:`_packed_layout`): every query row knows its sequence and its distance base
(``position + keys - queries`` of its sequence), every key row its sequence and position, and a
query sees a key only in its own sequence, under the same causal and window conditions. A paged
cache is read in place: the key rows are the cache's physical slots (``[pages * page_size]``),
each page's owner and logical position taken from the block table, slots past a sequence's length
and unused pages owned by no sequence. A page has one owner: a cache whose sequences share pages
(prefix caching) is beyond this mask, and the harness's paged cases never share one. The block mask is built once per layout (the lengths and
the block table, by value) and cached, so key blocks that hold no visible pair are skipped.

``torch.compile(flex_attention, dynamic=False)`` is made once per process, so each new shape,
dtype or grad mode compiles once (tens of seconds on the CPU for the first) and then hits the
cache. On the CPU FlexAttention runs forward only: torch refuses any input that requires grad.
On CUDA its Triton kernels need head_dim >= 16; the CPU takes any head dim.
"""

from __future__ import annotations

import importlib.util
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Callable

from pytest_attnkit.contract import AttentionImpl, Case
from pytest_attnkit.masks import rows_with_a_key

if TYPE_CHECKING:
    import torch

#: Block masks kept, least recently used dropped first; one is a few small int tensors.
BLOCK_MASK_CACHE_SIZE = 64
#: Compiled entries allowed per code object. Every shape compiles its own entry (dynamic=False)
#: and dynamo's default limit (8) would quietly send later shapes to eager FlexAttention, which
#: is unfused, quadratic-memory math.
RECOMPILE_LIMIT = 1 << 16

_lock = threading.Lock()
_compiled_flex: Callable[..., Any] | None = None
_block_masks: "OrderedDict[tuple[Any, ...], Any]" = OrderedDict()


def _raise_dynamo_limit(config: Any, names: tuple[str, ...], value: int) -> None:
    for name in names:  # older torch calls these cache_size_limit and accumulated_cache_size_limit
        if hasattr(config, name):
            setattr(config, name, max(getattr(config, name), value))
            return


def compiled_flex_attention() -> Callable[..., Any]:
    """``torch.compile(flex_attention, dynamic=False)``, made on first use, once per process."""
    global _compiled_flex
    with _lock:
        if _compiled_flex is None:
            import torch
            import torch._dynamo.config
            from torch.nn.attention.flex_attention import flex_attention

            try:
                import torch._functorch.config

                # Donated buffers free saved tensors during backward, which breaks the speed
                # suite's repeated backward calls on one retained graph.
                torch._functorch.config.donated_buffer = False
            except (ImportError, AttributeError):  # a torch without donated buffers
                pass
            _raise_dynamo_limit(torch._dynamo.config, ("recompile_limit", "cache_size_limit"), RECOMPILE_LIMIT)
            _raise_dynamo_limit(torch._dynamo.config,
                                ("accumulated_recompile_limit", "accumulated_cache_size_limit"), RECOMPILE_LIMIT)
            _compiled_flex = torch.compile(flex_attention, dynamic=False)
        return _compiled_flex


def _within_band(distance: Any, causal: bool, window: tuple[int, int] | None, visible: Any = None) -> Any:
    """``visible`` (if given) and the contract's conditions on ``d = i + Nk - Nq - j``: causal needs
    ``d >= 0``, a window ``-right <= d <= left`` (a side of -1 unbounded). At least one must apply."""
    left, right = window if window is not None else (-1, -1)
    conditions = [] if visible is None else [visible]
    if causal:
        conditions.append(distance >= 0)
    if left >= 0:
        conditions.append(distance <= left)
    if right >= 0:
        conditions.append(distance >= -right)
    result = conditions[0]
    for condition in conditions[1:]:
        result = result & condition
    return result


def _visibility_mask_mod(offset: int, causal: bool, window: tuple[int, int] | None) -> Callable[..., Any]:
    """``mask_mod`` for bottom-right causal and a window, with ``d = q_idx + offset - kv_idx``."""

    def mask_mod(batch: Any, head: Any, q_idx: Any, kv_idx: Any) -> Any:
        return _within_band(q_idx + offset - kv_idx, causal, window)

    return mask_mod


def _compiling() -> bool:
    """Whether this call is being traced by an enclosing ``torch.compile`` (a model compiled with
    fullgraph=True that calls this implementation)."""
    import torch

    return bool(torch.compiler.is_compiling())


def _flex_attention() -> Callable[..., Any]:
    """FlexAttention as this call should take it: compiled once per process, or, inside a model
    being compiled, the plain function, which the enclosing compilation compiles with the model
    (a lock or a cache lookup there would break its graph)."""
    if _compiling():
        from torch.nn.attention.flex_attention import flex_attention

        return flex_attention
    return compiled_flex_attention()


def _cached(cache: "OrderedDict[Any, Any]", key: Any, build: Callable[[], Any]) -> Any:
    """``cache[key]``, built on a miss; the least recently used entry goes past BLOCK_MASK_CACHE_SIZE.
    Inside a model being compiled it is always built: the compiled graph holds it."""
    if _compiling():
        return build()
    with _lock:
        if key in cache:
            cache.move_to_end(key)
            return cache[key]
    value = build()
    with _lock:
        cache[key] = value
        cache.move_to_end(key)
        while len(cache) > BLOCK_MASK_CACHE_SIZE:
            cache.popitem(last=False)
    return value


def visibility_block_mask(seqlen_q: int, seqlen_k: int, device: "torch.device", *, causal: bool = True,
                          window: tuple[int, int] | None = None) -> Any:
    """The ``BlockMask`` of bottom-right causal masking and a window on ``device``, cached (LRU)."""
    from torch.nn.attention.flex_attention import create_block_mask

    return _cached(_block_masks, (seqlen_q, seqlen_k, str(device), causal, window),
                   lambda: create_block_mask(_visibility_mask_mod(seqlen_k - seqlen_q, causal, window), None, None,
                                             seqlen_q, seqlen_k, device=device))


def _score_mod(distance_of: Callable[[Any, Any], Any], softcap: float,
               alibi_slopes: "torch.Tensor | None") -> Callable[..., Any] | None:
    """``score_mod`` for softcap (on the scaled score) and then the ALiBi bias, as the contract orders
    them; ``distance_of(q_idx, kv_idx)`` is the contract's ``i + Nk - Nq - j`` in the call's rows."""
    if not softcap and alibi_slopes is None:
        return None
    import torch

    def score_mod(score: Any, batch: Any, head: Any, q_idx: Any, kv_idx: Any) -> Any:
        if softcap:
            score = softcap * torch.tanh(score / softcap)
        if alibi_slopes is not None:
            score = score - alibi_slopes[head] * distance_of(q_idx, kv_idx).abs()
        return score

    return score_mod


def _join_sinks(out: "torch.Tensor", lse: "torch.Tensor", sinks: "torch.Tensor",
                dtype: "torch.dtype") -> tuple["torch.Tensor", "torch.Tensor"]:
    """The sink-free ``out`` [B, H, N, Dv] and ``lse`` [B, H, N] with each head's sink logit joined to
    the denominator: ``out * sigmoid(lse - s)`` (the keys' share) and ``logaddexp(lse, s)``."""
    import torch

    sink = sinks.to(lse.dtype)[None, :, None]
    keep = torch.sigmoid(lse - sink)
    return (out.to(keep.dtype) * keep[..., None]).to(dtype), torch.logaddexp(lse, sink)


def _lse_request() -> dict[str, Any]:
    try:
        from torch.nn.attention.flex_attention import AuxRequest
    except ImportError:  # torch before return_aux
        return {"return_lse": True}
    return {"return_aux": AuxRequest(lse=True)}


def _call_flex(q: "torch.Tensor", k: "torch.Tensor", v: "torch.Tensor", **keywords: Any) -> Any:
    """The compiled FlexAttention on these arguments. For fewer than 128 queries Inductor lowers it
    to its decoding template, and where none of that template's configurations fits the case it
    fails with ``NoValidChoicesError`` (an H100, 2026-11-25: 113 queries against 203 keys, GQA 4:2,
    fp16, head dim 64, causal; results/2026-11-25-h100-main-job). Then the call goes again through
    the main kernel (``FORCE_USE_FLEX_ATTENTION``), which takes any query length. Not yet run on a
    GPU: the next device session's sanitize run is its test."""
    try:
        return _flex_attention()(q, k, v, **keywords)
    except Exception as error:
        if "NoValidChoicesError" not in f"{type(error).__name__}: {error}" or "kernel_options" in keywords:
            raise
    return _flex_attention()(q, k, v, kernel_options={"FORCE_USE_FLEX_ATTENTION": True}, **keywords)


def flex_attention_contract(q: "torch.Tensor", k: "torch.Tensor", v: "torch.Tensor", *, causal: bool = False,
                            scale: float | None = None, window_size: tuple[int, int] | None = None,
                            softcap: float = 0.0, alibi_slopes: "torch.Tensor | None" = None,
                            sinks: "torch.Tensor | None" = None, return_lse: bool = False) -> Any:
    import torch

    if q.device.type == "cpu" and not torch.is_grad_enabled():
        # FlexAttention refuses CPU inputs that require grad even under no_grad.
        q, k, v = q.detach(), k.detach(), v.detach()
    seqlen_q, seqlen_k = q.shape[-2], k.shape[-2]
    window = None if window_size is None or tuple(window_size) == (-1, -1) else tuple(window_size)
    block_mask = None
    if causal or window is not None:
        block_mask = visibility_block_mask(seqlen_q, seqlen_k, q.device, causal=causal, window=window)
    offset = seqlen_k - seqlen_q
    score_mod = _score_mod(lambda q_idx, kv_idx: q_idx + offset - kv_idx, softcap, alibi_slopes)
    need_lse = return_lse or sinks is not None
    result = _call_flex(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale,
                        enable_gqa=q.shape[1] != k.shape[1], **(_lse_request() if need_lse else {}))
    if not need_lse:
        return result
    out, aux = result
    lse = aux if isinstance(aux, torch.Tensor) else aux.lse
    if sinks is not None:
        if block_mask is not None:
            # A row that sees no key has an empty sum: its LSE is -inf, whatever the kernel wrote.
            sees_a_key = rows_with_a_key(seqlen_q, seqlen_k, causal=causal, window=window, device=q.device)
            lse = torch.where(sees_a_key, lse, torch.full((), float("-inf"), device=lse.device, dtype=lse.dtype))
        out, lse = _join_sinks(out, lse, sinks, q.dtype)
    return (out, lse.float()) if return_lse else out


class _Layout:
    """Per-row metadata of a packed layout, on the inputs' device (see the module docstring)."""

    def __init__(self, doc_q: "torch.Tensor", base_q: "torch.Tensor", doc_k: "torch.Tensor", pos_k: "torch.Tensor",
                 keys_of_row: "torch.Tensor") -> None:
        self.doc_q, self.base_q, self.doc_k, self.pos_k = doc_q, base_q, doc_k, pos_k
        self.keys_of_row = keys_of_row  # how many keys the row's sequence has (0 for unused rows)

    def mask_mod(self, causal: bool, window: tuple[int, int] | None) -> Callable[..., Any]:
        doc_q, base_q, doc_k, pos_k = self.doc_q, self.base_q, self.doc_k, self.pos_k

        def mask_mod(batch: Any, head: Any, q_idx: Any, kv_idx: Any) -> Any:
            return _within_band(base_q[q_idx] - pos_k[kv_idx], causal, window,
                                visible=doc_q[q_idx] == doc_k[kv_idx])

        return mask_mod

    def distance(self, q_idx: Any, kv_idx: Any) -> Any:
        """The contract's ``i + Nk - Nq - j`` of a query row and a key row, within their sequence."""
        return self.base_q[q_idx] - self.pos_k[kv_idx]

    def sees_a_key(self, causal: bool, window: tuple[int, int] | None) -> "torch.Tensor":
        """Boolean per query row: whether any key of its sequence is visible to it."""
        import torch

        left, right = window if window is not None else (-1, -1)
        if causal:
            right = 0 if right < 0 else min(right, 0)
        first = torch.zeros_like(self.base_q) if left < 0 else (self.base_q - left).clamp_min(0)
        last = self.keys_of_row - 1
        if right >= 0:
            last = torch.minimum(last, self.base_q + right)
        return (last >= first) & (self.keys_of_row > 0)


def _packed_layout(q: "torch.Tensor", k: "torch.Tensor", layout: dict[str, Any]) -> _Layout:
    """The row metadata of a varlen (cu_seqlens) or paged (block_table) call."""
    import torch

    device = q.device
    if "block_table" in layout:
        table, lengths = layout["block_table"].long(), layout["cache_seqlens"].long()
        batch, seqlen_q = q.shape[0], q.shape[1]
        page_size, pages = k.shape[1], k.shape[0]
        rows = torch.arange(batch * seqlen_q, device=device)
        doc_q, position = rows // seqlen_q, rows % seqlen_q
        base_q = position + lengths[doc_q] - seqlen_q
        keys_of_row = lengths[doc_q]
        needed = (lengths + page_size - 1) // page_size
        column = torch.arange(table.shape[1], device=device)[None, :].expand_as(table)
        owned = column < needed[:, None]
        owner = torch.full((pages,), -2, dtype=torch.long, device=device)
        logical = torch.zeros(pages, dtype=torch.long, device=device)
        owner[table[owned]] = torch.arange(batch, device=device)[:, None].expand_as(table)[owned]
        logical[table[owned]] = column[owned]
        slots = torch.arange(pages * page_size, device=device)
        page_of_slot = slots // page_size
        doc_k = owner[page_of_slot]
        pos_k = logical[page_of_slot] * page_size + slots % page_size
        past_end = (doc_k < 0) | (pos_k >= lengths[doc_k.clamp_min(0)])
        doc_k = torch.where(past_end, torch.full_like(doc_k, -2), doc_k)
        return _Layout(doc_q, base_q, doc_k, pos_k, keys_of_row)
    cu_q, cu_k = layout["cu_seqlens_q"].long(), layout["cu_seqlens_k"].long()
    rows_q, rows_k = torch.arange(q.shape[0], device=device), torch.arange(k.shape[0], device=device)
    batch = cu_q.shape[0] - 1
    doc_q = torch.searchsorted(cu_q[1:], rows_q, right=True)  # == batch past the last sequence
    doc_k = torch.searchsorted(cu_k[1:], rows_k, right=True)
    queries, keys = cu_q[1:] - cu_q[:-1], cu_k[1:] - cu_k[:-1]
    used_q = doc_q < batch
    doc_q_safe = doc_q.clamp_max(batch - 1)
    base_q = rows_q - cu_q[doc_q_safe] + keys[doc_q_safe] - queries[doc_q_safe]
    pos_k = rows_k - cu_k[doc_k.clamp_max(batch - 1)]
    keys_of_row = torch.where(used_q, keys[doc_q_safe], torch.zeros_like(base_q))
    doc_q = torch.where(used_q, doc_q, torch.full_like(doc_q, -1))
    doc_k = torch.where(doc_k < batch, doc_k, torch.full_like(doc_k, -2))
    return _Layout(doc_q, base_q, doc_k, pos_k, keys_of_row)


_layouts: "OrderedDict[tuple[Any, ...], tuple[_Layout, Any]]" = OrderedDict()


def _layout_and_block_mask(q: "torch.Tensor", k: "torch.Tensor", layout: dict[str, Any], causal: bool,
                           window: tuple[int, int] | None, rows_q: int, rows_k: int) -> tuple[_Layout, Any]:
    """The layout's metadata and block mask, cached by value (the lengths and the block table, read
    back on every call: a tensor written in place, as serving engines do to a block table, must
    not find the mask of its old values)."""
    def build() -> tuple[_Layout, Any]:
        from torch.nn.attention.flex_attention import create_block_mask

        packed = _packed_layout(q, k, layout)
        return packed, create_block_mask(packed.mask_mod(causal, window), None, None, rows_q, rows_k, device=q.device)

    if _compiling():
        return build()  # the key would read the tensors back on the host: no graph holds that
    key = (tuple((name, tuple(value.flatten().tolist())) for name, value in sorted(layout.items())),
           q.shape, k.shape, str(q.device), causal, window)
    return _cached(_layouts, key, build)


def flex_attention_packed(q: "torch.Tensor", k: "torch.Tensor", v: "torch.Tensor", *, causal: bool = False,
                          scale: float | None = None, window_size: tuple[int, int] | None = None,
                          softcap: float = 0.0, alibi_slopes: "torch.Tensor | None" = None,
                          sinks: "torch.Tensor | None" = None, return_lse: bool = False,
                          **layout: Any) -> Any:
    """Varlen or paged attention through one FlexAttention call over the packed rows."""
    import torch

    if q.device.type == "cpu" and not torch.is_grad_enabled():
        q, k, v = q.detach(), k.detach(), v.detach()
    window = None if window_size is None or tuple(window_size) == (-1, -1) else tuple(window_size)
    paged = "block_table" in layout
    layout = {name: value for name, value in layout.items() if name in ("cu_seqlens_q", "cu_seqlens_k",
                                                                         "block_table", "cache_seqlens")}
    rows_q = q.shape[0] * q.shape[1] if paged else q.shape[0]
    q_rows = q.reshape(rows_q, *q.shape[-2:]) if paged else q
    k_rows = k.reshape(-1, *k.shape[-2:]) if paged else k
    v_rows = v.reshape(-1, *v.shape[-2:]) if paged else v
    packed, block_mask = _layout_and_block_mask(q, k, layout, causal, window, rows_q, k_rows.shape[0])
    score_mod = _score_mod(packed.distance, softcap, alibi_slopes)
    need_lse = return_lse or sinks is not None
    result = _call_flex(
        q_rows.transpose(0, 1)[None], k_rows.transpose(0, 1)[None], v_rows.transpose(0, 1)[None],
        score_mod=score_mod, block_mask=block_mask, scale=scale, enable_gqa=q.shape[-2] != k.shape[-2],
        **(_lse_request() if need_lse else {}))
    out, lse = result, None  # [1, Hq, rows, Dv] and [1, Hq, rows]
    if need_lse:
        out, lse = result[0], result[1] if isinstance(result[1], torch.Tensor) else result[1].lse
    sees_a_key = packed.sees_a_key(causal, window)
    if lse is not None:
        lse = torch.where(sees_a_key, lse, torch.full((), float("-inf"), device=lse.device, dtype=lse.dtype))
        if sinks is not None:
            out, lse = _join_sinks(out, lse, sinks, q.dtype)
        lse = lse[0]  # [Hq, rows]
    out = out[0].transpose(0, 1)  # [rows, Hq, Dv]
    # Rows that see no key (unused rows, sequences without keys) hold zeros, whatever the kernel wrote.
    out = torch.where(sees_a_key[:, None, None], out, torch.zeros((), dtype=out.dtype, device=out.device))
    if paged:
        out = out.reshape(q.shape[0], q.shape[1], *out.shape[1:])
        if lse is not None:
            lse = lse.reshape(lse.shape[0], q.shape[0], q.shape[1]).transpose(0, 1)
    if not return_lse:
        return out
    if sinks is None:  # the LSE of a row that sees no key is open: 0 here, not -inf
        lse = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    return out, lse.float()


class TorchFlex(AttentionImpl):
    devices = ("cpu", "cuda")
    dtypes = ("float16", "bfloat16", "float32")
    head_dims = None  # any on the CPU; CUDA's refinement is in not_supported_reasons
    supports_causal = True
    supports_gqa = True
    supports_seqlen_mismatch = True
    supports_backward = True  # CUDA only; see not_supported_reasons
    memory_class = "linear"
    supports_window = True
    supports_softcap = True
    supports_alibi = True
    supports_sinks = True  # through the LSE, so CUDA only; see not_supported_reasons
    supports_lse = True  # CUDA only; see not_supported_reasons
    head_dims_v = range(1, 1025)
    supports_varlen = True  # a document mask over the packed rows
    supports_paged_kv = True  # the same mask over the cache's physical slots, read in place
    supports_paged_kv_backward = True  # CUDA only, as every backward here

    def unavailable_reason(self, device: str) -> str | None:
        try:
            import torch
        except ImportError as error:
            return f"torch is not installed ({error})"
        try:
            import torch.nn.attention.flex_attention  # noqa: F401
        except ImportError as error:
            return f"torch {torch.__version__} has no FlexAttention (needs torch >= 2.5: {error})"
        if device == "cuda":
            if not torch.cuda.is_available():
                return "no CUDA device"
            # Looked up, not imported: torch's has_triton() imports Triton and starts its CUDA
            # driver, which held this worker's start 4.3-4.5 s on a fresh H200 while every other
            # first worker was ready (results/2026-12-02-session28/h200/startprobe-before.txt); the first
            # compile does that beside other work.
            if importlib.util.find_spec("triton") is None:
                return "torch.compile needs triton to build FlexAttention's CUDA kernels, and it is not installed"
            major, minor = torch.cuda.get_device_capability()
            if major < 7:
                return (f"torch.compile's Triton needs compute capability 7.0 or more to build FlexAttention's "
                        f"CUDA kernels (this GPU is {major}.{minor})")
        return super().unavailable_reason(device)

    def not_supported_reasons(self, case: Case, device: str, *, backward: bool = False) -> list[str]:
        reasons = super().not_supported_reasons(case, device, backward=backward)
        if device == "cpu" and backward:
            reasons.append("FlexAttention has no backward on the CPU (torch refuses inputs that require grad)")
        if device == "cuda" and case.head_dim < 16:
            reasons.append(f"head_dim={case.head_dim} (FlexAttention's CUDA kernels need head_dim >= 16)")
        if device == "cuda" and case.head_dim_v not in (None, case.head_dim) and case.head_dim_v > 128:
            # Its Triton template keeps a V-wide accumulator in shared memory, which past 128
            # outgrows an SM's shared memory (Hopper: 228 KiB) and does not compile.
            reasons.append(f"head_dim_v={case.head_dim_v} with head_dim={case.head_dim} (FlexAttention's CUDA kernel "
                           "does not fit a V head dim above 128 that differs from Q's in shared memory)")
        if device == "cpu" and (case.return_lse or case.sinks):
            reasons.append("FlexAttention compiled for the CPU returns no LSE (torch: return_lse is not supported "
                           "yet), and sinks are computed from it")
        return reasons

    def forward(self, q, k, v, *, causal=False, scale=None, **variants):
        if "cu_seqlens_q" in variants or "block_table" in variants:
            return flex_attention_packed(q, k, v, causal=causal, scale=scale, **variants)
        return flex_attention_contract(q, k, v, causal=causal, scale=scale, **variants)
