"""Tables kept in READMEs: each block ``<!-- generated:report (python -m fl_app.report ARGS --table KIND) -->`` is
the table that command prints of the committed runs it names (``fl_app.io.markdown``'s blocks), regenerated in place
by ``python -m fl_app.report --update-readme FILE``."""

from __future__ import annotations

import argparse
from pathlib import Path

from fl_app.io.markdown import replace_each
from fl_app.report.read import find_runs
from fl_app.report.tables import report
from fl_app.report.text import (
    accuracy_markdown,
    budget_groups_markdown,
    convergence_markdown,
    machine_time_markdown,
    matched_markdown,
    paired_markdown,
    passes_markdown,
    tier_gains_markdown,
    tiers_markdown,
)

# <!-- generated:report (python -m fl_app.report experiments/results/x/runs --reference feast --table tiers) -->
# ...generated...
# <!-- /generated:report -->
BLOCK = "report"
COMMAND = "python -m fl_app.report"
README_TABLES = {
    "accuracy": lambda t: accuracy_markdown(t["accuracy"]),
    "paired": lambda t: paired_markdown(t["paired"]),
    "tiers": lambda t: tiers_markdown(t["tiers"]),
    "tier-gains": lambda t: tier_gains_markdown(t["tier_gains"]),
    "matched": lambda t: matched_markdown(t["matched"]),
    "convergence": lambda t: convergence_markdown(t["convergence"]),
    "passes": lambda t: passes_markdown(t["passes"]),
    "budget-groups": lambda t: budget_groups_markdown(t["budget_groups"]),
    "machine-time": lambda t: machine_time_markdown(t["machine_time"]),
}


def readme_block(args_text: str, root: Path) -> str:
    parser = argparse.ArgumentParser(prog="report block", add_help=False)
    parser.add_argument("paths", nargs="+")
    parser.add_argument("--reference")
    parser.add_argument("--table", choices=list(README_TABLES), default="accuracy")
    parser.add_argument("--allow-mixed-commits", action="store_true")
    args = parser.parse_args(args_text.removeprefix(COMMAND).split())
    tables = report(find_runs([root / p for p in args.paths]), args.reference, args.allow_mixed_commits)
    return README_TABLES[args.table](tables)


def regenerate_readme(text: str, root: Path) -> str:
    """``text`` with every marked block replaced by the table the report tool makes of the committed runs it names
    (paths relative to ``root``, the repository)."""
    return replace_each(text, BLOCK, lambda command: readme_block(command, root))[0]
