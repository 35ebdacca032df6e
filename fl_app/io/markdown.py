"""Generated blocks in markdown files: the text between ``<!-- generated:NAME (COMMAND) -->`` and
``<!-- /generated:NAME -->`` is written by a tool and replaced whole; the rest of the file stays as its authors wrote
it.

COMMAND, in the start marker, is the command that regenerates the block (``tests/test_docs.py`` checks every committed
block names one); a bare ``<!-- generated:NAME -->`` still reads. A tool rewriting a block keeps its start marker."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from fl_app.io.files import replace_file

# a start marker on a line of its own, with the command that regenerates the block or (older files) without
START = re.compile(r"^<!-- generated:(?P<name>[\w.-]+)(?: \((?P<command>[^\n]+)\))? -->$", re.M)


def markers(name: str, command: str = "") -> tuple[str, str]:
    start = f"<!-- generated:{name} ({command}) -->" if command else f"<!-- generated:{name} -->"
    return start, f"<!-- /generated:{name} -->"


def _block(name: str) -> re.Pattern:
    start = re.escape(f"<!-- generated:{name}") + r"(?: \((?P<command>[^\n]+)\))? -->"
    return re.compile(f"^(?P<start>{start})$\n?(?P<body>.*?)\n?^{re.escape(markers(name)[1])}$", re.S | re.M)


def replace_each(text: str, name: str, body_of) -> tuple[str, int]:
    """``text`` with every block ``name`` holding ``body_of(command)`` (the command its start marker names, "" for a
    bare marker), and how many there were; each start marker is kept as written."""
    return _block(name).subn(lambda m: f"{m['start']}\n{body_of(m['command'] or '')}\n{markers(name)[1]}", text)


def replace_block(text: str, name: str, body: str) -> str | None:
    """``text`` with its block ``name`` holding ``body`` (the first such block); None when it has none. A marker
    counts only on a line of its own: one named in prose (say, in backticks) is text, not a block. The start marker
    (and the command it names) is kept."""
    match = _block(name).search(text)
    if match is None:
        return None
    return f"{text[: match.start()]}{match['start']}\n{body}\n{markers(name)[1]}{text[match.end() :]}"


def block_body(text: str, name: str) -> str | None:
    """The text of ``text``'s first block ``name`` (None when it has none)."""
    match = _block(name).search(text)
    return None if match is None else match["body"]


def generated_blocks(text: str) -> list[tuple[str, str]]:
    """(name, command) of every block's start marker in ``text`` (command "" where the marker names none)."""
    return [(m["name"], m["command"] or "") for m in START.finditer(text)]


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


def rewrite_each(paths, bodies: dict[str, str]) -> None:
    """``rewrite_blocks`` in each file of ``paths``; a ValueError naming the first file that has none of the blocks
    (a study's ``--readme``: a file without the block is a mistyped path, not a file to skip)."""
    for path in paths:
        if not rewrite_blocks(path, bodies):
            raise ValueError(f"{path}: no {' or '.join(markers(name)[0] for name in bodies)} block to rewrite")


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
