"""tools/flash_bench/share_check.py, the GPU check of kernels called from several processes at once
(the Gluon backward hung so: implementations/triton_flash/NOTES.md v26), on the CPU: its own
processes run, with stand-ins for a running kernel (spin) and a hung one (stall)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[2] / "tools" / "flash_bench" / "share_check.py"


def share_check(*words: str, tmp_path: Path) -> tuple[int, dict, str]:
    out = tmp_path / "record.json"
    result = subprocess.run([sys.executable, str(TOOL), *words, "--seconds", "2", "--stall", "6", "--out", str(out)],
                            capture_output=True, text=True, timeout=120)
    return result.returncode, json.loads(out.read_text()) if out.exists() else {}, result.stdout + result.stderr


@pytest.mark.timing  # a stall of seconds: another test's load must not stretch a running one's
def test_a_process_that_stops_finishing_calls_is_named_hung_and_the_others_finish(tmp_path: Path) -> None:
    code, record, text = share_check("--run", "spin", "--run", "stall", "--run", "spin", tmp_path=tmp_path)
    assert code == 2, text
    verdicts = [row["verdict"] for row in record["processes"]]
    assert verdicts[0] == "ok" and verdicts[2] == "ok" and verdicts[1].startswith("HUNG"), verdicts
    assert record["processes"][0]["calls"] > 0 and record["processes"][1]["calls"] == 0
    assert all(len(line) <= 100 for line in text.splitlines()), text


@pytest.mark.timing
def test_processes_that_all_finish_pass(tmp_path: Path) -> None:
    code, record, text = share_check("--run", "spin", "--run", "spin", tmp_path=tmp_path)
    assert code == 0 and [row["verdict"] for row in record["processes"]] == ["ok", "ok"], text


def test_a_bad_run_is_a_usage_error_naming_the_word(tmp_path: Path) -> None:
    code, _, text = share_check("--run", "bwd d128 cusal", tmp_path=tmp_path)
    assert code == 4 and "'cusal'" in text, text
