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
