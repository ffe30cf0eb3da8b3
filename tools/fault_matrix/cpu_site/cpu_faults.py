"""Deliberately broken implementations for the CPU part of the fault matrix (tools/fault_matrix).

Each is right except for one fault that a new user's kernel can have on any machine: it exits on
its third call, segfaults, hangs, runs out of memory, returns NaN or the wrong shape, raises,
prints a megabyte per call, writes into its input, or starts processes that outlive the call.
"""

import ctypes
import os
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

_calls = 0


def _sdpa(q, k, v, causal, scale):
    gqa = {"enable_gqa": True} if q.shape[1] != k.shape[1] else {}
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, **gqa)


def exits_on_third_call(q, k, v, *, causal=False, scale=None):
    global _calls
    _calls += 1
    if _calls == 3:
        os._exit(3)
    return _sdpa(q, k, v, causal, scale)


def segfault(q, k, v, *, causal=False, scale=None):
    ctypes.string_at(0)


def hangs(q, k, v, *, causal=False, scale=None):
    time.sleep(3600)


def out_of_memory(q, k, v, *, causal=False, scale=None):
    workspace = torch.empty(1 << 44, dtype=torch.uint8, device=q.device)  # 16 TiB
    return _sdpa(q, k, v, causal, scale) + workspace[0]


def nan(q, k, v, *, causal=False, scale=None):
    out = _sdpa(q, k, v, causal, scale).clone()
    out.view(-1)[0] = float("nan")
    return out


def wrong_shape(q, k, v, *, causal=False, scale=None):
    return _sdpa(q, k, v, causal, scale)[..., :-1]


def raises(q, k, v, *, causal=False, scale=None):
    raise RuntimeError("kernel launch failed: too many resources requested")


def chatty(q, k, v, *, causal=False, scale=None):
    """Right, and prints a megabyte per call."""
    sys.stdout.write(("debug: " + "x" * 120 + "\n") * 8192)
    return _sdpa(q, k, v, causal, scale)


def modifies_input(q, k, v, *, causal=False, scale=None):
    out = _sdpa(q, k, v, causal, scale)
    with torch.no_grad():
        k[0, 0, 0, 0] += 1.0
    return out


def starts_children(q, k, v, *, causal=False, scale=None):
    """Right, and starts two processes that outlive the call: one in the worker's process group,
    one that leaves it (setsid) through a parent that exits, as a daemon's double fork does."""
    subprocess.Popen(["sleep", "300"])
    subprocess.Popen([sys.executable, "-c", "import subprocess; subprocess.Popen(['sleep', '300'], "
                      "start_new_session=True)"]).wait()
    return _sdpa(q, k, v, causal, scale)
