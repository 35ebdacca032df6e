"""The run-config reference (docs/run-config.md), written from the registry ``fl_app.run.config.KEYS``.

    python -m fl_app.run.config_reference --out docs/run-config.md            # rewrite the table
    python -m fl_app.run.config_reference --out docs/run-config.md --check    # exit 1 when it is stale

Only the table between ``<!-- generated:run-config (COMMAND) -->`` and ``<!-- /generated:run-config -->`` is written;
the text around it is kept (a file without the markers gets a title and the table). Nothing but the registry is read.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from fl_app.io.cli import tool_parser
from fl_app.io.files import replace_file
from fl_app.io.markdown import markers, replace_block
from fl_app.run.config import KEYS, Key

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = Path("docs/run-config.md")  # relative to the repository root, where the tools are run
BLOCK = "run-config"
COMMAND = "python -m fl_app.run.config_reference --out docs/run-config.md"
START, END = markers(BLOCK, COMMAND)  # a new file's block names the command that regenerates it


def _code(value) -> str:
    return "`" + json.dumps(value, ensure_ascii=False) + "`"  # TOML spelling: "text", true, 0.0005


def allowed(spec: Key) -> str:
    """What a key accepts, in the words the validation's errors use."""
    if spec.choices:
        return ", ".join(_code(choice) for choice in spec.choices)
    if spec.check:
        return spec.check.rule
    if spec.parse:
        return "a comma-separated list"
    if isinstance(spec.default, bool):
        return "`true`, `false`"
    return "a string"


def table(keys: dict[str, Key] = KEYS) -> str:
    lines = ["| key | default | allowed | meaning |", "| --- | --- | --- | --- |"]
    for name, spec in keys.items():
        cells = (f"`{name}`", _code(spec.default), allowed(spec), spec.help)
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines)


def render(text: str | None, keys: dict[str, Key] = KEYS) -> str:
    """``text`` (the reference file's content, or None for a new file) with its generated table up to date."""
    body = table(keys)
    if text is not None and (updated := replace_block(text, BLOCK, body)) is not None:
        return updated
    block = f"{START}\n{body}\n{END}"
    return f"# Run config\n\n{block}\n" if text is None else f"{text.rstrip()}\n\n{block}\n"


def build_parser():
    parser = tool_parser("fl_app.run.config_reference", __doc__)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the reference file to write")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when the file is stale")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    current = args.out.read_text() if args.out.exists() else None
    updated = render(current)
    if args.check:
        if updated != current:
            print(f"{args.out} is stale: run python -m fl_app.run.config_reference --out {args.out}", file=sys.stderr)
            return 1
        print(f"{args.out} is up to date", file=sys.stderr)
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    replace_file(args.out, updated.encode())  # the reference is rewritten in place, never through a symlink
    print(f"wrote {args.out} ({len(KEYS)} keys)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
