"""Generated blocks in markdown files: the text between ``<!-- generated:NAME -->`` and ``<!-- /generated:NAME -->``
is written by a tool and replaced whole; the rest of the file stays as its authors wrote it."""

from __future__ import annotations

import re


def markers(name: str) -> tuple[str, str]:
    return f"<!-- generated:{name} -->", f"<!-- /generated:{name} -->"


def replace_block(text: str, name: str, body: str) -> str | None:
    """``text`` with its block ``name`` holding ``body`` (the first such block); None when it has none."""
    start, end = markers(name)
    pattern = re.compile(re.escape(start) + ".*?" + re.escape(end), re.S)
    new, found = pattern.subn(lambda _: f"{start}\n{body}\n{end}", text, count=1)
    return new if found else None
