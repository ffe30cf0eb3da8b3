"""The Gluon backward's host side on the CPU (the kernel itself runs only on an sm_90 GPU:
tools/flash_bench/gluon_bwd_check.py is its GPU check, implementations/triton_flash/NOTES.md v15.1
its first run)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pytest_attnkit.implementations.triton_flash import gluon_backward


def test_off_hopper_it_says_why() -> None:
    q = torch.zeros(1, 2, 128, 64, dtype=torch.float16)
    reason = gluon_backward.unsupported_reason(q, q, q, True, 0.125)
    assert reason is not None


def test_configs_round_trip() -> None:
    for text in ("m64s2", "m64s3", "m128s2", "m64s2-split", "m64s2-q128", "m64s2-krows", "m64s2-noadds", "m64s2-rot",
                 "m64s2-sum", "m64s3-rot-sum", "m64s2-tmar", "m64s3-tmar-sw", "m64s3-tmar-sw-dsr", "m64s2-tmar-sw-pair",
                 "m64s2-tmar-sw-pair-ld", "m64s2-tmar-sw-ld-lt-rl", "m64s3-tmar-sw-pair-ld-lt", "m64s2-tmar-sw-ld-dqp",
                 "m64s2-tmar-sw-ld-lt-rl-dqp", "m64s2-tmar-sw-ld-lt-rl-dqp-dqs"):
        config = gluon_backward.Config.parse(text)
        assert gluon_backward.Config.parse(str(config)) == config
    assert gluon_backward.Config.parse("m64s3-tmar-sw-dsr").ds_regs
    assert gluon_backward.Config.parse("m64s2-tmar-pair").pair_dq
    assert gluon_backward.Config.parse("m64s2-tmar-sw-ld").loop_descriptors
    assert gluon_backward.Config.parse("m64s2-tmar-sw-ld-dqp").dq_pipe
    # NOTES v30: every d64 and d128 default makes its descriptors in the loop; d128 one way causal or
    # not. NOTES v34: d128 takes -lt, -rl and -dqp (timed faster on an H200 on every case). NOTES v37:
    # d64 causal lays dQ out in blocks (-dqb), faster there on every case timed; d64 without causal not.
    assert [str(gluon_backward.default_config(d, c)) for d in (64, 128) for c in (False, True)] == [
        "m64s3-tmar-sw-pair-ld-r240", "m64s3-tmar-dqb-ld-r240"] + ["m64s2-tmar-sw-ld-lt-rl-dqp-r240"] * 2
    q = torch.empty(1, 2, 256, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="-dsr"):  # a Config made directly, not parsed
        gluon_backward.launch_arguments(q, q, q, q, torch.empty(1, 2, 256), torch.empty(1, 2, 256), q.float(), q, q,
                                        False, 0.125, gluon_backward.Config(qrows=False, ds_regs=True))
    assert not any(gluon_backward.default_config(d, c).ds_regs for d in gluon_backward.HEAD_DIMS for c in (0, 1))
    # The TMA reduce replaces the adds: not beside -sum or -noadds; the swizzle is its buffers';
    # dS from registers is the queries-as-rows layout's (-krows keeps dS^T); -pair sums before the reduce;
    # L, delta (-lt) and the mask's row limit (-rl) are a row's each, which -krows makes columns.
    # -dqp (NOTES v33) is written for two reduces a tile from shared-memory dS, beside dV's and dK's products.
    for text in ("m64s2-sum-tmar", "m64s2-noadds-tmar", "m64s2-sw", "m64s2-krows-dsr", "m64s2-pair", "m64s2-sum-pair",
                 "m64s2-krows-lt", "m64s2-krows-rl", "m64s2-dqp", "m64s2-tmar-sw-pair-dqp", "m64s2-tmar-sw-dsr-dqp",
                 "m64s2-split-tmar-dqp", "m64s2-krows-tmar-dqp"):
        with pytest.raises(ValueError):
            gluon_backward.Config.parse(text)
    # Refused as made too: -pair and -sum would both arrive on barriers that count one consumer.
    for fields in (dict(tma_dq=True, sum_dq=True, pair_dq=True), dict(tma_dq=True, dq_adds=False),
                   dict(dq_swizzle=True), dict(pair_dq=True)):
        with pytest.raises(ValueError):
            gluon_backward.Config(**fields)
    for head_dim in gluon_backward.HEAD_DIMS:
        for causal in (False, True):
            config = gluon_backward.default_config(head_dim, causal)
            assert gluon_backward.shared_bytes(config, head_dim) <= gluon_backward.SHARED_LIMIT


def test_query_tiles_and_walk_order() -> None:
    # Non-causal, whole key block: nothing masked; the last, ragged block: everything masked.
    assert gluon_backward.query_tiles(0, 1000, 1000, 64, False) == (0, 0, 16)
    assert gluon_backward.query_tiles(896, 1000, 1000, 64, False) == (0, 16, 16)
    # Causal, Nq == Nk: key block 128..255 is seen from query 128 on, whole from query 255 on.
    assert gluon_backward.query_tiles(128, 1024, 1024, 64, True) == (2, 4, 16)
    order = gluon_backward.walk_order(2, 4, 16, 5, True)
    assert order[:2] == [2, 3] and sorted(order) == list(range(2, 16)) and order[2] == 4 + 5 % 12


def test_the_gluon_backward_takes_every_call_it_covers_unless_the_switch_says_0(monkeypatch: pytest.MonkeyPatch) -> None:
    """NOTES v30: unset or "1", every call it covers (d128 causal below 8k keys too, which took the
    Triton backward until -ld made this kernel as fast there); "0", or the Gluon switch off, none."""
    monkeypatch.delenv(gluon_backward.ENV_SWITCH, raising=False)
    monkeypatch.delenv("ATTNKIT_TRITON_FLASH_GLUON", raising=False)
    assert gluon_backward.setting() is None and gluon_backward.takes()
    monkeypatch.setenv(gluon_backward.ENV_SWITCH, "yes")  # not a setting: the default decides
    assert gluon_backward.setting() is None and gluon_backward.takes()
    monkeypatch.setenv(gluon_backward.ENV_SWITCH, "1")
    assert gluon_backward.takes()
    monkeypatch.setenv(gluon_backward.ENV_SWITCH, "0")
    assert not gluon_backward.takes()
    monkeypatch.setenv(gluon_backward.ENV_SWITCH, "1")
    monkeypatch.setenv("ATTNKIT_TRITON_FLASH_GLUON", "0")
    assert gluon_backward.setting() == "0" and not gluon_backward.takes()


def test_the_launch_sends_the_backward_where_takes_says_and_gluon_false_keeps_the_triton_kernels(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """On a Hopper (its device check stubbed) launch.flash_bwd hands d128 16k and 1k causal calls
    to the Gluon backward; gluon=False (the benchmarks' Triton column) and the switch at 0 keep
    them on the Triton kernels; a softcapped call, which the Gluon backward does not cover, too."""
    from pytest_attnkit.implementations.triton_flash import gluon_common, launch

    monkeypatch.delenv(gluon_backward.ENV_SWITCH, raising=False)
    monkeypatch.delenv("ATTNKIT_TRITON_FLASH_GLUON", raising=False)
    monkeypatch.setattr(gluon_common, "device_reason", lambda device: None)
    taken = []

    def gluon_bwd(do, q, k, v, o, lse, causal, scale, dlse=None, alibi_slopes=None, window=None):
        taken.append(k.shape[2])
        return q, k, v

    monkeypatch.setattr(gluon_backward, "flash_bwd", gluon_bwd)

    class Triton(Exception):
        pass

    def problem(*args, **kwargs):
        raise Triton()  # the Triton kernels' path starts here

    monkeypatch.setattr(launch, "_Problem", problem)

    def call(n: int, **options) -> str:
        q = torch.zeros(1, 2, n, 128, dtype=torch.bfloat16)
        lse = torch.zeros(1, 2, n)
        try:
            launch.flash_bwd(q, q, q, q, q, lse, True, 0.088, **options)
        except Triton:
            return "triton"
        return "gluon"

    assert [call(16384), call(1024)] == ["gluon", "gluon"]
    assert call(16384, gluon=False) == "triton"
    assert call(16384, variants=launch.Variants(causal=True, softcap=30.0)) == "triton"
    # As shipped (NOTES v34), windowed and ALiBi calls take it.
    assert call(16384, variants=launch.Variants(causal=True, window=(64, 0))) == "gluon"
    assert call(1024, variants=launch.Variants(causal=True, alibi_slopes=torch.ones(2))) == "gluon"
    monkeypatch.setenv(gluon_backward.ENV_SWITCH, "0")
    assert [call(16384), call(1024)] == ["triton", "triton"]
    monkeypatch.setenv(gluon_backward.ENV_SWITCH, "1")
    assert call(1024) == "gluon" and taken == [16384, 1024, 16384, 1024, 1024]


def test_where_the_gluon_backward_can_run_triton_flash_declares_only_its_forward_deterministic(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The Gluon backward adds dQ in float atomics: where it can run (a Hopper, here stubbed),
    triton_flash must not declare a deterministic backward (the properties suite would fail it,
    rightly); with it turned off, or with no GPU, the Triton backward's bits are the same run to
    run and it declares both."""
    from pytest_attnkit.implementations.triton_flash import gluon_common
    from pytest_attnkit.implementations.triton_flash.adapter import TritonFlash

    monkeypatch.delenv(gluon_backward.ENV_SWITCH, raising=False)
    monkeypatch.delenv("ATTNKIT_TRITON_FLASH_GLUON", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert TritonFlash().deterministic_directions() == ("forward", "backward")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(gluon_common, "device_reason", lambda device: None)
    assert TritonFlash().deterministic_directions() == ("forward",)
    monkeypatch.setenv(gluon_backward.ENV_SWITCH, "0")
    assert TritonFlash().deterministic_directions() == ("forward", "backward")
    monkeypatch.delenv(gluon_backward.ENV_SWITCH)
    monkeypatch.setattr(gluon_common, "device_reason", lambda device: "Hopper (sm_90) only")
    assert TritonFlash().deterministic_directions() == ("forward", "backward")


def test_the_compile_check_finds_an_arrival_no_barrier_orders() -> None:
    """tools/flash_bench/gluon_bwd_compile.py's PTX rule: a plain arrival after shared stores with
    no bar.sync between is named by its source line; one after a bar.sync, or an expect_tx
    arrival (the producer's), is not."""
    import importlib
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools" / "flash_bench"))
    try:
        compile_check = importlib.import_module("gluon_bwd_compile")
    finally:
        sys.path.pop(0)
    ptx = "\n".join(["\tst.shared.v2.b32 \t[%r87+180224], {%r565, %r566};",
                     "\t.loc\t1 537 24",
                     "\t@%p30 mbarrier.arrive.shared::cta.b64 _, [%r302];",
                     "\tbar.sync \t3, 128;",
                     "\t.loc\t1 540 8",
                     "\t@%p30 mbarrier.arrive.shared::cta.b64 _, [%r303];",
                     "\t@!%p2 ld.shared.v2.b32 \t{%r1, %r2}, [%r9];",
                     "\t@%p9 mbarrier.arrive.expect_tx.shared.b64 _, [%r2263], 65536;"])
    assert compile_check.unbarriered_arrives(ptx) == ["gluon_backward.py:537"]


def test_mla_takes_three_chunks_its_default_only_and_fits_in_shared_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """MLA (Q's and K's head dim 192, V's 128; implementations/triton_flash/NOTES.md v24): the
    backward takes it on a Hopper (its device check stubbed) with its default configuration only,
    dQ's buffers a 64-column piece a consumer, so that it fits in shared memory; other unequal head
    dims are refused with the pairs it takes."""
    from pytest_attnkit.implementations.triton_flash import gluon_common

    monkeypatch.setattr(gluon_common, "device_reason", lambda device: None)
    q = torch.zeros(1, 4, 256, 192, dtype=torch.bfloat16)
    k = torch.zeros(1, 2, 200, 192, dtype=torch.bfloat16)
    v = torch.zeros(1, 2, 200, 128, dtype=torch.bfloat16)
    assert gluon_backward.unsupported_reason(q, k, v, True, 0.07) is None
    assert "192 with V's 128" in gluon_backward.unsupported_reason(q, k, k, True, 0.07)  # V's 192
    mla = gluon_backward.default_config(192, True)
    assert str(mla) == str(gluon_backward.default_config(192, False)) == "m64s2-tmar-sw-r240"
    need = gluon_backward.shared_bytes(mla, 192, head_dim_v=128)
    # K and V, the Q/dO ring, P and dS, a [64, 64] float32 dQ piece a consumer, 7 barriers.
    assert need == 128 * 320 * 2 + 2 * 64 * 320 * 2 + 4 * 64 * 64 * 2 + 2 * 64 * 64 * 4 + 8 * 7
    assert need <= gluon_backward.SHARED_LIMIT < gluon_backward.shared_bytes(mla, 192)
    lse = torch.empty(1, 4, 256)
    with pytest.raises(ValueError, match="MLA's backward is written for"):
        gluon_backward.launch_arguments(torch.empty(1, 4, 256, 128, dtype=torch.bfloat16), q, k, v, lse, lse,
                                        q.float(), k, v, True, 0.07, gluon_backward.Config.parse("m64s2-tmar-sw-pair"))


def test_lt_takes_a_stage_of_l_and_delta_into_the_ring_and_pads_rows_a_tma_descriptor_cannot_take() -> None:
    """-lt (NOTES v30): 8 bytes a query row a stage; L's and delta's rows by a TMA descriptor of
    blocks [1, 1, BLOCK_M], whose strides must be multiples of 16 bytes: Nq = 113 is copied into
    rows of 116, Nq = 128 is taken as it is."""
    plain, lt = gluon_backward.Config.parse("m64s2-tmar-sw-ld"), gluon_backward.Config.parse("m64s2-tmar-sw-ld-lt")
    assert gluon_backward.shared_bytes(lt, 128) - gluon_backward.shared_bytes(plain, 128) == 2 * 64 * 8
    assert gluon_backward.shared_bytes(lt, 128) <= gluon_backward.SHARED_LIMIT
    ragged = torch.randn(2, 3, 113)
    desc = gluon_backward.row_descriptor(ragged, 64)
    assert list(desc.shape) == [2, 3, 113] and list(desc.strides) == [3 * 116, 116, 1]
    assert list(desc.block_shape) == [1, 1, 64] and torch.equal(desc.base, ragged)
    whole = torch.randn(2, 3, 128)
    desc = gluon_backward.row_descriptor(whole, 64)
    assert desc.base.data_ptr() == whole.data_ptr() and list(desc.strides) == [3 * 128, 128, 1]


def test_alibi_goes_to_the_gluon_backward_only_once_takes_alibi_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """ALiBi through the Gluon backward (NOTES v31, taken since v34's GPU check): with TAKES_ALIBI
    False, ALiBi calls are refused with ALiBi named and go to the Triton backward; with it True,
    d64/d128 calls are taken and launch.flash_bwd hands the slopes over, MLA's head dims are still
    refused, and a window is while TAKES_WINDOW is False."""
    from pytest_attnkit.implementations.triton_flash import gluon_common, launch

    monkeypatch.delenv(gluon_backward.ENV_SWITCH, raising=False)
    monkeypatch.delenv("ATTNKIT_TRITON_FLASH_GLUON", raising=False)
    monkeypatch.setattr(gluon_common, "device_reason", lambda device: None)
    q = torch.zeros(1, 4, 256, 128, dtype=torch.bfloat16)
    k = torch.zeros(1, 2, 200, 128, dtype=torch.bfloat16)
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625])
    alibi = launch.Variants(causal=True, alibi_slopes=slopes)
    monkeypatch.setattr(gluon_backward, "TAKES_ALIBI", False)
    monkeypatch.setattr(gluon_backward, "TAKES_WINDOW", False)
    assert "ALiBi" in gluon_backward.unsupported_reason(q, k, k, True, 0.07, variants=alibi)
    taken = []

    def gluon_bwd(do, q, k, v, o, lse, causal, scale, dlse=None, alibi_slopes=None, window=None):
        taken.append(alibi_slopes)
        return q, k, v

    class Triton(Exception):
        pass

    def problem(*args, **kwargs):
        raise Triton()

    monkeypatch.setattr(gluon_backward, "flash_bwd", gluon_bwd)
    monkeypatch.setattr(launch, "_Problem", problem)

    def call(q, k, variants) -> str:
        try:
            launch.flash_bwd(q, q, k, k, q, torch.zeros(q.shape[:3]), variants.causal, 0.07, variants=variants)
        except Triton:
            return "triton"
        return "gluon"

    assert call(q, k, alibi) == "triton" and not taken
    monkeypatch.setattr(gluon_backward, "TAKES_ALIBI", True)
    assert gluon_backward.unsupported_reason(q, k, k, True, 0.07, variants=alibi) is None
    assert call(q, k, alibi) == "gluon" and taken[-1] is slopes
    assert call(q, k, launch.Variants(causal=True)) == "gluon" and taken[-1] is None
    mla_q, mla_k = torch.zeros(1, 4, 256, 192, dtype=torch.bfloat16), torch.zeros(1, 2, 200, 192, dtype=torch.bfloat16)
    mla_v = torch.zeros(1, 2, 200, 128, dtype=torch.bfloat16)
    assert gluon_backward.unsupported_reason(mla_q, mla_k, mla_v, True, 0.07, variants=launch.Variants(causal=True)) is None
    assert "MLA" in gluon_backward.unsupported_reason(mla_q, mla_k, mla_v, True, 0.07, variants=alibi)
    window = launch.Variants(causal=True, window=(64, 0), alibi_slopes=slopes)
    assert "window" in gluon_backward.unsupported_reason(q, k, k, True, 0.07, variants=window)


