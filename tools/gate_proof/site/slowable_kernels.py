"""A test implementation for the gate's proof: triton_flash plus real extra work.

With ``ATTNKIT_EXTRA_WORK=0.10`` it runs the same kernel a second time on the first 10% of the
query rows (non-causal, so that is 10% more attention FLOPs), and throws that result away. The
output stays correct; only the time grows. With the variable unset or 0 it is triton_flash.
"""

import os

from pytest_attnkit.implementations.triton_flash import flash_attention


def slowable_flash(q, k, v, *, causal=False, scale=None):
    out = flash_attention(q, k, v, causal=causal, scale=scale)
    extra = float(os.environ.get("ATTNKIT_EXTRA_WORK", "0"))
    if extra > 0:
        rows = max(1, round(extra * q.shape[-2]))
        flash_attention(q[..., :rows, :], k, v, causal=False, scale=scale)
    return out
