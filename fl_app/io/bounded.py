"""Reading a file with its size bounded before anything is allocated for it, and quoting what was read.

    text = read_bounded_text(path, max_bytes=MAX_TABLE_BYTES, max_line=MAX_LINE_CHARS)   # OSError / ValueError
    f"{path}: line 3, column 'round': {shown(cell)} is not a number"

A file larger than ``max_bytes`` is refused from its size alone; lines are read one at a time with at most
``max_line + 1`` characters each, so one huge line is refused after that many characters, not loaded whole.
``shown`` is ``repr`` cut to a readable length: an error never echoes a whole hostile cell.
"""

from __future__ import annotations

import os
from pathlib import Path

MAX_TABLE_BYTES = 256 * 2**20  # a run's CSV or JSON file: kilobytes for the longest runs
MAX_LINE_CHARS = 2**16  # one line of a run's CSV file (a few dozen numbers)
MAX_FIELD_CHARS = 2**10  # one cell of a run's CSV file (a number or a short name)
SHOWN_CHARS = 60


def shown(value, limit: int = SHOWN_CHARS) -> str:
    """``repr(value)``, cut to ``limit`` characters with how many were left out."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text) - limit} more characters)"


def read_bounded_text(path: str | Path, max_bytes: int = MAX_TABLE_BYTES, max_line: int | None = None) -> str:
    """The text of ``path`` (UTF-8); ``ValueError`` naming the file when it is larger than ``max_bytes`` or, given
    ``max_line``, a line is longer than ``max_line`` characters. The size is checked before reading."""
    with open(path, encoding="utf-8", newline="") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size > max_bytes:
            raise ValueError(f"{path}: {size} bytes; allowed: at most {max_bytes}")
        if max_line is None:
            return handle.read(max_bytes + 1)[:max_bytes]
        lines, total = [], 0
        while True:
            line = handle.readline(max_line + 2)  # the line, its end (\r\n) and one character more
            if not line:
                return "".join(lines)
            if len(line.rstrip("\r\n")) > max_line:
                raise ValueError(
                    f"{path}: line {len(lines) + 1} is longer than {max_line} characters "
                    f"(starts {shown(line[:SHOWN_CHARS])})"
                )
            total += len(line)
            if total > max_bytes:  # a file that grew while it was read
                raise ValueError(f"{path}: more than {max_bytes} bytes")
            lines.append(line)
