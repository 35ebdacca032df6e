"""The one command-line convention of every tool, as code.

- ``tool_parser("fl_app.extract", __doc__)``: the usage line reads ``python -m fl_app.extract``, the module docstring
  keeps its layout, and every option with a default shows it in ``--help``;
- ``comma_list(int)``: a list is one comma-separated argument (``--seeds 0,1,2``);
- ``run_config_overrides``: run-config overrides in Flower's own ``--run-config "key=value key2='text'"`` syntax;
- ``print_json``: JSON on stdout and a short human-readable table beside it on stderr.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

# Flower's --run-config syntax: key=value pairs separated by spaces, values in TOML (strings quoted)
_ASSIGNMENT = re.compile(r"(\S+?)=('[^']*'|\"[^\"]*\"|\S+)")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the description's line breaks and appends ``(default: ...)`` to every option that has a default."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "%(default)" in text or "(default: " in text:  # the text already says it, in its own words
            return text
        if action.required or action.default in (None, argparse.SUPPRESS):
            return text
        if not action.option_strings and action.nargs not in ("?", "*"):
            return text  # a required positional has no default to show
        if isinstance(action.default, (list, tuple)):
            return text + f" (default: {','.join(map(str, action.default)) or 'none'})"
        return text + " (default: %(default)s)"


def tool_parser(module: str | None, doc: str | None = None, **kwargs) -> argparse.ArgumentParser:
    """The parser of the tool run as ``python -m <module>``; ``doc`` (its module docstring) is the description.
    ``module=None``: the module this process runs as ``__main__`` (for parsers shared by several scripts)."""
    if module is None:
        spec = getattr(sys.modules["__main__"], "__spec__", None)
        module = spec.name if spec else "<module>"
    return argparse.ArgumentParser(prog=f"python -m {module}", description=doc, formatter_class=HelpFormatter, **kwargs)


def add_readme_option(parser: argparse.ArgumentParser, blocks: str) -> None:
    """A study's ``--readme FILE`` (repeatable): the markdown files whose generated ``blocks`` it rewrites."""
    parser.add_argument(
        "--readme", type=Path, action="append", default=[], help=f"markdown file whose {blocks} to rewrite (repeatable)"
    )


def add_command(commands, name: str, text: str) -> argparse.ArgumentParser:
    """A subcommand (``commands`` from ``add_subparsers``) with the same help layout as its tool."""
    return commands.add_parser(name, help=text, description=text, formatter_class=HelpFormatter)


def comma_list(item: Callable[[str], Any] = str, name: str | None = None) -> Callable[[str], list]:
    """An argparse ``type``: ``"0,1,2"`` -> ``[0, 1, 2]`` with ``item`` applied to each element."""
    what = name or getattr(item, "__name__", "value")

    def parse(text: str) -> list:
        parts = [part.strip() for part in text.split(",")]
        if not all(parts):
            raise argparse.ArgumentTypeError(f"{text!r}: an empty item; expected a comma-separated list of {what}")
        try:
            return [item(part) for part in parts]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: expected a comma-separated list of {what}") from None

    parse.__name__ = f"comma-separated list of {what}"
    return parse


def run_config_overrides(text: str) -> dict:
    """An argparse ``type``: ``"num-server-rounds=8 data-path='/x'"`` -> ``{"num-server-rounds": 8, ...}``, parsed as
    ``flwr run --run-config`` parses it (values in TOML, or one TOML file); anything left over is an error, not
    silently dropped."""
    import tomllib
    from pathlib import Path

    if text.strip().endswith(".toml") and "=" not in text:  # Flower also takes a TOML file of run-config values
        try:
            return tomllib.loads(Path(text.strip()).expanduser().read_text())
        except (OSError, tomllib.TOMLDecodeError) as error:
            raise argparse.ArgumentTypeError(f"{text!r}: {error}") from None
    pairs = _ASSIGNMENT.findall(text)
    leftover = _ASSIGNMENT.sub("", text).strip()
    if leftover:
        raise argparse.ArgumentTypeError(
            f"{text!r}: {leftover!r} is not KEY=VALUE; expected e.g. \"num-server-rounds=8 data-path='/x'\""
        )
    try:
        return tomllib.loads("\n".join(f'"{key}" = {value}' for key, value in pairs))
    except tomllib.TOMLDecodeError as error:
        raise argparse.ArgumentTypeError(
            f"{text!r}: {error}; values are TOML: numbers, true/false, quoted strings"
        ) from None


run_config_overrides.__name__ = "run-config overrides"


def format_table(rows: Sequence[dict], columns: Sequence[str] | None = None) -> str:
    """Rows of dicts as aligned plain-text columns (floats with 4 significant digits)."""
    if not rows:
        return "(no rows)"
    columns = list(columns or rows[0])

    def cell(value) -> str:
        if isinstance(value, float):
            return f"{value:.4g}"
        return "" if value is None else str(value)

    cells = [[cell(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(c), *(len(line[i]) for line in cells)) for i, c in enumerate(columns)]
    lines = [columns, *cells]
    return "\n".join("  ".join(text.ljust(w) for text, w in zip(line, widths)).rstrip() for line in lines)


def print_json(data: Any, table: Sequence[dict] | None = None, columns: Sequence[str] | None = None) -> None:
    """``data`` as one JSON line on stdout; ``table`` (rows of dicts) as a readable table on stderr."""
    print(json.dumps(data), flush=True)
    if table is not None:
        print(format_table(table, columns), file=sys.stderr, flush=True)
