"""The number tables and headlines of kvtranslate's READMEs are the ones experiments/translation/kvtranslate_report.py
writes from the committed result files: a hand edit, a result committed without regenerating them, or a table whose
markers were lost when a README was reorganised fails here."""

import os
import re
import sys

from fl_app.io.markdown import block_body

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "experiments", "translation"))

import kvtranslate_report  # noqa: E402


def read(path):
    with open(path) as f:
        return f.read()


def test_readme_tables_match_the_committed_results():
    blocks = kvtranslate_report.render()
    for path in kvtranslate_report.READMES:
        text = read(path)
        assert kvtranslate_report.apply(text, blocks) == text, (
            f"{path}: run python -m experiments.translation.kvtranslate_report"
        )


def test_every_generated_block_has_its_place_in_a_readme():
    """Each block the generator writes sits between its markers in one of the READMEs it rewrites (a block whose
    markers went missing would silently stop being checked)."""
    texts = [read(path) for path in kvtranslate_report.READMES]
    for name in kvtranslate_report.render():
        assert any(block_body(t, name) is not None for t in texts), f"no README holds the block {name!r}"


def test_headlines_are_one_readable_sentence_and_a_link():
    """The top README's kvtranslate headline (and the package README's summary): one sentence, one link to the
    results and study log that resolves from the README it sits in, no variant names or code."""
    blocks = kvtranslate_report.render()
    for name, readme in kvtranslate_report.HEADLINES.items():
        text = blocks[name]
        assert "\n" not in text and text.endswith(").") and not re.search(r"[.;:] ", text), text
        assert "`" not in text and "phrase_mix" not in text and "-latent" not in text, text
        links = re.findall(r"\]\(([^)]+)\)", text)
        assert len(links) == 1
        target = os.path.normpath(os.path.join(os.path.dirname(readme), links[0]))
        assert target == os.path.normpath(kvtranslate_report.STUDIES_README) and os.path.isfile(target)


def test_headline_says_how_the_mixture_compares():
    """The comparison words follow the paired interval: level within it, ahead or behind beyond it, per set."""

    def study(held, long):
        recipe = kvtranslate_report.RECIPE
        entry = dict(
            seeds=[0, 1, 2],
            heldout_phrasing_retention=dict(mean=0.9, ci95=0.01),
            long_retention=dict(mean=0.9, ci95=0.01),
        )
        mixture = dict(
            entry,
            **{
                f"heldout_phrasing_retention_minus_shared-latent{recipe}": held,
                f"long_retention_minus_shared-latent{recipe}": long,
            },
        )
        return dict(source="a", target="b", variants={f"shared-latent{recipe}": entry, f"mot{recipe}": mixture})

    level, ahead, behind = dict(mean=0.01, ci95=0.02), dict(mean=0.05, ci95=0.02), dict(mean=-0.05, ci95=0.02)
    link = "x.md"
    assert "a mixture of translators is level with a plain shared latent space" in kvtranslate_report.headline(
        None, None, study(level, level), link
    )
    assert "is ahead of a plain shared latent space (" in kvtranslate_report.headline(None, None, study(ahead, ahead))
    text = kvtranslate_report.headline(None, None, study(level, behind), link)
    assert "level with a plain shared latent space on held-out phrasings and behind it on long contexts" in text


def test_a_hand_edited_table_is_replaced():
    blocks = {"demo": "| a | b |"}
    edited = "x\n<!-- generated:demo -->\n| a | 0.999 |\n<!-- /generated:demo -->\ny"
    assert (
        kvtranslate_report.apply(edited, blocks) == "x\n<!-- generated:demo -->\n| a | b |\n<!-- /generated:demo -->\ny"
    )


def test_headline_reports_the_confirmation_set_not_the_screening_set():
    """The recipe was chosen on the screening study: the headline names the kind it ranked first and gives that
    kind's confirmation numbers (the committed files: screening shared-latent 0.93 / 1.00, confirmation 0.91 / 0.91)
    and says which set they come from."""
    recipe = kvtranslate_report.RECIPE
    screening = kvtranslate_report.load(
        os.path.join(kvtranslate_report.EXPERIMENTS, "retention_study_1000_steps_summary.json")
    )
    confirmation = kvtranslate_report.load(os.path.join(kvtranslate_report.EXPERIMENTS, "confirmation_summary.json"))
    best = max(
        kvtranslate_report.recipe_kinds(screening).items(),
        key=lambda kv: kv[1][1]["heldout_phrasing_retention"]["mean"],
    )[0]
    confirmed = confirmation["variants"][best + recipe]
    for name in kvtranslate_report.HEADLINES:
        text = kvtranslate_report.render()[name]
        assert "confirmation set" in text, text
        for key in ("heldout_phrasing_retention", "long_retention"):
            assert f"about {kvtranslate_report.fmt(confirmed[key]['mean'], 2)} " in text, text
        assert (
            f"about {kvtranslate_report.fmt(screening['variants'][best + recipe]['long_retention']['mean'], 2)} "
            not in text
        )
