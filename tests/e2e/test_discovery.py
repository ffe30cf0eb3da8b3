"""Discovery by entry point, broken entry points, selection, skip reasons and the header."""

from __future__ import annotations

import re

import pytest

from helpers import fake, run_attnkit, words

SMALL = "b1-h2-q17-k17-d32-fp16-causal"
D64 = "b2-h4:2-q113-k113-d64-fp16-causal"


def test_third_party_distribution_is_discovered_with_both_forms(pytester: pytest.Pytester, fake_dist) -> None:
    fake_dist({"plain_function": fake("good"), "capability_class": fake("HeadDim64Only"), "an_instance": fake("INSTANCE")})
    result = pytester.runpytest("--attnkit", "--attnkit-impl", "plain_function,capability_class,an_instance",
                                "-k", f"{SMALL} or {D64}", "-rs")
    result.stdout.fnmatch_lines([
        "attnkit: device cpu: *",
        "attnkit:   an_instance      available (linear memory, fwd only)",
        "attnkit:                    [[]fake_kernels:INSTANCE from fake-kernels]",
        "attnkit:   capability_class available (linear memory, fwd only)",
        "attnkit:                    [[]fake_kernels:HeadDim64Only from fake-kernels]",
        "attnkit:   plain_function   available (undeclared memory, fwd+bwd)",
        "attnkit:                    [[]fake_kernels:good from fake-kernels]",
    ])
    result.stdout.fnmatch_lines([
        "SKIPPED [[]1[]] *: capability_class does not support it: head_dim=32 (supported: 64)",
        "SKIPPED [[]1[]] *: capability_class does not support it: backward is not supported",
    ], consecutive=False)
    result.assert_outcomes(passed=4 + 1 + 1, skipped=3 + 3)


def test_unavailable_implementation_is_skipped_with_its_reason(pytester: pytest.Pytester, fake_dist) -> None:
    fake_dist({"frob": fake("NeedsFrobnicator")})
    result = pytester.runpytest("--attnkit", "--attnkit-impl", "frob", "-k", SMALL, "-rs")
    result.stdout.fnmatch_lines([
        "attnkit:   frob             unavailable: needs a frobnicator (none found)*",
        "SKIPPED * frob is unavailable: needs a frobnicator (none found)",
    ])
    result.assert_outcomes(skipped=2)


def test_broken_entry_points_fail_alone(pytester: pytest.Pytester, fake_dist) -> None:
    fake_dist(
        {
            "good": fake("good"),
            "missing_module": "no_such_module:attn",
            "missing_attr": fake("no_such_function"),
            "not_an_impl": fake("NotAnImpl"),
            "import_fails": "needs_libfoo:attn",
        },
        extra_modules={"needs_libfoo": "raise ImportError('libfoo.so.1: cannot open shared object file')\n"},
    )
    names = "good,missing_module,missing_attr,not_an_impl,import_fails"
    outcomes, recorder = run_attnkit(pytester, "--attnkit-impl", names, "-k", SMALL)
    assert outcomes[f"test_forward[good-{SMALL}]"].outcome == "passed"
    assert outcomes[f"test_backward[good-{SMALL}]"].outcome == "passed"
    expected = {
        "missing_module": "No module named 'no_such_module'",
        "missing_attr": "no_such_function",
        "not_an_impl": "names the class NotAnImpl, which does not derive from pytest_attnkit.AttentionImpl",
        "import_fails": "libfoo.so.1: cannot open shared object file",
    }
    for name, words in expected.items():
        first = outcomes[f"test_forward[{name}-{SMALL}]"]
        assert first.outcome == "failed" and "could not be loaded from entry point" in first.text and words in first.text
        later = outcomes[f"test_backward[{name}-{SMALL}]"]  # one import error, one failure (issue 44)
        assert later.outcome == "skipped" and f"{name} could not be loaded" in later.text
        assert f"test_forward[{name}-{SMALL}] fails with the traceback" in later.text
    result = pytester.runpytest("--attnkit", "--attnkit-impl", names, "--collect-only")
    result.stdout.fnmatch_lines(["attnkit:   import_fails     BROKEN: ImportError: libfoo.so.1: cannot open shared object file"])


