"""tools/flash_bench/gluon_harness.py's parallel compile without a GPU: a configuration that refuses
its case fails that case alone, in words; its group's other cases still compile (session 27's
``-bx16`` at d64 marked every case of its batch "COMPILE FAILED")."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import FLASH_BENCH, flash_bench_module

CHILD = '''
import json, sys
sys.path.insert(0, {tools!r})
import gluon_harness

def compile_one(case):
    if case["id"].startswith("bad"):
        raise ValueError("-bx16: 8 column blocks (d64) do not split into 16 boxes")

cases = json.loads(open(sys.argv[3]).read())
sys.exit(gluon_harness.compile_each(cases, compile_one))
'''


@pytest.fixture(scope="module")
def harness():
    return flash_bench_module("gluon_harness")


def test_a_case_that_raises_fails_alone_and_its_group_goes_on(harness, tmp_path: Path, monkeypatch) -> None:
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(tools=str(FLASH_BENCH)))
    monkeypatch.setattr(harness.os, "cpu_count", lambda: 1)  # one child: every case in one group
    said: list[str] = []
    specs = [{"id": "good-1"}, {"id": "bad-d64"}, {"id": "good-2"}]
    seconds = harness.compile_all(script, specs, tmp_path, said.append)
    assert set(seconds) == {"good-1", "good-2"}
    assert said == ["  COMPILE FAILED: bad-d64: ValueError: -bx16: 8 column blocks (d64) do not split into 16 boxes"]
