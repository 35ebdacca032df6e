"""The retention study's summary (paired differences over the seeds two variants share) and the report's
head-to-head table of the kinds trained with one recipe."""

import json
import math
import os
import statistics
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "experiments", "translation"))

import kvtranslate_report  # noqa: E402
import kvtranslate_retention  # noqa: E402


def run(variant, seed, held, long):
    return dict(
        source="s",
        target="t",
        variant=variant,
        seed=seed,
        steps=10,
        heldout_phrasing_retention=held,
        long_retention=long,
    )


def test_a_paired_difference_uses_only_the_seeds_both_variants_ran(tmp_path):
    path = tmp_path / "study.jsonl"
    rows = [run("a", 0, 0.5, 0.1), run("a", 1, 0.9, 0.2), run("a", 2, 0.8, 0.4)]
    rows += [run("b", 1, 0.7, 0.3), run("b", 2, 0.7, 0.1), run("b", 3, 0.1, 0.9)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = kvtranslate_retention.summarise(str(path), ["b"])
    diff = summary["variants"]["a"]["heldout_phrasing_retention_minus_b"]
    assert diff["seeds"] == [1, 2]  # seed 0 has no b, seed 3 no a
    assert math.isclose(diff["mean"], ((0.9 - 0.7) + (0.8 - 0.7)) / 2)
    assert math.isclose(diff["ci95"], 12.71 * statistics.stdev([0.2, 0.1]) / math.sqrt(2))
    assert json.loads((tmp_path / "study_summary.json").read_text()) == summary
    # the report's differences table names the paired seeds, not the variant's own
    assert "| `a` | `b` | 1, 2 |" in kvtranslate_report.retention_study_table(summary)


def test_the_recipe_table_puts_each_mixture_kind_against_the_others():
    recipe = kvtranslate_report.RECIPE

    def metric(mean, ci95, seeds=None):
        return dict(mean=mean, ci95=ci95, **({} if seeds is None else dict(seeds=seeds)))

    variants = {
        f"mot-latent{recipe}": {
            "seeds": [0, 1, 2],
            "heldout_phrasing_retention": metric(0.9, 0.02),
            "long_retention": metric(0.95, 0.05),
            f"heldout_phrasing_retention_minus_single{recipe}": metric(0.01, 0.03, [0, 1]),
            f"long_retention_minus_single{recipe}": metric(0.1, 0.04, [0, 1]),
        },
        f"single{recipe}": {
            "seeds": [0, 1],
            "heldout_phrasing_retention": metric(0.89, 0.01),
            "long_retention": metric(0.85, 0.02),
        },
        f"single{recipe}:w_ccl=0.0": {"seeds": [0], "heldout_phrasing_retention": metric(0.5, None)},  # not the recipe
        "mot:steps=2000": {"seeds": [0], "heldout_phrasing_retention": metric(0.5, None)},
    }
    study = dict(source="s", target="t", variants=variants)
    text = kvtranslate_report.recipe_table(study)
    assert "| `mot-latent` | 3 | 0.900 ± 0.020 (0.880 to 0.920) | 0.950 ± 0.050 (0.900 to 1.000) |" in text
    assert "| `single` | 2 | 0.890 ± 0.010 (0.880 to 0.900) | 0.850 ± 0.020 (0.830 to 0.870) |" in text
    # MoT minus the single projector over the two seeds they share: an advantage above 0.04 held-out is ruled out
    assert "| `mot-latent` | `single` | 2 | 0.010 ± 0.030 (-0.020 to 0.040) | 0.100 ± 0.040 (0.060 to 0.140) |" in text
    assert "w_ccl" not in text and "`mot`" not in text
    assert text.count("\n| `") == 3  # two kinds, one difference
    # the top-level README's headline says the same difference in words
    assert (
        "a mixture of translators on a shared latent space is level with a single projector on held-out phrasings "
        "and ahead of it on long contexts" in kvtranslate_report.headline(None, None, study)
    )


def metric(mean, ci95, seeds=None):
    return dict(mean=mean, ci95=ci95, **({} if seeds is None else dict(seeds=seeds)))


def test_the_confirmation_table_puts_each_kind_beside_its_screening_numbers():
    recipe = kvtranslate_report.RECIPE
    confirmation = dict(
        source="s",
        target="t",
        eval_seeds=[5000],
        variants={
            f"mot-latent{recipe}": dict(
                seeds=[300, 301],
                commits=["abc+dirty"],
                heldout_phrasing_retention=metric(0.9, 0.02),
                long_retention=metric(0.95, 0.05),
                **{
                    f"heldout_phrasing_retention_minus_single{recipe}": metric(-0.01, 0.03, [300, 301]),
                    f"long_retention_minus_single{recipe}": metric(0.1, 0.04, [300, 301]),
                },
            ),
            f"single{recipe}": dict(
                seeds=[300, 301], heldout_phrasing_retention=metric(0.91, 0.01), long_retention=metric(0.85, 0.02)
            ),
        },
    )
    screening = dict(
        source="s",
        target="t",
        variants={
            f"single{recipe}": dict(
                seeds=[0, 1, 2], heldout_phrasing_retention=metric(0.8, 0.1), long_retention=metric(0.7, 0.1)
            )
        },
    )
    text = kvtranslate_report.confirmation_table(confirmation, screening)
    assert "evaluation seed 5000, commits `abc+dirty`" in text
    assert "| `single` | 300, 301 | 3 | 0.910 ± 0.010 (0.900 to 0.920) | 0.800 ± 0.100 | 0.850 ± 0.020" in text
    assert "| `mot-latent` | 300, 301 | – | 0.900 ± 0.020 (0.880 to 0.920) | – |" in text  # no screening run
    assert "| `mot-latent` | `single` | 2 | -0.010 ± 0.030 (-0.040 to 0.020) | – | 0.100 ± 0.040" in text


def test_the_equal_capacity_table_groups_kinds_by_size_and_names_who_is_ahead():
    def sized(kind, size):
        return f"{kind}:phrase_mix=0.5:params={size}"

    a, b = sized("mot", 1000000), sized("single", 1000000)
    study = dict(
        source="s",
        target="t",
        eval_seeds=[5000],
        variants={
            a: dict(
                seeds=[0, 1, 2],
                parameters=[1001000],
                widths=dict(hidden=[183]),
                heldout_phrasing_retention=metric(0.92, 0.01),
                long_retention=metric(0.90, 0.02),
                **{
                    f"heldout_phrasing_retention_minus_{b}": metric(0.02, 0.01, [0, 1, 2]),
                    f"long_retention_minus_{b}": metric(-0.01, 0.03, [0, 1, 2]),
                },
            ),
            b: dict(
                seeds=[0, 1, 2],
                parameters=[998000],
                widths=dict(hidden=[258]),
                heldout_phrasing_retention=metric(0.90, 0.01),
                long_retention=metric(0.91, 0.02),
            ),
            "mot:phrase_mix=0.5": dict(seeds=[0], heldout_phrasing_retention=metric(0.5, None)),  # not sized
        },
    )
    text = kvtranslate_report.equal_capacity_table(study)
    assert "| 1,000,000 | `mot` | 1,001,000 | hidden 183 | 0, 1, 2 | 0.920 ± 0.010 (0.910 to 0.930) |" in text
    assert "| 1,000,000 | `mot` | `single` | 3 | 0.020 ± 0.010 (0.010 to 0.030) | -0.010 ± 0.030" in text
    assert "held-out phrasings: highest mean `mot` (0.920 ± 0.010); against `single` beyond seed-to-seed spread" in text
    # on long contexts the single projector leads; its difference is the mixture's, turned round
    assert "long contexts: highest mean `single` (0.910 ± 0.020); against `mot` within seed-to-seed spread" in text
    assert "`mot:phrase_mix=0.5`" not in text


def test_the_recipe_check_blocks_appear_only_once_their_files_exist(tmp_path, monkeypatch):
    monkeypatch.setattr(kvtranslate_report, "EXPERIMENTS", str(tmp_path))
    names = ("confirmation", "equal-capacity", "injection-depth")
    assert not set(names) & set(kvtranslate_report.render())
    summary = dict(source="s", target="t", eval_seeds=[5000], variants={})
    (tmp_path / "equal_capacity_summary.json").write_text(json.dumps(summary))
    blocks = kvtranslate_report.render()
    assert "equal-capacity" in blocks and not {"confirmation", "injection-depth"} & set(blocks)


def test_the_retention_study_takes_the_uniform_gate_ablation_flag(tmp_path):
    """`--uniform-gates` is read by the study loop for every mixture; the parser must know it (else a mixture run
    stops with usage error 2 before training)."""
    path = tmp_path / "study.jsonl"
    path.write_text(json.dumps(run("a", 0, 0.5, 0.1)) + "\n")
    kvtranslate_retention.main(["--summary", "--uniform-gates", "--out", str(path)])
    assert json.loads((tmp_path / "study_summary.json").read_text())["variants"]["a"]["seeds"] == [0]
