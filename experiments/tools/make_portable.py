"""Rewrite the paths in result records (JSON files) so that they hold no path of the machine that made them.

    python -m experiments.tools.make_portable experiments/results/NAME [...]  # default: all of experiments/results

Used once on the committed results, whose records held absolute paths of the machine that made them; kept for
results made elsewhere (or by tools that record absolute paths) before they are committed. Only path values change,
by these rules (the runner writes its records the same way):

- ``data-path``: relative to the repository when the folder lies in or beside it (``../shared/data/cifar10``).
- ``output-dir`` of a run's own record (``summary.json``, ``run.json``): ``.``, the folder holding the record,
  wherever the run was made and moved from.
- any other absolute path (``output-dir`` elsewhere, ``checkpoint``, ``app``): relative to the folder of the record
  when it points into this repository, ``.`` when it is the folder the record was copied from (its last two names
  are the record folder's last two), else ``<not committed>/`` and its last two names (a scratch folder that is gone).
- a runner record (``run.json``) without a data fingerprint gets one (``data``: SHA-256 of the files at the path it
  recorded, hashed now, marked ``"hashed": "after the run, ..."``), so that reuse can compare the data by content.

A file whose text is not what ``json.dumps`` (indent 2, or compact) writes is left alone and named, so that the
rewrite never changes how a number is written; numbers and every other value are compared before and after.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

from experiments.runner import RESULTS, ROOT, RUN_RECORD, data_location, portable_data_path
from fl_app.data.provenance import data_fingerprint
from fl_app.io.cli import tool_parser
from fl_app.run.outputs import write_text

ABSOLUTE = re.compile(r"^(/|~)")
NOT_COMMITTED = "<not committed>"


def portable_path(key: str, value: str, folder: Path) -> str:
    """The portable form of one absolute path found under ``key`` in a record kept in ``folder``."""
    if key == "data-path":
        return portable_data_path(value)
    path = Path(os.path.normpath(Path(value).expanduser()))
    if path.is_relative_to(ROOT):
        return os.path.relpath(path, folder)
    if len(path.parts) > 2 and folder.parts[-2:] == path.parts[-2:]:
        return "."
    return f"{NOT_COMMITTED}/" + "/".join(path.parts[-2:])


def rewrite(value, folder: Path, key: str = ""):
    """``value`` with every absolute path string replaced (see ``portable_path``)."""
    if isinstance(value, dict):
        return {k: rewrite(v, folder, k) for k, v in value.items()}
    if isinstance(value, list):
        return [rewrite(v, folder, key) for v in value]
    if isinstance(value, str) and ABSOLUTE.match(value) and "\n" not in value:
        return portable_path(key, value, folder)
    return value


def add_fingerprint(record: dict) -> dict:
    """A runner record's data fingerprint, hashed now from the folder at the path it recorded (None when that
    folder is not here)."""
    config = record.get("run_config", {})
    data_path = config.get("data-path", "")
    try:
        fingerprint = data_fingerprint(
            config.get("dataset", "cifar10"), config.get("data-source", "sample"), str(data_location(data_path))
        )
    except (OSError, ValueError):
        return record
    return {
        **record,
        "data": {
            "path": portable_data_path(data_path),
            **fingerprint,
            "hashed": "after the run, from the folder at the path it recorded",
        },
    }


def leaves(value, where: str = "") -> dict:
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in leaves(item, f"{where}/{key}").items()}
    if isinstance(value, list):
        return {k: v for i, item in enumerate(value) for k, v in leaves(item, f"{where}[{i}]").items()}
    return {where: value}


def make_portable(path: Path, printer=print) -> bool:
    """Rewrite one JSON record in place; True when it changed."""
    text = path.read_text()
    try:
        data = json.loads(text)
    except ValueError:
        return False
    indent = 2 if json.dumps(data, indent=2) + "\n" == text else None
    if indent is None and json.dumps(data) + "\n" != text:
        if re.search(r'"(/|~)', text):
            printer(f"left alone (not written by json.dumps, so rewriting could change how numbers read): {path}")
        return False
    new = rewrite(data, path.parent.resolve())
    own = isinstance(new, dict) and isinstance(new.get("run_config"), dict) and "output-dir" in new["run_config"]
    if path.name in ("summary.json", RUN_RECORD) and own and ABSOLUTE.match(data["run_config"]["output-dir"]):
        new["run_config"]["output-dir"] = "."
    if path.name == RUN_RECORD and isinstance(new, dict) and "run_config" in new and "data" not in new:
        # the fingerprint of the folder the run read: its recorded (absolute) path, before the rewrite
        new = {**add_fingerprint(data), **{k: v for k, v in new.items() if k != "data"}}
        new = {k: new[k] for k in [*data, *(k for k in new if k not in data)]}
    if new == data:
        return False
    before, after = leaves(data), leaves(new)
    changed = [k for k in before if before[k] != after.get(k)]
    assert all(isinstance(before[k], str) and ABSOLUTE.match(before[k]) for k in changed), (path, changed)
    assert set(before) <= set(after) and all(k.startswith("/data/") for k in set(after) - set(before)), path
    write_text(path, json.dumps(new, indent=indent) + "\n", replace=True)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = tool_parser("experiments.tools.make_portable", __doc__)
    parser.add_argument("folders", type=Path, nargs="*", help="folders to rewrite (default: experiments/results)")
    args = parser.parse_args(argv)
    folders = args.folders or [RESULTS]
    changed = [p for folder in folders for p in sorted(folder.rglob("*.json")) if make_portable(p)]
    print(f"{len(changed)} records rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
