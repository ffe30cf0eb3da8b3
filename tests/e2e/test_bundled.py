"""The main job on this machine: the bundled implementations against the bundled suites.

On a machine without a GPU (CI), torch_sdpa and triton_flash (in Triton's interpreter) must pass
the smoke set, skipping only what they decline in words, and cupy_naive must be skipped with its
reason. On a GPU machine every one of them must pass what it claims.
"""

from __future__ import annotations

import pytest

from helpers import run_attnkit

pytest.importorskip("torch")


def test_bundled_implementations_pass_the_default_case_set(pytester: pytest.Pytester) -> None:
    outcomes, recorder = run_attnkit(pytester, "--attnkit-impl", "torch_sdpa,triton_flash,cupy_naive")
    assert outcomes, "nothing ran"
    failures = {name: o.text for name, o in outcomes.items() if o.outcome == "failed"}
    assert not failures, failures
    by_impl: dict[str, dict[str, int]] = {}
    for name, outcome in outcomes.items():
        impl = name.split("[", 1)[1].split("-", 1)[0].rstrip("]")
        by_impl.setdefault(impl, {}).setdefault(outcome.outcome, 0)
        by_impl[impl][outcome.outcome] += 1
        if outcome.outcome == "skipped" and "memory" not in name:
            assert ("does not support it" in outcome.text or "is unavailable" in outcome.text
                    or "CUDA graphs need a CUDA device" in outcome.text
                    or "names no custom op" in outcome.text), outcome.text
    assert by_impl["torch_sdpa"].get("passed", 0) >= 20
    assert by_impl["triton_flash"].get("passed", 0) >= 16
    cupy = outcomes[next(name for name in outcomes if "[cupy_naive-" in name and "test_forward" in name)]
    if cupy.outcome == "skipped":  # no GPU here: skipped, with the reason, and the run is not green:
        assert "cupy_naive is unavailable: " in cupy.text  # cupy_naive was asked for and ran nothing
        assert recorder.ret == pytest.ExitCode.TESTS_FAILED
    else:
        assert recorder.ret == 0
