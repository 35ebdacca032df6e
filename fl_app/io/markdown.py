"""Generated blocks in markdown files: the text between ``<!-- generated:NAME -->`` and ``<!-- /generated:NAME -->``
is written by a tool and replaced whole; the rest of the file stays as its authors wrote it."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from fl_app.io.files import replace_file


def markers(name: str) -> tuple[str, str]:
    return f"<!-- generated:{name} -->", f"<!-- /generated:{name} -->"


def replace_block(text: str, name: str, body: str) -> str | None:
    """``text`` with its block ``name`` holding ``body`` (the first such block); None when it has none. A marker
    counts only on a line of its own: one named in prose (say, in backticks) is text, not a block."""
    start, end = markers(name)
    pattern = re.compile(f"^{re.escape(start)}$.*?^{re.escape(end)}$", re.S | re.M)
    new, found = pattern.subn(lambda _: f"{start}\n{body}\n{end}", text, count=1)
    return new if found else None


def replace_blocks(text: str, bodies: dict[str, str]) -> str | None:
    """``text`` with each block of ``bodies`` (name -> body) it has holding its body; None when it has none of them
    (a file may hold only some of a tool's blocks)."""
    found = False
    for name, body in bodies.items():
        new = replace_block(text, name, body)
        if new is not None:
            text, found = new, True
    return text if found else None


def rewrite_blocks(path: Path, bodies: dict[str, str]) -> bool:
    """Rewrite, in the file ``path``, each block of ``bodies`` it has (``replace_blocks``); False when it has none of
    them. The file is written only when it changes, and never through a symlink (``replace_file``)."""
    old = path.read_text()
    new = replace_blocks(old, bodies)
    if new is not None and new != old:
        replace_file(path, new.encode())
    return new is not None


def sync_blocks(path: Path, bodies: dict[str, str], command: str, check: bool = False, shown: str = "") -> int:
    """A generating tool's last step: with ``check``, say whether ``path``'s blocks already hold ``bodies`` (exit
    status 0, else 1: stale, naming ``command``); otherwise rewrite them (2 when the file has none of them)."""
    shown = shown or str(path)
    if check:
        current = path.read_text()
        same = replace_blocks(current, bodies) == current
        print(f"{shown} is up to date" if same else f"{shown}: stale generated blocks; run {command}")
        return 0 if same else 1
    if not rewrite_blocks(path, bodies):
        print(f"error: {shown} has none of the blocks {list(bodies)}", file=sys.stderr)
        return 2
    print(f"wrote {', '.join(bodies)} into {shown}")
    return 0
