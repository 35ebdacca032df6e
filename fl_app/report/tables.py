"""The report's tables, one list of dicts each, built from rows of runs: accuracy, paired differences, tiers, rounds,
convergence, equal compute, matched compute, passes, machine time; ``report`` makes all of them.
"""

from __future__ import annotations

import math

import pandas as pd

from fl_app.report.read import (
    COMPUTE_COLUMNS,
    DENSE_COLUMN,
    MATCHED_COLUMN,
    NOT_GROUPED,
    SECONDS_COLUMN,
    Run,
    prefer_client_subnet_accuracy,
)
from fl_app.report.rows import Row, check_commits, group_runs, rounds_text, seeds_text, tier_text
from fl_app.report.stats import (
    convergence_verdict,
    curve_frame,
    estimates,
    last_two,
    on_shared_rounds,
    records,
    run_frame,
)
from fl_app.run.stats import client_tier_scores, mean_ci, paired_difference, value_at_budget


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


def client_accuracies(run: Run) -> list[float]:
    """Each client's test accuracy as client-subnet accuracy scores it (their mean is that accuracy): the cached
    subnet the run recorded for it (``client_subnets``: FEAST, SuperFedNAS, DeepFedNAS), else the largest reporting
    tier its budget affords, 0 when none (``client_tier_scores``: a width level, the fixed smallest model)."""
    subnets = run.summary.get("client_subnets")
    if subnets:
        scores = [float(subnet["accuracy"]) for subnet in subnets]
    else:
        tiers = run.summary.get("tiers") or []
        scores = client_tier_scores(run.budgets, [t["macs"] for t in tiers], [t["accuracy"] for t in tiers])
    if len(scores) != len(run.budgets):
        raise ValueError(
            f"{run.folder}: summary.json scores {len(scores)} clients and clients.csv holds {len(run.budgets)} "
            "budgets; allowed: one score per client"
        )
    return scores


def budget_group_rows(rows: list[Row], reference: str) -> list[dict]:
    """Client-subnet accuracy per budget group, each row against the reference label's row paired by seed. The groups
    are the same clients for every method of a seed (the budgets follow the seed): from each of the reference's tiers
    up to the next, the last from its whole model up, so a group's clients can all run the reference's tier that
    opens it and none the next. Where a method's larger models could pay, its gain shows in the upper groups; in the
    lowest, every client of the reference runs a subnet below its second tier, so a difference there is not capacity."""
    table = []
    for row in rows:
        ref = row if row.first.label == reference else reference_row(rows, row, reference)
        tiers = sorted(t["macs"] for t in (ref.first.summary.get("tiers") or [])) if ref else []
        if not tiers or not all(run.budgets for run in row.runs + ref.runs):
            continue
        mine = {run.seed: group_means(run, tiers) for run in row.runs}
        theirs = {run.seed: group_means(run, tiers) for run in ref.runs}
        for g, low in enumerate(tiers):
            values = [groups[g][0] for groups in mine.values() if g in groups]
            if not values:
                continue
            estimate = mean_ci(values)
            paired = paired_difference(
                {s: groups[g][0] for s, groups in mine.items() if g in groups},
                {s: groups[g][0] for s, groups in theirs.items() if g in groups},
            )
            table.append(
                {
                    "method": row.name,
                    "reference": ref.name,
                    "budget_from_mmacs": round(low / 1e6, 3),
                    "budget_to_mmacs": round(tiers[g + 1] / 1e6, 3) if g + 1 < len(tiers) else math.nan,
                    "clients": float(sum(groups[g][1] for groups in mine.values() if g in groups) / len(values)),
                    "accuracy": estimate.mean,
                    "accuracy_ci95": estimate.half_width,
                    **({} if ref is row else paired_columns(paired)),
                }
            )
    return table


def group_means(run: Run, tiers: list[float]) -> dict[int, tuple[float, int]]:
    """{budget group: (mean client accuracy, clients)} of ``run``, the groups opened by ``tiers``: a client is in the
    group of the largest tier its budget affords (``budget_group_rows``)."""
    scores: dict[int, list[float]] = {}
    for budget, score in zip(run.budgets, client_accuracies(run)):
        scores.setdefault(max(sum(budget >= macs for macs in tiers) - 1, 0), []).append(score)
    return {g: (sum(v) / len(v), len(v)) for g, v in scores.items()}


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


# the widest vector extension a machine record lists, widest first: what sets a CPU round's speed most (the same
# clients train about 3x slower on a processor without AVX-512, reference-regime README)
VECTOR_CLASSES = (("avx512f", "AVX-512"), ("avx2", "AVX2"), ("avx", "AVX"), ("sse4_2", "SSE4.2"))


def processor_class(machine: dict | None) -> str:
    """A machine record's processor as the machine-time table names it: model, cores and widest vector extension."""
    if not machine:
        return "not recorded"
    processor = machine.get("processor") if isinstance(machine.get("processor"), dict) else {}
    extensions = processor.get("vector_extensions") or []
    widest = next((name for flag, name in VECTOR_CLASSES if flag in extensions), "no vector extension recorded")
    cores = f" ({processor['cores']} cores)" if isinstance(processor.get("cores"), int) else ""
    return f"{processor.get('model', 'unknown processor')}{cores}, {widest}"


def machine_time_rows(rows: list[Row]) -> list[dict]:
    """Per row whose every run recorded its rounds' wall time, and per processor that trained some of its rounds
    (``Run.machine_of_round``): the rounds trained there over the row's seeds, their mean seconds a round (each from
    the end of the round before: training, aggregation, evaluation, the round files and any checkpoint) and the hours
    one seed of the row's mean length takes at that rate: what a run costs on each kind of machine, to plan the next."""
    table = []
    for row in rows:
        if not all(run.records(SECONDS_COLUMN) for run in row.runs):
            continue
        seconds: dict[str, list[float]] = {}
        for run in row.runs:
            for server_round, wall in zip(run.rounds["round"], run.rounds[SECONDS_COLUMN]):
                seconds.setdefault(processor_class(run.machine_of_round(int(server_round))), []).append(float(wall))
        rounds_a_seed = sum(len(run.rounds) for run in row.runs) / len(row.runs)
        for processor, walls in sorted(seconds.items()):
            a_round = sum(walls) / len(walls)
            table.append(
                {
                    "method": row.name,
                    "rounds": rounds_text(row),
                    "seeds": seeds_text(row),
                    "processor": processor,
                    "rounds_there": len(walls),
                    "seconds_a_round": a_round,
                    "hours_a_seed": rounds_a_seed * a_round / 3600,
                }
            )
    return table


def report(runs: list[Run], reference: str | None = None, allow_mixed_commits: bool = False) -> dict:
    """Every table of a set of runs: {'accuracy', 'paired', 'tiers', 'tier_gains', 'rounds', 'tier_rounds',
    'convergence', 'compute', 'compute_text', 'matched', 'passes', 'budget_groups', 'machine_time'}
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
        "budget_groups": budget_group_rows(rows, reference) if reference else [],
        "machine_time": machine_time_rows(rows),
        "rows": rows,
        "reference": reference,
    }
