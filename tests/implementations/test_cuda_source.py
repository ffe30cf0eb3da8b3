"""The CUDA C source of cupy_naive compiles with nvcc, so a syntax error cannot land unnoticed
on a machine without a GPU. Skipped, with the reason, where nvcc is not installed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

import pytest_attnkit.implementations as implementations

SOURCE = Path(implementations.__file__).with_name("cupy_naive.cu")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_cupy_naive_kernel_compiles_without_warnings(tmp_path: Path, arch: str) -> None:
    result = subprocess.run(
        ["nvcc", "--ptx", f"-arch={arch}", "-Werror", "all-warnings", "-o", str(tmp_path / "naive.ptx"), str(SOURCE)],
        capture_output=True, text=True,
    )
    assert result.returncode == 0, result.stderr
    ptx = (tmp_path / "naive.ptx").read_text()
    for kernel in ("naive_attention_f16", "naive_attention_bf16", "naive_attention_f32"):
        assert f".entry {kernel}" in ptx
