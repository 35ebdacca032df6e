"""The number tables of kvtranslate's READMEs are the ones experiments/kvtranslate_report.py writes from the
committed result files: a hand edit or a result committed without regenerating them fails here."""

import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "experiments"))

import kvtranslate_report  # noqa: E402


def test_readme_tables_match_the_committed_results():
    blocks = kvtranslate_report.render()
    for path in (kvtranslate_report.README, kvtranslate_report.CHECKPOINTS_README, kvtranslate_report.TOP_README):
        with open(path) as f:
            text = f.read()
        assert kvtranslate_report.apply(text, blocks) == text, f"{path}: run python experiments/kvtranslate_report.py"


def test_a_hand_edited_table_is_replaced():
    blocks = {"demo": "| a | b |"}
    edited = "x\n<!-- generated:demo -->\n| a | 0.999 |\n<!-- /generated:demo -->\ny"
    assert (
        kvtranslate_report.apply(edited, blocks) == "x\n<!-- generated:demo -->\n| a | b |\n<!-- /generated:demo -->\ny"
    )
