"""experiments.studies.sharing_scores (the study): the paired differences per score and round against a hand
computation on a made-up suite folder, and the control verdict's rule (the low end of the interval must clear the
margin)."""

from __future__ import annotations

import json
import math

import pytest

from experiments.studies.sharing_scores import comparisons, controls, main, read_runs, verdict
from fl_app.run.stats import t_quantile


def write_suite(root, scores):
    """scores: label -> list over seeds of (own, best_own); the other scores copy own so each is paired alike."""
    for label, values in scores.items():
        for seed, (own, best) in enumerate(values):
            folder = root / "runs" / label / f"seed{seed}"
            folder.mkdir(parents=True)
            summary = {"completed": True, "best_round": 10}
            for key in ("mean_client_accuracy", "pooled_accuracy", "balanced_accuracy", "global_accuracy"):
                summary[key], summary["best_" + key] = own, best
            (folder / "summary.json").write_text(json.dumps(summary))
    (root / "runs" / "local" / "seed9").mkdir()
    (root / "runs" / "local" / "seed9" / "summary.json").write_text(json.dumps({"completed": False}))


SCORES = {
    "local": [(0.70, 0.72), (0.60, 0.61), (0.65, 0.66)],
    "fedproto": [(0.73, 0.75), (0.62, 0.64), (0.69, 0.70)],  # differences 3, 2, 4 points (best: 3, 3, 4)
    "fedtopo": [(0.70, 0.72), (0.61, 0.60), (0.65, 0.67)],
}


def test_paired_differences_by_hand(tmp_path):
    write_suite(tmp_path, SCORES)
    runs = read_runs(tmp_path)
    assert sorted(runs["local"]) == [0, 1, 2]  # the unfinished seed is left out
    lines = comparisons(runs, "local", "fedtopo")
    line = next(
        x
        for x in lines
        if (x["method"], x["vs"], x["score"], x["round"]) == ("fedproto", "local", "pooled_accuracy", "last")
    )
    diffs = [0.03, 0.02, 0.04]
    mean = sum(diffs) / 3
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / 2)
    assert line["difference"] == pytest.approx(mean)
    assert line["difference_ci95"] == pytest.approx(t_quantile(0.95, 2) * sd / math.sqrt(3))
    assert (line["wins"], line["n"]) == (3, 3)
    best = next(
        x
        for x in lines
        if (x["method"], x["vs"], x["score"], x["round"]) == ("fedproto", "local", "global_accuracy", "best")
    )
    assert best["difference"] == pytest.approx((0.03 + 0.03 + 0.04) / 3)
    # fedtopo is paired with every other label too, never twice with the reference
    assert {(x["method"], x["vs"]) for x in lines} == {
        ("fedproto", "local"),
        ("fedtopo", "local"),
        ("fedtopo", "fedproto"),
    }


def test_a_control_needs_the_low_end_to_clear_the_margin(tmp_path):
    write_suite(tmp_path, SCORES)
    lines = comparisons(read_runs(tmp_path), "local", "fedtopo")
    # fedproto's best-round differences 3, 3, 4: mean 3.33, half-width 4.303 * 0.577 / 1.732 = 1.43 -> low 1.9
    found = controls(lines, "local", "fedtopo", margin=1.0)
    assert {(x["score"], x["round"]) for x in found} == {
        (s, "best") for s in ("mean_client_accuracy", "pooled_accuracy", "balanced_accuracy", "global_accuracy")
    }
    assert not controls(lines, "local", "fedtopo", margin=2.0)
    assert verdict(lines, "local", "fedtopo", 1.0).startswith("A positive control at 3 seeds")
    assert verdict(lines, "local", "fedtopo", 2.0).startswith("Not a positive control at 3 seeds")


def test_the_command_writes_tables_and_the_readme_block(tmp_path, capsys):
    write_suite(tmp_path, SCORES)
    readme = tmp_path / "README.md"
    readme.write_text("x\n<!-- generated:sharing-verdict -->\nold\n<!-- /generated:sharing-verdict -->\n")
    assert main([str(tmp_path), "--out", str(tmp_path / "out"), "--readme", str(readme)]) == 0
    assert "A positive control" in readme.read_text()
    assert (tmp_path / "out" / "sharing_scores.csv").read_text().count(
        "fedproto"
    ) == 16  # against local, and fedtopo against it
    assert main([str(tmp_path), "--reference", "nobody"]) == 2
    assert "allowed: fedproto, fedtopo, local" in capsys.readouterr().err
    # one block per cell: --block names which one, the others stay as they were
    readme.write_text("<!-- generated:cell-a -->\nold\n<!-- /generated:cell-a -->\nkept\n")
    assert main([str(tmp_path), "--readme", str(readme), "--block", "cell-b"]) == 2
    assert "no <!-- generated:cell-b --> block" in capsys.readouterr().err
    assert main([str(tmp_path), "--readme", str(readme), "--block", "cell-a"]) == 0
    assert "A positive control" in readme.read_text() and "old" not in readme.read_text()
