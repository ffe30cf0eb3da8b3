"""Papercuts of a first run (issue 44), one test per item: skip reasons cut mid-word, a speed
column that said nothing, pytest-benchmark's noise, one import error in 291 lines, a run green on
nothing it was asked to test, lines too wide, columns that slipped, and a misspelled name."""

from __future__ import annotations

import pytest


# 11. A misspelled implementation name gets a "did you mean", and is still a usage error.
def test_a_misspelled_implementation_name_gets_a_did_you_mean(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--attnkit", "-p", "no:cacheprovider", "--attnkit-impl=torch_spda")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: attnkit: no implementation matches 'torch_spda'; "
                                 "did you mean 'torch_sdpa'? (known: *torch_sdpa*) (command line --attnkit-impl)"])
