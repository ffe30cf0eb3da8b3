"""Which forward triton_flash runs: the Gluon kernel on Hopper, the Triton kernels elsewhere.

The Gluon path itself runs only on an sm_90 GPU (results/2026-11-25-h100-session3: 168 of 168
cases of tools/flash_bench/gluon_check.py and the whole default set through the harness on an
H100). Here, on the CPU: every call falls back, says why, and the switch turns it off."""

from __future__ import annotations

import pytest
import torch

from pytest_attnkit.implementations.triton_flash import launch


def _dense(device: str = "cpu", dtype: torch.dtype = torch.float16) -> torch.Tensor:
    return torch.zeros(1, 2, 128, 64, dtype=dtype, device=device)


def test_off_hopper_every_call_takes_the_triton_kernels_and_says_why() -> None:
    q = _dense()
    reason = launch.gluon_path(q, q, q, launch.Variants(causal=True), None, 0.125)
    assert reason is not None and "CUDA device" in reason
    note = launch.path_note(torch.device("cpu"))
    assert note.startswith("forward: Triton kernels (the Gluon forward needs") and "CUDA device" in note


def test_the_switch_turns_the_gluon_forward_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATTNKIT_TRITON_FLASH_GLUON", "0")
    q = _dense()
    assert launch.gluon_path(q, q, q, launch.Variants(), None, 0.125) == "turned off by ATTNKIT_TRITON_FLASH_GLUON=0"
    assert "turned off" in launch.path_note(torch.device("cpu"))


def test_variants_and_packed_layouts_are_not_the_gluon_kernel_s() -> None:
    from pytest_attnkit.implementations.triton_flash import gluon_forward

    q = _dense()
    windowed = launch.Variants(causal=True, window=(32, 0))
    assert "variants" in gluon_forward.unsupported_reason(q, q, q, True, 0.125, variants=windowed)
    assert "packed" in gluon_forward.unsupported_reason(q, q, q, False, 0.125, layout=object())


def test_alibi_is_the_gluon_forward_s_and_not_the_gluon_backward_s() -> None:
    # The forward takes ALiBi (implementations/triton_flash/NOTES.md v19): its refusal on the
    # CPU is the device's, not the variant's; softcap and sinks stay with the Triton kernels,
    # and so does every variant of the (switched-off) Gluon backward.
    from pytest_attnkit.implementations.triton_flash import gluon_backward, gluon_forward

    q = _dense()
    alibi = launch.Variants(causal=True, alibi_slopes=torch.ones(2))
    reason = gluon_forward.unsupported_reason(q, q, q, True, 0.125, variants=alibi)
    assert reason is not None and "variants" not in reason
    for other in (launch.Variants(softcap=30.0), launch.Variants(alibi_slopes=torch.ones(2), sinks=torch.ones(2))):
        assert "variants" in gluon_forward.unsupported_reason(q, q, q, False, 0.125, variants=other)
    assert "variants" in gluon_backward.unsupported_reason(q, q, q, True, 0.125, variants=alibi)
