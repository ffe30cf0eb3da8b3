"""controller/table.py: a Section's rows are built once and rendered to the terminal and to Markdown."""

from __future__ import annotations

import pytest

from pytest_attnkit.controller.table import Cell, Column, Section, markdown_table, terminal_table


def _section(**widths: int) -> Section:
    section = Section([Column("impl", "implementation"), Column("ms", "ms", right=True, width=widths.get("ms", 0)),
                       Column("-v only", None), Column(None, "report only"), Column("verdict", "verdict")])
    section.add("k", "1.5000", "x", "y", Cell("REGRESSION 2/3", "regression"))
    section.add("longer", "12.0000", "x", "y", "unchanged")
    return section


def test_the_terminal_and_markdown_show_the_same_rows_each_with_its_columns() -> None:
    section = _section()
    assert terminal_table(section) == ["impl         ms  -v only  verdict",
                                       "k        1.5000  x        REGRESSION 2/3",
                                       "longer  12.0000  x        unchanged"]
    assert markdown_table(section) == ["| implementation | ms | report only | verdict |", "|---|---|---|---|",
                                       "| k | 1.5000 | y | regression |", "| longer | 12.0000 | y | unchanged |"]


def test_fixed_widths_wrap_a_long_last_cell_under_its_column() -> None:
    section = Section([Column("N", "N", right=True, width=7), Column("note", "note")])
    section.add("1024", "word " * 30)
    lines = terminal_table(section)
    assert lines[0] == "        N  note"
    assert lines[1].startswith("     1024  word") and len(lines) > 2
    assert all(line.startswith(" " * 11 + "word") and len(line) <= 100 for line in lines[2:])


def test_a_row_of_the_wrong_length_is_refused() -> None:
    with pytest.raises(ValueError, match="a row of 2 cells in a table of 1 columns"):
        Section([Column("a", "a")]).add("1", "2")


def _document(tests: list[tuple[str, str]], collected: dict[str, int]) -> dict:
    """A report document for one available implementation ``k``, with tests (suite, outcome)."""
    return {"implementations": {"k": {"status": "available", "capabilities": {}}}, "interrupted": False,
            "tests": [{"impl": "k", "suite": suite, "outcome": outcome, "case": "c", "reason": None}
                      for suite, outcome in tests],
            "collected": {"k": collected}, "memory": [], "properties": [],
            "speed": {"ceilings": {}, "measurements": [], "gate": []}}


def test_a_sanitize_run_s_summary_gives_its_verdict_and_no_rows_of_suites_that_did_not_run() -> None:
    from pytest_attnkit.controller.table import headline_lines

    lines = headline_lines(_document([("sanitize", "passed"), ("sanitize", "failed")], {"sanitize": 2}))
    rows = {line.split()[1 if line.startswith("k") else 0]: line for line in lines}
    assert "sanitize" in rows and "FAIL: 2 of 2 tests run (1 passed, 1 failed)" in rows["sanitize"], lines
    assert rows["correctness"].endswith("not run") and "accuracy" not in rows, lines
    # A run without sanitize has no such row; one with correctness keeps its accuracy row.
    lines = headline_lines(_document([("correctness", "passed")], {"correctness": 1}))
    assert not any(" sanitize " in line for line in lines) and any(" accuracy " in line for line in lines), lines


def test_the_markdown_report_has_a_sanitize_column_only_when_sanitize_ran() -> None:
    from pytest_attnkit.controller.table import markdown

    def header(document: dict) -> str:
        document.update(environment={}, device="cuda", profile="default")
        return next(line for line in markdown(document).splitlines() if line.startswith("| implementation"))

    assert header(_document([("sanitize", "passed")], {"sanitize": 1})).endswith("| gate | sanitize |")
    assert header(_document([("correctness", "passed")], {"correctness": 1})).endswith("| gate |")
