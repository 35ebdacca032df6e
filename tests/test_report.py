"""fl_app.report: grouping runs into rows, commit checks, the two accuracy kinds, the CLI, and the README tables
regenerated from the committed results."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from clients.local_training import local_batches
from fl_app.report import (
    MixedCommits,
    find_runs,
    images_per_round,
    main,
    passes_markdown,
    regenerate_readme,
    report,
    report_text,
    tiers_markdown,
    write_tables,
)
from fl_app.report.tables import client_accuracies
from fl_app.report.text import budget_groups_markdown, machine_time_markdown
from fl_app.run.outputs import write_csv, write_json
from tests.harness.training import plain_settings

ROOT = Path(__file__).resolve().parents[1]
END_REPORT = "<!-- /generated:report -->"


def make_run(
    folder: Path, method="feast", seed=0, accuracy=0.3, commit=None, label=None, kind="supernet", **config
) -> Path:
    folder.mkdir(parents=True)
    run_config = {"method": method, "seed": seed, "num-server-rounds": 4, **config}
    summary = {
        "method": method,
        "dataset": "cifar10",
        "rounds": 4,
        "seed": seed,
        "bytes_down": 3e6,
        "bytes_up": 1e6,
        "run_config": run_config,
    }
    if kind == "supernet":
        summary.update(population_weighted_accuracy=accuracy, tiers=[{"macs": 4.9e5, "accuracy": accuracy}])
    else:
        summary.update(mean_client_accuracy=accuracy)
    write_json(folder / "summary.json", summary)
    write_csv(folder / "metrics.csv", [{"round": 4, "population_weighted_accuracy": accuracy}])
    if commit:
        write_json(
            folder / "run.json",
            {
                "commit": commit,
                "dirty": False,
                "label": label or method,
                "run_config": run_config,
                "federation": {},
                "seed": seed,
            },
        )
    return folder


def test_runs_differing_only_in_seed_are_one_row_and_other_settings_split_rows(tmp_path):
    for seed, acc in ((0, 0.30), (1, 0.34), (2, 0.32)):
        make_run(tmp_path / f"a{seed}", seed=seed, accuracy=acc)
    make_run(tmp_path / "b0", seed=0, accuracy=0.5, lr=0.1)
    tables = report(find_runs([tmp_path]))
    rows = {r["method"]: r for r in tables["accuracy"]}
    assert set(rows) == {"feast [lr=None]", "feast [lr=0.1]"}
    assert rows["feast [lr=None]"]["seeds"] == "0,1,2" and rows["feast [lr=None]"]["accuracy"] == pytest.approx(0.32)
    assert rows["feast [lr=0.1]"]["n"] == 1


def test_key_at_its_default_is_the_same_setting(tmp_path):
    make_run(tmp_path / "a", seed=0)
    make_run(tmp_path / "b", seed=1, lr=0.05)  # 0.05 is the registry default
    assert len(report(find_runs([tmp_path]))["accuracy"]) == 1


def test_mixed_commits_are_refused_unless_allowed_and_each_row_names_its_commits(tmp_path):
    make_run(tmp_path / "a", seed=0, commit="a" * 40)
    make_run(tmp_path / "b", seed=1, commit="b" * 40)
    with pytest.raises(MixedCommits, match="aaaaaaa .1 runs., bbbbbbb .1 runs."):
        report(find_runs([tmp_path]))
    table = report(find_runs([tmp_path]), allow_mixed_commits=True)["accuracy"]
    assert table[0]["commit"] == "aaaaaaa, bbbbbbb"


def test_model_heterogeneous_runs_report_mean_client_accuracy(tmp_path):
    make_run(tmp_path / "t0", method="fedtopo", seed=0, accuracy=0.7, kind="multiarch")
    make_run(tmp_path / "t1", method="fedtopo", seed=1, accuracy=0.74, kind="multiarch")
    text = report_text(report(find_runs([tmp_path])))
    assert "mean client accuracy (%)" in text and "| fedtopo | cifar10 | 4 | 0,1 | – | 72.0 ± 25.4 |" in text


def add_client_subnet_accuracy(folder: Path, final: float, at_round_2: float) -> None:
    """What runs record since client_subnet_accuracy exists: the summary key and a metrics.csv column."""
    summary = json.loads((folder / "summary.json").read_text())
    write_json(folder / "summary.json", {**summary, "client_subnet_accuracy": final}, replace=True)
    write_csv(
        folder / "metrics.csv",
        [
            {"round": 2, "population_weighted_accuracy": 0.1, "client_subnet_accuracy": at_round_2},
            {
                "round": 4,
                "population_weighted_accuracy": summary["population_weighted_accuracy"],
                "client_subnet_accuracy": final,
            },
        ],
        replace=True,
    )


def test_client_subnet_accuracy_is_used_when_every_run_of_the_table_recorded_it(tmp_path):
    for seed, (final, early) in enumerate(((0.50, 0.20), (0.54, 0.30))):
        add_client_subnet_accuracy(make_run(tmp_path / f"a{seed}", seed=seed, accuracy=0.3), final, early)
    tables = report(find_runs([tmp_path]))
    (row,) = tables["accuracy"]
    assert row["accuracy"] == pytest.approx(0.52) and row["accuracy_kind"] == "client_subnet_accuracy"
    assert "client-subnet accuracy (%)" in report_text(tables)
    assert [(r["round"], r["accuracy"]) for r in tables["rounds"]] == [
        (2, pytest.approx(0.25)),
        (4, pytest.approx(0.52)),
    ]
    # one run without it: the whole table falls back to the population-weighted accuracy, as before
    make_run(tmp_path / "a2", seed=2, accuracy=0.3)
    (row,) = report(find_runs([tmp_path]))["accuracy"]
    assert row["accuracy"] == pytest.approx(0.3) and row["accuracy_kind"] == "population_weighted_accuracy"


def test_failed_runs_are_left_out(tmp_path):
    make_run(tmp_path / "ok", seed=0, accuracy=0.4)
    failed = make_run(tmp_path / "failed", seed=1, accuracy=0.1)
    summary = json.loads((failed / "summary.json").read_text())
    (failed / "summary.json").write_text(json.dumps({**summary, "completed": False}))
    assert [r.folder.name for r in find_runs([tmp_path])] == ["ok"]


def test_suite_folder_reads_only_its_current_runs(tmp_path):
    make_run(tmp_path / "runs/feast/seed0", commit="c" * 40)
    make_run(tmp_path / "runs/feast/seed0.v2", commit="c" * 40, accuracy=0.9, lr=0.2)
    write_json(tmp_path / "suite.json", {"runs": [{"folder": "runs/feast/seed0.v2"}]})
    runs = find_runs([tmp_path])
    assert [r.folder.name for r in runs] == ["seed0.v2"]


def test_cli_prints_the_table_and_writes_csv_and_plots(tmp_path, capsys):
    for seed in (0, 1):
        make_run(tmp_path / "runs" / f"f{seed}", seed=seed, accuracy=0.3 + seed / 100)
        make_run(tmp_path / "runs" / f"m{seed}", method="fedavg-min", seed=seed, accuracy=0.3)
    assert main([str(tmp_path / "runs"), "--reference", "fedavg-min", "--out", str(tmp_path / "rep"), "--plots"]) == 0
    printed = capsys.readouterr().out
    # differences 0 and +1 point: mean 0.5, half-width 12.706 * 0.707 / sqrt(2) = 6.35; seed 0 is a tie, not a win
    assert "| feast | fedavg-min | +0.5 ± 6.4 | 1/2 | not distinguishable at 2 seeds |" in printed
    assert (tmp_path / "rep/table.csv").exists() and (tmp_path / "rep/paired.csv").exists()
    assert (tmp_path / "rep/accuracy_vs_macs.png").read_bytes()[:4] == b"\x89PNG"
    assert main([str(tmp_path / "nothing")]) == 2


def test_readme_tables_match_the_committed_results():
    """Every <!-- generated:report (...) --> table in the READMEs is what the report tool makes of the runs it names."""
    checked = 0
    for readme in [ROOT / "README.md", *sorted(ROOT.glob("experiments/**/README.md")), *sorted(ROOT.glob("docs/*.md"))]:
        text = readme.read_text()
        if "<!-- generated:report (" in text:
            assert regenerate_readme(text, ROOT) == text, f"{readme}: rerun python -m fl_app.report --update-readme"
            checked += 1
    assert checked >= 1


def test_equal_compute_reads_every_row_at_the_references_total_flops(tmp_path):
    def run_with_curve(name, method, rounds, flops_per_round, evaluated):
        folder = make_run(tmp_path / name, method=method, commit="d" * 40, label=name, **{"num-server-rounds": rounds})
        write_csv(
            folder / "rounds.csv", [{"round": r, "client_train_flops": flops_per_round} for r in range(1, rounds + 1)]
        )
        write_csv(folder / "metrics.csv", [{"round": r, "population_weighted_accuracy": a} for r, a in evaluated])

    run_with_curve("feast", "feast", 4, 10.0, [(2, 0.2), (4, 0.4)])  # 40 FLOPs in all
    run_with_curve("fedavg-min", "fedavg-min", 4, 2.0, [(4, 0.3)])  # 8 FLOPs: stops below the budget
    run_with_curve("fedavg-min-long", "fedavg-min", 30, 2.0, [(10, 0.25), (20, 0.35), (30, 0.38)])  # 40 after 20
    tables = report(find_runs([tmp_path]), reference="feast")
    rows = {r["method"]: r for r in tables["compute"]}
    assert rows["feast"]["compute_budget"] == 40.0 and rows["feast"]["accuracy_at_budget"] == 0.4
    assert rows["fedavg-min-long"]["accuracy_at_budget"] == 0.35 and rows["fedavg-min-long"]["reached_budget"]
    assert rows["fedavg-min"]["accuracy_at_budget"] == 0.3 and not rows["fedavg-min"]["reached_budget"]
    text = report_text(tables)
    assert "client training FLOPs" in text and "| fedavg-min | 8 | 40 | 30.0 (final; ran out before) |" in text


def test_equal_compute_matches_each_seed_to_the_references_own_total(tmp_path):
    """Seeds whose reference totals differ: each seed is read at the reference's total of the same seed, so the
    reference reads its own final accuracy (a mean budget would read seed 1 at an earlier evaluation)."""

    def run_with_curve(name, method, seed, flops, evaluated):
        folder = make_run(
            tmp_path / name, method=method, seed=seed, commit="d" * 40, **{"num-server-rounds": len(flops)}
        )
        write_csv(folder / "rounds.csv", [{"round": r, "client_train_flops": f} for r, f in enumerate(flops, 1)])
        write_csv(folder / "metrics.csv", [{"round": r, "population_weighted_accuracy": a} for r, a in evaluated])

    # feast: seed 0 spends 4 x 10 = 40 FLOPs, seed 1 spends 4 x 20 = 80; the mean, 60, lies below seed 1's total
    run_with_curve("feast0", "feast", 0, [10.0] * 4, [(2, 0.20), (4, 0.40)])
    run_with_curve("feast1", "feast", 1, [20.0] * 4, [(2, 0.30), (4, 0.50)])
    # fedavg-min, 10 FLOPs a round, evaluated every 2 rounds: cumulative 20, 40, 60, 80, 100 at rounds 2 .. 10
    curve0 = [(2, 0.10), (4, 0.15), (6, 0.22), (8, 0.27), (10, 0.31)]
    curve1 = [(2, 0.12), (4, 0.18), (6, 0.24), (8, 0.29), (10, 0.33)]
    run_with_curve("min0", "fedavg-min", 0, [10.0] * 10, curve0)
    run_with_curve("min1", "fedavg-min", 1, [10.0] * 10, curve1)
    rows = {r["method"]: r for r in report(find_runs([tmp_path]), reference="feast")["compute"]}
    # by hand: seed 0 at 40 FLOPs -> round 4 (0.15); seed 1 at 80 FLOPs -> round 8 (0.29)
    assert rows["fedavg-min"]["accuracy_at_budget"] == pytest.approx((0.15 + 0.29) / 2)
    assert rows["fedavg-min"]["compute_budget"] == 60.0 and rows["fedavg-min"]["reached_budget"]
    # the reference row is its final accuracy, seed by seed
    assert rows["feast"]["accuracy_at_budget"] == pytest.approx((0.40 + 0.50) / 2) and rows["feast"]["n"] == 2
    assert rows["feast"]["accuracy_at_budget_ci95"] == pytest.approx(12.706 * 0.0707107 / 2**0.5, rel=1e-4)


def test_tier_curves_average_each_tier_and_round_over_seeds(tmp_path):
    """tier_rounds.csv by hand: two seeds, two tiers at rounds 2 and 4; a tier one seed lacks at a round is left
    out (means over the same seeds only)."""
    rows_of = {
        0: [(2, 4.9e5, 0.20), (2, 1.5e6, 0.25), (4, 4.9e5, 0.30), (4, 1.5e6, 0.40)],
        1: [(2, 4.9e5, 0.22), (4, 4.9e5, 0.34), (4, 1.5e6, 0.44)],
    }
    for seed, tier_rows in rows_of.items():
        folder = make_run(tmp_path / f"r{seed}", seed=seed, accuracy=0.3)
        write_csv(
            folder / "metrics.csv",
            [
                {"round": r, "tier_macs": m, "test_accuracy": a, "population_weighted_accuracy": 0.3}
                for r, m, a in tier_rows
            ],
        )
    table = report(find_runs([tmp_path]))["tier_rounds"]
    got = {(r["tier_mmacs"], r["round"]): (r["accuracy"], r["n"]) for r in table}
    assert set(got) == {(0.49, 2), (0.49, 4), (1.5, 4)}  # 1.5 MMACs at round 2: seed 1 has none
    assert got[(0.49, 2)][0] == pytest.approx(0.21) and got[(0.49, 4)][0] == pytest.approx(0.32)
    assert got[(1.5, 4)] == (pytest.approx(0.42), 2)
    assert report(find_runs([tmp_path / "r0"]))["tier_rounds"][0]["n"] == 1


def test_curves_align_seeds_evaluated_at_the_same_fractions_of_their_own_horizons(tmp_path):
    """A match-compute row: seed 0 runs 547 rounds and evaluates at 55, 110, 547; seed 1 runs 597 and evaluates at
    60, 120, 597. Each seed's k-th evaluation is averaged with the other's, at the mean of their rounds."""
    rows_of = {0: [(55, 0.40), (110, 0.50), (547, 0.60)], 1: [(60, 0.44), (120, 0.56), (597, 0.70)]}
    for seed, points in rows_of.items():
        folder = make_run(tmp_path / f"r{seed}", seed=seed, accuracy=0.3)
        write_csv(
            folder / "metrics.csv",
            [
                {"round": r, "tier_macs": 4.9e5, "test_accuracy": a, "population_weighted_accuracy": a}
                for r, a in points
            ],
        )
    tables = report(find_runs([tmp_path]))
    for name in ("rounds", "tier_rounds"):
        got = {r["round"]: (r["accuracy"], r["n"]) for r in tables[name]}
        assert got == {58: (pytest.approx(0.42), 2), 115: (pytest.approx(0.53), 2), 572: (pytest.approx(0.65), 2)}


def test_tier_curves_keep_a_seed_whose_horizon_is_longer(tmp_path):
    """A match-compute row's seeds stop at different rounds: seed 0 at 25, seed 1 at 33. Rounds both evaluated are
    means over both; rounds only seed 1 reached stay, at n = 1; round 25, which seed 1 reached without evaluating, is
    left out."""
    rows_of = {0: [(10, 0.20), (20, 0.30), (25, 0.32)], 1: [(10, 0.24), (20, 0.36), (30, 0.40), (33, 0.41)]}
    for seed, points in rows_of.items():
        folder = make_run(tmp_path / f"r{seed}", seed=seed, accuracy=0.3)
        write_csv(
            folder / "metrics.csv",
            [
                {"round": r, "tier_macs": 4.9e5, "test_accuracy": a, "population_weighted_accuracy": 0.3}
                for r, a in points
            ],
        )
    table = report(find_runs([tmp_path]))["tier_rounds"]
    got = {r["round"]: (r["accuracy"], r["n"]) for r in table}
    assert set(got) == {10, 20, 30, 33}
    assert got[10] == (pytest.approx(0.22), 2) and got[20] == (pytest.approx(0.33), 2)
    assert got[30] == (pytest.approx(0.40), 1) and got[33] == (pytest.approx(0.41), 1)


def test_tier_table_counts_the_clients_whose_budget_affords_each_tier(tmp_path):
    """By hand: budgets (1, 5) MMACs at seed 0 and (3, 5) at seed 1; tiers 0.49, 2 and 13.55 MMACs are afforded by
    2, 1.5 (2 then 1) and 0 clients on average; a run without clients.csv leaves the count empty."""
    for seed, budgets in ((0, (1e6, 5e6)), (1, (3e6, 5e6))):
        folder = make_run(tmp_path / f"r{seed}", seed=seed, accuracy=0.3)
        summary = json.loads((folder / "summary.json").read_text())
        summary["tiers"] = [{"macs": m, "accuracy": 0.3} for m in (4.9e5, 2e6, 1.355e7)]
        (folder / "summary.json").write_text(json.dumps(summary))
        write_csv(folder / "clients.csv", [{"partition_id": i, "budget_macs": b} for i, b in enumerate(budgets)])
    table = report(find_runs([tmp_path]))["tiers"]
    assert [r["clients_affording"] for r in table] == [2.0, 1.5, 0.0]
    assert "| feast | 2.00 | 30.0 ± 0.0 | 2 | 1.5 |" in tiers_markdown(table)
    (tmp_path / "r0" / "clients.csv").unlink()
    assert math.isnan(report(find_runs([tmp_path / "r0"]))["tiers"][0]["clients_affording"])


def test_budget_groups_pair_each_groups_clients_by_seed_against_the_reference(tmp_path):
    """By hand: FEAST's tiers 1 and 4 MMACs make two groups, [1, 4) and 4 up. Seed 0: budgets 1, 2, 5 MMACs, FEAST's
    clients score 0.5, 0.6, 0.8 (its own subnets), FedAvg-min's one model 0.5; seed 1: budgets 1.5, 6, 7, FEAST 0.55,
    0.85, 0.9, FedAvg-min 0.52. FedAvg-min against FEAST: [1, 4) -0.05 and -0.03, 4 up -0.3 and -0.355."""
    cases = {0: ((1e6, 2e6, 5e6), (0.5, 0.6, 0.8), 0.5), 1: ((1.5e6, 6e6, 7e6), (0.55, 0.85, 0.9), 0.52)}
    for seed, (budgets, feast, fedavg) in cases.items():
        for method in ("feast", "fedavg-min"):
            folder = make_run(tmp_path / f"{method}{seed}", method=method, seed=seed, commit="a" * 40)
            summary = json.loads((folder / "summary.json").read_text())
            if method == "feast":
                summary["tiers"] = [{"macs": 1e6, "accuracy": 0.5}, {"macs": 4e6, "accuracy": 0.8}]
                summary["client_subnets"] = [{"macs": b, "accuracy": a} for b, a in zip(budgets, feast)]
            else:
                summary["tiers"] = [{"macs": 1e6, "accuracy": fedavg}]
            (folder / "summary.json").write_text(json.dumps(summary))
            write_csv(folder / "clients.csv", [{"partition_id": i, "budget_macs": b} for i, b in enumerate(budgets)])
    table = report(find_runs([tmp_path]), "feast")["budget_groups"]
    rows = {(r["method"], r["budget_from_mmacs"]): r for r in table}
    assert set(rows) == {("feast", 1.0), ("feast", 4.0), ("fedavg-min", 1.0), ("fedavg-min", 4.0)}
    assert rows["feast", 1.0]["accuracy"] == pytest.approx(0.55) and rows["feast", 1.0]["clients"] == 1.5
    assert rows["feast", 4.0]["accuracy"] == pytest.approx((0.8 + 0.875) / 2)
    assert math.isnan(rows["feast", 4.0]["budget_to_mmacs"]) and "difference" not in rows["feast", 4.0]
    assert rows["fedavg-min", 1.0]["difference"] == pytest.approx(-0.04)
    assert rows["fedavg-min", 4.0]["difference"] == pytest.approx(-0.3275)
    assert rows["fedavg-min", 4.0]["n"] == 2 and rows["fedavg-min", 4.0]["wins"] == 0
    text = budget_groups_markdown(table)
    assert "| fedavg-min | 1.00 to 4.00 | 1.5 | 51.0 ± 12.7 | feast | -4.0 ± 12.7 |" in text
    assert "| feast | 4.00+ | 1.5 |" in text


def test_each_clients_accuracy_averages_to_the_recorded_client_subnet_accuracy():
    """The budget groups split client-subnet accuracy, not another score: on every committed reference-regime run
    (cache-scored methods and tier-scored ones, ScaleFL's clients below its first level at 0 included) the clients'
    accuracies average to the run's recorded client-subnet accuracy."""
    runs = find_runs([ROOT / "experiments/results/reference-regime/runs"])
    assert len(runs) >= 24
    for run in runs:
        scores = client_accuracies(run)
        assert len(scores) == 100
        assert sum(scores) / len(scores) == pytest.approx(run.summary["client_subnet_accuracy"], abs=1e-12)


@pytest.mark.parametrize(
    "num_samples, epochs, max_steps, batch_size",
    [
        (10, 1, 2, 4),
        (10, 1, 0, 4),
        (9, 1, 0, 4),
        (9, 3, 5, 4),
        (9, 3, 2, 4),
        (3, 2, 40, 32),
        (1, 3, 0, 4),
        (9, 2, 0, 1),
        (1280, 1, 40, 32),
        (20403, 1, 40, 32),
        (2000, 3, 150, 32),
    ],
)
def test_images_per_round_counts_what_local_training_yields(num_samples, epochs, max_steps, batch_size):
    """The report's count equals the images ``local_batches`` hands a client in a round (a last batch of one sample
    is skipped: 9 = 4 + 4 + 1 trains 8 per epoch)."""
    settings = plain_settings(epochs=epochs, max_steps=max_steps, batch_size=batch_size, momentum=0.0, weight_decay=0.0)
    generator = torch.Generator().manual_seed(0)
    yielded = sum(len(idx) for idx in local_batches(num_samples, settings, generator))
    assert images_per_round(num_samples, epochs, max_steps, batch_size) == yielded


def test_passes_count_each_clients_answered_rounds_over_the_images_the_clients_hold(tmp_path):
    """By hand, at 2 steps of batch 4: a client holding 10 images trains 8 a round, one holding 5 trains 4 (its last
    batch of one is skipped). Seed 0: rounds answered (3, 2), (3·8 + 2·4) / 15 = 2.133 passes; seed 1: (1, 4),
    (8 + 16) / 15 = 1.6; a run whose clients.csv lacks rounds_answered gets no row."""
    for seed, answered in ((0, (3, 2)), (1, (1, 4))):
        folder = make_run(tmp_path / f"r{seed}", seed=seed, **{"max-local-steps": 2, "batch-size": 4})
        clients = [
            {"partition_id": i, "num_examples": n, "rounds_answered": r}
            for i, (n, r) in enumerate(zip((10, 5), answered))
        ]
        write_csv(folder / "clients.csv", clients)
    table = report(find_runs([tmp_path]))["passes"]
    assert [r["passes"] for r in table] == ["2.1,1.6"]
    assert table[0]["passes_mean"] == pytest.approx((32 / 15 + 24 / 15) / 2)
    assert "| feast | 4 | 0,1 | 2.1,1.6 | 1.9 ± 3.4 | 15 |" in passes_markdown(table)
    other = make_run(tmp_path / "other", method="heterofl")
    write_csv(other / "clients.csv", [{"partition_id": 0, "num_examples": 10}])
    assert [r["method"] for r in report(find_runs([tmp_path]))["passes"]] == ["feast"]
    garbled = make_run(tmp_path / "garbled", method="fiarse", **{"batch-size": "32"})
    write_csv(garbled / "clients.csv", [{"partition_id": 0, "num_examples": 10, "rounds_answered": 1}])
    with pytest.raises(ValueError, match="run config 'batch-size' is '32'; allowed: a whole number >= 0"):
        report(find_runs([tmp_path]))


def _machine(extensions: list[str]) -> dict:
    return {"processor": {"model": "AMD EPYC", "cores": 2, "vector_extensions": extensions}, "lanes": 1}


def test_machine_time_splits_each_runs_rounds_by_the_processor_that_trained_them(tmp_path):
    """By hand: seed 0 trained rounds 1-2 on an AVX2-only processor (its parked copy, ``earlier_segments``) and was
    continued after round 2 on one with AVX-512; seed 1 trained rounds 1-4 on the AVX2 one. AVX-512: rounds 3, 4 of
    seed 0, (2 + 4) / 2 = 3 s a round, 4 rounds a seed x 3 s = 12 s = 0.00333 h; AVX2: seed 0's 6 + 10 and seed 1's
    9 + 11 + 13 + 15 s over 6 rounds = 64 / 6 s a round. A third seed continued after round 2 with no segment record
    leaves rounds 1-2 "not recorded"."""
    avx2, avx512 = ["sse4_2", "avx", "avx2", "fma"], ["avx2", "avx512f"]
    walls = {0: (6, 10, 2, 4), 1: (9, 11, 13, 15)}
    for seed, wall in walls.items():
        folder = make_run(tmp_path / f"r{seed}", seed=seed, commit="a" * 40)
        record = json.loads((folder / "run.json").read_text())
        if seed == 0:
            segment = {"folder": "seed0.interrupted-1", "rounds": [1, 2], "machine": _machine(avx2)}
            record.update(machine=_machine(avx512), resumed_after_round=2, earlier_segments=[segment])
        else:
            record.update(machine=_machine(avx2), resumed_after_round=0)
        write_json(folder / "run.json", record)
        write_csv(folder / "rounds.csv", [{"round": r, "seconds": w} for r, w in enumerate(wall, start=1)])
    table = report(find_runs([tmp_path]))["machine_time"]
    assert [(r["processor"], r["rounds_there"]) for r in table] == [
        ("AMD EPYC (2 cores), AVX-512", 2),
        ("AMD EPYC (2 cores), AVX2", 6),
    ]
    assert table[0]["seconds_a_round"] == pytest.approx(3.0) and table[0]["hours_a_seed"] == pytest.approx(12 / 3600)
    assert table[1]["seconds_a_round"] == pytest.approx(64 / 6)
    assert "| feast | 4 | 0,1 | AMD EPYC (2 cores), AVX2 | 6 | 10.7 | 0.0 |" in machine_time_markdown(table)
    folder = make_run(tmp_path / "r2", seed=2, commit="a" * 40)
    write_json(folder / "run.json", {**json.loads((folder / "run.json").read_text()), "resumed_after_round": 2})
    write_csv(folder / "rounds.csv", [{"round": r, "seconds": 1.0} for r in range(1, 5)])
    rows = {r["processor"]: r["rounds_there"] for r in report(find_runs([tmp_path]))["machine_time"]}
    assert rows == {"AMD EPYC (2 cores), AVX-512": 2, "AMD EPYC (2 cores), AVX2": 6, "not recorded": 4}


def test_a_run_without_round_times_gets_no_machine_time_and_bad_segments_are_refused(tmp_path, capsys):
    folder = make_run(tmp_path / "runs/a", seed=0, commit="a" * 40)
    write_csv(folder / "rounds.csv", [{"round": r, "client_seconds": 0.0} for r in range(1, 5)])
    assert report(find_runs([tmp_path]))["machine_time"] == []
    record = json.loads((folder / "run.json").read_text())
    write_json(folder / "run.json", {**record, "earlier_segments": [{"rounds": [5, 2]}]})
    _refused(tmp_path, capsys, f"{folder / 'run.json'}: 'earlier_segments' is ")


def test_tier_gains_pair_each_tier_with_the_next_smaller_one_by_seed(tmp_path):
    """By hand: seed 0 tiers (0.50, 0.60), seed 1 (0.60, 0.65): the larger tier gains 0.10 and 0.05, mean 0.075,
    half-width t(0.975, 1) * sd / sqrt(2); seed 2 lacks the larger tier and is left out of the pair."""
    for seed, tiers in ((0, (0.50, 0.60)), (1, (0.60, 0.65)), (2, (0.55,))):
        folder = make_run(tmp_path / f"r{seed}", seed=seed, accuracy=0.3)
        summary = json.loads((folder / "summary.json").read_text())
        summary["tiers"] = [{"macs": m, "accuracy": a} for m, a in zip((4.9e5, 2e6), tiers)]
        (folder / "summary.json").write_text(json.dumps(summary))
    (gain,) = report(find_runs([tmp_path]))["tier_gains"]
    assert (gain["tier_mmacs"], gain["vs_tier_mmacs"], gain["n"], gain["wins"]) == (2.0, 0.49, 2, 2)
    assert gain["difference"] == pytest.approx(0.075)
    assert gain["difference_ci95"] == pytest.approx(12.706 * 0.0353553 / 2**0.5, rel=1e-4)
    assert gain["verdict"] == "not distinguishable at 2 seeds"


def test_convergence_compares_each_seeds_last_two_evaluations(tmp_path):
    """By hand, three seeds each: feast goes 0.50/0.52/0.54 -> 0.51/0.53/0.55 (each mean, 52 and 53, inside the
    other's interval of ±4.97 points: flat; change +1 point, the same in every seed), fedavg-min goes 0.30/0.31/0.32
    -> 0.40/0.42/0.41 (still rising). A seed with one evaluation is left out; a tier curve gets its own line."""
    curves = {
        "feast": {0: [(2, 0.50), (4, 0.51)], 1: [(2, 0.52), (4, 0.53)], 2: [(2, 0.54), (4, 0.55)], 3: [(4, 0.9)]},
        "fedavg-min": {0: [(2, 0.30), (4, 0.40)], 1: [(2, 0.31), (4, 0.42)], 2: [(2, 0.32), (4, 0.41)]},
    }
    for method, by_seed in curves.items():
        for seed, curve in by_seed.items():
            folder = make_run(tmp_path / f"{method}{seed}", method=method, seed=seed)
            empty = {"tier_macs": "", "test_accuracy": ""}
            rows = [{"round": r, "population_weighted_accuracy": a, **empty} for r, a in curve]
            if method == "feast":  # a tier line per evaluation, as a supernet run writes them
                rows += [
                    {"round": r, "population_weighted_accuracy": "", "tier_macs": 4.9e5, "test_accuracy": a + 0.05}
                    for r, a in curve
                ]
            write_csv(folder / "metrics.csv", rows)
    table = {(r["method"], r["tier_mmacs"] == r["tier_mmacs"]): r for r in report(find_runs([tmp_path]))["convergence"]}
    flat, tier, rising = table[("feast", False)], table[("feast", True)], table[("fedavg-min", False)]
    assert (flat["previous"], flat["last"], flat["n"]) == (pytest.approx(0.52), pytest.approx(0.53), 3)
    assert flat["last_ci95"] == pytest.approx(4.303 * 0.02 / 3**0.5, rel=1e-3)
    assert flat["change"] == pytest.approx(0.01) and flat["change_ci95"] == pytest.approx(0.0, abs=1e-12)
    assert flat["verdict"] == "flat" and flat["rounds"] == "2-4"
    assert (tier["tier_mmacs"], tier["last"], tier["verdict"]) == (0.49, pytest.approx(0.58), "flat")
    assert rising["change"] == pytest.approx(0.1) and rising["verdict"] == "still rising"
    one = report(find_runs([tmp_path / "fedavg-min0"]))["convergence"]
    assert one[0]["verdict"] == "no interval at 1 seed"


# -- the committed tables ------------------------------------------------------------------------------------------
# each committed suite folder, as its README makes it: (paths, reference, allow mixed commits)
COMMITTED_SUITES = {
    "compare-seeds": (["experiments/results/compare-seeds"], "feast", False),
    "ablations-seeds": (["experiments/results/ablations-seeds"], "feast", False),
    "gamma-seeds": (["experiments/results/gamma-seeds"], "deepfednas", False),
    "gamma-class-size": (["experiments/results/gamma-class-size/runs"], "deepfednas", False),
    "fedtopo-16rounds": (["experiments/results/fedtopo-16rounds/runs"], "fedtopo", False),
    "fedtopo-inprocess": (["experiments/results/fedtopo-inprocess/runs"], "fedtopo", True),
    "fedtopo-100clients": (["experiments/results/fedtopo-100clients/runs"], "fedtopo", True),
    "converged": (["experiments/results/converged/runs"], "feast", False),
    "reference-regime": (["experiments/results/reference-regime"], "feast", True),  # matched rows at a later commit
    "reference-regime-1000": (["experiments/results/reference-regime-1000"], "feast", False),
    "fedtopo-regime": (["experiments/results/fedtopo-regime/runs"], "fedtopo", True),
    "fedtopo-regime-data": (["experiments/results/fedtopo-regime-data/runs"], "fedtopo", True),
    "fedtopo-regime-pat": (["experiments/results/fedtopo-regime-pat/runs"], "fedtopo", True),
    "fedtopo-regime-arch": (["experiments/results/fedtopo-regime-arch/runs"], "fedtopo", True),
    "fedtopo-regime-lambda": (["experiments/results/fedtopo-regime-lambda/runs"], "fedtgp-lambda10", False),
    "fedtopo-regime-ablations": (["experiments/results/fedtopo-regime-ablations/runs"], "fedtopo", True),
}
TABLE_NAMES = (
    "table.md",
    "table.csv",
    "paired.csv",
    "tiers.csv",
    "rounds.csv",
    "tier_rounds.csv",
    "compute.csv",
    "matched.csv",
    "convergence.csv",
    "budget_groups.csv",
)


@pytest.mark.parametrize("suite", sorted(COMMITTED_SUITES))
def test_committed_suite_tables_are_byte_identical_to_what_the_report_writes(suite, tmp_path):
    """The tables (grouped and aggregated with pandas) equal, byte for byte, the committed ones; a table the report
    does not write (a quantity not recorded) is not committed either."""
    paths, reference, mixed = COMMITTED_SUITES[suite]
    tables = report(find_runs([ROOT / p for p in paths]), reference, mixed)
    write_tables(tmp_path, tables)
    committed = ROOT / "experiments/results" / suite
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written == sorted(n for n in TABLE_NAMES if (committed / n).exists())
    for name in written:
        assert (tmp_path / name).read_bytes() == (committed / name).read_bytes(), f"{suite}/{name}"


def test_a_quantity_not_recorded_gets_no_table(tmp_path):
    """client_seconds written as zeros (the in-process driver does not measure it): no "accuracy at 0 client
    seconds" table."""
    for seed in (0, 1):
        folder = make_run(tmp_path / f"r{seed}", seed=seed, accuracy=0.3 + seed / 10)
        write_csv(folder / "rounds.csv", [{"round": r, "client_seconds": 0.0} for r in range(1, 5)])
    tables = report(find_runs([tmp_path]))
    assert tables["compute"] == [] and "client seconds" not in report_text(tables)


# -- malformed files: an error naming the file ---------------------------------------------------------------------
def _refused(tmp_path, capsys, fragment: str) -> str:
    assert main([str(tmp_path / "runs")]) == 2
    error = capsys.readouterr().err
    assert fragment in error, error
    return error


def test_a_summary_that_is_not_an_object_is_refused_naming_the_file(tmp_path, capsys):
    make_run(tmp_path / "runs/ok", seed=0)
    (tmp_path / "runs/bad").mkdir()
    (tmp_path / "runs/bad/summary.json").write_text("[1, 2]")
    _refused(tmp_path, capsys, f"{tmp_path / 'runs/bad/summary.json'}: expected a JSON object")


@pytest.mark.parametrize(
    "field, value",
    [
        ("completed", "false"),  # a string: would have been counted as a finished run
        ("completed", 0),
        ("population_weighted_accuracy", "0.3"),
        ("population_weighted_accuracy", 37.5),  # a percentage where a fraction belongs
        ("seed", 1.5),
        ("bytes_down", None),
        ("tiers", [{"macs": "small", "accuracy": 0.3}]),
    ],
)
def test_malformed_summary_fields_are_refused_naming_file_and_field(tmp_path, capsys, field, value):
    folder = make_run(tmp_path / "runs/a", seed=0)
    summary = json.loads((folder / "summary.json").read_text())
    (folder / "summary.json").write_text(json.dumps({**summary, field: value}))
    _refused(tmp_path, capsys, f"{folder / 'summary.json'}: '{field}' is {value!r}; allowed: ")


def test_a_garbled_run_record_is_refused_not_ignored(tmp_path, capsys):
    folder = make_run(tmp_path / "runs/a", seed=0, commit="a" * 40)
    (folder / "run.json").write_text('{"commit": "aaaa", "label": ')
    _refused(tmp_path, capsys, f"{folder / 'run.json'}: not valid JSON")
    (folder / "run.json").write_text(json.dumps({"commit": "a" * 40, "dirty": "no"}))
    _refused(tmp_path, capsys, f"{folder / 'run.json'}: 'dirty' is 'no'; allowed: true or false")


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("round,train_loss\n4,0.3\n", "no column population_weighted_accuracy or mean_client_accuracy"),
        ("population_weighted_accuracy\n0.3\n", "no column round"),
        ("round,population_weighted_accuracy\n4,abc\n", "line 2, column 'population_weighted_accuracy': 'abc'"),
        ("round,population_weighted_accuracy\nfour,0.3\n", "line 2, column 'round': 'four'"),
        ("round,population_weighted_accuracy\n4.5,0.3\n", "line 2, column 'round'"),
        ("round,population_weighted_accuracy\n4,0.3,1,2\n", "not a readable CSV table"),
        ("round,population_weighted_accuracy\n4,30.5\n", "allowed: a number in [0, 1]"),
        ("", "not a readable CSV table"),
    ],
)
def test_missing_or_garbled_metrics_columns_are_refused_naming_the_file(tmp_path, capsys, text, fragment):
    folder = make_run(tmp_path / "runs/a", seed=0)
    (folder / "metrics.csv").write_text(text)
    error = _refused(tmp_path, capsys, f"{folder / 'metrics.csv'}: ")
    assert fragment in error


