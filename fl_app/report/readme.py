"""Tables kept in READMEs: each ``<!-- report: ARGS -->`` block is regenerated from the committed runs it names."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from fl_app.report.read import find_runs
from fl_app.report.tables import report
from fl_app.report.text import (
    accuracy_markdown,
    convergence_markdown,
    matched_markdown,
    paired_markdown,
    passes_markdown,
    tier_gains_markdown,
    tiers_markdown,
)

# <!-- report: experiments/results/x/runs --reference feast --table tiers -->  ...generated...  <!-- /report -->
README_BLOCK = re.compile(r"(<!-- report: (?P<args>[^>]*?) -->\n)(?P<body>.*?)(<!-- /report -->)", re.S)
README_TABLES = {
    "accuracy": lambda t: accuracy_markdown(t["accuracy"]),
    "paired": lambda t: paired_markdown(t["paired"]),
    "tiers": lambda t: tiers_markdown(t["tiers"]),
    "tier-gains": lambda t: tier_gains_markdown(t["tier_gains"]),
    "matched": lambda t: matched_markdown(t["matched"]),
    "convergence": lambda t: convergence_markdown(t["convergence"]),
    "passes": lambda t: passes_markdown(t["passes"]),
}


def readme_block(args_text: str, root: Path) -> str:
    parser = argparse.ArgumentParser(prog="report block", add_help=False)
    parser.add_argument("paths", nargs="+")
    parser.add_argument("--reference")
    parser.add_argument("--table", choices=list(README_TABLES), default="accuracy")
    parser.add_argument("--allow-mixed-commits", action="store_true")
    args = parser.parse_args(args_text.split())
    tables = report(find_runs([root / p for p in args.paths]), args.reference, args.allow_mixed_commits)
    return README_TABLES[args.table](tables) + "\n"


def regenerate_readme(text: str, root: Path) -> str:
    """``text`` with every marked block replaced by the table the report tool makes of the committed runs it names
    (paths relative to ``root``, the repository)."""
    return README_BLOCK.sub(lambda m: m.group(1) + readme_block(m.group("args"), root) + m.group(4), text)
