"""The project's own test rule (tests/alone.py): under ``pytest -n``, a test marked ``timing`` runs
with no other test beside it, plain or timing, and the rest still run two at a time."""

from __future__ import annotations

import json
import os
from itertools import combinations
from pathlib import Path

import pytest

pytest.importorskip("xdist")

TESTS = '''
import json, os, time
import pytest

def _record(name, seconds):
    started = time.monotonic()
    time.sleep(seconds)
    with open(os.environ["INTERVALS"], "a") as out:
        out.write(json.dumps([name, started, time.monotonic()]) + "\\n")

MARK
@pytest.mark.parametrize("n", range(2))
def test_timed(n):
    _record(f"timed{n}", 0.8)

@pytest.mark.parametrize("n", range(10))
def test_plain(n):
    _record(f"plain{n}", 0.2)
'''


def _intervals(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
               marked: bool) -> dict[str, tuple[float, float]]:
    out = pytester.path / "intervals.jsonl"
    pytester.makepyfile(test_inner=TESTS.replace("MARK", "@pytest.mark.timing" if marked else ""))
    monkeypatch.setenv("INTERVALS", str(out))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(Path(__file__).parents[1]),
                                                                   os.environ.get("PYTHONPATH")])))
    result = pytester.runpytest_subprocess("-p", "alone", "-n", "2", "-p", "no:cacheprovider", "-q")
    assert result.ret == 0, result.stdout.str()
    return {name: (start, end) for name, start, end in map(json.loads, out.read_text().splitlines())}


@pytest.mark.parametrize("marked", [True, False], ids=["marked", "unmarked"])
def test_a_timing_test_runs_alone_and_the_rest_two_at_a_time(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                                                             marked: bool) -> None:
    intervals = _intervals(pytester, monkeypatch, marked)
    assert len(intervals) == 12
    beside = {(a, b) for (a, (a0, a1)), (b, (b0, b1)) in combinations(sorted(intervals.items()), 2)
              if a0 < b1 and b0 < a1}
    assert any(a.startswith("plain") and b.startswith("plain") for a, b in beside), "nothing ran side by side"
    with_timed = sorted(pair for pair in beside if "timed0" in pair or "timed1" in pair)
    if marked:
        assert not with_timed, f"beside a timing test: {with_timed}"
    else:  # the check can fail: unmarked, the two timing tests run beside other tests
        assert with_timed
