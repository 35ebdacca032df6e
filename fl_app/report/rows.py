"""Runs grouped into rows: runs that share everything but the seed are one row, named by label, grid cell and the
settings that tell rows apart; a table of runs made at different commits is refused unless allowed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pandas as pd

from fl_app.report.read import NOT_GROUPED, MixedCommits, Run
from fl_app.run.stats import Estimate, mean_ci


@dataclass
class Row:
    runs: list[Run]
    name: str = ""

    @property
    def first(self) -> Run:
        return self.runs[0]

    def by_seed(self, value=lambda run: run.accuracy) -> dict[int, float]:
        return {run.seed: value(run) for run in self.runs}

    def estimate(self, value=lambda run: run.accuracy) -> Estimate:
        return mean_ci([value(run) for run in self.runs])

    @property
    def commits(self) -> str:
        return ", ".join(sorted({run.commit for run in self.runs}))

    @property
    def seeds(self) -> int:
        return len(self.runs)


def group_runs(runs: list[Run]) -> list[Row]:
    """One row per set of runs that differ only in the seed (in the order the rows first appear, each row's runs by
    seed); a row's name is its label and grid cell, plus the run-config keys that tell apart rows that would
    otherwise share a name."""
    frame = pd.DataFrame(
        {"run": runs, "key": [json.dumps(run.group_key()) for run in runs], "seed": [run.seed for run in runs]}
    )
    rows = [
        Row(list(members.sort_values("seed", kind="stable")["run"])) for _, members in frame.groupby("key", sort=False)
    ]
    for row in rows:
        cell = ", ".join(f"{k}={v}" for k, v in row.first.cell.items())
        row.name = f"{row.first.label} ({cell})" if cell else row.first.label
    names = pd.Series([row.name for row in rows])
    for _, same in names[names.duplicated(keep=False)].groupby(names, sort=False):
        group = [rows[i] for i in same.index]
        configs = [r.first.config or {"rounds": r.first.summary.get("rounds")} for r in group]
        differing = sorted(
            k
            for k in set().union(*configs)
            if k not in NOT_GROUPED and len({json.dumps(c.get(k)) for c in configs}) > 1
        )
        for row, config in zip(group, configs):
            row.name += " [" + ", ".join(f"{k}={config.get(k)}" for k in differing) + "]"
    return rows


def check_commits(runs: list[Run], allow_mixed: bool) -> None:
    commits = pd.Series([run.commit for run in runs]).value_counts().sort_index()
    if len(commits) > 1 and not allow_mixed:
        listed = ", ".join(f"{c} ({n} runs)" for c, n in commits.items())
        raise MixedCommits(
            f"these runs were made at different commits: {listed}; rerun them at one commit, or pass "
            "--allow-mixed-commits to put them in one table (each row names its commits)"
        )


def tier_text(run: Run) -> str:
    tiers = run.summary.get("tiers") or []
    if not tiers:
        return "–"
    return "/".join(f"{t['macs'] / 1e6:.2f}" for t in tiers) + "M"


def seeds_text(row: Row) -> str:
    return ",".join(str(run.seed) for run in row.runs)


def rounds_text(row: Row):
    """The row's rounds; 'least-most' when its seeds differ (a match-compute row: each seed its reference's)."""
    rounds = sorted({run.summary.get("rounds", "?") for run in row.runs}, key=str)
    if len(rounds) == 1:
        return rounds[0]
    numbers = [r for r in rounds if isinstance(r, int)]
    return f"{min(numbers)}-{max(numbers)}" if len(numbers) == len(rounds) else "/".join(map(str, rounds))
