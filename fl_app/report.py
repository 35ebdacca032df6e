"""Read run folders (a suite's, or ``~/fl_app_runs/*``) and print one table; optionally write CSV tables and plots.

    python -m fl_app.report ~/fl_app_runs/*
    python -m fl_app.report /tmp/smoke --reference feast --out /tmp/smoke/report --plots
    python -m fl_app.report RUN_FOLDER --clients --out DIR      # each client's labels and budget (reads the data)
    python -m fl_app.report --update-readme README.md docs/*.md $(find experiments -name README.md)

Runs that share everything but the seed are one row: the mean over seeds with its 95% t-interval. With
``--reference LABEL`` every other row also gets the paired difference against that label over the seeds both ran.
Each row names the commit(s) its runs were made at; a table of runs from different commits is refused unless
``--allow-mixed-commits`` is given. A quantity a run did not record (e.g. client seconds that are all zero) gets no
table and no plot.

Accuracy is the population-weighted accuracy for the supernet methods (each client scored with a tier it can afford,
see the run-config key ``population-tier``) and the mean client accuracy for the model-heterogeneous ones (each
client's own model on its own test split). When every run of a table recorded ``client_subnet_accuracy`` (each client
scored with its own largest affordable cached subnet), the table uses that instead, for all of its runs.

Runs the suite runner trained to another label's client training compute (``match-compute``, see
``experiments.runner``; their run.json has ``match_compute``) also get the matched-compute table (``matched.csv``):
their compute relative to that label's runs and their final accuracy against its own, paired by seed.

Whether a run has converged (``convergence.csv``): per row, and per tier of a supernet row, the last two evaluations
over seeds, the change between them paired by seed, and "flat" when each mean lies inside the other's seed interval.

How long a run trained (the README table ``passes``): its passes over the images its clients hold, from each client's
answered rounds and partition size in clients.csv and the run's local-training keys.

Every file read is checked: a malformed field (``completed`` not a boolean, a summary that is not an object, a
metrics.csv without its columns, text where a number belongs) is an error that names the file, not a count. Files
are written through ``fl_app.io.files.replace_file``: a symlink at an output name is refused, never written through.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import math
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from fl_app.io.bounded import MAX_FIELD_CHARS, MAX_LINE_CHARS, MAX_TABLE_BYTES, read_bounded_text, shown
from fl_app.io.cells import markdown_cell, spreadsheet_cell
from fl_app.io.cli import tool_parser
from fl_app.io.files import replace_file
from fl_app.run.config import KEYS
from fl_app.run.stats import Estimate, format_estimate, mean_ci, paired_difference, value_at_budget

# summary key of the headline accuracy, in order of preference
ACCURACY_KEYS = ("population_weighted_accuracy", "mean_client_accuracy")
# preferred over ACCURACY_KEYS for a table whose every run recorded it (``prefer_client_subnet_accuracy``)
CLIENT_SUBNET_ACCURACY = "client_subnet_accuracy"
ALL_ACCURACY_KEYS = (CLIENT_SUBNET_ACCURACY, *ACCURACY_KEYS)
# run-config keys that do not change what a run computes: ignored when grouping runs into rows
NOT_GROUPED = ("seed", "output-dir", "checkpoint-every", "round-timeout", "resume-from")
# the files write_tables writes, by table
TABLE_FILES = {"accuracy": "table.csv", "paired": "paired.csv", "tiers": "tiers.csv", "rounds": "rounds.csv"}
TABLE_FILES["compute"] = "compute.csv"
TABLE_FILES["matched"] = "matched.csv"
TABLE_FILES["tier_rounds"] = "tier_rounds.csv"
TABLE_FILES["convergence"] = "convergence.csv"
TIER_COLUMNS = ("tier_macs", "test_accuracy")  # metrics.csv: one row per evaluated round and tier
# run-config keys the suite runner sets per seed for a match-compute run (from its sources' compute): not grouped on
MATCH_SET = ("num-server-rounds", "eval-every")
MATCHED_COLUMN = "client_train_flops"  # the compute a match-compute run matches (experiments.runner)
# the executed FLOPs where a run counts them apart (FIARSE's dense tensors; other runs execute what they count)
DENSE_COLUMN = "client_train_flops_dense"


def settings(run_config: dict) -> dict:
    """A run config without the keys at their default value.

    Runs are compared through this, so a key added to the registry later, with a default that keeps the old
    behaviour, does not split or invalidate earlier runs; a changed default does show as a difference."""
    return {k: v for k, v in run_config.items() if k not in KEYS or KEYS[k].default != v}


class MixedCommits(ValueError):
    pass


class ReportError(ValueError):
    """A file of a run folder that cannot be read as the app writes it; the message names the file."""


# -- checking what is read -----------------------------------------------------------------------------------------
def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# whole numbers a run records (rounds, clients, seeds, partition ids) are far below this; 2^53 is also where a float
# stops holding every whole number exactly
MAX_WHOLE = 2**53

# kind -> (test, what is allowed); a table beats an if-chain
KINDS = {
    "boolean": (lambda v: isinstance(v, bool), "true or false"),
    "text": (lambda v: isinstance(v, str), "a string"),
    "object": (lambda v: isinstance(v, dict), "a JSON object"),
    "whole": (lambda v: _is_whole(v) and abs(v) <= MAX_WHOLE, f"a whole number from -{MAX_WHOLE} to {MAX_WHOLE}"),
    "count": (lambda v: _is_whole(v) and 0 <= v <= MAX_WHOLE, f"a whole number from 0 to {MAX_WHOLE}"),
    "amount": (lambda v: _is_number(v) and math.isfinite(v) and v >= 0, "a finite number >= 0"),
    "fraction": (lambda v: v is None or (_is_number(v) and 0 <= v <= 1), "a number in [0, 1] or null"),
    "tiers": (
        lambda v: (
            isinstance(v, list)
            and all(
                isinstance(t, dict)
                and _is_number(t.get("macs"))
                and math.isfinite(t["macs"])
                and t["macs"] > 0
                and _is_number(t.get("accuracy"))
                and 0 <= t["accuracy"] <= 1
                for t in v
            )
        ),
        "a list of objects with 'macs' (a number > 0) and 'accuracy' (a number in [0, 1])",
    ),
}
# the fields the report reads, each checked where present (a hand-started run may lack run.json and some keys)
SUMMARY_FIELDS = {
    "completed": "boolean",
    "method": "text",
    "dataset": "text",
    "seed": "whole",
    "rounds": "count",
    "num_clients": "count",
    "clients_per_round": "count",
    "population_weighted_accuracy": "fraction",
    "mean_client_accuracy": "fraction",
    CLIENT_SUBNET_ACCURACY: "fraction",
    "bytes_down": "amount",
    "bytes_up": "amount",
    "tiers": "tiers",
    "run_config": "object",
}
RECORD_FIELDS = {
    "label": "text",
    "cell": "object",
    "commit": "text",
    "dirty": "boolean",
    "federation": "object",
    "run_config": "object",
    "match_compute": "object",
}


def check_fields(path: Path, data, fields: dict) -> dict:
    if not isinstance(data, dict):
        raise ReportError(f"{path}: expected a JSON object, found {type(data).__name__}")
    for key, kind in fields.items():
        test, allowed = KINDS[kind]
        if key in data and not test(data[key]):
            raise ReportError(f"{path}: '{key}' is {shown(data[key])}; allowed: {allowed}")
    return data


def read_json(path: Path, fields: dict) -> dict:
    try:
        data = json.loads(read_bounded_text(path, MAX_TABLE_BYTES))
    except OSError as error:
        raise ReportError(f"{path}: cannot be read ({error.strerror or error})") from None
    except ValueError as error:
        raise ReportError(f"{path}: not valid JSON ({error})") from None
    return check_fields(path, data, fields)


def read_table(
    path: Path, required: tuple, numeric: tuple = (), any_of: tuple = (), whole: str = "round"
) -> pd.DataFrame:
    """A CSV table with its ``required`` columns, at least one of ``any_of``, whole numbers from 0 to ``MAX_WHOLE`` in
    the column ``whole`` and numbers (or empty / nan) in the ``numeric`` columns it has; an error names the file, the
    column and the line. The file's size, its lines and its cells are bounded (``fl_app.io.bounded``) before they are
    parsed."""
    try:
        text = read_bounded_text(path, MAX_TABLE_BYTES, MAX_LINE_CHARS)
        # without a header row pandas refuses a line longer than the first and marks a shorter one with NaN (an
        # empty field stays ''), so every line is checked against the header; numbers are converted below
        lines = pd.read_csv(io.StringIO(text), header=None, dtype=str, keep_default_na=False)
    except FileNotFoundError:
        raise ReportError(f"{path}: missing (a finished run writes it)") from None
    except (OSError, ValueError, pd.errors.ParserError, pd.errors.EmptyDataError) as error:
        raise ReportError(f"{path}: not a readable CSV table ({shown(str(error).strip(), 300)})") from None
    long = lines.map(lambda cell: isinstance(cell, str) and len(cell) > MAX_FIELD_CHARS).to_numpy()
    if long.any():
        line, column = (int(i) for i in zip(*long.nonzero()).__next__())
        raise ReportError(
            f"{path}: line {line + 1}, field {column + 1}: {shown(lines.iat[line, column])}; "
            f"allowed: at most {MAX_FIELD_CHARS} characters"
        )
    short = lines.isna().any(axis=1).to_numpy()
    if short.any():
        raise ReportError(f"{path}: not a readable CSV table (line {int(short.argmax()) + 1} has too few fields)")
    header = list(lines.iloc[0])
    if len(set(header)) < len(header):
        raise ReportError(f"{path}: a column name appears twice ({', '.join(header)})")
    frame = pd.DataFrame(lines.iloc[1:].to_numpy(), columns=header)
    missing = [c for c in required if c not in frame.columns]
    if any_of and not any(c in frame.columns for c in any_of):
        missing.append(" or ".join(any_of))
    if missing:
        raise ReportError(f"{path}: no column {', '.join(missing)} (columns: {', '.join(map(str, frame.columns))})")
    written = frame[whole].copy() if whole in frame.columns else None  # the text, for an error message
    for column in [c for c in (whole, *numeric) if c in frame.columns]:
        # Python's float: every value is exactly the one the run wrote, whatever pandas' own parser does
        converted = [_number_or_none(v) for v in frame[column]]
        bad = next((i for i, v in enumerate(converted) if v is None), None)
        if bad is not None:
            cell = shown(frame[column].iloc[bad])
            raise ReportError(f"{path}: line {bad + 2}, column '{column}': {cell} is not a number")
        frame[column] = pd.Series(converted, index=frame.index, dtype=float)
    counted = frame[whole] if whole in frame.columns else pd.Series(dtype=float)
    ok = counted.notna() & (counted == counted.round()) & (counted >= 0) & (counted <= MAX_WHOLE)
    if not ok.all():
        bad = int((~ok).to_numpy().argmax())
        raise ReportError(
            f"{path}: line {bad + 2}, column '{whole}': {shown(written.iloc[bad])}; allowed: {KINDS['count'][1]}"
        )
    return frame.assign(**{whole: counted.astype(int)}) if whole in frame.columns else frame


def _number_or_none(text: str) -> float | None:
    """A CSV cell as a number: '' is nan (not recorded in that row); text that is no number is None."""
    if text == "":
        return math.nan
    try:
        return float(text)
    except ValueError:
        return None


# -- runs ----------------------------------------------------------------------------------------------------------
@dataclass
class Run:
    folder: Path
    summary: dict
    record: dict  # the runner's run.json ({} for runs started by hand)
    curve: list[tuple[int, float]] = field(default_factory=list)  # (round, accuracy) at each evaluation
    rounds: pd.DataFrame | None = None  # rounds.csv (None when the run wrote none)
    accuracy_keys: tuple = ACCURACY_KEYS  # summary keys of its accuracy, in order of preference
    client_subnet_curve: list[tuple[int, float]] = field(default_factory=list)  # the curve of client_subnet_accuracy
    tier_curve: list[tuple[int, float, float]] = field(default_factory=list)  # (round, tier MACs, test accuracy)
    budgets: list[float] = field(default_factory=list)  # the clients' MAC budgets (clients.csv; [] when absent)
    # (images held, rounds answered) per client (clients.csv; [] when it lacks either column)
    client_rounds: list[tuple[int, int]] = field(default_factory=list)

    @property
    def label(self) -> str:
        return self.record.get("label") or self.summary.get("method", "?")

    @property
    def cell(self) -> dict:
        return self.record.get("cell") or {}

    @property
    def seed(self) -> int:
        return int(self.summary.get("seed", self.config.get("seed", 0)))

    @property
    def config(self) -> dict:
        """The run config's settings that differ from today's defaults (see ``settings``)."""
        return settings(self.record.get("run_config") or self.summary.get("run_config") or {})

    @property
    def commit(self) -> str:
        commit = self.record.get("commit")
        if not commit:
            return "unrecorded"
        return commit[:7] + ("+modified" if self.record.get("dirty") else "")

    @property
    def accuracy(self) -> float:
        return next((float(self.summary[k]) for k in self.accuracy_keys if self.summary.get(k) is not None), math.nan)

    @property
    def accuracy_kind(self) -> str:
        return next((k for k in self.accuracy_keys if self.summary.get(k) is not None), self.accuracy_keys[0])

    @property
    def images_held(self) -> int:
        """The images all clients hold (clients.csv; 0 when it did not record them)."""
        return sum(n for n, _ in self.client_rounds)

    @property
    def passes(self) -> float:
        """Passes over the clients' training images: every client's answered rounds times the images it trains in
        a round (``images_per_round`` under the run's local-training keys), summed, over the images all clients
        hold; nan when clients.csv did not record them."""
        if not self.images_held:
            return math.nan
        config = self.record.get("run_config") or self.summary.get("run_config") or {}
        epochs, max_steps, batch = (config.get(k, KEYS[k].default) for k in LOCAL_TRAINING_KEYS)
        for key, value in zip(LOCAL_TRAINING_KEYS, (epochs, max_steps, batch)):
            if not KINDS["whole"][0](value) or value < 0:
                raise ReportError(f"{self.folder}: run config '{key}' is {value!r}; allowed: a whole number >= 0")
        trained = sum(r * images_per_round(n, epochs, max_steps, batch) for n, r in self.client_rounds)
        return trained / self.images_held

    @property
    def matched_to(self) -> str | None:
        """The label whose compute a match-compute run matched (None for other runs)."""
        match = self.record.get("match_compute")
        return match.get("reference") if isinstance(match, dict) else None

    def group_key(self) -> tuple:
        # the seeds of a match-compute run train different rounds (each its reference seed's compute): one row
        matched = self.matched_to is not None
        config = {k: v for k, v in self.config.items() if k not in NOT_GROUPED and not (matched and k in MATCH_SET)}
        return (
            self.label,
            json.dumps(self.cell, sort_keys=True),
            json.dumps(config, sort_keys=True),
            json.dumps(self.record.get("federation", {}), sort_keys=True),
            None if matched else self.summary.get("rounds"),
            self.summary.get("num_clients"),
        )

    def records(self, column: str) -> bool:
        """Whether rounds.csv recorded ``column``: there, finite in every round and not zero in all of them (a
        quantity the run did not measure is written as zeros or nan)."""
        if self.rounds is None or column not in self.rounds.columns:
            return False
        values = self.rounds[column]
        return bool(values.notna().all() and values.map(math.isfinite).all() and values.sum() > 0)

    def compute_points(self, column: str) -> list[tuple[int, float, float]]:
        """(round, cumulative client compute after it, accuracy) at each evaluated round; [] when unrecorded."""
        if not self.records(column):
            return []
        cumulative = dict(zip(self.rounds["round"], self.rounds[column].cumsum()))
        return [(r, float(cumulative[r]), a) for r, a in self.curve if r in cumulative]

    def compute_curve(self, column: str) -> list[tuple[float, float]]:
        """(cumulative client compute after the round, accuracy) at each evaluated round; [] when unrecorded."""
        return [(c, a) for _, c, a in self.compute_points(column)]


def load_run(folder: Path) -> Run:
    folder = Path(folder)
    summary = read_json(folder / "summary.json", SUMMARY_FIELDS)
    record = read_json(folder / "run.json", RECORD_FIELDS) if os.path.lexists(folder / "run.json") else {}
    if "seed" in record and not KINDS["whole"][0](record["seed"]):
        raise ReportError(f"{folder / 'run.json'}: 'seed' is {record['seed']!r}; allowed: a whole number")
    if "match_compute" in record and not isinstance(record["match_compute"].get("reference"), str):
        raise ReportError(f"{folder / 'run.json'}: 'match_compute' has no 'reference' label; allowed: a string")
    seed = (record.get("run_config") or summary.get("run_config") or {}).get("seed", 0)
    if "seed" not in summary and not KINDS["whole"][0](seed):
        raise ReportError(f"{folder}: run config 'seed' is {seed!r}; allowed: a whole number")
    # every run records one of ACCURACY_KEYS; client_subnet_accuracy is recorded beside them
    metrics = read_table(folder / "metrics.csv", ("round",), (*ALL_ACCURACY_KEYS, *TIER_COLUMNS), any_of=ACCURACY_KEYS)
    for key in (k for k in ALL_ACCURACY_KEYS if k in metrics.columns):
        outside = metrics[key].notna() & ~metrics[key].between(0, 1)
        if outside.any():
            line = int(outside.to_numpy().argmax())
            raise ReportError(
                f"{folder / 'metrics.csv'}: line {line + 2}, column '{key}': {float(metrics[key].iloc[line])!r}; "
                "allowed: a number in [0, 1] or empty"
            )
    curve = accuracy_curve(metrics, ACCURACY_KEYS)
    rounds = None
    if os.path.lexists(folder / "rounds.csv"):
        rounds = read_table(folder / "rounds.csv", ("round",), (*(c for c, _ in COMPUTE_COLUMNS), DENSE_COLUMN))
        repeated = rounds["round"].duplicated()
        if repeated.any():
            raise ReportError(
                f"{folder / 'rounds.csv'}: round {rounds['round'][repeated].iloc[0]} appears twice (one row per round)"
            )
    client_subnet_curve = accuracy_curve(metrics, (CLIENT_SUBNET_ACCURACY,))
    budgets, client_rounds = [], []
    if os.path.lexists(folder / "clients.csv"):
        counts = ("num_examples", "rounds_answered")
        clients = read_table(folder / "clients.csv", (), ("budget_macs", *counts), whole="partition_id")
        budgets = clients["budget_macs"].dropna().tolist() if "budget_macs" in clients.columns else []
        if all(c in clients.columns for c in counts) and clients[list(counts)].notna().all().all():
            client_rounds = [(int(n), int(r)) for n, r in zip(clients["num_examples"], clients["rounds_answered"])]
    return Run(
        folder,
        summary,
        record,
        curve,
        rounds,
        client_subnet_curve=client_subnet_curve,
        tier_curve=tier_curve(metrics),
        budgets=budgets,
        client_rounds=client_rounds,
    )


# the run-config keys that fix how many images a client trains on in a round
LOCAL_TRAINING_KEYS = ("local-epochs", "max-local-steps", "batch-size")


def images_per_round(num_samples: int, epochs: int, max_steps: int, batch_size: int) -> int:
    """The images a client holding ``num_samples`` trains on in one round: what ``clients.local_training``'s
    ``local_batches`` yields, every epoch cut into batches of ``batch_size`` (an epoch's last batch of one sample
    skipped), no batch after ``max_steps`` (0 = no cap)."""
    if batch_size < 2:  # every batch is a single sample: all skipped
        return 0
    full, rest = divmod(num_samples, batch_size)
    last = rest if rest >= 2 else 0  # an epoch's short last batch, when it is trained
    per_epoch = full + (last > 0)  # batches in an epoch
    if max_steps == 0 or max_steps >= epochs * per_epoch:
        return epochs * (full * batch_size + last)
    epochs_done, batches = divmod(max_steps, per_epoch)  # batches < per_epoch: all of them full
    return epochs_done * (full * batch_size + last) + batches * batch_size


def tier_curve(metrics: pd.DataFrame) -> list[tuple[int, float, float]]:
    """(round, tier MACs, test accuracy) of every tier row of metrics.csv ([] for a run without tiers)."""
    if any(c not in metrics.columns for c in TIER_COLUMNS):
        return []
    rows = metrics.dropna(subset=list(TIER_COLUMNS))
    return [(int(r), float(m), float(a)) for r, m, a in zip(rows["round"], rows["tier_macs"], rows["test_accuracy"])]


def accuracy_curve(metrics: pd.DataFrame, keys: tuple) -> list[tuple[int, float]]:
    """(round, accuracy) of each evaluated round: a row's accuracy is the first of ``keys`` it has a value in, a
    round's its last row with one ([] when metrics.csv has none of the columns)."""
    present = [k for k in keys if k in metrics.columns]
    if not present:
        return []
    accuracy = metrics[present].bfill(axis=1).iloc[:, 0]
    curve = accuracy.groupby(metrics["round"]).last().dropna()
    return [(int(r), float(a)) for r, a in curve.items()]


def prefer_client_subnet_accuracy(runs: list[Run]) -> list[Run]:
    """The runs scored by ``client_subnet_accuracy`` (summary and curve) when every one recorded it, so one table
    holds one kind; otherwise unchanged (``ACCURACY_KEYS``, as runs made before it was recorded)."""
    if not runs or not all(
        run.summary.get(CLIENT_SUBNET_ACCURACY) is not None and run.client_subnet_curve for run in runs
    ):
        return runs
    return [
        dataclasses.replace(run, curve=run.client_subnet_curve, accuracy_keys=(CLIENT_SUBNET_ACCURACY,)) for run in runs
    ]


def suite_folders(path: Path) -> list[Path]:
    """The run folders a suite.json lists (inside the suite folder), those with a summary.json."""
    listed = read_json(path / "suite.json", {})
    runs = listed.get("runs")
    if not isinstance(runs, list) or not all(isinstance(r, dict) and isinstance(r.get("folder"), str) for r in runs):
        raise ReportError(f"{path / 'suite.json'}: 'runs' must be a list of objects with a 'folder' string")
    folders = []
    for entry in runs:
        relative = Path(entry["folder"])
        if relative.is_absolute() or ".." in relative.parts:
            raise ReportError(
                f"{path / 'suite.json'}: run folder '{entry['folder']}' is not inside the suite folder; allowed: a "
                "relative path without '..'"
            )
        if (path / relative / "summary.json").exists():
            folders.append(path / relative)
    return folders


def find_runs(paths: list[Path]) -> list[Run]:
    """Run folders named directly, the current runs of a suite folder (its suite.json), or any summary.json below."""
    folders = []
    for path in map(Path, paths):
        if (path / "summary.json").exists():
            folders.append(path)
        elif (path / "suite.json").exists():
            folders += suite_folders(path)
        else:
            folders += sorted(p.parent for p in path.rglob("summary.json") if ".interrupted-" not in str(p))
    runs = [load_run(f) for f in dict.fromkeys(folders)]
    return [run for run in runs if run.summary.get("completed", True)]  # a failed run's summary says completed: false


# -- rows ----------------------------------------------------------------------------------------------------------
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


# -- tables --------------------------------------------------------------------------------------------------------
def run_frame(rows: list[Row], **values) -> pd.DataFrame:
    """One line per run: its row's index and, per keyword, ``value(run)`` (runs in row order, each row's by seed)."""
    return pd.DataFrame(
        [
            {"row": i, "seed": run.seed, **{name: value(run) for name, value in values.items()}}
            for i, row in enumerate(rows)
            for run in row.runs
        ],
        columns=["row", "seed", *values],
    )


def estimates(frame: pd.DataFrame, by: list[str], column: str, prefix: str = "") -> pd.DataFrame:
    """Mean, 95% half-width and count of ``column`` per group (the t-interval of ``fl_app.run.stats``; values in
    the frame's order, so each mean is summed in seed order as every earlier table was)."""
    grouped = frame.groupby(by, sort=True)[column].agg(lambda values: mean_ci(values.tolist()))
    return pd.DataFrame(
        {
            f"{prefix}{column}": [e.mean for e in grouped],
            f"{prefix}{column}_ci95": [e.half_width for e in grouped],
            "n": [e.n for e in grouped],
        },
        index=grouped.index,
    )


def records(frame: pd.DataFrame) -> list[dict]:
    return frame.to_dict("records")


def accuracy_rows(rows: list[Row]) -> list[dict]:
    if not rows:
        return []
    frame = run_frame(
        rows,
        accuracy=lambda run: run.accuracy,
        mb_down=lambda run: run.summary.get("bytes_down", math.nan) / 1e6,
        mb_up=lambda run: run.summary.get("bytes_up", math.nan) / 1e6,
    )
    acc = estimates(frame, ["row"], "accuracy")
    table = pd.DataFrame(
        {
            "method": [row.name for row in rows],
            "dataset": [row.first.summary.get("dataset", "?") for row in rows],
            "rounds": [rounds_text(row) for row in rows],
            "seeds": [seeds_text(row) for row in rows],
            "tiers": [tier_text(row.first) for row in rows],
            "accuracy": acc["accuracy"].to_numpy(),
            "accuracy_ci95": acc["accuracy_ci95"].to_numpy(),
            "n": acc["n"].to_numpy(),
            "accuracy_kind": [row.first.accuracy_kind for row in rows],
            "mb_down": estimates(frame, ["row"], "mb_down")["mb_down"].to_numpy(),
            "mb_up": estimates(frame, ["row"], "mb_up")["mb_up"].to_numpy(),
            "commit": [row.commits for row in rows],
        }
    )
    return records(table)


def reference_row(rows: list[Row], row: Row, reference: str) -> Row | None:
    """The row of the reference label in ``row``'s grid cell; of several (e.g. hand-made runs of two lengths), the
    one whose settings differ least. None for the reference's own rows."""
    candidates = [r for r in rows if r.first.label == reference and r.first.cell == row.first.cell]
    if not candidates or row in candidates:
        return None
    return min(candidates, key=lambda r: config_distance(r.first.config, row.first.config))


def paired_columns(paired) -> dict:
    """The columns of a paired comparison (``paired_difference``'s result) in paired.csv and matched.csv."""
    return {
        "difference": paired.difference.mean,
        "difference_ci95": paired.difference.half_width,
        "n": paired.difference.n,
        "wins": paired.wins,
        "verdict": paired.verdict,
    }


def paired_rows(rows: list[Row], reference: str) -> list[dict]:
    """Each row against the row of the reference label in the same grid cell, paired by seed."""
    table = []
    for row in rows:
        ref = reference_row(rows, row, reference)
        if ref is None:
            continue
        paired = paired_difference(row.by_seed(), ref.by_seed())
        table.append(
            {
                "method": row.name,
                "reference": ref.name,
                **paired_columns(paired),
            }
        )
    return table


def config_distance(a: dict, b: dict) -> int:
    return sum(a.get(k) != b.get(k) for k in set(a) | set(b) if k not in NOT_GROUPED)


def affording(run: Run, macs: float) -> float:
    """How many of the run's clients have a budget that affords ``macs`` (nan when the run recorded no budgets)."""
    return float(sum(budget >= macs for budget in run.budgets)) if run.budgets else math.nan


def tier_rows(rows: list[Row]) -> list[dict]:
    """Per row and tier (the tiers every run of the row reported): the tier's MMACs, its accuracy and how many
    clients afford it (mean over seeds). A tier no client affords is trained by none of a fixed-level method's
    clients (HeteroFL's, ScaleFL's largest level), only through the weights it shares with smaller ones."""
    frame = pd.DataFrame(
        [
            {
                "row": i,
                "tier": t,
                "macs": tier["macs"],
                "accuracy": tier["accuracy"],
                "affording": affording(run, tier["macs"]),
            }
            for i, row in enumerate(rows)
            for run in row.runs
            for t, tier in enumerate(run.summary.get("tiers") or [])
        ],
        columns=["row", "tier", "macs", "accuracy", "affording"],
    )
    if frame.empty:
        return []
    runs_with_tier = frame.groupby(["row", "tier"])["tier"].transform("size")
    frame = frame[runs_with_tier == frame["row"].map(lambda i: rows[i].seeds)]  # tiers every run of the row has
    acc = estimates(frame, ["row", "tier"], "accuracy")
    first = frame.groupby(["row", "tier"], sort=True)["macs"].first()
    table = pd.DataFrame(
        {
            "method": [rows[i].name for i, _ in acc.index],
            "tier_mmacs": [round(macs / 1e6, 3) for macs in first],
            "accuracy": acc["accuracy"].to_numpy(),
            "accuracy_ci95": acc["accuracy_ci95"].to_numpy(),
            "n": acc["n"].to_numpy(),
            "clients_affording": frame.groupby(["row", "tier"], sort=True)["affording"].mean().to_numpy(),
        }
    )
    return records(table)


def tier_gain_rows(rows: list[Row]) -> list[dict]:
    """Per row with tiers, each tier against the next smaller one, paired by seed: does the larger subnet pay? Only
    the seeds whose runs report both tiers (at the same MACs) are paired."""
    table = []
    for row in rows:
        by_seed = {run.seed: [(t["macs"], t["accuracy"]) for t in run.summary.get("tiers") or []] for run in row.runs}
        macs = sorted({m for tiers in by_seed.values() for m, _ in tiers})
        for smaller, larger in zip(macs, macs[1:]):
            paired = paired_difference(
                {s: dict(tiers).get(larger) for s, tiers in by_seed.items()},
                {s: dict(tiers).get(smaller) for s, tiers in by_seed.items()},
            )
            table.append(
                {
                    "method": row.name,
                    "tier_mmacs": round(larger / 1e6, 3),
                    "vs_tier_mmacs": round(smaller / 1e6, 3),
                    **paired_columns(paired),
                }
            )
    return table


def curve_frame(rows: list[Row]) -> pd.DataFrame:
    """One line per run and evaluated round: row index, seed, round, accuracy."""
    return pd.DataFrame(
        [
            {"row": i, "seed": run.seed, "round": rnd, "accuracy": acc}
            for i, row in enumerate(rows)
            for run in row.runs
            for rnd, acc in run.curve
        ],
        columns=["row", "seed", "round", "accuracy"],
    )


def on_shared_rounds(frame: pd.DataFrame) -> pd.DataFrame:
    """Where a row's runs evaluated at different rounds but equally often, put each run's k-th evaluation at the mean
    of the runs' k-th rounds. A match-compute row's seeds have their own horizons and the runner evaluates each at the
    same fractions of its horizon, so this averages seeds at the same point of their runs instead of dropping them."""
    frame = frame.copy()
    for row, mine in frame.groupby("row"):
        by_seed = {seed: sorted(r["round"].unique()) for seed, r in mine.groupby("seed")}
        schedules = list(by_seed.values())
        if all(s == schedules[0] for s in schedules) or len({len(s) for s in schedules}) > 1:
            continue
        shared = [int(round(sum(rounds) / len(rounds))) for rounds in zip(*schedules)]
        for seed, rounds in by_seed.items():
            at = (frame["row"] == row) & (frame["seed"] == seed)
            frame.loc[at, "round"] = frame.loc[at, "round"].map(dict(zip(rounds, shared)))
    return frame


def round_rows(rows: list[Row]) -> list[dict]:
    frame = on_shared_rounds(curve_frame(rows))
    if frame.empty:
        return []
    acc = estimates(frame, ["row", "round"], "accuracy")
    table = pd.DataFrame(
        {
            "method": [rows[i].name for i, _ in acc.index],
            "round": [int(r) for _, r in acc.index],
            "accuracy": acc["accuracy"].to_numpy(),
            "accuracy_ci95": acc["accuracy_ci95"].to_numpy(),
            "n": acc["n"].to_numpy(),
        }
    )
    return records(table)


def tier_round_rows(rows: list[Row]) -> list[dict]:
    """Per row, tier and evaluated round: the tier's test accuracy over seeds (a tier is named by its MACs, as the
    runs' tier tables are). Seeds evaluated equally often at different rounds are aligned (``on_shared_rounds``);
    otherwise a point needs every run of the row that reached its round to have evaluated that tier there, so means
    at one round are over the same seeds, a run whose horizon ended earlier is not counted as missing, and ``n``
    says how many seeds a point has."""
    frame = pd.DataFrame(
        [
            {"row": i, "seed": run.seed, "macs": macs, "round": rnd, "accuracy": acc}
            for i, row in enumerate(rows)
            for run in row.runs
            for rnd, macs, acc in run.tier_curve
        ],
        columns=["row", "seed", "macs", "round", "accuracy"],
    )
    if frame.empty:
        return []
    frame = on_shared_rounds(frame)
    last_round = frame.groupby(["row", "seed"])["round"].max()
    reached = {
        (i, rnd): int((last_round.loc[i] >= rnd).sum())
        for i, rnd in frame[["row", "round"]].drop_duplicates().itertuples(index=False)
    }
    runs_there = frame.groupby(["row", "macs", "round"])["round"].transform("size")
    frame = frame[runs_there == [reached[key] for key in zip(frame["row"], frame["round"])]]
    if frame.empty:
        return []
    acc = estimates(frame, ["row", "macs", "round"], "accuracy")
    table = pd.DataFrame(
        {
            "method": [rows[i].name for i, _, _ in acc.index],
            "tier_mmacs": [round(macs / 1e6, 3) for _, macs, _ in acc.index],
            "round": [int(r) for _, _, r in acc.index],
            "accuracy": acc["accuracy"].to_numpy(),
            "accuracy_ci95": acc["accuracy_ci95"].to_numpy(),
            "n": acc["n"].to_numpy(),
        }
    )
    return records(table)


def last_two(curve) -> tuple | None:
    """The last two evaluations ((round, accuracy), (round, accuracy)) of a curve sorted by round; None if fewer."""
    points = sorted(curve)
    return (points[-2], points[-1]) if len(points) >= 2 else None


def convergence_verdict(previous, last, change) -> str:
    """'flat' when each of the last two evaluations' means lies inside the other's seed interval (the test of a
    converged curve the studies use), else the direction the mean moved; no verdict without an interval."""
    if last.n < 2 or previous.n < 2:
        return f"no interval at {min(last.n, previous.n)} seed"
    if abs(last.mean - previous.mean) <= min(last.half_width, previous.half_width):
        return "flat"
    return "still rising" if change.mean > 0 else "still falling"


def convergence_rows(rows: list[Row]) -> list[dict]:
    """Per row (and per tier of a tiered row): each seed's last two evaluations, their means over seeds with 95%
    intervals, the change between them paired by seed, and whether the curve has flattened (``convergence_verdict``).
    A seed with fewer than two evaluations is left out; each seed uses its own last two rounds (a match-compute row's
    seeds stop at different rounds)."""
    table = []
    for row in rows:
        curves = {"all": {run.seed: run.curve for run in row.runs}}
        for run in row.runs:
            for rnd, macs, acc in run.tier_curve:
                curves.setdefault(macs, {}).setdefault(run.seed, []).append((rnd, acc))
        for tier, by_seed in curves.items():
            pairs = {seed: found for seed, curve in by_seed.items() if (found := last_two(curve))}
            if not pairs:
                continue
            previous = mean_ci([p[0][1] for p in pairs.values()])
            last = mean_ci([p[1][1] for p in pairs.values()])
            change = paired_difference({s: p[1][1] for s, p in pairs.items()}, {s: p[0][1] for s, p in pairs.items()})
            rounds = sorted({(p[0][0], p[1][0]) for p in pairs.values()})
            table.append(
                {
                    "method": row.name,
                    "tier_mmacs": math.nan if tier == "all" else round(tier / 1e6, 3),
                    "rounds": ", ".join(f"{a}-{b}" for a, b in rounds),
                    "previous": previous.mean,
                    "previous_ci95": previous.half_width,
                    "last": last.mean,
                    "last_ci95": last.half_width,
                    "change": change.difference.mean,
                    "change_ci95": change.difference.half_width,
                    "n": last.n,
                    "verdict": convergence_verdict(previous, last, change.difference),
                }
            )
    return table


COMPUTE_COLUMNS = (("client_train_flops", "client training FLOPs"), ("client_seconds", "client seconds"))


def compute_column(runs: list[Run]) -> tuple[str, str] | None:
    """The best compute measure every run recorded per round (analytic FLOPs before seconds); None when none was
    recorded by all (a quantity written as zeros or nan was not measured: no table or plot is built on it)."""
    for column, text in COMPUTE_COLUMNS:
        if runs and all(run.records(column) for run in runs):
            return column, text
    return None


def total_compute(run: Run, column: str) -> float:
    curve = run.compute_curve(column)
    return curve[-1][0] if curve else math.nan


def total_executed(run: Run) -> float:
    """A run's total executed client training FLOPs: ``client_train_flops_dense`` where it counted them apart (FIARSE
    computes its masked model densely: the FEAST repository's convention for matching it), else its
    ``client_train_flops``."""
    return total_compute(run, DENSE_COLUMN if run.records(DENSE_COLUMN) else MATCHED_COLUMN)


def compute_reference(rows: list[Row], row: Row, reference: str | None) -> Row | None:
    """The row whose per-seed totals set ``row``'s budgets: the row itself for the reference label, else the
    reference row of its grid cell (``reference_row``), else the reference row of any cell whose settings differ
    least; None without a reference (or when no row carries its label)."""
    if reference is None:
        return None
    if row.first.label == reference:
        return row
    found = reference_row(rows, row, reference)
    if found is not None:
        return found
    candidates = [r for r in rows if r.first.label == reference]
    return min(candidates, key=lambda r: config_distance(r.first.config, row.first.config), default=None)


def equal_compute_rows(rows: list[Row], reference: str | None = None) -> tuple[list[dict], str]:
    """Accuracy of every row after the same client compute, matched per seed.

    With a reference named, seed s of every row is read after the total client compute of the reference's own
    seed-s run (the reference row of its grid cell, see ``compute_reference``): so the reference reads its final
    accuracy, and a seed that spent more than the others is not read at an earlier evaluation. A seed the reference
    did not run is left out (``n`` counts the matched seeds). Without a reference every run is read after the least
    total of any run (so every run has spent it). A run that stopped below its budget shows its final accuracy; the
    row is marked as not having reached the budget. ``compute_budget`` is the mean of the row's per-seed budgets."""
    found = compute_column([run for row in rows for run in row.runs])
    if found is None:
        return [], ""
    column, text = found
    frame = run_frame(rows, total=lambda run: total_compute(run, column))
    least = float(frame["total"].min())
    budgets = []
    for row in rows:
        ref = compute_reference(rows, row, reference)
        ref_totals = ref.by_seed(lambda run: total_compute(run, column)) if ref is not None else {}
        budgets += [ref_totals.get(run.seed, math.nan) if ref is not None else least for run in row.runs]
    frame["budget"] = budgets
    frame["at_budget"] = [
        value_at_budget(run.compute_curve(column), budget)
        for run, budget in zip((run for row in rows for run in row.runs), budgets)
    ]
    matched = frame[frame["budget"].notna()]
    totals = estimates(frame, ["row"], "total")
    spent = estimates(matched, ["row"], "budget").reindex(totals.index)
    acc = estimates(matched, ["row"], "at_budget", prefix="accuracy_").reindex(totals.index)
    reached = (matched["total"] >= matched["budget"]).groupby(matched["row"]).all().reindex(totals.index)
    table = pd.DataFrame(
        {
            "method": [row.name for row in rows],
            "compute_budget": spent["budget"].to_numpy(),
            "total_compute": totals["total"].to_numpy(),
            "reached_budget": [bool(r) if r == r else False for r in reached],
            "accuracy_at_budget": acc["accuracy_at_budget"].to_numpy(),
            "accuracy_at_budget_ci95": acc["accuracy_at_budget_ci95"].to_numpy(),
            "n": acc["n"].fillna(0).astype(int).to_numpy(),
        }
    )
    return records(table), text


def matched_rows(rows: list[Row]) -> list[dict]:
    """Each match-compute row (see ``experiments.runner``) against the row of the label it matched, in its grid cell
    (``reference_row``): the mean over seeds of its total client training FLOPs over the reference's of the same
    seed, its final accuracy (mean and 95% interval over its seeds), and the paired difference of the final
    accuracies over the seeds both ran. A row whose reference runs are not in the table is left out."""
    table = []
    for row in rows:
        label = row.first.matched_to
        ref = reference_row(rows, row, label) if label is not None else None
        if ref is None:
            continue
        theirs = ref.by_seed(lambda run: total_compute(run, MATCHED_COLUMN))
        ratios = [total_compute(run, MATCHED_COLUMN) / theirs[run.seed] for run in row.runs if run.seed in theirs]
        theirs_executed = ref.by_seed(total_executed)
        executed = [total_executed(run) / theirs_executed[run.seed] for run in row.runs if run.seed in theirs]
        accuracy = row.estimate()
        paired = paired_difference(row.by_seed(), ref.by_seed())
        table.append(
            {
                "method": row.name,
                "reference": ref.name,
                "rounds": ",".join(str(run.summary.get("rounds", "?")) for run in row.runs),
                "seeds": seeds_text(row),
                "compute_ratio": math.fsum(ratios) / len(ratios) if ratios else math.nan,
                "compute_ratio_executed": math.fsum(executed) / len(executed) if executed else math.nan,
                "accuracy": accuracy.mean,
                "accuracy_ci95": accuracy.half_width,
                **paired_columns(paired),
            }
        )
    if not executed_apart(table):  # every run executed what it counted: one compute column, as before
        for r in table:
            del r["compute_ratio_executed"]
    return table


def executed_apart(table: list[dict]) -> bool:
    """Whether a matched row's executed compute ratio differs from its counted one (a run counted its executed FLOPs
    apart: FIARSE's dense tensors)."""
    return any(
        not math.isclose(r["compute_ratio"], r["compute_ratio_executed"], rel_tol=1e-9)
        for r in table
        if "compute_ratio_executed" in r and not math.isnan(r["compute_ratio"])
    )


def passes_rows(rows: list[Row]) -> list[dict]:
    """Per row whose every run recorded its clients' rounds (clients.csv): the passes over the clients' training
    images (``Run.passes``) of each seed, their mean with its 95% interval, and the images the clients hold."""
    table = []
    for row in rows:
        passes = [run.passes for run in row.runs]
        if any(math.isnan(p) for p in passes):
            continue
        estimate = mean_ci(passes)
        held = sorted({run.images_held for run in row.runs})
        rounds = [str(run.summary.get("rounds", "?")) for run in row.runs]
        table.append(
            {
                "method": row.name,
                "rounds": ",".join(rounds) if len(set(rounds)) > 1 else rounds[0],
                "seeds": seeds_text(row),
                "passes": ",".join(f"{p:.1f}" for p in passes),
                "passes_mean": estimate.mean,
                "passes_ci95": estimate.half_width,
                "n": estimate.n,
                "images_held": "/".join(f"{h:,}" for h in held),
            }
        )
    return table


# -- markdown ------------------------------------------------------------------------------------------------------
def percent(mean: float, half: float) -> str:
    if math.isnan(mean):
        return "–"
    return format_estimate(Estimate(mean, half, 2 if not math.isnan(half) else 1, math.nan))


def markdown(header: list[str], lines: list[list]) -> str:
    out = ["| " + " | ".join(map(markdown_cell, header)) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    out += ["| " + " | ".join(markdown_cell(c) for c in line) + " |" for line in lines]
    return "\n".join(out)


ACCURACY_TITLES = {
    "population_weighted_accuracy": "population-weighted accuracy (%)",
    "mean_client_accuracy": "mean client accuracy (%)",
    CLIENT_SUBNET_ACCURACY: "client-subnet accuracy (%)",
}


def accuracy_markdown(table: list[dict]) -> str:
    kinds = {row["accuracy_kind"] for row in table}
    acc_header = ACCURACY_TITLES[kinds.pop()] if len(kinds) == 1 else "accuracy (%)"
    return markdown(
        ["method", "dataset", "rounds", "seeds", "tiers (MMACs)", acc_header, "MB down", "MB up", "commit"],
        [
            [
                r["method"],
                r["dataset"],
                r["rounds"],
                r["seeds"],
                r["tiers"],
                percent(r["accuracy"], r["accuracy_ci95"]),
                f"{r['mb_down']:.1f}",
                f"{r['mb_up']:.1f}",
                r["commit"],
            ]
            for r in table
        ],
    )


def paired_markdown(table: list[dict]) -> str:
    return markdown(
        ["method", "vs", "difference (points)", "seeds won", "verdict"],
        [
            [
                r["method"],
                r["reference"],
                signed(r["difference"], r["difference_ci95"]),
                f"{r['wins']}/{r['n']}",
                r["verdict"],
            ]
            for r in table
        ],
    )


def convergence_markdown(table: list[dict]) -> str:
    return markdown(
        ["method", "tier (MMACs)", "rounds", "accuracy (%) then", "accuracy (%) last", "change (points)", "verdict"],
        [
            [
                r["method"],
                "all" if math.isnan(r["tier_mmacs"]) else f"{r['tier_mmacs']:.2f}",
                r["rounds"],
                percent(r["previous"], r["previous_ci95"]),
                percent(r["last"], r["last_ci95"]),
                signed(r["change"], r["change_ci95"]),
                r["verdict"],
            ]
            for r in table
        ],
    )


def signed(mean: float, half: float) -> str:
    text = percent(mean, half)
    return text if text.startswith(("-", "–")) else "+" + text


def compute_markdown(table: list[dict], text: str) -> str:
    return markdown(
        ["method", f"total {text}", f"budget ({text})", "accuracy (%) at the budget"],
        [
            [
                r["method"],
                f"{r['total_compute']:.4g}",
                f"{r['compute_budget']:.4g}",
                percent(r["accuracy_at_budget"], r["accuracy_at_budget_ci95"])
                + ("" if r["reached_budget"] else " (final; ran out before)"),
            ]
            for r in table
        ],
    )


def matched_markdown(table: list[dict]) -> str:
    """The matched table; with an ``executed`` column where some row's executed compute ratio differs from its
    counted one (``executed_apart``)."""
    apart = executed_apart(table)
    return markdown(
        [
            "method",
            "vs",
            "rounds",
            "compute (× vs)",
            *(["executed compute (× vs)"] if apart else []),
            "accuracy (%)",
            "difference (points)",
            "seeds won",
            "verdict",
        ],
        [
            [
                r["method"],
                r["reference"],
                r["rounds"],
                f"{r['compute_ratio']:.3f}",
                *([f"{r['compute_ratio_executed']:.3f}"] if apart else []),
                percent(r["accuracy"], r["accuracy_ci95"]),
                signed(r["difference"], r["difference_ci95"]),
                f"{r['wins']}/{r['n']}",
                r["verdict"],
            ]
            for r in table
        ],
    )


MATCHED_NOTE = (
    "Matched compute: each seed trained ceil(T / f) rounds, T the client training FLOPs of vs's run of that seed, f "
    "the FLOPs per round of the method's own equal-rounds run, with its learning-rate schedule over those rounds; "
    "compute is its total over vs's (mean over seeds), and the difference is to vs's final accuracy."
)


CONVERGENCE_NOTE = (
    "Converged: each seed's last two evaluations; 'flat' when each mean lies inside the other's 95% interval over "
    "seeds (the change is paired by seed)."
)


def compute_reference_label(tables: dict) -> str | None:
    """The reference label when a row carries it (the compute budgets are then its per-seed totals), else None."""
    reference = tables.get("reference")
    return reference if any(row.first.label == reference for row in tables.get("rows", [])) else None


def compute_note(reference: str | None) -> str:
    if reference:
        return (
            f"At equal compute, each seed is read after the total of {reference}'s run of the same seed (budget: "
            f"their mean), so {reference} reads its final accuracy."
        )
    return "At equal compute, every run is read after the least total of any run."


def report(runs: list[Run], reference: str | None = None, allow_mixed_commits: bool = False) -> dict:
    """Every table of a set of runs: {'accuracy', 'paired', 'tiers', 'tier_gains', 'rounds', 'tier_rounds',
    'convergence', 'compute', 'compute_text', 'matched', 'passes'}
    (and the rows and reference they were made of)."""
    if not runs:
        raise ValueError("no finished runs found (a run folder holds summary.json)")
    check_commits(runs, allow_mixed_commits)
    rows = group_runs(prefer_client_subnet_accuracy(runs))
    compute, compute_text = equal_compute_rows(rows, reference)
    return {
        "accuracy": accuracy_rows(rows),
        "paired": paired_rows(rows, reference) if reference else [],
        "tiers": tier_rows(rows),
        "tier_gains": tier_gain_rows(rows),
        "rounds": round_rows(rows),
        "tier_rounds": tier_round_rows(rows),
        "convergence": convergence_rows(rows),
        "compute": compute,
        "compute_text": compute_text,
        "matched": matched_rows(rows),
        "passes": passes_rows(rows),
        "rows": rows,
        "reference": reference,
    }


def report_text(tables: dict) -> str:
    parts = [accuracy_markdown(tables["accuracy"])]
    if tables["paired"]:
        parts.append(paired_markdown(tables["paired"]))
    if tables["compute"]:
        parts.append(compute_markdown(tables["compute"], tables["compute_text"]))
        parts.append(compute_note(compute_reference_label(tables)))
    if tables.get("matched"):
        parts.append(matched_markdown(tables["matched"]))
        parts.append(MATCHED_NOTE)
    if tables.get("convergence"):
        parts.append(convergence_markdown(tables["convergence"]))
        parts.append(CONVERGENCE_NOTE)
    parts.append("Means over seeds with 95% t-intervals (±); differences are paired by seed.")
    return "\n\n".join(parts)


# -- writing -------------------------------------------------------------------------------------------------------
def csv_bytes(table: list[dict]) -> bytes:
    """The table as CSV, written as ``csv.DictWriter`` writes it (CRLF lines, nan for a missing value); a text cell
    that a spreadsheet would run as a formula is escaped (``spreadsheet_cell``)."""
    buffer = io.StringIO()
    table = [{key: spreadsheet_cell(value) for key, value in row.items()} for row in table]
    pd.DataFrame(table).to_csv(buffer, index=False, lineterminator="\r\n", na_rep="nan")
    return buffer.getvalue().encode()


def write_file(path: Path, content) -> Path:
    """Create or rewrite one output file (a symlink or folder at the name is refused: ``ReportError``)."""
    try:
        return replace_file(path, content)
    except FileExistsError as error:
        raise ReportError(str(error)) from None


def write_tables(out: Path, tables: dict) -> str:
    """table.md (what is printed) and the CSV tables of ``TABLE_FILES`` that have rows."""
    out.mkdir(parents=True, exist_ok=True)
    text = report_text(tables)
    write_file(out / "table.md", (text + "\n").encode())
    for name, filename in TABLE_FILES.items():
        if tables.get(name):
            write_file(out / filename, csv_bytes(tables[name]))
    return text


def stale_files(out: Path, tables: dict, plotted: list[Path] | None = None) -> list[Path]:
    """Table files (and, after plotting, plot files) in ``out`` this report did not write: left from an earlier
    report, of other runs or of a quantity no longer reported; they are named, not removed."""
    stale = [out / f for name, f in TABLE_FILES.items() if not tables.get(name) and os.path.lexists(out / f)]
    if plotted is not None:
        from fl_app.plots import PLOTS

        stale += [out / name for name in PLOTS if out / name not in plotted and os.path.lexists(out / name)]
    return stale


def write_suite_tables(
    out: Path, folders: list[Path], reference: str | None = None, allow_mixed_commits: bool = False, plots: bool = True
) -> str:
    """The runner's last step: tables (and plots) of a suite's finished runs, written into its folder."""
    try:
        runs = [load_run(f) for f in folders]
        tables = report(runs, reference, allow_mixed_commits)
        text = write_tables(out, tables)
        if plots:
            write_plots(out, tables)
    except (MixedCommits, ValueError) as error:
        return f"no table written: {error}"
    return text


def write_plots(out: Path, tables: dict) -> list[Path]:
    """The summary plots (see ``fl_app.plots``), written into ``out``."""
    from fl_app import plots

    return plots.write_plots(out, tables, write_file)


# -- each client's data and budget ---------------------------------------------------------------------------------
def client_plot(folder: Path, out: Path) -> Path:
    """clients_<label>_seed<N>.png: every client's training labels (redrawn from the run config with the app's own
    partitioning; checked against the partition sizes clients.csv recorded) and its budget or model."""
    from fl_app import plots

    run = load_run(folder)
    counts, budgets, architectures = plots.client_partitions(run)
    name = re.sub(r"[^A-Za-z0-9_.=-]+", "_", run.label + "".join(f"_{k}={v}" for k, v in run.cell.items()))
    out.mkdir(parents=True, exist_ok=True)
    figure = plots.figure_clients(run, counts, budgets, architectures)
    return write_file(out / f"clients_{name}_seed{run.seed}.png", plots.png_bytes(figure))


# -- tables kept in READMEs ----------------------------------------------------------------------------------------
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


def tiers_markdown(table: list[dict]) -> str:
    return markdown(
        ["method", "tier (MMACs)", "accuracy (%)", "seeds", "clients affording it"],
        [
            [
                r["method"],
                f"{r['tier_mmacs']:.2f}",
                percent(r["accuracy"], r["accuracy_ci95"]),
                r["n"],
                "" if math.isnan(r["clients_affording"]) else f"{round(r['clients_affording'], 1):g}",
            ]
            for r in table
        ],
    )


def passes_markdown(table: list[dict]) -> str:
    return markdown(
        ["method", "rounds", "seeds", "passes (per seed)", "passes", "images the clients hold"],
        [
            [
                r["method"],
                r["rounds"],
                r["seeds"],
                r["passes"],
                format_estimate(Estimate(r["passes_mean"], r["passes_ci95"], r["n"], math.nan), scale=1.0),
                r["images_held"],
            ]
            for r in table
        ],
    )


def tier_gains_markdown(table: list[dict]) -> str:
    return markdown(
        ["method", "tier (MMACs)", "vs tier (MMACs)", "difference (points)", "seeds won", "verdict"],
        [
            [
                r["method"],
                f"{r['tier_mmacs']:.2f}",
                f"{r['vs_tier_mmacs']:.2f}",
                signed(r["difference"], r["difference_ci95"]),
                f"{r['wins']}/{r['n']}",
                r["verdict"],
            ]
            for r in table
        ],
    )


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


def build_parser() -> argparse.ArgumentParser:
    parser = tool_parser("fl_app.report", __doc__)
    parser.add_argument("paths", nargs="+", type=Path, help="run folders, suite folders, or folders holding runs")
    parser.add_argument("--reference", help="label to take paired differences against (unset: no differences)")
    parser.add_argument("--out", type=Path, help="write table.md and the CSV tables here (unset: print only)")
    parser.add_argument("--plots", action="store_true", help="with --out: also write the plots")
    parser.add_argument(
        "--clients",
        action="store_true",
        help="with --out: the paths are run folders; plot each client's labels and budget (reads the run's data)",
    )
    parser.add_argument(
        "--allow-mixed-commits", action="store_true", help="let one table hold runs made at different commits"
    )
    parser.add_argument(
        "--update-readme",
        action="store_true",
        help="the paths are markdown files: regenerate their <!-- report: ... --> tables in place",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.update_readme:
            root = Path(__file__).resolve().parents[1]
            for path in args.paths:
                text = path.read_text()
                updated = regenerate_readme(text, root)
                if updated != text:
                    write_file(path, updated.encode())
                print(f"{'updated' if updated != text else 'unchanged'} {path}")
            return 0
        if args.clients:
            if not args.out:
                raise ValueError("--clients writes plots: give --out DIR")
            for folder in args.paths:
                print(f"wrote {client_plot(folder, args.out)}")
            return 0
        tables = report(find_runs(args.paths), args.reference, args.allow_mixed_commits)
        if not args.out:
            print(report_text(tables))
            return 0
        print(write_tables(args.out, tables))
        plotted = write_plots(args.out, tables) if args.plots else None
        for path in plotted or []:
            print(f"wrote {path}")
        for path in stale_files(args.out, tables, plotted):
            print(f"note: {path} is left from an earlier report (this one has nothing to put there)", file=sys.stderr)
    except (MixedCommits, ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
