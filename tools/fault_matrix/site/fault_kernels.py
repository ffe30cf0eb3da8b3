"""Deliberately broken implementations for the GPU part of the fault matrix (tools/fault_matrix).

Each is right except for one fault that only a GPU can show: an illegal memory access (a Triton
kernel reading far out of bounds), work launched on a side stream that the caller's stream never
waits for, an allocation the device cannot satisfy, a cached answer that makes it impossibly fast,
and a crash of the whole process.
"""

import ctypes

import torch
import torch.nn.functional as F
import triton
import triton.language as tl


def _sdpa(q, k, v, causal, scale):
    gqa = {"enable_gqa": True} if q.shape[1] != k.shape[1] else {}
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, **gqa)


@triton.jit
def _read_far(X, Y, OFFSET: tl.constexpr, N: tl.constexpr):
    lanes = tl.arange(0, N)
    tl.store(Y + lanes, tl.load(X + OFFSET + lanes))


def illegal_memory_access(q, k, v, *, causal=False, scale=None):
    out = _sdpa(q, k, v, causal, scale)
    sink = torch.empty(128, device=q.device, dtype=q.dtype)
    _read_far[(1,)](q, sink, OFFSET=1 << 40, N=128)  # a terabyte past q
    return out


def side_stream(q, k, v, *, causal=False, scale=None):
    side = torch.cuda.Stream(device=q.device)
    side.wait_stream(torch.cuda.current_stream(q.device))
    with torch.cuda.stream(side):
        out = _sdpa(q, k, v, causal, scale)
    return out  # the caller's stream never waits for `side`


def out_of_memory(q, k, v, *, causal=False, scale=None):
    workspace = torch.empty(1 << 44, dtype=torch.uint8, device=q.device)  # 16 TiB
    return _sdpa(q, k, v, causal, scale) + workspace[0]


_answers = {}


def cached(q, k, v, *, causal=False, scale=None):
    key = (q.data_ptr(), k.data_ptr(), v.data_ptr(), tuple(q.shape), causal)
    if key not in _answers:
        _answers[key] = _sdpa(q, k, v, causal, scale)
    return _answers[key]


def segfault(q, k, v, *, causal=False, scale=None):
    ctypes.string_at(0)
