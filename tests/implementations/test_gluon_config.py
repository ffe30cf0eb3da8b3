"""The Gluon forward's configurations without a GPU: the names the bench tools pass, and the checks
that refuse a configuration before it can deadlock or fail to launch (registers, shared memory)."""

from __future__ import annotations

import pytest

from pytest_attnkit.implementations.triton_flash import gluon_forward as gf


@pytest.mark.parametrize("text", ["n128s2-eager-r240", "n128s3-eager-r240", "n128s3-eager-c3-r160",
                                  "n64s2-nopp-r232", "n128s2-eager-c3-r152", "n128s2-eager-p-r240",
                                  "n128s3-eager-c3-p-r160", "n128s2-eager-hf-r240", "n128s2-eager-p-g-r240",
                                  "n128s2-eager-sm-r240", "n128s3-eager-c3-sm-r160"])
def test_a_configuration_reads_back_as_written(text: str) -> None:
    assert str(gf.Config.parse(text)) == text


def test_three_consumers_take_192_rows_and_160_registers_unless_told() -> None:
    config = gf.Config.parse("n128s3-eager-c3")
    assert (config.consumers, config.consumer_regs, config.block_m) == (3, 160, 192)
    assert gf.Config.parse("n128s2-eager").block_m == 128
    assert gf.register_reason(config) is None and gf.register_reason(gf.default_config(128, False)) is None


@pytest.mark.parametrize("text", ["n128s3-eager-c3-r168", "n128s2-eager-r256", "n128s2-eager-r244"])
def test_a_register_split_that_does_not_fit_is_refused(text: str) -> None:
    reason = gf.register_reason(gf.Config.parse(text))
    assert reason is not None and "65,536 registers" in reason


def test_shared_memory_counts_a_q_part_and_two_barriers_per_consumer() -> None:
    three = gf.Config.parse("n128s3-eager-c3")
    assert gf.shared_bytes(three, 64) == 192 * 64 * 2 + 2 * 3 * 128 * 64 * 2 + 8 * (2 * 3 + 4 * 3)
    assert gf.shared_bytes(three, 64) <= gf.SHARED_LIMIT < gf.shared_bytes(three, 128)


def test_persistent_adds_an_o_buffer_and_a_q_empty_barrier_per_consumer_and_is_the_default_only_where_it_gained() -> None:
    plain, persistent = gf.Config.parse("n128s2-eager"), gf.Config.parse("n128s2-eager-p")
    assert persistent.persistent and not plain.persistent
    assert gf.shared_bytes(persistent, 128) - gf.shared_bytes(plain, 128) == 128 * 128 * 2 + 8 * 2
    assert gf.shared_bytes(persistent, 128) <= gf.SHARED_LIMIT < gf.shared_bytes(gf.Config.parse("n128s3-eager-p"), 128)
    for head_dim in (64, 128):
        for causal in (False, True):
            for n_k in (None, 1024, 4096, 16384):
                config = gf.default_config(head_dim, causal, n_k)
                # Persistent only where it was measured to gain: without causal over short keys
                # (results/2026-11-26-session5/gluon: d128 +4-5% at 1k, 4k and 16k nothing;
                # session6/gluon-fwd-grouped/d64_1k.txt: d64 +7% at 1k over three consumers), and
                # causal up to 4k keys with its heads in groups (session6/gluon-fwd-grouped: +1% to
                # +23%; the ungrouped order lost 23% at 1k).
                grouped = causal and n_k is not None and n_k <= gf.GROUPED_MAX_KEYS
                assert config.persistent == (grouped or (not causal and n_k is not None
                                                         and n_k <= gf.PERSISTENT_MAX_KEYS)), (head_dim, causal, n_k)
                assert config.grouped == grouped
                assert not config.heavy_first
                assert gf.register_reason(config) is None
                assert gf.shared_bytes(config, head_dim) <= gf.SHARED_LIMIT


def test_head_groups_are_two_whole_rounds_of_the_snake() -> None:
    # Each group is exactly two rounds (2 x CTAs items), so the snake pairs heavy with light items
    # inside it; a group of any other size drifted to 1.5-1.7x the mean work (gluon_model.py).
    for n_m in (1, 3, 8, 16, 32, 128, 300):
        for n_bh in (1, 16, 64, 128, 512):
            ctas, group = gf.grouped_grid(n_m, n_bh, 132)
            assert 1 <= ctas <= 132 and 1 <= group <= n_bh
            assert group == n_bh or 2 * ctas == group * n_m, (n_m, n_bh, ctas, group)
    assert gf.grouped_grid(8, 128, 132) == (132, 33)  # 1k: every SM, 33 heads a group
    assert gf.grouped_grid(32, 64, 132) == (128, 8)  # 4k: 128 SMs
    with pytest.raises(ValueError, match="needs -p"):
        gf.Config.parse("n128s2-eager-g")


