"""Table cells made safe for where they are written: a text cell of a CSV file never starts a spreadsheet formula,
a markdown table cell never ends its row or starts another.

    spreadsheet_cell("=HYPERLINK(...)")  -> "'=HYPERLINK(...)"   spreadsheet_cell("-1.2 ± 0.3") -> unchanged
    markdown_cell("a | b\\n| forged |")  -> "a \\| b  \\| forged \\|"

Labels and run-config values reach the tables from files anyone can edit; numbers and their printed estimates are
written unchanged, so an honest report's files stay as they were.
"""

from __future__ import annotations

import re

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")  # what spreadsheets read as the start of a formula
# a printed number or estimate ('-1.2 ± 0.3', '-4.5e-03', '1,234/5,678'): a sign here starts no formula
NUMERIC_TEXT = re.compile(r"[-+]?[0-9.,eE+\- ±%/–]*")


def spreadsheet_cell(value):
    """``value`` unchanged unless it is text a spreadsheet would read as a formula: then prefixed with ``'``."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS) and not NUMERIC_TEXT.fullmatch(value):
        return "'" + value
    return value


def markdown_cell(value) -> str:
    """``str(value)`` with ``|`` escaped and line breaks made spaces, so it stays one cell of one row."""
    return re.sub(r"\r\n|\r|\n", " ", str(value).replace("|", "\\|"))
