"""Compile caches that outlive the run: Triton's, TorchInductor's, CuPy's and the CUDA driver's, in one user folder.

A cold run spends most of its time compiling: Triton specializes a kernel per combination of its
constexprs, torch.compile builds a graph per shape and score function, CuPy compiles its CUDA C.
Each keeps a disk cache, but in places a CI job loses or that differ by tool (TorchInductor's is
under /tmp). So every worker gets one folder for all of them, which a CI job can keep between
runs (the README's recipes cache it), and a second run on the same machine finds its kernels
compiled:

- ``TRITON_CACHE_DIR`` = ``<folder>/triton``
- ``TORCHINDUCTOR_CACHE_DIR`` = ``<folder>/inductor`` (its FX graph and autotuning caches, and the
  Triton kernels it builds)
- ``CUPY_CACHE_DIR`` = ``<folder>/cupy``
- ``CUDA_CACHE_PATH`` = ``<folder>/cuda`` (the CUDA driver's cache of the PTX it compiled for
  this GPU, whose default place, ``~/.nv/ComputeCache``, is lost with the machine: kernels
  shipped or built as PTX are translated once per machine. Whether cuDNN's run-time compiled
  attention goes through it is not documented: NVRTC may give it SASS directly. On a fresh H200
  torch_sdpa's first calls with the GPU alone took 11.1 s, 6.0 s run again on the same machine,
  one paged case 3276 ms against 5 ms (results/2026-11-27-session11); this cache, the OS's page
  cache of cuDNN's libraries, or both may account for it: not yet measured.)

``<folder>`` is ``--attnkit-cache-dir``, else ``$XDG_CACHE_HOME/pytest-attnkit``, else
``~/.cache/pytest-attnkit``; ``none`` leaves every compiler its own default. A variable the user
set in the environment always wins. The header names the folder. The caches are keyed by the
compilers on their versions, the device and the kernel's source, so one folder serves every
version and GPU: a stale entry is never used, only kept.
"""

from __future__ import annotations

import os
from pathlib import Path

#: Each compiler's variable, and its subfolder.
VARIABLES = {"TRITON_CACHE_DIR": "triton", "TORCHINDUCTOR_CACHE_DIR": "inductor", "CUPY_CACHE_DIR": "cupy",
             "CUDA_CACHE_PATH": "cuda"}


def cache_root(setting: str, anchor: Path) -> Path | None:
    """The folder for ``--attnkit-cache-dir`` (relative to ``anchor``), the default, or None for ``none``."""
    if setting.strip().lower() == "none":
        return None
    if setting:
        return (anchor / os.path.expanduser(setting)).resolve()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base, "pytest-attnkit").resolve()


def cache_environment(root: Path | None) -> dict[str, str]:
    """The variables every worker gets: each compiler's folder under ``root``, unless set already."""
    if root is None:
        return {}
    return {name: str(root / sub) for name, sub in VARIABLES.items() if not os.environ.get(name)}


def describe(root: Path | None, environment: dict[str, str]) -> str:
    """The header's words for where compiled kernels are kept."""
    if root is None:
        return "compile caches: each compiler's default (--attnkit-cache-dir=none)"
    kept = [name for name in VARIABLES if name not in environment]
    text = f"compile caches: {root}"
    if kept:
        text += f" (but {', '.join(kept)} as set in the environment)"
    return text