def test_a_run_without_metrics_and_text_in_a_compute_column_are_refused(tmp_path, capsys):
    folder = make_run(tmp_path / "runs/a", seed=0)
    write_csv(folder / "rounds.csv", [{"round": 1, "client_train_flops": "many"}])
    _refused(tmp_path, capsys, f"{folder / 'rounds.csv'}: line 2, column 'client_train_flops': 'many'")
    (folder / "rounds.csv").unlink()
    (folder / "metrics.csv").unlink()
    _refused(tmp_path, capsys, f"{folder / 'metrics.csv'}: missing")


def test_a_suite_listing_a_folder_outside_itself_is_refused(tmp_path):
    make_run(tmp_path / "elsewhere/run", seed=0)
    (tmp_path / "suite").mkdir()
    write_json(tmp_path / "suite/suite.json", {"runs": [{"folder": "../elsewhere/run"}]})
    with pytest.raises(ValueError, match="suite.json: run folder '../elsewhere/run' is not inside the suite folder"):
        find_runs([tmp_path / "suite"])


# -- writing: never through a symlink ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["table.md", "table.csv", "rounds.csv", "accuracy_per_round.png"])
def test_out_never_writes_through_a_planted_symlink(tmp_path, capsys, name):
    for seed in (0, 1):
        make_run(tmp_path / "runs" / f"f{seed}", seed=seed, accuracy=0.3 + seed / 100)
    out, victim = tmp_path / "out", tmp_path / "victim.txt"
    out.mkdir()
    victim.write_text("not the report's\n")
    (out / name).symlink_to(victim)
    assert main([str(tmp_path / "runs"), "--out", str(out), "--plots"]) == 2
    assert f"{out / name} is a symlink" in capsys.readouterr().err
    assert victim.read_text() == "not the report's\n" and (out / name).is_symlink()


