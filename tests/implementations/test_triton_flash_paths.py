"""Which forward triton_flash runs: the Gluon kernel on Hopper, the Triton kernels elsewhere.

The Gluon path itself runs only on an sm_90 GPU (results/2026-11-25-h100-session3: 168 of 168
cases of tools/flash_bench/gluon_check.py and the whole default set through the harness on an
H100). Here, on the CPU: every call falls back, says why, and the switch turns it off."""

from __future__ import annotations

import os

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


def test_packed_layouts_are_not_the_gluon_kernel_s_and_windows_softcap_and_sinks_are(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The Gluon forward takes sliding windows (implementations/triton_flash/NOTES.md v22),
    softcap and sinks (v23), causal or not, with ALiBi too, alone or together; not packed layouts.
    The Gluon backward takes windows and ALiBi (v34), not softcap or sinks. On a Hopper (its
    device check stubbed) such a call's forward reason is None; on the CPU it is the device's."""
    from pytest_attnkit.implementations.triton_flash import gluon_backward, gluon_common, gluon_forward

    q = _dense()
    windowed = launch.Variants(causal=True, window=(32, 0))
    reason = gluon_forward.unsupported_reason(q, q, q, True, 0.125, variants=windowed)
    assert reason is not None and "variants" not in reason and "CUDA device" in reason
    assert "packed" in gluon_forward.unsupported_reason(q, q, q, False, 0.125, layout=object())
    monkeypatch.setattr(gluon_common, "device_reason", lambda device: None)
    every = (windowed, launch.Variants(window=(16, 4)), launch.Variants(window=(-1, 8)),
             launch.Variants(causal=True, window=(8, 0), alibi_slopes=torch.ones(2)), launch.Variants(softcap=30.0),
             launch.Variants(causal=True, sinks=torch.ones(2)),
             launch.Variants(causal=True, window=(64, 0), softcap=30.0, alibi_slopes=torch.ones(2), sinks=torch.ones(2)))
    for variants in every:
        assert gluon_forward.unsupported_reason(q, q, q, variants.causal, 0.125, variants=variants) is None
        backward = gluon_backward.unsupported_reason(q, q, q, variants.causal, 0.125, variants=variants)
        if variants.softcap or variants.sinks is not None:
            assert "variants" in backward
        else:
            assert backward is None
    assert gluon_common.plain_variants(True, windowed, window=True)
    assert not gluon_common.plain_variants(False, launch.Variants(softcap=30.0), window=True, sinks=True)
    assert not gluon_common.plain_variants(True, launch.Variants(causal=True, sinks=torch.ones(2)), softcap=True)
    assert not gluon_common.plain_variants(False, windowed, window=True)  # causal must match


def test_the_gluon_window_band_folds_causal_and_bounds_the_unbounded_side() -> None:
    """The band the kernel's WINDOW takes is the contract's (pytest_attnkit.masks): -right <=
    i + Nk - Nq - j <= left, a side of -1 unbounded (2**30, launch's own bound), causal capping
    the right side at 0."""
    from pytest_attnkit.implementations.triton_flash import gluon_forward

    assert gluon_forward.UNBOUNDED == launch._UNBOUNDED
    assert gluon_forward.band(False, (16, 4)) == (16, 4)
    assert gluon_forward.band(True, (16, 4)) == (16, 0)
    assert gluon_forward.band(True, (32, -1)) == (32, 0)
    assert gluon_forward.band(False, (-1, 8)) == (1 << 30, 8)
    assert gluon_forward.band(False, (64, -1)) == (64, 1 << 30)
    assert gluon_forward.band(False, None) == (1 << 30, 1 << 30)
    for causal in (False, True):
        for n_k in (1024, 4096, 16384):
            for head_dim in (64, 128):
                assert not gluon_forward.default_config(head_dim, causal, n_k, one_item=True).persistent


def test_the_gluon_fp8_forward_is_taken_where_it_was_faster_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """The FP8 Gluon kernel beat the Triton one on an H200 and an H100 at d128 from 4k keys
    (causal from 16k) and d64 from 16k, and lost below (implementations/triton_flash/NOTES.md,
    v20.6): the rule sends exactly those calls to it, ATTNKIT_TRITON_FLASH_GLUON_FP8=1/0 forces
    it either way, the Gluon switch turns it off, and the header (here a Hopper's, its device
    check stubbed) says which. What it refuses: the CPU, dtypes other than e4m3, variants."""
    from pytest_attnkit.implementations.triton_flash import gluon_common, gluon_forward

    monkeypatch.delenv("ATTNKIT_TRITON_FLASH_GLUON_FP8", raising=False)
    monkeypatch.delenv("ATTNKIT_TRITON_FLASH_GLUON", raising=False)
    takes = launch._gluon_fp8_takes
    assert takes(128, False, 4096) and takes(128, False, 16384) and not takes(128, False, 4095)
    assert not takes(128, False, 1024)
    assert takes(128, True, 16384) and not takes(128, True, 4096)
    assert takes(64, False, 16384) and takes(64, True, 16384)
    assert not takes(64, False, 4096) and not takes(64, True, 16383)
    assert not takes(96, False, 16384)  # a head dim no GPU timed (the kernel refuses it anyway)
    hopper = torch.device("cuda")
    monkeypatch.setattr(gluon_forward, "device_reason", lambda device: None)  # the header of a Hopper
    note = launch.path_note(hopper)
    assert note.startswith("forward: Gluon") and "FP8 at d128 from 4k keys (causal from 16k) and d64 from 16k" in note
    monkeypatch.setenv("ATTNKIT_TRITON_FLASH_GLUON_FP8", "0")
    assert not takes(128, False, 16384) and "FP8 on the Triton kernel" in launch.path_note(hopper)
    monkeypatch.setenv("ATTNKIT_TRITON_FLASH_GLUON_FP8", "1")
    assert takes(128, True, 1024) and takes(64, False, 1)
    assert "FP8 too (ATTNKIT_TRITON_FLASH_GLUON_FP8=1)" in launch.path_note(hopper)
    monkeypatch.setenv("ATTNKIT_TRITON_FLASH_GLUON", "0")  # the Gluon switch turns FP8 off too
    assert not takes(128, False, 16384) and "FP8" not in launch.path_note(hopper)
    monkeypatch.undo()
    q = _dense(dtype=torch.float8_e4m3fn)
    assert "CUDA device" in gluon_forward.fp8_unsupported_reason(q, q, q, False)
    windowed = launch.Variants(causal=True, window=(32, 0))
    assert "variants" in gluon_forward.fp8_unsupported_reason(q, q, q, True, variants=windowed)
    monkeypatch.setattr(gluon_forward, "device_reason", lambda device: None)
    monkeypatch.setattr(gluon_common, "device_reason", lambda device: None)  # dense_reason's check
    assert "float8_e4m3fn" in gluon_forward.fp8_unsupported_reason(_dense(), _dense(), _dense(), False)


def test_the_gluon_fp8_inputs_v_with_keys_last_and_the_descales_in_one_tensor() -> None:
    """V^T as the Gluon FP8 kernel takes it (the Triton FP8 kernel's copy seen keys last, whose
    values the GPU run checks; its warm-up's empty one here), rows padded to 16 keys; a V handed in
    keys-contiguous with rows 16-byte aligned is taken as it is; the descales in one tensor."""
    from pytest_attnkit.implementations.triton_flash import gluon_common, gluon_forward

    v = torch.randn(2, 3, 37, 64).to(torch.float8_e4m3fn)
    v_t = gluon_forward.keys_last_like(v)
    assert v_t.shape == (2, 3, 64, 37) and v_t.stride(-1) == 1 and v_t.stride(-2) == 48  # padded to 16 keys
    assert v_t.dtype == v.dtype
    given = torch.randn(2, 3, 64, 48).to(torch.float8_e4m3fn)[..., :37].transpose(2, 3)  # keys contiguous
    assert launch.keys_contiguous(given) is given and gluon_common.aligned(given.transpose(2, 3))
    # The same taken one key in: its base is 1 byte off, so the Gluon FP8 path must refuse it
    # (launch.flash_fwd_fp8 checks V^T with gluon_common.aligned) and the Triton kernel take it.
    shifted = torch.randn(2, 3, 64, 48).to(torch.float8_e4m3fn)[..., 1:38].transpose(2, 3)
    assert launch.keys_contiguous(shifted) is shifted and not gluon_common.aligned(shifted.transpose(2, 3))
    with pytest.raises(ValueError, match="eager only"):
        gluon_forward.launch_arguments_fp8(v, v, v_t, v, v, v, False, 0.1, gluon_forward.Config.parse("n128s3"))
    descales = gluon_forward.fp8_descales((None, torch.full((2, 3), 2.0), torch.full((2, 3), 0.5)), 2, 3,
                                          torch.device("cpu"))
    assert descales.shape == (2, 3, 3) and descales.is_contiguous() and descales[1, 2].tolist() == [1.0, 2.0, 0.5]


def test_mla_is_the_gluon_forward_s_and_other_unequal_head_dims_are_not(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a Hopper (its device check stubbed): the forward takes MLA's d192 with V's d128, says
    which pairs it takes when refusing any other (V's 192, V's 64 beside Q's 128, Q's 96); the
    Gluon backward takes the same pairs."""
    from pytest_attnkit.implementations.triton_flash import gluon_backward, gluon_common, gluon_forward

    monkeypatch.setattr(gluon_common, "device_reason", lambda device: None)

    def tensors(d: int, dv: int) -> tuple[torch.Tensor, ...]:
        q = torch.zeros(1, 2, 128, d, dtype=torch.bfloat16)
        return q, torch.zeros(1, 2, 96, d, dtype=torch.bfloat16), torch.zeros(1, 2, 96, dv, dtype=torch.bfloat16)

    assert gluon_forward.unsupported_reason(*tensors(192, 128), True, 0.07) is None
    assert gluon_forward.unsupported_reason(*tensors(128, 128), False, 0.09) is None
    for d, dv in ((192, 192), (128, 64), (96, 96), (64, 128)):
        reason = gluon_forward.unsupported_reason(*tensors(d, dv), True, 0.1)
        assert reason is not None and "192 with V's 128" in reason and f"v {dv}" in reason, (d, dv, reason)
    assert gluon_backward.unsupported_reason(*tensors(192, 128), True, 0.07) is None  # NOTES v24
    assert "192 with V's 128" in gluon_backward.unsupported_reason(*tensors(128, 64), True, 0.07)


def test_on_a_hopper_every_variant_takes_the_gluon_forward_and_the_header_says_the_backward_s_path(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """What ran right on an H200 takes the Gluon forward on a Hopper (its device checks stubbed):
    d64/d128 with windows, ALiBi, softcap, sinks, each alone and all together, and MLA plain,
    causal and with those (gluon_check's 40 MLA variant cases, NOTES v27). The header says which
    backward runs, as ATTNKIT_TRITON_FLASH_GLUON_BWD sets it."""
    from pytest_attnkit.implementations.triton_flash import gluon_backward, gluon_common, gluon_forward

    monkeypatch.delenv("ATTNKIT_TRITON_FLASH_GLUON", raising=False)
    monkeypatch.setattr(gluon_common, "device_reason", lambda device: None)
    monkeypatch.setattr(gluon_forward, "device_reason", lambda device: None)
    q = _dense()
    mla_q, mla_v = torch.zeros(1, 2, 128, 192, dtype=torch.float16), torch.zeros(1, 2, 128, 128, dtype=torch.float16)
    slopes = torch.ones(2)
    every = [launch.Variants(causal=True, window=(8, 0)), launch.Variants(alibi_slopes=slopes),
             launch.Variants(softcap=30.0), launch.Variants(causal=True, sinks=torch.ones(2)),
             launch.Variants(causal=True, window=(8, 0), alibi_slopes=slopes, softcap=15.0, sinks=torch.ones(2)),
             launch.Variants(causal=True), launch.Variants()]
    for q_in, v_in in ((q, q), (mla_q, mla_v)):
        for variants in every:
            assert launch.gluon_path(q_in, q_in, v_in, variants, None, 0.125) is None, (q_in.shape, variants)
    monkeypatch.delenv("ATTNKIT_TRITON_FLASH_GLUON_BWD", raising=False)
    note = launch.path_note(torch.device("cuda"))
    assert "softcap, sinks" in note and "d192/dv128 (MLA)" in note, note
    assert "Backward: Gluon on every dense plain, causal, ALiBi or windowed call it covers" in note, note
    monkeypatch.setattr(gluon_backward, "TAKES_WINDOW", False)  # the header follows the switches
    assert "Backward: Gluon on every dense plain, causal or ALiBi call it covers" in launch.path_note(
        torch.device("cuda"))
    monkeypatch.setattr(gluon_backward, "TAKES_WINDOW", True)
    monkeypatch.setenv("ATTNKIT_TRITON_FLASH_GLUON_BWD", "1")
    assert launch.path_note(torch.device("cuda")) == note
    monkeypatch.setenv("ATTNKIT_TRITON_FLASH_GLUON_BWD", "0")
    assert launch.path_note(torch.device("cuda")).endswith(
        "Triton kernels for the rest and the backward (ATTNKIT_TRITON_FLASH_GLUON_BWD=0)")


def test_the_launch_hands_the_gluon_forward_every_variant(monkeypatch: pytest.MonkeyPatch) -> None:
    """launch._launch_gluon passes the window, softcap, sinks and ALiBi on: one dropped would run
    attention without it, right-shaped and wrong, on every Hopper."""
    from pytest_attnkit.implementations.triton_flash import gluon_forward

    seen = {}
    monkeypatch.setattr(gluon_forward, "flash_fwd", lambda *args, **kwargs: seen.update(kwargs))
    q = _dense()
    slopes, sinks = torch.ones(2), torch.ones(2)
    variants = launch.Variants(causal=True, window=(16, 0), softcap=20.0, alibi_slopes=slopes, sinks=sinks)
    problem = launch._Problem(q, q, q, 0.125, variants, None)
    launch._launch_gluon(problem, *problem.outputs(), None)
    assert seen["window"] == (16, 0) and seen["softcap"] == 20.0
    assert seen["alibi_slopes"] is slopes and seen["sinks"] is sinks


def test_a_window_side_past_any_length_is_unbounded_not_wrapped() -> None:
    """A side of 2**31 - 1 (as int32 the kernels' row + Nk - Nq + side wraps) is the unbounded
    2**30, in the Gluon forward's band and the Triton kernels' alike."""
    from pytest_attnkit.implementations.triton_flash import gluon_forward

    assert gluon_forward.band(False, (2**31 - 1, 2**31 - 1)) == (1 << 30, 1 << 30)
    assert launch.Variants(window=(2**31 - 1, 5)).band() == (1 << 30, 5)


def test_a_gluon_switch_set_between_calls_is_planned_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The forward caches each shape's plan (which kernel, which tiles); the Gluon switch decides
    the kernel, so a process that sets it between two calls of a shape must plan it again, not
    keep the kernel the old setting chose (it did, noticed in session 18)."""
    planned = []

    def plan(problem, o, lse):
        planned.append(os.environ.get("ATTNKIT_TRITON_FLASH_GLUON"))
        return (lambda *args: None), None

    monkeypatch.setattr(launch, "_plan_fwd", plan)
    monkeypatch.delenv("ATTNKIT_TRITON_FLASH_GLUON", raising=False)
    launch._PLANS.clear()
    q = torch.zeros(1, 2, 8, 64, dtype=torch.float16)
    for _ in range(2):
        launch.flash_fwd(q, q, q, False, 0.125)
    assert len(planned) == 1
    monkeypatch.setenv("ATTNKIT_TRITON_FLASH_GLUON", "0")
    launch.flash_fwd(q, q, q, False, 0.125)
    monkeypatch.setenv("ATTNKIT_TRITON_FLASH_GLUON", "1")  # under an unverified triton, not as unset
    launch.flash_fwd(q, q, q, False, 0.125)
    assert planned == [None, "0", "1"]
    launch._PLANS.clear()


def test_under_a_triton_they_have_not_run_on_a_gpu_under_the_gluon_kernels_take_no_call(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The Gluon kernels ran right on GPUs only under triton 3.6 (VERIFIED_TRITON). Under another
    (3.9 renamed three of their calls; a new compiler can turn right source into a kernel that
    hangs, NOTES v26-v28) a CUDA device's calls take the Triton kernels, the header says why and
    how to take them anyway, and the backward stays deterministic; ATTNKIT_TRITON_FLASH_GLUON=1
    takes them."""
    from pytest_attnkit.implementations.triton_flash import gluon_backward, gluon_common
    from pytest_attnkit.implementations.triton_flash.adapter import TritonFlash

    if gluon_common.GLUON_IMPORT_ERROR is not None:
        pytest.skip(f"this triton has no Gluon: {gluon_common.GLUON_IMPORT_ERROR}")
    for name in ("ATTNKIT_TRITON_FLASH_GLUON", "ATTNKIT_TRITON_FLASH_GLUON_BWD", "TRITON_INTERPRET"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(gluon_common.triton, "__version__", "3.9.0")
    reason = gluon_common.device_reason(torch.device("cuda"))
    assert reason == ("triton 3.6, the version its kernels ran right on a GPU under (this is triton 3.9.0; "
                      "ATTNKIT_TRITON_FLASH_GLUON=1 takes them anyway)")
    assert launch.path_note(torch.device("cuda")) == f"forward: Triton kernels (the Gluon forward needs {reason})"
    assert not gluon_backward.may_run(torch.device("cuda"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert TritonFlash().deterministic_directions() == ("forward", "backward")
    assert gluon_common.version_reason("3.6.0") is None and gluon_common.version_reason("3.6.2") is None
    assert gluon_common.version_reason("3.7.0") is not None
    monkeypatch.setenv("ATTNKIT_TRITON_FLASH_GLUON", "1")
    assert gluon_common.version_reason() is None
