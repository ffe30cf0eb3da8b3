"""Option values: validated, with the source of a bad value named, and exit code 4."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--attnkit-profile", "huge"], "*argument --attnkit-profile: 'huge' is not one of: auto, smoke, default, full"),
        (["--attnkit-device", "tpu"], "*argument --attnkit-device: 'tpu' is not one of: auto, cpu, cuda"),
        (["--attnkit-trials", "0"], "*argument --attnkit-trials: '0' must be at least 1"),
        (["--attnkit-timeout", "soon"], "*argument --attnkit-timeout: 'soon' is not a number"),
        (["--attnkit-sanitizer", "/nowhere/compute-sanitizer"],
         "*argument --attnkit-sanitizer: '/nowhere/compute-sanitizer' is neither an executable file nor a program on the PATH"),
        # Suites installed in this environment (the example suite) come after the bundled five.
        (["--attnkit-suite", "speed,colour"],
         "*unknown suite 'colour' (known: correctness, memory, speed, properties, sanitize, *or all)"),
    ],
)
def test_bad_command_line_values(pytester: pytest.Pytester, args: list[str], message: str) -> None:
    result = pytester.runpytest("--attnkit", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def test_bad_environment_value_names_the_variable(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATTNKIT_PROFILE", "huge")
    result = pytester.runpytest("--attnkit")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: attnkit: bad value in environment variable ATTNKIT_PROFILE: 'huge' is not one of:*"])


def test_bad_ini_value_names_the_option(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nattnkit_trials = many\n")
    result = pytester.runpytest("--attnkit")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: attnkit: bad value in ini option attnkit_trials: 'many' is not a whole number"])


def test_command_line_wins_over_environment_over_ini(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_attnkit.controller.options import resolve

    pytester.makeini("[pytest]\nattnkit_seed = 1\nattnkit_trials = 3\nattnkit_profile = full\n")
    monkeypatch.setenv("ATTNKIT_SEED", "2")
    monkeypatch.setenv("ATTNKIT_PROFILE", "default")
    config = pytester.parseconfig("--attnkit-seed", "5")
    settings = resolve(config)
    assert (settings.seed, settings.profile, settings.trials) == (5, "default", 3)
    assert settings.sources["seed"] == "command line --attnkit-seed"
    assert settings.sources["profile"] == "environment variable ATTNKIT_PROFILE"
    assert settings.sources["trials"] == "ini option attnkit_trials"
    assert settings.sources["device"] == "default"


def test_cuda_without_a_gpu_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytest.importorskip("torch")
    import subprocess
    import sys

    has_cuda = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
                              capture_output=True, text=True).stdout.strip() == "True"
    if has_cuda:
        pytest.skip("this machine has a CUDA device")
    result = pytester.runpytest("--attnkit", "--attnkit-device", "cuda")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: attnkit: device cuda was asked for (command line --attnkit-device) but torch sees no CUDA device*"])


def test_the_ab_gate_has_a_threshold_of_its_own(pytester: pytest.Pytester) -> None:
    """Paired in one process, the A/B gate has no between-process drift to absorb: 2%, not the 8%."""
    from pytest_attnkit.controller.options import resolve

    settings = resolve(pytester.parseconfig())
    assert (settings.threshold, settings.against_threshold) == (0.08, 0.02)
    assert resolve(pytester.parseconfig("--attnkit-against-threshold", "3%")).against_threshold == 0.03
    result = pytester.runpytest("--attnkit", "--attnkit-against-threshold", "0.5")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--attnkit-against-threshold*"])
