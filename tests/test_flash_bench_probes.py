"""The warp-specialized probes in ``tools/flash_bench`` (``ws_kernel.py``, ``ws_bwd_kernel.py``)
compute attention and its dK/dV: ``ws_probe.py --check`` runs them in Triton's interpreter, in a
child process (the interpreter must be on before Triton defines a kernel, and this pytest process
stays free of Triton), against float64 attention, and exits 1 past its bound. The interpreter
ignores warp specialization and its FP8 casts are not exact, so the GPU run (``ws_probe.py``)
also flags a probe output that differs from the shipped kernel's."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

if importlib.util.find_spec("triton") is None or importlib.util.find_spec("torch") is None:
    pytest.skip("triton and torch are needed", allow_module_level=True)

PROBE = Path(__file__).resolve().parents[1] / "tools" / "flash_bench" / "ws_probe.py"


def test_the_probes_match_float64_attention_in_the_interpreter() -> None:
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, str(PROBE), "--check"], capture_output=True, text=True, env=env,
                          timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    # five forward cases (GQA, causal also with Nq < Nk, ragged last blocks) and four dK/dV cases
    # (causal, ALiBi)
    assert sum(line.startswith("forward ") for line in lines) == 5, done.stdout
    assert sum(line.startswith("dK/dV ") for line in lines) == 4, done.stdout
    assert lines[-1].endswith(": ok"), done.stdout
