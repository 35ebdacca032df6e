"""fl_app.report: grouping runs into rows, commit checks, the two accuracy kinds, the CLI, and the README tables
regenerated from the committed results."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fl_app.report import MixedCommits, find_runs, main, regenerate_readme, report, report_text
from fl_app.run.outputs import write_csv, write_json

ROOT = Path(__file__).resolve().parents[1]


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
    make_run(tmp_path / "t0", method="fedtopo", seed=0, accuracy=0.7, kind="hetero")
    make_run(tmp_path / "t1", method="fedtopo", seed=1, accuracy=0.74, kind="hetero")
    text = report_text(report(find_runs([tmp_path])))
    assert "mean client accuracy (%)" in text and "| fedtopo | cifar10 | 4 | 0,1 | – | 72.0 ± 25.4 |" in text


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
    """Every <!-- report: ... --> table in the READMEs is what the report tool makes of the runs it names."""
    checked = 0
    for readme in [ROOT / "README.md", *sorted(ROOT.glob("experiments/**/README.md")), *sorted(ROOT.glob("docs/*.md"))]:
        text = readme.read_text()
        if "<!-- report:" in text:
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
    assert "client training FLOPs" in text and "| fedavg-min | 8 | 30.0 (final; ran out before) |" in text
