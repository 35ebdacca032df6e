"""experiments.studies.regime_map: the method against a named baseline and the cell's best other one, paired by seed,
checked against hand computations on made-up runs."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from experiments.studies.regime_map import csv_bytes, headline, main, regime_map
from fl_app.io.markdown import block_body, generated_blocks
from fl_app.run.outputs import write_csv, write_json


def make_run(root, label, cell, seed, previous, last):
    """A finished run of ``label`` in grid cell ``cell`` with evaluations at rounds 10 and 20."""
    name = label + "".join(f"@{k}={v}" for k, v in cell.items())
    folder = root / "runs" / name / f"seed{seed}"
    folder.mkdir(parents=True)
    run_config = {"method": label, "seed": seed, "num-server-rounds": 20, **cell}
    write_json(
        folder / "summary.json",
        {"method": label, "dataset": "cifar10", "rounds": 20, "seed": seed, "mean_client_accuracy": last},
    )
    write_csv(
        folder / "metrics.csv",
        [{"round": 10, "mean_client_accuracy": previous}, {"round": 20, "mean_client_accuracy": last}],
    )
    write_json(
        folder / "run.json",
        {"commit": "abc1234", "dirty": False, "label": label, "cell": cell, "run_config": run_config, "seed": seed},
    )


FINAL = {  # label -> final accuracy per seed, in the cell dirichlet-alpha=0.1
    "fedtopo": (0.80, 0.82, 0.84),
    "local": (0.78, 0.80, 0.80),
    "fd": (0.79, 0.83, 0.80),
    "lg-fedavg": (0.70, 0.85, 0.70),
}


@pytest.fixture
def folders(tmp_path):
    base, arch = tmp_path / "regime", tmp_path / "regime-arch"
    for label, finals in FINAL.items():
        for seed, last in enumerate(finals):
            previous = 0.60 if label == "fd" else last - 0.001  # fd still rising, the others flat
            make_run(base, label, {"dirichlet-alpha": 0.1}, seed, previous, last)
    for label in ("fedtopo", "local"):
        for seed in (0, 1):
            make_run(arch, label, {"backbones": 1}, seed, 0.5, 0.5 + 0.01 * (label == "fedtopo") * (seed + 1))
    return base / "runs", arch / "runs"


def test_each_cell_is_paired_with_the_named_and_the_best_other_baseline(folders):
    base, arch = regime_map(list(folders), "fedtopo", "local", allow_mixed_commits=False)
    # against local: (0.02, 0.02, 0.04); the best other by mean is fd (0.8067 > lg-fedavg's 0.75): (0.01, -0.01, 0.04)
    assert base["vs_local_difference"] == pytest.approx(0.08 / 3) and base["vs_local_wins"] == 3
    assert base["best_baseline"] == "fd"
    assert base["vs_best_difference"] == pytest.approx(0.04 / 3) and base["vs_best_wins"] == 2
    assert base["vs_best_verdict"] == "not distinguishable at 3 seeds"
    assert (base["methods"], base["seeds"], base["converged"], base["not_flat"]) == (4, 3, False, "fd")
    # the one-backbone cell: no other baseline; local's two seeds flat and fedtopo's curves flat too
    assert arch["vs_local_difference"] == pytest.approx(0.015) and arch["best_baseline"] == ""
    assert arch["vs_best_verdict"] == "no runs" and arch["folder"] == "regime-arch"


def test_a_suite_without_a_grid_is_one_cell_named_by_its_folder(tmp_path):
    for label, finals in (("fedtopo", (0.70, 0.72)), ("local", (0.71, 0.71))):
        for seed, last in enumerate(finals):
            make_run(tmp_path / "control", label, {}, seed, last, last)
    (line,) = regime_map([tmp_path / "control" / "runs"], "fedtopo", "local")
    assert (line["folder"], line["cell"]) == ("control", "control")
    assert line["vs_local_difference"] == pytest.approx(0.0)


def test_cli_writes_table_csv_and_plot_and_names_a_missing_method(folders, tmp_path, capsys):
    out = tmp_path / "out"
    assert main([*map(str, folders), "--method", "fedtopo", "--against", "local", "--out", str(out)]) == 0
    assert (
        "| regime | dirichlet-alpha=0.1 | 4 × 3 | 82.0 ± 5.0 | +2.7 ± 2.9 | 3/3 | fd |"
        in (out / "regime_map.md").read_text()
    )
    with open(out / "regime_map.csv") as f:
        assert [line["cell"] for line in csv.DictReader(f)] == ["dirichlet-alpha=0.1", "backbones=1"]
    assert (out / "regime_map.png").read_bytes().startswith(b"\x89PNG")
    assert main([str(folders[0]), "--method", "fedproto", "--against", "local"]) == 2
    assert "no finished run of 'fedproto'" in capsys.readouterr().err
    assert main([str(folders[0]), str(tmp_path / "nowhere"), "--method", "fedtopo", "--against", "local"]) == 2
    assert "no such folder" in capsys.readouterr().err and not (tmp_path / "nowhere").exists()


def test_headline_says_where_the_method_gains_and_how_sure(folders, tmp_path):
    lines = regime_map(list(folders), "fedtopo", "local")
    text = headline(lines, "fedtopo", "local")
    # both cells level with local (+2.7 ± 2.9 at 3 seeds, +1.5 ± 6.4 at 2), neither flat (fd rising; fedtopo rising)
    assert "the 2 cells of the regime map so far (0 of them converged; 2-3 seeds paired per cell" in text
    # once every cell has converged the map is no longer provisional
    done = headline([{**line, "converged": True} for line in lines], "fedtopo", "local")
    assert done.startswith("Across the 2 cells of the regime map (all converged; 2-3 seeds paired per cell")
    assert "fedtopo against local is ahead beyond the interval in no cell, behind in no cell, level in 2 cells" in text
    assert "(from backbones=1 +1.5 ± 6.4 to dirichlet-alpha=0.1 +2.7 ± 2.9 points); against" in text
    # the one-backbone cell has no other baseline: counted as such, not dropped from the sentence
    assert "best other baseline it is ahead beyond the interval in no cell, behind in no cell, level in 1 cell" in text
    assert "(dirichlet-alpha=0.1 +1.3 ± 6.3); no other baseline has run yet in 1 cell. No cell shows" in text
    assert "No cell shows fedtopo ahead of local and of the best other baseline beyond the interval." in text
    # the interval's upper end: +1.5 + 6.35 (12.706 · 0.00707 / √2) in the one-backbone cell, above +2.7 + 2.9
    assert text.endswith("The intervals leave room for a gain over local of at most +7.9 points (backbones=1).")
    # a cell where fedtopo leads local by 2 points and fd by 1 in every seed: ahead of both, named
    for label, offset in (("fedtopo", 0.02), ("local", 0.0), ("fd", 0.01)):
        for seed in range(3):
            make_run(
                tmp_path / "regime-data", label, {"client-data-fraction": 0.25}, seed, 0.7, 0.7 + offset + seed / 100
            )
    lines = regime_map([*folders, tmp_path / "regime-data" / "runs"], "fedtopo", "local")
    text = headline(lines, "fedtopo", "local")
    assert "ahead beyond the interval in 1 cell (client-data-fraction=0.25 +2.0 ± 0.0)" in text
    assert (
        "best other baseline it is ahead beyond the interval in 1 cell (client-data-fraction=0.25 +1.0 ± 0.0)" in text
    )
    assert "It gains over both in: client-data-fraction=0.25. The intervals" in text


def test_cli_rewrites_the_readme_block_and_refuses_a_file_without_one(folders, tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_text("# Map\n\n<!-- generated:regime-headline -->\nold\n<!-- /generated:regime-headline -->\nend\n")
    args = [*map(str, folders), "--method", "fedtopo", "--against", "local", "--readme", str(readme)]
    assert main(args) == 0
    expected = headline(regime_map(list(folders), "fedtopo", "local"), "fedtopo", "local")
    assert readme.read_text() == (
        f"# Map\n\n<!-- generated:regime-headline -->\n{expected}\n<!-- /generated:regime-headline -->\nend\n"
    )
    readme.write_text("no block\n")
    assert main(args) == 2 and "no <!-- generated:regime-headline --> block" in capsys.readouterr().err
    assert readme.read_text() == "no block\n"


ROOT = Path(__file__).resolve().parents[1]
# the FedTopo regime map's folders, in the order its README's command names them (those committed so far)


def committed_folders() -> list[Path]:
    """The folders the README's regime-headline marker names in its command: the map's cells, wherever they live."""
    commands = [c for name, c in generated_blocks((ROOT / "README.md").read_text()) if name == "regime-headline"]
    assert commands, "README.md: no regime-headline block"
    return [ROOT / word for word in commands[0].split() if word.endswith("/runs")]


def test_the_committed_fedtopo_regime_map_is_what_the_study_writes():
    committed = ROOT / "experiments/results/fedtopo-regime/regime_map.csv"
    if not committed.exists():
        pytest.skip("no regime map committed yet")
    lines = regime_map(committed_folders(), "fedtopo", "local", allow_mixed_commits=True)
    assert csv_bytes(lines) == committed.read_bytes()
    text = headline(lines, "fedtopo", "local")
    for readme in ("README.md", "docs/fedtopo.md", "experiments/results/fedtopo-regime/README.md"):
        assert block_body((ROOT / readme).read_text(), "regime-headline") == text, readme
