"""Reading result folders: a run folder's summary.json, run.json, metrics.csv, rounds.csv and clients.csv, each
field checked (an error names the file, the field and the allowed values), as one ``Run``; ``find_runs`` finds them.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from fl_app.io.bounded import MAX_FIELD_CHARS, MAX_LINE_CHARS, MAX_TABLE_BYTES, read_bounded_text, shown
from fl_app.run.config import KEYS

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
TABLE_FILES["budget_groups"] = "budget_groups.csv"
TIER_COLUMNS = ("tier_macs", "test_accuracy")  # metrics.csv: one row per evaluated round and tier
# run-config keys the suite runner sets per seed for a match-compute run (from its sources' compute): not grouped on
MATCH_SET = ("num-server-rounds", "eval-every")
MATCHED_COLUMN = "client_train_flops"  # the compute a match-compute run matches (experiments.runner)
# the executed FLOPs where a run counts them apart (FIARSE's dense tensors; other runs execute what they count)
DENSE_COLUMN = "client_train_flops_dense"
COMPUTE_COLUMNS = (("client_train_flops", "client training FLOPs"), ("client_seconds", "client seconds"))
SECONDS_COLUMN = "seconds"  # a round's wall time, from the end of the round before (fl_app.run.lifecycle)


def settings(run_config: dict) -> dict:
    """A run config without the keys at their default value.

    Runs are compared through this, so a key added to the registry later, with a default that keeps the old
    behaviour, does not split or invalidate earlier runs; a changed default does show as a difference."""
    return {k: v for k, v in run_config.items() if k not in KEYS or KEYS[k].default != v}


class MixedCommits(ValueError):
    pass


class ReportError(ValueError):
    """A file of a run folder that cannot be read as the app writes it; the message names the file."""


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
    "segments": (
        lambda v: (
            isinstance(v, list)
            and all(
                isinstance(s, dict)
                and isinstance(s.get("rounds"), list)
                and len(s["rounds"]) == 2
                and all(_is_whole(r) and 1 <= r <= MAX_WHOLE for r in s["rounds"])
                and s["rounds"][0] <= s["rounds"][1] + 1  # [n + 1, n]: a copy that kept no round of its own
                and (s.get("machine") is None or isinstance(s["machine"], dict))
                for s in v
            )
        ),
        "a list of objects with 'rounds' ([first, last], whole numbers from 1, first <= last + 1) and an optional "
        "'machine' object",
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
    "machine": "object",
    "resumed_after_round": "count",
    "earlier_segments": "segments",
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

    def machine_of_round(self, server_round: int) -> dict | None:
        """The machine record (run.json ``machine``) of the stretch that trained ``server_round``: a parked copy the
        run continued (``earlier_segments``) or the run's own last stretch, after ``resumed_after_round``; None for a
        round no record covers (a run continued before its segments were recorded)."""
        for segment in self.record.get("earlier_segments", []):
            first, last = segment["rounds"]
            if first <= server_round <= last:
                return segment.get("machine")
        return self.record.get("machine") if server_round > self.record.get("resumed_after_round", 0) else None

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
        rounds = read_table(
            folder / "rounds.csv", ("round",), (*(c for c, _ in COMPUTE_COLUMNS), DENSE_COLUMN, SECONDS_COLUMN)
        )
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
        if (path / "summary.json").exists() and not (path / "metrics.csv").exists() and (path / "runs").is_dir():
            path = path / "runs"  # a results folder: its summary.json is an old study's table, its runs are in runs/
        if (path / "summary.json").exists():
            folders.append(path)
        elif (path / "suite.json").exists():
            folders += suite_folders(path)
        else:
            folders += sorted(p.parent for p in path.rglob("summary.json") if ".interrupted-" not in str(p))
    runs = [load_run(f) for f in dict.fromkeys(folders)]
    return [run for run in runs if run.summary.get("completed", True)]  # a failed run's summary says completed: false
