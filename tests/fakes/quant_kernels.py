"""Quantized attention kernels for tests/suites/test_accuracy.py: an honest one and broken ones.

``int8_attention`` quantizes as SageAttention does: K smoothed (its mean over tokens removed,
which leaves the softmax unchanged), Q and K in int8 with a scale per block of 64 tokens per
head, P and V in fp16. Each broken kernel adds one fault to it. ``Fp8Plain`` takes FP8 inputs
and their descales (FA3's names) and computes in float32; ``Fp8IgnoresVDescale`` forgets v's
descale.
"""
import math
import torch
from pytest_attnkit import AttentionImpl

BLOCK = 64

def _int8_per_block(x):
    # x [B, H, N, D]: one scale per block of 64 tokens per head, symmetric int8.
    b, h, n, d = x.shape
    pad = (-n) % BLOCK
    xf = torch.nn.functional.pad(x.float(), (0, 0, 0, pad)).view(b, h, -1, BLOCK, d)
    scale = xf.abs().amax(dim=(-1, -2), keepdim=True).clamp_min(1e-8) / 127.0
    quant = torch.round(xf / scale).clamp(-127, 127).to(torch.int8)
    return (quant.float() * scale).view(b, h, -1, d)[:, :, :n]

def int8_attention(q, k, v, *, causal, scale, scale_error=1.0, causal_shift=0, drop_last=False, gqa_modulo=False,
                   nan=False):
    hq, hkv = q.shape[1], k.shape[1]
    nq, nk = q.shape[-2], k.shape[-2]
    scale = (1.0 / math.sqrt(q.shape[-1]) if scale is None else scale) * scale_error
    # SageAttention smooths K (subtracts its mean over tokens) before quantizing: softmax is unchanged.
    kf = k.float()
    kf = kf - kf.mean(dim=-2, keepdim=True)
    qd, kd = _int8_per_block(q), _int8_per_block(kf)
    if hq != hkv:
        if gqa_modulo:
            index = torch.arange(hq, device=q.device) % hkv
        else:
            index = torch.arange(hq, device=q.device) // (hq // hkv)
        kd, vv = kd[:, index], v[:, index]
    else:
        vv = v
    scores = torch.matmul(qd, kd.transpose(-2, -1)) * scale
    rows = torch.arange(nq, device=q.device)[:, None]
    cols = torch.arange(nk, device=q.device)[None, :]
    visible = torch.ones(nq, nk, dtype=torch.bool, device=q.device)
    if causal:
        visible = cols <= rows + nk - nq + causal_shift
    if drop_last:
        visible = visible & (cols < nk - 1)
    scores = scores.masked_fill(~visible, float("-inf"))
    seen = visible.any(dim=-1, keepdim=True)
    scores = scores.masked_fill(~seen, 0.0)
    probs = torch.softmax(scores, dim=-1) * seen
    out = torch.matmul(probs.to(torch.float16), vv.to(torch.float16)).float()
    if nan:
        out[0, 0, -1, 0] = float("nan")
    return out.to(q.dtype)

class _Int8(AttentionImpl):
    dtypes = ("float16", "bfloat16")
    supports_backward = False
    accuracy = "quantized"
    faults = {}

    def forward(self, q, k, v, *, causal=False, scale=None):
        return int8_attention(q, k, v, causal=causal, scale=scale, **self.faults)

class Int8Honest(_Int8):
    pass

class Int8HonestExact(_Int8):
    accuracy = "exact"

class Int8WrongScale(_Int8):
    faults = {"scale_error": 1.05}

class Int8CausalOffByOne(_Int8):
    faults = {"causal_shift": 1}

class Int8DropsLastKey(_Int8):
    faults = {"drop_last": True}

class Int8GqaModulo(_Int8):
    faults = {"gqa_modulo": True}

class Int8Nan(_Int8):
    faults = {"nan": True}


class Fp8Plain(AttentionImpl):
    dtypes = ("float8_e4m3fn", "float8_e5m2", "bfloat16")
    supports_backward = False

    def forward(self, q, k, v, *, causal=False, scale=None, q_descale=None, k_descale=None, v_descale=None):
        group = q.shape[1] // k.shape[1]
        if q_descale is not None:
            q = q.float() * q_descale.repeat_interleave(group, dim=1)[:, :, None, None]
            k = k.float() * k_descale[:, :, None, None]
            v = v.float() * self.v_factor(v_descale)[:, :, None, None]
        k, v = k.float().repeat_interleave(group, dim=1), v.float().repeat_interleave(group, dim=1)
        out = torch.nn.functional.scaled_dot_product_attention(q.float(), k, v, is_causal=causal, scale=scale)
        return out.to(torch.bfloat16)

    def v_factor(self, v_descale):
        return v_descale


class Fp8IgnoresVDescale(Fp8Plain):
    def v_factor(self, v_descale):
        return torch.ones_like(v_descale)
