"""A wrong result says what it looks like (issue 44): the diagnosis of pytest_attnkit/worker/diagnosis.py.

Each kernel of tests/fakes/buggy_kernels.py carries one common bug, planted in torch's SDPA or in a
float32 attention of its own (not the oracle). Every kernel runs on every case below through the
worker's own check (in this process, for speed): a kernel gets its bug named wherever the bug
shows, and never a suspect of another bug; a correct kernel passes, and a kernel wrong by random
noise fails with nothing named. One inner ``pytest --attnkit`` run proves the line reaches the
failure message, within 100 columns.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from helpers import run_attnkit
from pytest_attnkit.contract import AttentionImpl, Case, FunctionImpl
from pytest_attnkit.messages import Status

torch = pytest.importorskip("torch")

from pytest_attnkit.worker.correctness import run_correctness  # noqa: E402
from pytest_attnkit.worker.diagnosis import SUSPECTS, WIDTH  # noqa: E402

BUGGY_PATH = Path(__file__).parents[1] / "fakes" / "buggy_kernels.py"
_spec = importlib.util.spec_from_file_location("buggy_kernels", BUGGY_PATH)
assert _spec is not None and _spec.loader is not None
buggy = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(buggy)

DENSE = Case(1, 2, 2, 100, 100, 64, "float16")
CAUSAL = Case(1, 2, 2, 113, 203, 40, "float32", causal=True)
GQA = Case(2, 4, 2, 113, 113, 64, "float16", causal=True)
WINDOW = Case(1, 2, 2, 113, 113, 64, "float16", causal=True, window=(32, 0))
TWO_SIDED = Case(1, 4, 2, 113, 203, 64, "float32", window=(32, 16))
SOFTCAP = Case(1, 2, 2, 113, 113, 64, "float16", causal=True, softcap=15.0, logit_scale=4.0)
SINKS = Case(1, 2, 2, 100, 100, 64, "float32", causal=True, sinks=True, return_lse=True)
LSE = Case(1, 2, 2, 64, 64, 64, "float32", return_lse=True)
VARLEN = Case.packed((300, 7, 7, 7, 0, 50), (300, 30, 0, 7, 9, 64), 2, 2, 64, "float32")
PAGED = Case.paged(1, (300, 17, 1, 64), 16, 4, 1, 64, "float16")
CASES = (DENSE, CAUSAL, GQA, WINDOW, TWO_SIDED, SOFTCAP, SINKS, LSE, VARLEN, PAGED)
ALL_DENSE = (DENSE, CAUSAL, GQA, WINDOW, TWO_SIDED, SOFTCAP, SINKS, LSE)

#: Each buggy kernel: the suspect its bug must get named, and the cases where the bug shows.
#: On every other case the kernel passes, or fails with nothing named.
KERNELS: dict[str, tuple[str, tuple[Case, ...]]] = {
    "sdpa_is_causal": ("causal-top-left", (CAUSAL,)),
    "CausalMissing": ("causal-missing", (CAUSAL, GQA, SOFTCAP, SINKS)),
    "CausalUnasked": ("causal-unasked", (DENSE, TWO_SIDED, LSE, VARLEN)),
    "ScaleOne": ("scale-one", CASES),
    "ScaleTwice": ("scale-squared", CASES),
    "GqaModulo": ("gqa-modulo", (GQA, TWO_SIDED)),
    "WindowLeftWider": ("window-left-wider", (WINDOW, TWO_SIDED)),
    "WindowLeftNarrower": ("window-left-narrower", (WINDOW, TWO_SIDED)),
    "WindowRightWider": ("window-right-wider", (TWO_SIDED,)),
    "WindowRightNarrower": ("window-right-narrower", (TWO_SIDED,)),
    "SoftcapFirst": ("softcap-before-scale", (SOFTCAP,)),
    "LseBase2": ("lse-base-2", (SINKS, LSE)),
    "LseWithoutSinks": ("lse-without-sinks", (SINKS,)),
    "SinksIgnored": ("sinks-ignored", (SINKS,)),
    "VarlenNeighbourKeys": ("varlen-neighbour-keys", (VARLEN,)),
    "PagedInPageOrder": ("paged-page-order", (PAGED,)),
    "KeysTail64": ("keys-tail-64", (DENSE, CAUSAL, GQA, WINDOW, TWO_SIDED, SOFTCAP, SINKS)),
    "QueriesTail64": ("queries-tail-64", (DENSE, CAUSAL, GQA, WINDOW, TWO_SIDED, SOFTCAP, SINKS)),
    "RowsSkipped": ("rows-unwritten", ALL_DENSE),
}


def _impl(name: str) -> AttentionImpl:
    target = getattr(buggy, name)
    return target() if isinstance(target, type) else FunctionImpl(target)


def _named(message: str) -> list[str]:
    return [suspect.name for suspect in SUSPECTS if suspect.line() in message]


def _check(impl: AttentionImpl, case: Case, *, backward: bool = False):
    if impl.not_supported_reasons(case, "cpu", backward=backward):
        return None
    return run_correctness(impl, case, device="cpu", base_seed=0, trials=1, backward=backward)


def test_every_suspect_has_a_kernel_that_proves_it() -> None:
    proven = {suspect for suspect, _ in KERNELS.values()}
    # The other tiles' suspects are the 64 one's, with another tile size.
    assert {suspect.name for suspect in SUSPECTS} - proven == {"keys-tail-128", "keys-tail-16", "queries-tail-128",
                                                               "queries-tail-16"}


@pytest.mark.parametrize("kernel", sorted(KERNELS))
def test_a_bug_is_named_where_it_shows_and_no_other_is(kernel: str) -> None:
    expected, showing = KERNELS[kernel]
    impl = _impl(kernel)
    for case in CASES:
        reply = _check(impl, case)
        if reply is None:
            continue
        named = _named(reply.message)
        if case in showing:
            assert reply.status is Status.WRONG and named == [expected], (case.id, named, reply.message)
        else:
            assert named == [], (case.id, named, reply.message)


@pytest.mark.parametrize("kernel", ["Correct", "Perturbed"])
def test_right_or_randomly_wrong_kernels_get_no_diagnosis(kernel: str) -> None:
    impl = _impl(kernel)
    for case in CASES:
        reply = _check(impl, case)
        assert reply is not None
        if kernel == "Correct":
            assert reply.status is Status.OK, (case.id, reply.message)
        elif case.kind == "dense":
            assert reply.status is Status.WRONG, case.id
        assert "looks like:" not in reply.message, (case.id, reply.message)


@pytest.mark.parametrize(("kernel", "case"), [("sdpa_is_causal", CAUSAL), ("KeysTail64", GQA), ("LseBase2", SINKS),
                                              ("GqaModulo", TWO_SIDED)])
def test_backward_failures_are_diagnosed_with_the_suspects_gradients(kernel: str, case: Case) -> None:
    reply = _check(_impl(kernel), case, backward=True)
    assert reply is not None and reply.status is Status.WRONG
    assert _named(reply.message) == [KERNELS[kernel][0]], reply.message


def test_nan_only_on_rows_that_see_no_key_is_named_and_nan_elsewhere_is_not() -> None:
    """No wrong reference holds NaN, so the rows that see no key are read from where the NaN are
    (diagnosis.keyless_rows_nonfinite): named when every NaN lies there, and only then."""
    more_queries = Case(1, 2, 2, 203, 113, 64, "float32", causal=True)  # rows 0-89 see no key
    for backward in (False, True):
        reply = _check(_impl("KeylessRowsNaN"), more_queries, backward=backward)
        assert reply is not None and reply.status is Status.WRONG
        assert ("looks like: NaN or Inf on 90 of the 90 query rows that see no key (causal with Nq > Nk)"
                in " ".join(reply.message.split())), reply.message
        assert all(len(line) <= WIDTH for line in reply.message.splitlines() if "looks like" in line)
    for case in (DENSE, CAUSAL, GQA, TWO_SIDED):  # every row sees a key: the bug does not show
        reply = _check(_impl("KeylessRowsNaN"), case)
        assert reply is not None and reply.status is Status.OK, (case.id, reply.message)
    for case in (DENSE, more_queries):  # a NaN on a row that sees keys: nothing named
        reply = _check(_impl("NaNOnARowWithKeys"), case)
        assert reply is not None and reply.status is Status.WRONG and "looks like" not in reply.message, reply.message


def test_each_line_fits_and_links_a_heading_that_exists() -> None:
    docs = Path(__file__).parents[2]
    for suspect in SUSPECTS:
        assert all(len(line) <= WIDTH for line in suspect.line().splitlines()), suspect.line()
        page, anchor = suspect.anchor.split("#")
        headings = re.findall(r"^#+ (.+)$", (docs / page).read_text(encoding="utf-8"), re.MULTILINE)
        slugs = {re.sub(r"[\s]+", "-", re.sub(r"[^\w\s-]", "", heading).strip().lower()) for heading in headings}
        assert anchor in slugs, (suspect.name, anchor)


def test_the_failure_message_says_what_the_result_looks_like(pytester: pytest.Pytester, fake_dist) -> None:
    fake_dist({"sdpa_is_causal": "buggy_kernels:sdpa_is_causal", "gqa_modulo": "buggy_kernels:GqaModulo",
               "correct": "buggy_kernels:Correct"}, extra_modules={"buggy_kernels": BUGGY_PATH.read_text()})
    outcomes, _ = run_attnkit(pytester, "--attnkit-impl=sdpa_is_causal,gqa_modulo,correct", "-k",
                              f"test_forward and ({CAUSAL.id} or {GQA.id})")
    top_left = outcomes[f"test_forward[sdpa_is_causal-{CAUSAL.id}]"]
    assert top_left.outcome == "failed"
    assert ("looks like: the causal mask aligned top-left (torch SDPA's is_causal does this; the contract aligns"
            in top_left.text), top_left.text
    assert "docs/contract.md#what-an-implementation-is-handed" in top_left.text
    assert outcomes[f"test_forward[sdpa_is_causal-{GQA.id}]"].outcome == "passed"
    modulo = outcomes[f"test_forward[gqa_modulo-{GQA.id}]"]
    assert modulo.outcome == "failed" and "looks like: query head h reading KV head h % Hkv" in modulo.text
    for case in (CAUSAL, GQA):
        assert outcomes[f"test_forward[correct-{case.id}]"].outcome == "passed"
