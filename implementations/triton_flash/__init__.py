"""FlashAttention in Triton, forward and backward, for pytest-attnkit.

``kernels`` holds the Triton kernels (and the math), ``launch`` the tiles, the decode split and
the launchers, ``autograd`` the differentiable ``flash_attention``, and ``adapter`` the
pytest-attnkit implementation ``TritonFlash``, the only module that imports the harness.
Versions, numbers and limits: ``NOTES.md`` beside this file.
"""

from .adapter import TritonFlash
from .autograd import flash_attention

__all__ = ["TritonFlash", "flash_attention"]
