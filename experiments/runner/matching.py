"""Match-compute runs: the rounds of a run that matches another label's client training FLOPs, read from the
finished runs of its seed (the reference's total, the same method's equal-rounds run per round)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING

from experiments.runner.suite import MATCH_FLOPS_COLUMNS
from fl_app.report import MATCHED_COLUMN, read_table
from fl_app.run.config import validate_run_config

if TYPE_CHECKING:  # planning imports this module
    from experiments.runner.planning import PlannedRun


def match_sources_of(run: PlannedRun, runs: list[PlannedRun]) -> tuple[PlannedRun, PlannedRun]:
    """The reference's and the source's runs of ``run``'s seed and cell (``expand`` plans both)."""
    reference, source = run.match
    found = {(r.label, json.dumps(r.cell, sort_keys=True), r.seed): r for r in runs}
    cell = json.dumps(run.cell, sort_keys=True)
    return found[(reference, cell, run.seed)], found[(source, cell, run.seed)]


def flops_per_round(folder: Path, flops: str = "counted") -> list[float]:
    """``client_train_flops`` of each round of a finished run's rounds.csv (their sum is the total that
    ``fl_app.report.total_compute`` reads), or with ``flops = "executed"`` its ``client_train_flops_dense`` where
    the run counted them apart (else the counted ones: it executed what it counted); ValueError naming the file when
    a round did not record it."""
    path = folder / "rounds.csv"
    column = MATCH_FLOPS_COLUMNS[flops]
    table = read_table(path, ("round", MATCHED_COLUMN), (MATCHED_COLUMN, column))
    if column not in table.columns:
        column = MATCHED_COLUMN
    values = table[column].tolist()
    if not values or not all(math.isfinite(v) and v >= 0 for v in values) or math.fsum(values) <= 0:
        raise ValueError(f"{path}: {column} is not recorded (a number >= 0, not all zero) in every round")
    return values


def matched_rounds(reference_total: float, per_round: float) -> int:
    """ceil(reference_total / per_round), at least 1; a quotient within float rounding of a whole number is that
    number (matching a run of the same FLOPs per round must not add a round)."""
    ratio = reference_total / per_round
    return max(1, round(ratio) if math.isclose(ratio, round(ratio), rel_tol=1e-9) else math.ceil(ratio))


def resolve_match(run: PlannedRun, reference: PlannedRun, source: PlannedRun) -> None:
    """Set a match-compute run's num-server-rounds from the finished reference and source runs of its seed, and
    its eval-every; ValueError naming the file or key when they cannot be set."""
    flops_kind = run.match_flops
    reference_total = math.fsum(flops_per_round(reference.folder, flops_kind))
    per_round = flops_per_round(source.folder, flops_kind)
    flops = math.fsum(per_round) / len(per_round)
    rounds = matched_rounds(reference_total, flops)
    # evaluate about as often as the source (every eval-every rounds and after the last: ceil(R / eval-every)
    # evaluations): a run several times longer at the same eval-every would spend that many times the evaluation
    # time, and its curve would have more points than the one it is compared with
    evaluations = math.ceil(source.run_config["num-server-rounds"] / source.run_config["eval-every"])
    eval_every = math.ceil(rounds / evaluations)
    config = {**run.run_config, "num-server-rounds": rounds, "eval-every": eval_every}
    run.run_config = validate_run_config(config).to_dict()
    run.run_config.pop("output-dir")
    run.match_compute = {
        "reference": reference.label,
        "reference_total_flops": reference_total,
        "source": source.label,
        "source_flops_per_round": flops,
        **({"flops": flops_kind} if flops_kind != "counted" else {}),
        "rounds": rounds,
        "eval_every": eval_every,
    }


def match_text(run: PlannedRun) -> str:
    """A match-compute run's rounds, or what it waits for or why it is not run ('' for other runs)."""
    if run.match_compute and run.action != "skip":
        kind = " executed" if run.match_flops == "executed" else ""
        return f"{run.match_compute['rounds']} rounds, the{kind} client training FLOPs of {run.match[0]}"
    return run.reason
