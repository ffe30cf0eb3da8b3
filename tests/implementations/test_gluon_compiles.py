"""The Gluon kernels compile for sm_90a under the installed triton, without a GPU.

Triton 3.9 renamed four of the calls the kernels made, and every Gluon kernel then failed to
compile (implementations/triton_flash/NOTES.md v28). No GPU machine here runs triton 3.9, so
only a compile check could see it. This test runs the two compile tools
(``tools/flash_bench/gluon_compile.py`` and ``gluon_bwd_compile.py``, ``--quick``: each default,
causal and not, d64, d128 and MLA, bf16) in a subprocess through their stand-in sm_90a driver.
It holds each kernel to this: it compiles, no mbarrier word is also used as data (the v26
hang), and ptxas did not serialize its wgmma products for want of registers (its info C7512, not a
warning: the MLA backward was compiled so, at 0.61x cuDNN, until v29). Spills are the tools'
report, not this test's rule: triton 3.9's backward spills more than 3.6's.

It runs under the triton versions the kernels were compile-checked under (:data:`CHECKED`). Under
another version the names may have moved again: the test skips and says so, and the Gluon
kernels take no call there anyway unless asked (gluon_common.VERIFIED_TRITON)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
#: The triton versions (major.minor) the compile tools ran clean under (NOTES v28).
CHECKED = ("3.6", "3.9")


def _triton_version() -> str:
    triton = pytest.importorskip("triton")
    from pytest_attnkit.implementations.triton_flash import gluon_common

    if gluon_common.GLUON_IMPORT_ERROR is not None:
        pytest.skip(f"this triton has no Gluon: {gluon_common.GLUON_IMPORT_ERROR}")
    version = ".".join(triton.__version__.split(".")[:2])
    if version not in CHECKED:
        pytest.skip(f"triton {triton.__version__}: the Gluon kernels were compile-checked under triton "
                    f"{', '.join(CHECKED)} only; run tools/flash_bench/gluon_compile.py under this one")
    return triton.__version__


@pytest.mark.parametrize("tool, kernels", [("gluon_compile.py", 6), ("gluon_bwd_compile.py", 6)])
def test_every_default_gluon_kernel_compiles_for_sm90a_under_this_triton(tool: str, kernels: int,
                                                                          tmp_path: Path) -> None:
    version = _triton_version()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
           # An empty cache: Triton's key does not hold the builtins a kernel calls through a module
           # global, so a kernel cached before a rename would hide it.
           "TRITON_CACHE_DIR": str(tmp_path / "triton-cache")}
    env.pop("TRITON_INTERPRET", None)
    run = subprocess.run([sys.executable, str(REPO / "tools" / "flash_bench" / tool), "--quick"], cwd=REPO,
                         env=env, capture_output=True, text=True, timeout=900)
    lines = [line for line in run.stdout.splitlines() if re.match(r"(bwd )?d\d+", line)]
    assert f"triton {version}" in run.stdout, run.stdout + run.stderr[-3000:]
    failed = [line[:300] for line in lines if "FAILED to compile" in line]
    assert not failed, "\n".join(failed)
    assert len(lines) == kernels, run.stdout
    aliased = [line[:120] for line in lines if "; 0 mbarrier words also read or written as data" not in line]
    assert not aliased, "\n".join(aliased)
    serial = [line.split(" (")[0] + ": ptxas serialized its products (C7512)" for line in lines
              if "WGMMA SERIALIZED" in line]
    assert not serial, "\n".join(serial)


def test_the_compile_tools_name_serialized_products() -> None:
    """ptxas says it serialized a kernel's products only in an info line (C7512), beside its -v
    report; the tools read it there (the line v29's backward compile printed before the change), and
    a spill warning alone is not it."""
    sys.path.insert(0, str(REPO / "tools" / "flash_bench"))
    try:
        import gluon_compile
    finally:
        sys.path.pop(0)
    info = ("ptxas info    : (C7512) Potential Performance Loss: wgmma.mma_async instructions are serialized "
            "due to insufficient register resources for the function '_attn_bwd_sm90'")
    spill = ("ptxas warning : Registers are spilled to local memory in function '_attn_bwd_sm90', 1452 bytes "
             "spill stores, 1328 bytes spill loads")
    assert "WGMMA SERIALIZED" in gluon_compile.serialized([spill, info])
    assert gluon_compile.serialized([spill]) == ""
    assert gluon_compile.serialized([]) == ""
