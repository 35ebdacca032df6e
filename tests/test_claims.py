"""experiments.studies.claims: a converged suite's verdicts on one method's claims, read from made-up runs whose
paired differences are computed by hand, and the committed READMEs' blocks equal to what the study writes."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.studies.claims import detail, headline, main, read_claims
from fl_app.io.markdown import block_body, rewrite_blocks
from fl_app.run.outputs import write_csv, write_json

ROOT = Path(__file__).resolve().parents[1]
# label -> final accuracy per seed; feast's tiers (0.5 and 2 MMACs) per seed; a matched label trains to feast's FLOPs
FINAL = {
    "feast": (0.60, 0.62, 0.64),
    "heterofl": (0.50, 0.52, 0.50),  # behind at every seed: -0.10, -0.10, -0.14
    "fiarse": (0.70, 0.52, 0.66),  # level: +0.10, -0.10, +0.02
    "heterofl-matched": (0.70, 0.71, 0.75),  # ahead at every seed: +0.10, +0.09, +0.11
}
TIERS = ((0.55, 0.60), (0.56, 0.62), (0.57, 0.64))  # the larger tier gains 0.05, 0.06, 0.07


def make_suite(root: Path) -> Path:
    for label, finals in FINAL.items():
        for seed, accuracy in enumerate(finals):
            folder = root / "runs" / label / f"seed{seed}"
            folder.mkdir(parents=True)
            tiers = [{"macs": m, "accuracy": a} for m, a in zip((5e5, 2e6), TIERS[seed])] if label == "feast" else []
            run_config = {"method": label.removesuffix("-matched"), "seed": seed, "num-server-rounds": 20}
            summary = {"method": run_config["method"], "dataset": "cifar10", "rounds": 20, "seed": seed}
            write_json(folder / "summary.json", {**summary, "population_weighted_accuracy": accuracy, "tiers": tiers})
            write_csv(folder / "metrics.csv", [{"round": 20, "population_weighted_accuracy": accuracy}])
            record = {"commit": "abc1234", "dirty": False, "label": label, "run_config": run_config, "seed": seed}
            if label.endswith("-matched"):
                record["match_compute"] = {"reference": "feast"}
            write_json(folder / "run.json", record)
    return root / "runs"


def test_each_baseline_is_grouped_by_its_paired_verdict_against_the_method(tmp_path):
    claims = read_claims(make_suite(tmp_path), "feast")
    assert [v.name for v in claims.equal] == ["fiarse", "heterofl"]
    heterofl = claims.equal[1]
    assert heterofl.difference == pytest.approx(-0.34 / 3) and heterofl.verdict == "worse"
    assert list(heterofl.seeds.values()) == pytest.approx([-0.10, -0.10, -0.14])
    assert [v.name for v in claims.matched] == ["heterofl-matched"] and claims.matched[0].verdict == "better"
    text = headline(claims)
    assert text.startswith(
        "Each larger tier of feast against the next smaller one: better beyond the interval from 0.50"
    )
    assert "to 2.00 MMACs (+6.0 ± 2.5 points, larger ahead at 3/3 seeds)" in text  # sd 0.01, t(0.975, 2) = 4.303
    assert "feast is ahead of 1 of the 2 baselines at every seed" in text
    assert "behind feast beyond the interval: heterofl; level with feast: fiarse." in text
    assert "ahead of feast beyond the interval: heterofl-matched (+10.0 ± 2.5)" in text
    lines = detail(claims).splitlines()
    assert "heterofl (-11.3 ± 5.7; seeds -10.0, -10.0, -14.0)" in lines[1]  # sd 0.0231
    assert "fiarse (+0.7 ± 25.0; seeds +10.0, -10.0, +2.0)" in lines[1]  # sd 0.1007


def test_cli_rewrites_both_blocks_and_refuses_a_method_without_one_row(tmp_path, capsys):
    runs = make_suite(tmp_path)
    readme = tmp_path / "README.md"
    blocks = "<!-- generated:claims-headline -->\nold\n<!-- /generated:claims-headline -->\n"
    readme.write_text(f"# Suite\n{blocks}\n<!-- generated:claims -->\nold\n<!-- /generated:claims -->\n")
    assert main([str(runs), "--method", "feast", "--readme", str(readme)]) == 0
    claims = read_claims(runs, "feast")
    assert readme.read_text() == (
        f"# Suite\n<!-- generated:claims-headline -->\n{headline(claims)}\n<!-- /generated:claims-headline -->\n\n"
        f"<!-- generated:claims -->\n{detail(claims)}\n<!-- /generated:claims -->\n"
    )
    assert main([str(runs), "--method", "scalefl"]) == 2
    assert "--method 'scalefl': 0 rows of it" in capsys.readouterr().err
    readme.write_text("no block\n")
    assert main([str(runs), "--method", "feast", "--readme", str(readme)]) == 2
    assert readme.read_text() == "no block\n"


def test_the_committed_feast_claims_are_what_the_study_writes():
    claims = read_claims(ROOT / "experiments/results/converged/runs", "feast")
    for name, text, readme in (
        ("claims-headline", headline(claims), "README.md"),
        ("claims-headline", headline(claims), "docs/results.md"),
        ("claims", detail(claims), "experiments/results/converged/README.md"),
    ):
        body = block_body((ROOT / readme).read_text(), name)
        assert body == text, f"{readme}: rerun python -m experiments.studies.claims"


def test_readme_blocks_are_never_written_through_a_symlink(tmp_path, capsys):
    runs = make_suite(tmp_path)
    target = tmp_path / "elsewhere.md"
    target.write_text("<!-- generated:claims -->\nold\n<!-- /generated:claims -->\n")
    (tmp_path / "README.md").symlink_to(target)
    assert main([str(runs), "--method", "feast", "--readme", str(tmp_path / "README.md")]) == 2
    assert "is a symlink" in capsys.readouterr().err and "old" in target.read_text()


def test_a_marker_named_in_prose_is_not_a_block(tmp_path):
    """Only markers on lines of their own delimit a block: the prose mentioning one stays as it was."""
    readme = tmp_path / "README.md"
    prose = "The study writes the `<!-- generated:claims -->` block.\n"
    readme.write_text(f"{prose}\n<!-- generated:claims -->\nold\n<!-- /generated:claims -->\nend\n")
    assert rewrite_blocks(readme, {"claims": "new"})
    assert readme.read_text() == f"{prose}\n<!-- generated:claims -->\nnew\n<!-- /generated:claims -->\nend\n"


def test_a_method_without_tiers_is_read_from_its_baselines_alone(tmp_path):
    """heterofl has no tiers and no matched runs of its own: only the equal-rounds sentence, against feast and fiarse
    (heterofl-matched was matched to feast, so it is neither)."""
    claims = read_claims(make_suite(tmp_path), "heterofl")
    assert [v.name for v in claims.equal] == ["feast", "fiarse"] and claims.matched == []
    assert headline(claims).startswith("At equal rounds heterofl is ahead of 0 of the 2 baselines at every seed;")
    assert detail(claims).startswith("- At equal rounds heterofl")
