"""Command-line conventions shared by `python -m kvtranslate` and the kvtranslate experiment scripts: lists are
one comma-separated argument, every flag's help shows its default, and a short human-readable table goes to
stderr beside the JSON a command prints on stdout."""

import argparse
import sys
from collections.abc import Sequence
from typing import Any, TextIO


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows '(default: ...)' after every flag's help, except required flags and flags without a default."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        # identity, not equality: a default of 0 or 0.0 is shown
        if action.required or action.default is None or action.default is False or action.default == argparse.SUPPRESS:
            return action.help
        return super()._get_help_string(action)


def comma_list(text: str) -> list[str]:
    """'a,b,c' -> ['a', 'b', 'c'] (spaces around items and empty items dropped)."""
    return [part.strip() for part in text.split(",") if part.strip()]


def int_list(text: str) -> list[int]:
    """'128,256' -> [128, 256]."""
    return [int(part) for part in comma_list(text)]


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def text_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Columns padded to their widest cell; floats with three decimals, None as '-'."""
    cells = [list(header)] + [[cell(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def print_table(header: Sequence[str], rows: Sequence[Sequence[Any]], file: TextIO | None = None) -> None:
    """The table on stderr (or `file`)."""
    print(text_table(header, rows), file=file or sys.stderr, flush=True)
