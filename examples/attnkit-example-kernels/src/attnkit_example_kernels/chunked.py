"""Form (a): a plain function. Attention computed a block of query rows at a time.

Each block materialises only its own ``chunk x N`` scores, so the forward's extra memory grows
linearly with N; autograd keeps every block's probabilities for the backward, which therefore
grows quadratically. As a plain function it declares nothing, and pytest-attnkit reports what it
measures.
"""

from __future__ import annotations

import torch


def chunked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                      scale: float | None = None, chunk: int = 128) -> torch.Tensor:
    """softmax(scale * q k^T) v on [batch, heads, seqlen, head_dim] tensors; GQA, bottom-right causal."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    group = q.shape[1] // k.shape[1]
    if group > 1:  # query head h reads kv head h // group
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    seqlen_q, seqlen_k = q.shape[-2], k.shape[-2]
    keys, values = k.float(), v.float()
    blocks = []
    for start in range(0, seqlen_q, chunk):
        scores = (q[..., start:start + chunk, :].float() @ keys.transpose(-1, -2)) * scale
        if causal:
            rows = torch.arange(start, start + scores.shape[-2], device=q.device)[:, None]
            visible = torch.arange(seqlen_k, device=q.device)[None, :] <= rows + (seqlen_k - seqlen_q)
            sees_a_key = visible.any(dim=-1, keepdim=True)  # rows that see no key output zeros
            scores = scores.masked_fill(~visible, float("-inf")).masked_fill(~sees_a_key, 0.0)
            probs = torch.softmax(scores, dim=-1) * sees_a_key
        else:
            probs = torch.softmax(scores, dim=-1)
        blocks.append((probs @ values).to(q.dtype))
    return torch.cat(blocks, dim=-2)
