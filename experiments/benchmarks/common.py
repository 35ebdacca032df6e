"""The benchmarks' shared command-line convention: a result is one JSON line on stdout, and ``--out FILE`` also
writes it to a new file, refused before anything is measured when something is already there (no result is ever
overwritten, and no measurement is lost to a name taken at the end)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fl_app.io.files import existing_output, write_own_file


def add_out_option(parser: argparse.ArgumentParser, what: str = "the JSON line") -> None:
    parser.add_argument("--out", type=Path, help=f"also write {what} to this file (default: none)")


def refuse_existing_out(parser: argparse.ArgumentParser, out: Path | None) -> None:
    """Exit with the parser's usage error when ``--out`` names something that already exists."""
    problem = out and existing_output(out)
    if problem:
        parser.error(problem)


def write_json_lines(out: Path | None, results: list[dict]) -> None:
    """With ``--out``: each result as one JSON line of a new file."""
    if out:
        write_own_file(out, "".join(json.dumps(result) + "\n" for result in results).encode())
