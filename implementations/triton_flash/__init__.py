"""FlashAttention in Triton, forward and backward, for pytest-attnkit.

``kernels`` holds the Triton kernels (and the math), ``launch`` the tiles, the decode split and
the launchers, ``autograd`` the differentiable entry points (``flash_attention``,
``flash_attention_varlen``, ``flash_attention_with_kvcache``), and ``adapter`` the
pytest-attnkit implementation ``TritonFlash``, the only module that imports the harness.
Versions, numbers and limits: ``NOTES.md`` beside this file.
"""

from .adapter import TritonFlash
from .autograd import flash_attention, flash_attention_varlen, flash_attention_with_kvcache

__all__ = ["TritonFlash", "flash_attention", "flash_attention_varlen", "flash_attention_with_kvcache"]
