"""Text as the terminal shows it: the width every attnkit line keeps to, and wrapping at words.

The views (:mod:`pytest_attnkit.controller.table`), the failure messages
(:mod:`pytest_attnkit.controller.outcome`) and the closing lines of the session and the report
files wrap with :func:`wrap`; words that must paste back as one line (a path, a rerun command)
are joined by :data:`NO_BREAK`. It imports nothing of the package, so every one of them can read
it without importing another.
"""

from __future__ import annotations

import textwrap

WIDTH = 100

#: Joins words that must stay on one line ("report: /a/long/path"): a break there reads badly.
NO_BREAK = "\u00a0"


def wrap(text: str, indent: str = "", width: int = WIDTH) -> list[str]:
    """``text`` wrapped to ``width`` columns, continuation lines indented by ``indent``; a path
    longer than the width stays whole, and words joined by :data:`NO_BREAK` stay together."""
    lines = textwrap.wrap(text, width=width, subsequent_indent=indent, break_on_hyphens=False,
                          break_long_words=False) or [""]
    return [line.replace(NO_BREAK, " ") for line in lines]
