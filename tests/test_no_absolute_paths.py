"""No committed file holds a path of the machine that made it, so that results, configs and docs read the same in a
clone at any other path.

The rule, in two parts:

- No file names a machine's workspace or home folder: a path starting at the root of the file system with
  ``work``, ``root``, ``home`` or ``Users`` (examples use placeholders such as ``/path/to/data``, or paths relative
  to the repository such as ``../shared/data/cifar10``).
- Records (JSON, JSON lines, CSV, text and logs, and the values of TOML files) hold no path under ``tmp`` either.
  Prose, code and TOML comments may show a folder there (``/tmp/smoke``) as the one a reader picks for a command.

Files are those git tracks or would add (``git ls-files --cached --others --exclude-standard``); binary files are
skipped, except checkpoints (``.pt``, e.g. a parked run's): torch stores their pickled run config uncompressed, so
their bytes are searched for both kinds of path. A record that holds such a path is fixed with ``python -m
experiments.tools.make_portable FOLDER``; a checkpoint, by ``python -m experiments.runner park`` before it is
committed.
"""

from __future__ import annotations

import io
import re
import tomllib
from pathlib import Path

import torch

from tests.harness.repository import tracked_files

ROOT = Path(__file__).resolve().parents[1]
# a path that starts at the root of the file system: not preceded by a name, a dot, a colon or a slash (URLs, ~/x)
START = r"(?<![\w.:/~-])/"
MACHINE = re.compile(START + r"(?:" + "|".join(["work", "root", "home", "Users"]) + r")/")
SCRATCH = re.compile(START + "tmp/")
RECORDS = (".json", ".jsonl", ".csv", ".txt", ".log")
CHECKPOINTS = (".pt",)


def toml_strings(value) -> list[str]:
    if isinstance(value, dict):
        return [s for item in value.values() for s in toml_strings(item)]
    if isinstance(value, list):
        return [s for item in value for s in toml_strings(item)]
    return [value] if isinstance(value, str) else []


def offences(name: str, text: str) -> list[str]:
    """'file:line: text' for each line breaking the rule."""
    found = []
    lines = text.splitlines()
    scratch_checked = name.endswith(RECORDS)
    for number, line in enumerate(lines, 1):
        if MACHINE.search(line) or (scratch_checked and SCRATCH.search(line)):
            found.append(f"{name}:{number}: {line.strip()[:160]}")
    if name.endswith(".toml"):
        try:
            values = toml_strings(tomllib.loads(text))
        except tomllib.TOMLDecodeError:
            values = []
        found += [f"{name}: value {value!r}" for value in values if SCRATCH.search(value)]
    return found


def checkpoint_offences(name: str, data: bytes) -> list[str]:
    """'file: holds PATH...' for each path of a machine in a checkpoint's bytes."""
    text = data.decode("latin-1")
    found = [m.start() for pattern in (MACHINE, SCRATCH) for m in pattern.finditer(text)]
    return [f"{name}: holds {text[start : start + 60]!r}" for start in sorted(found)]


def test_the_rule_catches_what_it_should_and_nothing_else():
    home = "/" + "home/someone/x"  # spelt in two pieces so that this file does not break its own rule
    assert offences("a.json", f'{{"output-dir": "{home}"}}')
    assert offences("a.csv", "folder\n" + "/" + "tmp/run-1\n")
    assert offences("a.toml", 'data-path = "' + "/" + 'tmp/x"\n')
    assert offences("a.md", "see " + "/" + "work/main/README.md")
    assert not offences("a.md", "python -m tool --out " + "/" + "tmp/smoke")  # a reader's choice of folder
    assert not offences("a.toml", "# --out " + "/" + "tmp/smoke\nx = 1\n")
    assert not offences("a.md", "https://example.org/home/page and ~/work/x and ../shared/data/cifar10")
    for path in (home, "/" + "tmp/x"):
        saved = io.BytesIO()
        torch.save({"run_config": {"output-dir": path, "data-path": "../shared/data/cifar10"}}, saved)
        assert checkpoint_offences("c.pt", saved.getvalue())
    saved = io.BytesIO()
    torch.save({"run_config": {"output-dir": ".", "data-path": "../shared/data/cifar10"}}, saved)
    assert not checkpoint_offences("c.pt", saved.getvalue())


def test_no_committed_file_holds_a_path_of_a_machine():
    found = []
    for name in tracked_files():
        data = (ROOT / name).read_bytes()
        if name.endswith(CHECKPOINTS):
            found += checkpoint_offences(name, data)
            continue
        if b"\0" in data[:8192]:
            continue  # binary (images, model files)
        found += offences(name, data.decode("utf-8", errors="replace"))
    assert not found, f"{len(found)} lines hold a path of a machine:\n" + "\n".join(found[:60])