def test_an_unknown_part_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown part 'c4'"):
        gf.Config.parse("n128s2-c4")


def test_the_default_takes_three_consumers_only_at_d64_without_causal() -> None:
    # Measured on an H100 (results/2026-11-26-session4/gluon/forward-c3): c3 won at 4k d64
    # non-causal (486 against 438 TFLOP/s), lost under causal (366 against 396) and at d128.
    assert str(gf.default_config(64, False)) == "n128s3-eager-c3-r160"
    assert str(gf.default_config(64, True)) == "n128s3-eager-r240"
    assert str(gf.default_config(128, False)) == str(gf.default_config(128, True)) == "n128s2-eager-r240"
    for head_dim in gf.HEAD_DIMS:
        for causal in (False, True):
            config = gf.default_config(head_dim, causal)
            assert gf.register_reason(config) is None
            assert gf.shared_bytes(config, head_dim) <= gf.SHARED_LIMIT


def test_row_sums_on_the_tensor_cores_are_off_by_default_one_item_only_and_count_their_tiles_of_ones() -> None:
    """``-sm`` (implementations/triton_flash/NOTES.md, v20.3): P @ ones beside PV, a [BLOCK_N, 16]
    tile of ones per consumer in shared memory; written for the one-item grid, so a persistent
    configuration with it is refused by name as it is made, parsed or not. The FP8 launch refuses
    it too (its sums came out wrong on an H200: implementations/triton_flash/NOTES.md, v20.4); its
    kernel's memory counts one byte an element (and O's bf16 buffer, P's tile)."""
    sums = gf.Config.parse("n128s2-eager-sm")
    assert sums.sum_mma and not gf.Config.parse("n128s2-eager").sum_mma
    assert gf.shared_bytes(sums, 128) - gf.shared_bytes(gf.Config.parse("n128s2-eager"), 128) == 2 * 128 * 16 * 2
    for head_dim in gf.HEAD_DIMS:
        for causal in (False, True):
            for n_k in (None, 1024, 16384):
                assert not gf.default_config(head_dim, causal, n_k).sum_mma
    with pytest.raises(ValueError, match="one-item grid only"):
        gf.Config.parse("n128s2-eager-p-sm")
    import torch

    q = torch.empty(1, 2, 256, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="one-item grid only"):  # a Config made directly, not parsed
        gf.launch_arguments(q, q, q, q, torch.empty(1, 2, 256), False, 0.125,
                            gf.Config(eager=True, persistent=True, sum_mma=True))
    fp8 = gf.fp8_config(128, causal=True, n_k=4096)  # two consumers where three lost (causal 4k)
    assert fp8.consumers == 2 and gf.fp8_config(64, causal=True, n_k=4096).consumers == 2
    assert [gf.fp8_config(d, causal, n_k).consumers for d in (64, 128) for causal, n_k in
            ((False, 4096), (False, 16384), (True, 16384))] == [3] * 6
    assert gf.fp8_shared_bytes(fp8, 128) == 128 * 128 + 2 * 128 * 128 + 2 * 3 * 128 * 128 + 128 * 128 + 8 * (4 + 12)
    q8 = q.to(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="-sm is not for FP8"):
        gf.launch_arguments_fp8(q8, q8, q8.transpose(2, 3), q, torch.empty(1, 2, 256), torch.ones(1, 2, 3), False,
                                0.125, gf.Config(block_n=128, stages=3, eager=True, sum_mma=True))


