"""experiments.studies.split_difference: two suite folders compared run by run, by hand-made summaries."""

from __future__ import annotations

import json

import pytest

from experiments.studies import split_difference


def _suite(folder, values, completed=True):
    for (label, seed), value in values.items():
        run = folder / "runs" / label / seed
        run.mkdir(parents=True)
        summary = {"completed": completed, "population_weighted_accuracy": value}
        (run / "summary.json").write_text(json.dumps(summary))


def test_split_difference_pairs_runs_by_label_and_seed_and_never_overwrites(tmp_path, capsys):
    old, new = tmp_path / "old", tmp_path / "new"
    _suite(old, {("feast", "seed0"): 0.30, ("feast", "seed1"): 0.20, ("other", "seed0"): 0.5})
    _suite(new, {("feast", "seed0"): 0.35, ("feast", "seed1"): 0.19, ("only-new", "seed0"): 0.9})
    # an interrupted copy (moved aside by the runner) and a run that failed, in both folders: neither is compared
    _suite(old, {("feast", "seed0.interrupted-1"): 0.1})
    _suite(new, {("feast", "seed0.interrupted-1"): 0.9})
    _suite(old, {("feast", "seed2"): 0.1}, completed=False)
    _suite(new, {("feast", "seed2"): 0.9}, completed=False)
    runs, labels = split_difference.compare(old, new)
    assert [(r["label"], r["seed"]) for r in runs] == [("feast", "seed0"), ("feast", "seed1")]  # shared runs only
    assert labels[0]["old"] == pytest.approx(0.25) and labels[0]["new"] == pytest.approx(0.27)
    assert labels[0]["differences"] == pytest.approx([0.05, -0.01])

    out = tmp_path / "diff"
    split_difference.main([str(old), str(new), "--out", str(out)])
    assert "| feast | 25.0 | 27.0 | +5.0 / -1.0 |" in (out / "split_difference.md").read_text()
    assert (out / "split_difference.csv").read_text().count("\n") == 3  # header and two runs
    with pytest.raises(SystemExit):
        split_difference.main([str(old), str(new), "--out", str(out)])  # refuses to overwrite
    assert "already exist" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        split_difference.main([str(old), str(tmp_path / "empty"), "--out", str(tmp_path / "x")])
