"""experiments.studies.validation_choice: the setting a tuning suite's validation split chooses, by hand on a made-up
suite folder (test accuracies are never read), and its refusals."""

from __future__ import annotations

import json

import pytest

from experiments.runner.planning import cell_suffix
from experiments.studies.validation_choice import choose, finished_runs, main


def write_run(root, label, cell, seed, validation, completed=True, test=0.5):
    """validation: round -> validation accuracy, over a 100-round run."""
    folder = root / "runs" / f"{label}{cell_suffix(cell)}" / f"seed{seed}"  # the runner's layout
    folder.mkdir(parents=True)
    history = [{"round": r, "validation_accuracy": v, "mean_client_accuracy": test} for r, v in validation.items()]
    summary = {"completed": completed, "rounds": 100, "history": history, "mean_client_accuracy": test}
    (folder / "summary.json").write_text(json.dumps(summary))
    (folder / "run.json").write_text(json.dumps({"label": label, "cell": cell, "seed": seed}))


def test_the_choice_is_the_best_mean_over_the_second_half_then_over_seeds(tmp_path):
    a, b = {"topo-beta": 0.5}, {"topo-beta": 2.0}
    # a: second-half means 0.60 and 0.64 -> 0.62 (its early 0.99 does not count); b: 0.63 and 0.63 -> 0.63
    write_run(tmp_path, "fedtopo", a, 10, {10: 0.99, 50: 0.99, 60: 0.58, 100: 0.62}, test=0.9)
    write_run(tmp_path, "fedtopo", a, 11, {60: 0.64, 100: 0.64}, test=0.9)
    write_run(tmp_path, "fedtopo", b, 10, {60: 0.62, 80: 0.63, 100: 0.64}, test=0.1)
    write_run(tmp_path, "fedtopo", b, 11, {100: 0.63}, test=0.1)
    write_run(tmp_path, "fedtopo", b, 12, {100: 0.99}, completed=False)  # a failed run does not count
    rows, chosen = choose(finished_runs(tmp_path))
    assert [r["setting"] for r in rows] == ["fedtopo topo-beta=2.0", "fedtopo topo-beta=0.5"]
    assert chosen["late_validation"] == pytest.approx(0.63) and rows[1]["late_validation"] == pytest.approx(0.62)
    assert chosen["seeds"] == "10 11" and rows[1]["per_seed"] == "60.00 64.00"


def test_settings_with_different_seeds_or_no_late_validation_are_refused(tmp_path, capsys):
    write_run(tmp_path, "fedtopo", {"topo-tau": 0.1}, 10, {100: 0.6})
    write_run(tmp_path, "fedtopo", {"topo-tau": 0.5}, 11, {100: 0.7})
    with pytest.raises(SystemExit):
        main([str(tmp_path)])
    assert "different seeds" in capsys.readouterr().err
    other = tmp_path / "other"
    write_run(other, "fedtopo", {"topo-tau": 0.1}, 10, {10: 0.6, 50: 0.6})
    with pytest.raises(SystemExit):
        main([str(other)])
    assert "no evaluation with a validation accuracy after round 50" in capsys.readouterr().err


def test_the_tables_are_written_and_a_readme_block_rewritten(tmp_path):
    write_run(tmp_path, "fedtopo", {"topo-beta": 0.5}, 10, {100: 0.6})
    write_run(tmp_path, "fedtopo", {"topo-beta": 5.0}, 10, {100: 0.5})
    readme = tmp_path / "README.md"
    block = "<!-- generated:validation-choice (python -m x) -->\nold\n<!-- /generated:validation-choice -->\n"
    readme.write_text("intro\n" + block)
    main([str(tmp_path), "--out", str(tmp_path / "out"), "--readme", str(readme)])
    text = readme.read_text()
    assert "Chosen on validation: **fedtopo topo-beta=0.5** (60.00 %, 10.00 points above the next)" in text
    assert "old" not in text and text.startswith("intro\n")
    assert (tmp_path / "out" / "validation_choice.csv").read_text().splitlines()[1].startswith("fedtopo topo-beta=0.5")