def test_alibi_launches_with_its_slopes_pointer_and_is_refused_where_it_is_not_written() -> None:
    """The launch passes ALiBi's slopes (times log2(e), [B, Hq]) after the scales (before the
    window's two sides) and ALIBI=True; without ALiBi the slot holds L's tensor and ALIBI is left
    at the kernel's default (False: the default kernels' SASS is unchanged). Keys as rows (-krows)
    and MLA are refused."""
    q = torch.zeros(2, 4, 256, 64, dtype=torch.bfloat16)
    k = torch.zeros(2, 2, 200, 64, dtype=torch.bfloat16)
    lse = torch.zeros(2, 4, 256)
    slopes = torch.rand(2, 4)
    config = gluon_backward.default_config(64, True)
    work = gluon_backward.dq_workspace(q, config)  # -dqb's blocks at d64 causal (NOTES v37)
    args, kwargs, _ = gluon_backward.launch_arguments(q, q, k, k, lse, lse, work, k, k, True, 0.125, config, slopes)
    assert args[-3] is slopes and kwargs["ALIBI"] is True
    args, kwargs, _ = gluon_backward.launch_arguments(q, q, k, k, lse, lse, work, k, k, True, 0.125, config)
    assert args[-3] is lse and "ALIBI" not in kwargs
    with pytest.raises(ValueError, match="queries as rows"):
        gluon_backward.launch_arguments(q, q, k, k, lse, lse, q.float(), k, k, True, 0.125,
                                        gluon_backward.Config.parse("m64s2-krows"), slopes)


