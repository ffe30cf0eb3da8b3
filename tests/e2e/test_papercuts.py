"""Papercuts of a first run (issue 44), one test per item: skip reasons cut mid-word, a speed
column that said nothing, pytest-benchmark's noise, one import error in 291 lines, a run green on
nothing it was asked to test, lines too wide, columns that slipped, and a misspelled name."""

from __future__ import annotations

import re
import shlex

import pytest

from helpers import fake, words


# 11. A misspelled implementation name gets a "did you mean", and is still a usage error.
def test_a_misspelled_implementation_name_gets_a_did_you_mean(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--attnkit", "-p", "no:cacheprovider", "--attnkit-impl=torch_spda")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    said = words(result.stderr.str())
    assert ("ERROR: attnkit: no implementation matches 'torch_spda'; did you mean 'torch_sdpa'? "
            "(command line --attnkit-impl) known: ") in said and "torch_sdpa" in said.split("known: ")[1], said
    assert all(len(line) <= 100 for line in result.stderr.lines), result.stderr.lines


PICKY = '''
from fake_kernels import good
from pytest_attnkit import AttentionImpl


class Picky(AttentionImpl):
    """Refuses the 17-token cases with a reason longer than the summary quotes."""

    def not_supported_reasons(self, case, device, *, backward=False):
        reasons = super().not_supported_reasons(case, device, backward=backward)
        if case.seqlen_q == 17:
            reasons.append(LONG_REASON)
        return reasons

    def forward(self, q, k, v, *, causal=False, scale=None):
        return good(q, k, v, causal=causal, scale=scale)


LONG_REASON = "its tiles take no sequence of 17 tokens, only lengths that are multiples of sixteen"
'''
LONG_REASON = "its tiles take no sequence of 17 tokens, only lengths that are multiples of sixteen"
LONG_NAME = "a_kernel_with_a_long_name"


def _summary(result: pytest.RunResult) -> list[str]:
    """The attnkit sections of the terminal summary, up to pytest's short summary or final line."""
    lines = result.outlines
    start = next(i for i, line in enumerate(lines) if "attnkit summary" in line)
    end = next((i for i in range(start, len(lines)) if "short test summary info" in lines[i]
                or re.match(r"=+ .*(passed|failed|skipped|error|deselected|no tests ran).* =+$", lines[i])), len(lines))
    return lines[start:end]


def _label_columns(lines: list[str], labels: tuple[str, ...]) -> dict[str, set[int]]:
    """Per label of the summary's blocks, the columns it starts at."""
    found: dict[str, set[int]] = {label: set() for label in labels}
    for line in lines:
        for label in labels:
            match = re.search(rf"(?:^| ){label} ", line)
            if match and line[:match.start()].strip() in ("", LONG_NAME, "picky"):
                found[label].add(match.start() + (match.group(0)[0] == " "))
    return found


# 1. A skip reason is shortened at a word, with "...", never cut mid-word.
# 2. The speed column says what the speed suite did on a CPU, as the speed table below it does.
# 9. The summary's and the header's columns line up whatever the names' lengths.
def test_the_summary_quotes_whole_words_counts_timed_cases_and_keeps_its_columns(
        pytester: pytest.Pytester, fake_dist) -> None:
    fake_dist({LONG_NAME: fake("good"), "picky": "picky_kernels:Picky"}, extra_modules={"picky_kernels": PICKY})
    result = pytester.runpytest("--attnkit", "-p", "no:cacheprovider", "--attnkit-suite=correctness,speed",
                                f"--attnkit-impl={LONG_NAME},picky", f"--attnkit-reference={LONG_NAME}",
                                "--attnkit-device=cpu", "--benchmark-disable",
                                "-k", "test_forward and (q17-k17 or q113-k113) or speed_forward and not causal")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    summary = _summary(result)
    text = " ".join(" ".join(summary).split())
    # 1.
    quoted = re.search(r"picky correctness .*?\(mostly: ([^)]*)\)", text)
    assert quoted, text
    assert quoted.group(1).endswith(" ..."), quoted.group(1)
    kept = quoted.group(1).removesuffix(" ...")
    assert LONG_REASON.startswith(kept) and LONG_REASON[len(kept)] == " ", quoted.group(1)
    # 2.
    assert text.count(" speed 1 case timed (1 fwd), in the speed table; none at the headline shape") == 2, text
    assert sum(1 for line in summary if re.match(rf"({LONG_NAME}|picky) +fwd ", line)) == 2, "\n".join(summary)
    # 9.
    blocks = summary[1:next(i for i, line in enumerate(summary) if i and line.startswith("==="))]
    columns = _label_columns(blocks, ("correctness", "accuracy", "memory", "speed", "gate"))
    assert all(len(at) == 1 for at in columns.values()) and len(set.union(*columns.values())) == 1, columns
    states = {line.index(" available") for line in result.outlines if line.startswith("attnkit:   ")
              and " available" in line}
    assert len(states) == 1, "\n".join(line for line in result.outlines if line.startswith("attnkit:"))


# 3. pytest-benchmark's header fits in 100 columns, and a speed test that fails before it timed
# anything brings no "fixture was not used" warning.
def test_pytest_benchmark_keeps_to_the_width_and_quiet_on_a_failed_speed_test(
        pytester: pytest.Pytester, fake_dist) -> None:
    pytest.importorskip("pytest_benchmark")
    fake_dist({"raises": fake("raises")})
    result = pytester.runpytest("--attnkit", "-p", "no:cacheprovider", "--attnkit-suite=speed",
                                "--attnkit-impl=raises", "--attnkit-device=cpu", "-k", "speed_forward and not causal")
    result.assert_outcomes(failed=1)
    text = result.stdout.str()
    assert "Benchmark fixture was not used" not in text and "PytestBenchmarkWarning" not in text, text
    # The header's plugins' lines come in an order pytest decides (pytest 9.1 put pytest-benchmark's
    # before attnkit's, 9.2 after): the header is everything before pytest's "rootdir:" line.
    header = result.outlines[:next(i for i, line in enumerate(result.outlines) if line.startswith("rootdir:"))]
    benchmark = [line for line in header if line.startswith("benchmark:")]
    assert len(benchmark) >= 2 and benchmark[0].startswith("benchmark: "), "\n".join(header)
    assert all(len(line) <= 100 for line in benchmark), "\n".join(header)


# 4. One import error costs a few lines: named once in the header, one failure with the
# traceback, and the implementation's other tests skipped with a reference to it.
def test_an_entry_point_that_does_not_import_fails_once(pytester: pytest.Pytester, fake_dist) -> None:
    fake_dist({"mykern": "mykern.nosuchmodule:attn"})
    result = pytester.runpytest("--attnkit", "-p", "no:cacheprovider", "--attnkit-impl=mykern",
                                "--attnkit-suite=correctness,properties")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    outcomes = result.parseoutcomes()
    assert outcomes["failed"] == 1 and outcomes["skipped"] > 10, outcomes
    text = result.stdout.str()
    assert text.count("No module named 'mykern'") <= 3, text  # the header, the failure, its summary line
    assert len(result.outlines) < 80, text
    result.stdout.fnmatch_lines(["attnkit:   mykern * BROKEN: ModuleNotFoundError: No module named 'mykern'"])


CUDA_ONLY = '''
from fake_kernels import good
from pytest_attnkit import AttentionImpl


class MyFlash(AttentionImpl):
    """The README's example class: CUDA only."""
    devices = ("cuda",)
    dtypes = ("float16", "bfloat16")
    head_dims = (64, 128)
    supports_backward = False
    memory_class = "linear"

    def forward(self, q, k, v, *, causal=False, scale=None):
        return good(q, k, v, causal=causal, scale=scale)
'''


# 5. An implementation that --attnkit-impl asked for and that ran nothing, being unavailable,
# makes the run fail and says what to do; without --attnkit-impl an unavailable one is reported.
def test_a_run_that_tested_nothing_it_was_asked_for_fails(pytester: pytest.Pytester, fake_dist) -> None:
    fake_dist({"my_flash": "cuda_only:MyFlash"}, extra_modules={"cuda_only": CUDA_ONLY})
    result = pytester.runpytest("--attnkit", "-p", "no:cacheprovider", "--attnkit-impl=my_*",
                                "--attnkit-suite=correctness", "--attnkit-device=cpu")
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    assert result.parseoutcomes().get("passed", 0) == 0
    text = " ".join(" ".join(result.outlines).split())
    assert ("my_flash was asked for (--attnkit-impl=my_*) and ran no test: it is unavailable here (runs on "
            "cuda, not cpu). Run it where it is available, or leave it out of --attnkit-impl.") in text, text


def test_without_attnkit_impl_an_unavailable_implementation_is_only_reported() -> None:
    from pytest_attnkit.controller.session import asked_for_but_untested

    document = {"implementations": {"cupy_naive": {"status": "unavailable", "reason": "CUDA only"},
                                    "torch_sdpa": {"status": "available", "reason": None}},
                "tests": [{"impl": "torch_sdpa", "outcome": "passed"}, {"impl": "cupy_naive", "outcome": "skipped"}]}
    assert asked_for_but_untested(document, []) == []
    [said] = asked_for_but_untested(document, ["cupy_naive", "torch_sdpa"])
    assert said.startswith("cupy_naive was asked for (--attnkit-impl=cupy_naive,torch_sdpa) and ran no test")


NARROW = '''
from fake_kernels import good
from pytest_attnkit import AttentionImpl


class Narrow(AttentionImpl):
    """Legal, but the smoke set has no case at head dim 96."""
    dtypes = ("float16", "bfloat16", "float32")
    head_dims = (96,)
    supports_backward = False
    memory_class = "linear"

    def forward(self, q, k, v, *, causal=False, scale=None):
        return good(q, k, v, causal=causal, scale=scale)
'''


# 5b. One that ran nothing because every test it had was skipped fails the run the same way: its
# declarations refused them all (named), or the suites chosen cannot run here (said apart).
def test_a_named_implementation_whose_tests_were_all_skipped_fails_the_run(pytester: pytest.Pytester,
                                                                           fake_dist) -> None:
    fake_dist({"narrow": "narrow:Narrow"}, extra_modules={"narrow": NARROW})
    result = pytester.runpytest("--attnkit", "-p", "no:cacheprovider", "--attnkit-impl=narrow",
                                "--attnkit-suite=correctness", "--attnkit-device=cpu")
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    text = " ".join(" ".join(result.outlines).split())
    assert "narrow was asked for (--attnkit-impl=narrow) and ran no test: its declarations refuse all " in text, text
    assert "(most often: head_dim=" in text and "Declare what it runs (docs/contract.md)" in text, text
    # The default suites on the CPU: the memory suite's tests skip for the CPU, the rest are refused.
    everything = pytester.runpytest("--attnkit", "-p", "no:cacheprovider", "--attnkit-impl=narrow",
                                    "--attnkit-device=cpu")
    assert everything.ret == pytest.ExitCode.TESTS_FAILED, everything.stdout.str()
    text = " ".join(" ".join(everything.outlines).split())
    assert "narrow was asked for (--attnkit-impl=narrow) and ran no test: all " in text, text
    assert "its declarations refuse " in text and "(most often: head_dim=" in text, text
    unnamed = pytester.runpytest("--attnkit", "-p", "no:cacheprovider", "--attnkit-suite=correctness",
                                 "--attnkit-device=cpu", "-k", "narrow")
    assert unnamed.ret == pytest.ExitCode.OK, unnamed.stdout.str()  # not asked for by name: only reported


def test_the_words_say_whether_the_declarations_or_the_suites_skipped_the_tests() -> None:
    from pytest_attnkit.controller.session import asked_for_but_untested

    gpu_only = {"impl": "k", "outcome": "skipped", "reason": "needs a CUDA GPU", "suite": "sanitize"}
    narrow = {"impl": "k", "outcome": "skipped", "reason": "head_dim=64 (supported: 96)", "refused": True}
    document = {"implementations": {"k": {"status": "available", "reason": None}}, "tests": [gpu_only, narrow]}
    [said] = asked_for_but_untested(document, ["k"])
    assert "all 2 selected here were skipped (most often: needs a CUDA GPU); its declarations refuse 1 of " \
           "them (most often: head_dim=64 (supported: 96))" in said, said
    document["tests"] = [gpu_only]
    [said] = asked_for_but_untested(document, ["k"])
    assert "(most often: needs a CUDA GPU). Run it where its suites can run" in said, said
    document["tests"] = [narrow]
    [said] = asked_for_but_untested(document, ["k"])
    assert "its declarations refuse all 1 selected here (most often: head_dim=64 (supported: 96))" in said
    document["tests"] = [narrow, {"impl": "k", "outcome": "passed", "reason": None}]
    assert asked_for_but_untested(document, ["k"]) == []  # one ran
    document["tests"] = []  # every test deselected (-k): nothing was selected to skip
    assert asked_for_but_untested(document, ["k"]) == []


# 6. Failure messages keep to 100 columns, wrapped at words with nothing cut; a rerun command
# stays on one line so that it pastes back.
def test_failure_messages_keep_to_100_columns(pytester: pytest.Pytester, fake_dist) -> None:
    fake_dist({"wrong_scale": fake("wrong_scale"), "raises": fake("raises")})
    result = pytester.runpytest("--attnkit", "-p", "no:cacheprovider", "--attnkit-suite=correctness",
                                "--attnkit-impl=wrong_scale,raises", "-k", "test_forward and q113-k113-d64")
    assert result.parseoutcomes()["failed"] >= 2
    failures = result.outlines[result.outlines.index(next(line for line in result.outlines if "= FAILURES =" in line)):]
    # What cannot break stays whole: a path, a rerun command; pytest's own FAILED lines are not attnkit's.
    wide = [line for line in failures if len(line) > 100 and " " in line.strip()
            and not line.startswith("rerun: pytest --attnkit ") and not line.startswith("FAILED ")]
    assert not wide, "\n".join(wide)
    text = " ".join(" ".join(failures).split())
    # Nothing cut: the figures of the comparison are all there, and the rerun command is whole.
    assert re.search(r"out: max error \S+ exceeds allowed \S+ .* cosine \S+, RMSE \S+", text), text
    # The command is the failure's last line, alone, so that it pastes back as printed.
    assert re.search(r"^rerun: pytest --attnkit --attnkit-impl=wrong_scale --attnkit-seed=0 -k "
                     r"'test_forward\[wrong_scale-b\S+\]'$", "\n".join(failures), re.MULTILINE), "\n".join(failures)


# The rerun line pastes back as printed: run it, and the one test it names fails the same way,
# even where its case's id begins another's (the smoke set's ...-causal and ...-causal-w16:0-lse).
def test_the_rerun_line_reruns_the_failure_as_printed(pytester: pytest.Pytester, fake_dist) -> None:
    fake_dist({"wrong_scale": fake("wrong_scale")})
    # The smoke set's case, on any machine: the rerun line repeats the device the run was given.
    first = pytester.runpytest("--attnkit", "-p", "no:cacheprovider", "--attnkit-suite=correctness",
                               "--attnkit-impl=wrong_scale", "--attnkit-device=cpu", "-k",
                               "test_forward and q203-k113-d64")
    assert first.parseoutcomes().get("failed", 0) + first.parseoutcomes().get("skipped", 0) >= 2, first.outlines
    [line] = [line for line in first.outlines if line.startswith("rerun: ") and "-lse" not in line]
    command = shlex.split(line.removeprefix("rerun: "))  # as a shell reads the pasted line
    assert command[:2] == ["pytest", "--attnkit"] and "--attnkit-device=cpu" in command, line
    again = pytester.runpytest(*command[1:], "-p", "no:cacheprovider")
    assert {k: v for k, v in again.parseoutcomes().items() if k != "deselected"} == {"failed": 1}, again.outlines
    assert [line for line in again.outlines if line.startswith("rerun: ")] == [line]