def test_a_declaration_the_harness_does_not_know_fails_the_implementation_and_says_what_it_knows(
        pytester: pytest.Pytester, fake_dist) -> None:
    """dtypes by their short names would match no case (every test skipped, the run green);
    memory_class "Linear" would be judged as no class at all; devices as a bare string is a
    tuple of letters. Each fails the implementation at its first test, naming the values known."""
    fake_dist({"good": fake("good"), "short_dtypes": fake("ShortDtypeNames"), "capital": fake("CapitalMemoryClass")})
    outcomes, recorder = run_attnkit(pytester, "--attnkit-impl", "good,short_dtypes,capital", "-k", SMALL)
    assert outcomes[f"test_forward[good-{SMALL}]"].outcome == "passed"
    expected = {
        "short_dtypes": ["dtypes: 'fp16' is not one of float16, bfloat16, float32, float8_e4m3fn, float8_e5m2 "
                         "('fp16' is the short name of 'float16')", "'bf16' is the short name of 'bfloat16'"],
        "capital": ["memory_class = 'Linear' is not one of linear, quadratic or None",
                    "devices = 'cpu' is a string; it must be a tuple of names, e.g. ('cpu',)"],
    }
    for name, phrases in expected.items():
        first = outcomes[f"test_forward[{name}-{SMALL}]"]
        assert first.outcome == "failed" and "declares what the harness does not know" in first.text, first.text
        for phrase in phrases:
            assert phrase in words(first.text), first.text
    assert recorder.ret == pytest.ExitCode.TESTS_FAILED


def test_declaration_problems_name_each_unknown_value_and_pass_what_the_contract_allows() -> None:
    from pytest_attnkit.contract import AccuracyBudget, AttentionImpl, MemoryClass

    def problems(**declared: object) -> list[str]:
        return type("Impl", (AttentionImpl,), declared)().declaration_problems()

    assert problems() == []
    assert problems(devices=("cuda",), dtypes=("float8_e4m3fn", "bfloat16"), memory_class=MemoryClass.QUADRATIC,
                    accuracy=AccuracyBudget(atol=0.1, rtol=0.1), deterministic="forward") == []
    assert problems(memory_class=None, accuracy="quantized") == [] and problems(memory_class="quadratic") == []
    assert problems(devices=("gpu",)) == ["devices: 'gpu' is not one of cpu, cuda"]
    assert problems(dtypes=("fp32",)) == [
        "dtypes: 'fp32' is not one of float16, bfloat16, float32, float8_e4m3fn, float8_e5m2 "
        "('fp32' is the short name of 'float32')"]
    assert problems(memory_class="neither") == ["memory_class = 'neither' is not one of linear, quadratic or None"]
    assert len(problems(accuracy="loose", deterministic="sometimes", dtypes="float16")) == 3


def test_selection_by_glob_and_by_k(pytester: pytest.Pytester, fake_dist) -> None:
    fake_dist({"good": fake("good"), "good_too": fake("good"), "other": fake("good")})
    result = pytester.runpytest("--attnkit", "--attnkit-impl", "good*", "--collect-only", "-q")
    collected = [line for line in result.stdout.lines if "::test_" in line]
    assert collected and all(re.search(r"\[(good|good_too)[-\]]", line) for line in collected)
    result = pytester.runpytest("--attnkit", "--attnkit-impl", "good,other", "-k", "other", "--collect-only", "-q")
    collected = [line for line in result.stdout.lines if "::test_" in line]
    assert collected and all(re.search(r"\[other[-\]]", line) for line in collected)