def test_mla_takes_the_one_item_grid_with_o_over_q_and_fits_in_shared_memory() -> None:
    """MLA (Q's and K's head dim 192, V's 128): Q and K in three 64-column chunks (Gluon's shapes
    are powers of two), the K/V ring at each one's width, O over Q's buffer; the persistent grid's
    own O buffer would not fit, so its default is the one-item grid at every length, causal or not."""
    plain = gf.Config.parse("n128s2-eager")
    assert gf.qk_chunk(192) == 64 and gf.qk_chunk(128) == 128 and gf.qk_chunk(64) == 64
    assert gf.shared_bytes(plain, 192, head_dim_v=128) == (128 * 192 * 2 + 2 * 128 * (192 + 128) * 2
                                                           + 8 * (2 * 2 + 4 * 2))
    assert gf.shared_bytes(plain, 192, head_dim_v=128) <= gf.SHARED_LIMIT < gf.shared_bytes(plain, 192)
    assert gf.shared_bytes(gf.Config.parse("n128s2-eager-p"), 192, head_dim_v=128) > gf.SHARED_LIMIT
    for causal in (False, True):
        for n_k in (None, 1024, 4096, 16384):
            assert str(gf.default_config(192, causal, n_k, 128)) == "n128s2-eager-r240"
    assert (192, 128) in gf.HEAD_DIM_PAIRS and (192, 192) not in gf.HEAD_DIM_PAIRS


def test_the_window_tile_model_holds_against_the_contract_s_mask_and_catches_an_early_whole_tile() -> None:
    """tools/flash_bench/gluon_model.py mirrors the Gluon forward's tile ranges under a sliding
    window (the kernel itself runs only on a GPU): every visible key walked, no tile past the last,
    the unmasked tiles whole for every row, against pytest_attnkit.masks.visibility_mask; the whole
    tiles planted one tile early fail it."""
    import sys
    from pathlib import Path

    tools = Path(__file__).resolve().parents[2] / "tools" / "flash_bench"
    sys.path.insert(0, str(tools))
    try:
        import gluon_model
    finally:
        sys.path.remove(str(tools))
    assert gluon_model.check_window_schedule() > 1000
    with pytest.raises(AssertionError, match="not whole"):
        gluon_model.check_window_schedule(w_lo_shift=1)
    assert gluon_model.window_band(False, (2**31 - 1, -1)) == gf.band(False, (2**31 - 1, -1))
    assert gluon_model.window_band(True, (16, 4)) == gf.band(True, (16, 4))


#: The Gluon backward's PTX before v26's fix (d128 causal, triton 3.6, sm_90a), cut to the lines
#: that matter: dq_ready's barrier initialized at 229376, then gl.warp_specialize's captured tile
#: count stored into the same word, and a consumer reading it back.
ALIASED_PTX = """
	mov.b32 	%r2331, global_smem;
	add.s32 	%r2318, %r2331, 229696;
	@%p167 mbarrier.init.shared::cta.b64 [%r2318], 1;
	add.s32 	%r2319, %r2331, 229376;
	@%p167 mbarrier.init.shared::cta.b64 [%r2319], 2;
	add.s32 	%r2320, %r2331, 229392;
	@%p167 mbarrier.init.shared::cta.b64 [%r2320], 2;
	fence.proxy.async.shared::cta;
	st.shared.v2.b32 	[global_smem+229704], {0, 16843009};
	st.shared.b32 	[global_smem+229376], %r2640;
	barrier.sync 	1;
	ld.shared.b32 	%r82, [global_smem+229376];
"""


def test_a_barrier_word_also_used_as_data_is_found() -> None:
    """tools/flash_bench/gluon_compile.py's barrier_aliases, which fails a compiled Gluon kernel
    (forward or backward) whose shared memory holds an mbarrier and plain data in one word: the
    backward's captured tile count in a dead barrier's word hung it whenever two processes shared
    the GPU (implementations/triton_flash/NOTES.md v26)."""
    import sys
    from pathlib import Path

    tools = Path(__file__).resolve().parents[2] / "tools" / "flash_bench"
    sys.path.insert(0, str(tools))
    try:
        import gluon_compile
    finally:
        sys.path.remove(str(tools))
    assert gluon_compile.barrier_aliases(ALIASED_PTX) == [229376]
    # The capture moved off the barriers (the fix): nothing found; 229704 is a word of its own.
    fixed = ALIASED_PTX.replace("[global_smem+229376]", "[global_smem+229720]")
    assert gluon_compile.barrier_aliases(fixed) == []
    # Through a register the address reaches the same word: found too.
    through = fixed + "\tadd.s32 \t%r9, %r2331, 229392;\n\tst.shared.b32 \t[%r9], %r1;\n"
    assert gluon_compile.barrier_aliases(through) == [229392]
    # Inside a barrier's 8 bytes (its upper word) counts.
    assert gluon_compile.barrier_aliases(fixed + "\tld.shared.b32 \t%r5, [global_smem+229700];\n") == [229700]