def test_a_window_goes_to_the_gluon_backward_only_once_takes_window_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sliding windows through the Gluon backward (NOTES v32, taken since v34's GPU check): refused,
    with the window named, while TAKES_WINDOW is False; when True, launch.flash_bwd hands the
    window over (with ALiBi's slopes too where both are asked); MLA's head dims stay refused."""
    from pytest_attnkit.implementations.triton_flash import gluon_common, launch

    monkeypatch.delenv(gluon_backward.ENV_SWITCH, raising=False)
    monkeypatch.delenv("ATTNKIT_TRITON_FLASH_GLUON", raising=False)
    monkeypatch.setattr(gluon_common, "device_reason", lambda device: None)
    q = torch.zeros(1, 4, 256, 64, dtype=torch.bfloat16)
    k = torch.zeros(1, 2, 200, 64, dtype=torch.bfloat16)
    windowed = launch.Variants(causal=True, window=(64, 0))
    monkeypatch.setattr(gluon_backward, "TAKES_ALIBI", False)
    monkeypatch.setattr(gluon_backward, "TAKES_WINDOW", False)
    assert "a window" in gluon_backward.unsupported_reason(q, k, k, True, 0.07, variants=windowed)
    taken = []

    def gluon_bwd(do, q, k, v, o, lse, causal, scale, dlse=None, alibi_slopes=None, window=None):
        taken.append((window, alibi_slopes))
        return q, k, v

    monkeypatch.setattr(gluon_backward, "flash_bwd", gluon_bwd)
    monkeypatch.setattr(gluon_backward, "TAKES_WINDOW", True)
    assert gluon_backward.unsupported_reason(q, k, k, True, 0.07, variants=windowed) is None
    launch.flash_bwd(q, q, k, k, q, torch.zeros(q.shape[:3]), True, 0.07, variants=windowed)
    assert taken == [((64, 0), None)]
    slopes = torch.ones(4)
    both = launch.Variants(causal=False, window=(10, 20), alibi_slopes=slopes)
    assert "ALiBi" in gluon_backward.unsupported_reason(q, k, k, False, 0.07, variants=both)
    monkeypatch.setattr(gluon_backward, "TAKES_ALIBI", True)
    launch.flash_bwd(q, q, k, k, q, torch.zeros(q.shape[:3]), False, 0.07, variants=both)
    assert taken[-1] == ((10, 20), slopes)
    mla_q, mla_k = torch.zeros(1, 4, 256, 192, dtype=torch.bfloat16), torch.zeros(1, 2, 200, 192, dtype=torch.bfloat16)
    mla_v = torch.zeros(1, 2, 200, 128, dtype=torch.bfloat16)
    assert "MLA" in gluon_backward.unsupported_reason(mla_q, mla_k, mla_v, True, 0.07, variants=windowed)


def test_a_window_launches_as_its_band_with_causal_folded_in_and_one_kernel_for_both() -> None:
    """The launch passes the band (kernels.band: a side -1 unbounded as 2**30, causal folded into
    the right side) as the last two runtime arguments, WINDOW=True and CAUSAL=False (one kernel
    for causal and not); without a window, (0, 0) and neither constexpr. Rotated walks refused."""
    from pytest_attnkit.implementations.triton_flash.kernels import UNBOUNDED

    q = torch.zeros(1, 4, 256, 64, dtype=torch.bfloat16)
    k = torch.zeros(1, 2, 200, 64, dtype=torch.bfloat16)
    lse = torch.zeros(1, 4, 256)
    config = gluon_backward.default_config(64, True)
    work = gluon_backward.dq_workspace(q, config)  # -dqb's blocks at d64 causal (NOTES v37)
    args, kwargs, _ = gluon_backward.launch_arguments(q, q, k, k, lse, lse, work, k, k, True, 0.125, config,
                                                      None, (100, -1))
    assert args[-2:] == (100, 0) and kwargs["WINDOW"] is True and kwargs["CAUSAL"] is False
    args, kwargs, _ = gluon_backward.launch_arguments(q, q, k, k, lse, lse, work, k, k, False, 0.125, config,
                                                      None, (-1, 30))
    assert args[-2:] == (UNBOUNDED, 30) and kwargs["CAUSAL"] is False
    args, kwargs, _ = gluon_backward.launch_arguments(q, q, k, k, lse, lse, work, k, k, True, 0.125, config)
    assert args[-2:] == (0, 0) and "WINDOW" not in kwargs and kwargs["CAUSAL"] is True
    with pytest.raises(ValueError, match="walked in order"):
        gluon_backward.launch_arguments(q, q, k, k, lse, lse, q.float(), k, k, True, 0.125,
                                        gluon_backward.Config.parse("m64s2-rot"), None, (64, 0))


def test_band_tiles_are_query_tiles_for_a_causal_or_unbounded_band_and_mask_both_ends_of_a_window() -> None:
    """band_tiles (the kernel's window formulas; tools/flash_bench/gluon_bwd_model.py checks them
    against every pair over many lengths and windows): a causal band gives query_tiles' causal
    ranges, an unbounded one its plain ranges; a 256-key window at 16k walks the key block's 4224
    queries' tiles, the first two and last two masked."""
    from pytest_attnkit.implementations.triton_flash.kernels import band

    for n0 in (0, 128, 1024):
        first, whole, end = gluon_backward.query_tiles(n0, 4096, 4096, 64, True)
        assert gluon_backward.band_tiles(n0, 4096, 4096, 64, *band(True, None)) == (first, whole, end, end)
        assert gluon_backward.band_tiles(n0, 4096, 4096, 64, *band(False, None)) == (0, 0, 64, 64)
    assert gluon_backward.band_tiles(8192, 16384, 16384, 64, *band(True, (4096, 0))) == (128, 130, 192, 194)
    # The last, ragged key block: every tile masked.
    assert gluon_backward.band_tiles(256, 300, 300, 64, 64, 0)[1:3] == (5, 5)


def test_dqp_launches_with_its_constexpr_where_a_config_asks_for_it() -> None:
    """-dqp (NOTES v33; d128's default since v34) reaches the kernel as DQ_PIPE; a config without
    it leaves the constexpr at the kernel's default (d64's default: one dQ piece, nothing to pipe)."""
    q = torch.zeros(1, 2, 256, 128, dtype=torch.bfloat16)
    lse = torch.zeros(1, 2, 256)
    _, kwargs, _ = gluon_backward.launch_arguments(q, q, q, q, lse, lse, q.float(), q, q, True, 0.09,
                                                   gluon_backward.Config.parse("m64s2-tmar-sw-ld-dqp"))
    assert kwargs["DQ_PIPE"] is True
    _, kwargs, _ = gluon_backward.launch_arguments(q, q, q, q, lse, lse, q.float(), q, q, True, 0.09,
                                                   gluon_backward.default_config(128, True))
    assert kwargs["DQ_PIPE"] is True
    _, kwargs, _ = gluon_backward.launch_arguments(q, q, q, q, lse, lse, q.float(), q, q, True, 0.09,
                                                   gluon_backward.Config.parse("m64s2-tmar-sw-ld"))
    assert "DQ_PIPE" not in kwargs
    # -dqs (the pieces in buffers of their own) rides on -dqp: DQ_PIPE=2, and refused without it.
    _, kwargs, _ = gluon_backward.launch_arguments(q, q, q, q, lse, lse, q.float(), q, q, True, 0.09,
                                                   gluon_backward.Config.parse("m64s2-tmar-sw-ld-lt-rl-dqp-dqs"))
    assert kwargs["DQ_PIPE"] == 2
    with pytest.raises(ValueError, match="-dqs"):
        gluon_backward.Config.parse("m64s2-tmar-sw-ld-dqs")
    with pytest.raises(ValueError, match="-dqs"):  # its reduces are -sw's 32-column boxes
        gluon_backward.Config.parse("m64s2-tmar-dqp-dqs")


def test_dqb_lays_dq_out_in_8_column_blocks_of_4_rows_a_line_and_puts_them_back() -> None:
    """-dqb (NOTES v36): dQ's workspace [B, H, D / 8, N4, 8] (N rounded up to 4), which the kernel's
    one reduce a tile addresses as 128-byte lines of 4 rows of an 8-column block; -sw-dqb swizzles
    each line's chunks; refused beside -pair and -dqs; the constexpr (DQ_SWIZZLE 2 or 3) and the
    5-d descriptor reach the launch, and a workspace of another shape is refused there. (The
    kernel's own relabelling of its registers, _blocks, runs only on the GPU: gluon_bwd_check.py.)"""
    config = gluon_backward.Config.parse("m64s2-tmar-dqb-ld-lt-rl-dqp")
    swizzled = gluon_backward.Config.parse("m64s2-tmar-sw-dqb-ld-lt-rl-dqp")
    assert config.dq_blocked and not config.dq_swizzle and swizzled.dq_blocked and swizzled.dq_swizzle
    for one in (config, swizzled):
        assert gluon_backward.Config.parse(str(one)) == one
    for text in ("m64s2-dqb", "m64s2-tmar-dqb-pair"):
        with pytest.raises(ValueError, match="-dqb lays out the buffer"):
            gluon_backward.Config.parse(text)
    with pytest.raises(ValueError, match="needs -dqp and -sw, without -dqb"):
        gluon_backward.Config.parse("m64s2-tmar-sw-dqb-dqp-dqs")
    batch, heads, n, head_dim = 2, 3, 113, 128
    q = torch.zeros(batch, heads, n, head_dim, dtype=torch.bfloat16)
    work = gluon_backward.dq_workspace(q, config)
    assert work.shape == (batch, heads, head_dim // 8, 116, 8) and work.dtype == torch.float32 and not work.any()
    assert gluon_backward.dq_workspace(q, gluon_backward.default_config(head_dim, True)).shape == q.shape
    # The descriptor's line (block c, quad j) is rows 4j..4j+3 of columns 8c..8c+7, row after row.
    dq = torch.randn(batch, heads, n, head_dim)
    work[:, :, :, :n] = dq.view(batch, heads, n, head_dim // 8, 8).permute(0, 1, 3, 2, 4)
    lse = torch.zeros(batch, heads, n)
    for one, constexpr, swizzle in ((config, 2, 0), (swizzled, 3, 128)):
        args, kwargs, _ = gluon_backward.launch_arguments(q, q, q, q, lse, lse, work, q, q, True, 0.09, one)
        desc = args[8]
        assert kwargs["DQ_SWIZZLE"] == constexpr and desc.layout.swizzle_byte_width == swizzle
        assert list(desc.shape) == [batch, heads, head_dim // 8, 29, 32]
        assert list(desc.block_shape) == [1, 1, 16, 16, 32] and desc.base.data_ptr() == work.data_ptr()
        assert torch.equal(desc.base[1, 2, 5, 7].view(4, 8), dq[1, 2, 28:32, 40:48])
    with pytest.raises(ValueError, match="is not dq_workspace's"):
        gluon_backward.launch_arguments(q, q, q, q, lse, lse, q.float(), q, q, True, 0.09, config)
    # -bxN: the tile's reduce in N boxes of 16 / N column blocks (the kernel loops over the
    # descriptor's block shape); refused without -dqb, for an N that is no power of 2 up to 16, and
    # where the head's blocks do not split into N.
    for boxes in (2, 4, 16):
        split = gluon_backward.Config.parse(f"m64s2-tmar-dqb-bx{boxes}-ld-lt-rl-dqp")
        assert split.dq_boxes == boxes and gluon_backward.Config.parse(str(split)) == split
        args, kwargs, _ = gluon_backward.launch_arguments(q, q, q, q, lse, lse, work, q, q, True, 0.09, split)
        assert list(args[8].block_shape) == [1, 1, 16 // boxes, 16, 32] and kwargs["DQ_SWIZZLE"] == 2
        assert args[8].layout.swizzle_byte_width == 0 and args[8].base.data_ptr() == work.data_ptr()
    # -flat: the same boxes through a 3-d view [B * H * D / 8, N4 / 4, 32]; the kernel's reduce
    # addresses block rows from the (batch, head)'s first (DQ_SWIZZLE 4, or 5 with -sw).
    for text, boxes, constexpr in (("m64s2-tmar-dqb-flat-ld", 1, 4), ("m64s2-tmar-sw-dqb-bx16-flat-ld", 16, 5)):
        flat = gluon_backward.Config.parse(text)
        assert flat.dq_flat and gluon_backward.Config.parse(str(flat)) == flat
        args, kwargs, _ = gluon_backward.launch_arguments(q, q, q, q, lse, lse, work, q, q, True, 0.09, flat)
        desc = args[8]
        assert kwargs["DQ_SWIZZLE"] == constexpr and list(desc.shape) == [batch * heads * 16, 29, 32]
        assert list(desc.block_shape) == [16 // boxes, 16, 32] and desc.base.data_ptr() == work.data_ptr()
        assert desc.layout.swizzle_byte_width == (128 if flat.dq_swizzle else 0)
        assert torch.equal(desc.base[(1 * heads + 2) * 16 + 5, 7].view(4, 8), dq[1, 2, 28:32, 40:48])
    with pytest.raises(ValueError, match="-flat is -dqb's workspace"):
        gluon_backward.Config.parse("m64s2-tmar-sw-flat")
    for text in ("m64s2-tmar-sw-bx4", "m64s2-tmar-dqb-bx3", "m64s2-tmar-dqb-bx32"):
        with pytest.raises(ValueError, match="-bxN splits"):
            gluon_backward.Config.parse(text)
    with pytest.raises(ValueError, match="-bx1 is -dqb as it is"):  # not a second name for -dqb's kernel
        gluon_backward.Config.parse("m64s2-tmar-dqb-bx1")
    with pytest.raises(ValueError, match="do not split into 16 boxes"):
        q64 = torch.zeros(batch, heads, n, 64, dtype=torch.bfloat16)
        wide = gluon_backward.Config.parse("m64s3-tmar-dqb-bx16-ld")
        gluon_backward.launch_arguments(q64, q64, q64, q64, lse, lse, gluon_backward.dq_workspace(q64, wide),
                                        q64, q64, True, 0.09, wide)
    # Its conversion back (a Triton kernel, run here in the interpreter in a child process, as the
    # harness's workers run Triton on the CPU): every row in place, the padding rows dropped.
    code = ("import torch; from pytest_attnkit.implementations.triton_flash import gluon_backward as gb; "
            "torch.manual_seed(0); q = torch.zeros(2, 3, 113, 64); "
            "w = gb.dq_workspace(q, gb.Config.parse('m64s2-tmar-dqb')); w.normal_(); "
            "ref = w[:, :, :, :113].permute(0, 1, 3, 2, 4).reshape(2, 3, 113, 64); "
            "print(torch.equal(gb.dq_result(w, q), ref), torch.equal(gb.dq_result(w, q.half()), ref.half()))")
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=Path(__file__).resolve().parents[2],
                          capture_output=True, text=True, timeout=300)
    assert done.stdout.split() == ["True", "True"], done.stderr[-2000:]