def test_unknown_implementation_is_a_usage_error_listing_known_names(pytester: pytest.Pytester, fake_dist) -> None:
    fake_dist({"good": fake("good")})
    result = pytester.runpytest("--attnkit", "--attnkit-impl", "good,nope*")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: attnkit: no implementation matches 'nope*' (command line --attnkit-impl)",
                                 "  known: *good*"])


def test_bundled_suites_skip_without_the_flag(pytester: pytest.Pytester) -> None:
    import pytest_attnkit.suites.test_correctness as suite

    result = pytester.runpytest(suite.__file__, "-rs")
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines(["SKIPPED * attnkit suites run with --attnkit"])


def test_memory_suite_says_why_it_measures_nothing_on_the_cpu(pytester: pytest.Pytester, fake_dist) -> None:
    fake_dist({"good": fake("good")})
    result = pytester.runpytest("--attnkit", "--attnkit-impl", "good", "--attnkit-suite", "memory",
                                "--attnkit-device", "cpu", "-rs")
    # forward and backward: dense, with a window, varlen; and paged forward
    result.assert_outcomes(skipped=7)
    result.stdout.fnmatch_lines(["SKIPPED [[]1[]] *: the memory suite measures the CUDA caching allocator's peaks; "
                                 "this run is on the CPU, where torch keeps no peak statistics, so nothing is measured"])


def test_a_node_id_as_pytest_printed_it_reruns_just_that_test(pytester: pytest.Pytester, fake_dist) -> None:
    fake_dist({"good": fake("good"), "wrong_scale": fake("wrong_scale")})
    node_id = f"pytest_attnkit/suites/test_correctness.py::test_forward[wrong_scale-{SMALL}]"
    failed = pytester.runpytest("--attnkit", "--attnkit-impl=good,wrong_scale", "-k", f"test_forward and {SMALL}")
    failed.stdout.fnmatch_lines([f"FAILED {node_id}*"])
    failed.stdout.fnmatch_lines(["*pytest --attnkit --attnkit-impl=wrong_scale --attnkit-seed=0 -k*"])
    again = pytester.runpytest("--attnkit", node_id)
    again.assert_outcomes(failed=1)
    header = "\n".join(line for line in again.outlines if line.startswith("attnkit:   "))
    assert "wrong_scale" in header and "good" not in header  # only the implementation it names is started


def test_the_header_says_which_path_an_implementation_runs_here(pytester: pytest.Pytester, fake_dist) -> None:
    # triton_flash's forward is a Gluon kernel on Hopper and Triton kernels elsewhere: the header
    # and the report say which one this machine ran. A path_note that raises is shown, not fatal.
    fake_dist({"two_paths": "paths:TwoPaths", "bad_note": "paths:BadNote"}, extra_modules={"paths": """
        from fake_kernels import good
        from pytest_attnkit import AttentionImpl

        class TwoPaths(AttentionImpl):
            def path_note(self, device):
                return f"forward: the portable kernel on {device} (the fast one needs a GPU)"

            def forward(self, q, k, v, *, causal=False, scale=None):
                return good(q, k, v, causal=causal, scale=scale)

        class BadNote(TwoPaths):
            def path_note(self, device):
                raise RuntimeError("no such GPU query")
        """})
    report = pytester.path / "report"
    result = pytester.runpytest("--attnkit", "--attnkit-impl", "two_paths,bad_note", "-k", SMALL,
                                f"--attnkit-report={report}")
    result.stdout.fnmatch_lines([
        "attnkit:   bad_note * available (linear memory, fwd+bwd)*",
        "attnkit: * its path_note() raised RuntimeError: no such GPU query",
        "attnkit:   two_paths * available (linear memory, fwd+bwd)*",
        "attnkit: * forward: the portable kernel on cpu (the fast one needs a GPU)",
    ])
    result.assert_outcomes(passed=4)
    import json

    document = json.loads((report / "attnkit-report.json").read_text())
    assert document["implementations"]["two_paths"]["path_note"].startswith("forward: the portable kernel on cpu")