def test_out_never_writes_through_a_planted_temporary_name(tmp_path):
    for seed in (0, 1):
        make_run(tmp_path / "runs" / f"f{seed}", seed=seed, accuracy=0.3 + seed / 100)
    out, victim = tmp_path / "out", tmp_path / "victim.txt"
    out.mkdir()
    victim.write_text("not the report's\n")
    for name in ("table.md", "table.csv", "rounds.csv"):
        (out / f"{name}.tmp").symlink_to(victim)
    assert main([str(tmp_path / "runs"), "--out", str(out)]) == 0
    assert victim.read_text() == "not the report's\n"
    assert not (out / "table.csv").is_symlink() and (out / "table.csv").read_text().startswith("method,")


def test_update_readme_does_not_write_through_a_symlink(tmp_path, capsys):
    target = tmp_path / "real.md"
    start, end = "<!-- generated:report (python -m fl_app.report experiments/results/compare/runs) -->", END_REPORT
    target.write_text(f"{start}\nold\n{end}\n")
    (tmp_path / "link.md").symlink_to(target)
    assert main(["--update-readme", str(tmp_path / "link.md")]) == 2
    assert "is a symlink" in capsys.readouterr().err and target.read_text().endswith(f"old\n{end}\n")


# -- bounded reading and cells that stay cells ---------------------------------------------------------------------
def test_a_huge_csv_line_or_cell_is_refused_before_it_is_parsed_with_a_short_message(tmp_path, capsys, monkeypatch):
    import fl_app.report.read as report_module  # patched where read_table looks the limits up

    monkeypatch.setattr(report_module, "MAX_LINE_CHARS", 1000)  # the real limit is 64 KiB: same code, small file
    monkeypatch.setattr(report_module, "MAX_FIELD_CHARS", 100)
    folder = make_run(tmp_path / "runs/a", seed=0)
    (folder / "metrics.csv").write_text("round,population_weighted_accuracy\n4," + "9" * 5000 + "\n")
    error = _refused(tmp_path, capsys, f"{folder / 'metrics.csv'}: line 2 is longer than 1000 characters")
    assert len(error) < 400, error  # the cell is quoted cut short, never whole
    (folder / "metrics.csv").write_text("round,population_weighted_accuracy\n4," + "x" * 500 + "\n")
    error = _refused(tmp_path, capsys, f"{folder / 'metrics.csv'}: line 2, field 2: 'xxx")
    assert "allowed: at most 100 characters" in error and len(error) < 400, error


