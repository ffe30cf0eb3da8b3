"""torch_flex's availability on CUDA, read without importing Triton (its worker's start waits on it)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from pytest_attnkit.implementations.torch_flex import TorchFlex  # noqa: E402


@pytest.fixture
def cuda(monkeypatch: pytest.MonkeyPatch):
    """A CUDA device as torch reports it, with this compute capability."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)

    def capability(major: int, minor: int) -> None:
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (major, minor))

    capability(9, 0)
    return capability


def test_without_triton_torch_flex_is_unavailable_on_cuda_and_says_why(cuda, monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "triton" else real(name, *a))
    assert TorchFlex().unavailable_reason("cuda") == (
        "torch.compile needs triton to build FlexAttention's CUDA kernels, and it is not installed")


def test_a_gpu_older_than_volta_is_unavailable(cuda) -> None:
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed here")
    cuda(6, 1)
    assert "compute capability 7.0 or more" in TorchFlex().unavailable_reason("cuda")
    cuda(9, 0)
    assert TorchFlex().unavailable_reason("cuda") is None


def test_the_check_does_not_import_triton() -> None:
    """In a fresh process, so that no earlier test's import of Triton hides it."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed here")
    code = ("import sys, torch\n"
            "torch.cuda.is_available = lambda: True\n"
            "torch.cuda.get_device_capability = lambda device=None: (9, 0)\n"
            "from pytest_attnkit.implementations.torch_flex import TorchFlex\n"
            "assert TorchFlex().unavailable_reason('cuda') is None\n"
            "print('triton' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