def test_whole_numbers_are_bounded(tmp_path, capsys):
    folder = make_run(tmp_path / "runs/a", seed=0)
    (folder / "metrics.csv").write_text("round,population_weighted_accuracy\n1e300,0.3\n")
    _refused(tmp_path, capsys, f"{folder / 'metrics.csv'}: line 2, column 'round': '1e300'; allowed: a whole number")
    (folder / "metrics.csv").write_text("round,population_weighted_accuracy\n4,0.3\n")
    make_run(tmp_path / "runs/b", seed=10**400)
    _refused(tmp_path, capsys, "'seed' is ")


def test_labels_cannot_become_spreadsheet_formulas_or_markdown_rows(tmp_path):
    labels = ('=HYPERLINK("http://x")', "-2+3+cmd|' /C calc'!A0", "@SUM(A1)", "a | b\n| forged | row |")
    for i, label in enumerate(labels):
        make_run(tmp_path / f"r{i}", method="feast", seed=0, commit="a" * 40, label=label, lr=0.1 * (i + 1))
    make_run(tmp_path / "ref", method="fedavg-min", seed=0, commit="a" * 40, lr=0.1)
    text = write_tables(tmp_path / "rep", report(find_runs([tmp_path]), reference="fedavg-min"))
    table = (tmp_path / "rep/table.csv").read_text()
    cells = [line.split(",")[0] for line in table.splitlines()[1:]] + table.split('"')[1::2]
    assert not any(cell.startswith(("=", "+", "-", "@")) for cell in cells), table
    assert "'=HYPERLINK" in table and "'-2+3+cmd" in table and "'@SUM" in table
    paired = (tmp_path / "rep/paired.csv").read_text()
    assert ",-" in paired or ",+" in paired or ",0" in paired  # numbers and estimates stay as they are
    rows = [line for line in text.splitlines() if line.startswith("|")]
    assert not any(line.startswith("| forged") for line in rows), text
    assert "a \\| b \\| forged \\| row \\|" in text


def test_a_results_folder_with_a_study_summary_reads_its_runs(tmp_path):
    """experiments/results/ablations holds an old study's summary.json beside runs/: the folder means its runs."""
    make_run(tmp_path / "results/runs/feast/seed0", seed=0)
    make_run(tmp_path / "results/runs/feast/seed1", seed=1)
    (tmp_path / "results/summary.json").write_text('{"rounds": 10, "table": []}')
    assert sorted(run.seed for run in find_runs([tmp_path / "results"])) == [0, 1]
