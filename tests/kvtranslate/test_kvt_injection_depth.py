"""The injection-depth study: the layer probe puts translated K/V in exactly the layers asked (the target's own in the
others), the two failure modes are the measures the study defines, and the summary pairs each variant with its no-CCL
twin by seed and plots every variant."""

import json
import math
import os
import statistics
import sys

import pytest
import torch

from kvtranslate.corpus import make_dataset
from kvtranslate.evaluate import closed_set_correct, prefix_and_tails
from kvtranslate.models import load_pair
from kvtranslate.pipeline import build_translator, encode_pair_items
from kvtranslate.train import TRAIN_DEFAULTS

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "experiments", "translation"))

import kvtranslate_injection_depth as depth  # noqa: E402


@pytest.fixture(scope="module")
def setup():
    pair = load_pair("tiny-gpt2", "tiny-qwen2")
    torch.manual_seed(0)
    translator = build_translator(pair, {**TRAIN_DEFAULTS, "kind": "single"}).eval()  # untrained: far from native
    data = encode_pair_items(pair, make_dataset(6, seed=3, split="eval"))
    return pair, translator, data


def test_the_layer_probe_translates_exactly_the_layers_asked(setup):
    pair, translator, data = setup
    translated, _, _ = prefix_and_tails("translated", data, pair, translator)
    native, _, _ = prefix_and_tails("native", data, pair)
    assert not torch.allclose(translated[0][0], native[0][0])  # the probe below tells the two apart
    probe, _, _ = prefix_and_tails("translated", data, pair, translator, layers=(0,))
    assert torch.equal(probe[0][0], translated[0][0]) and torch.equal(probe[0][1], translated[0][1])
    assert torch.equal(probe[1][0], native[1][0]) and torch.equal(probe[1][1], native[1][1])
    every, _, _ = prefix_and_tails("translated", data, pair, translator, layers=(0, 1))
    assert all(torch.equal(a, b) for la, lb in zip(every, translated) for a, b in zip(la, lb))
    # no layer translated: the target's own cache, so the answers are the native cache's
    assert closed_set_correct(data, "translated", pair, translator, layers=()) == closed_set_correct(
        data, "native", pair
    )
    none, _, _ = prefix_and_tails("translated", data, pair, translator, layers=())
    assert all(torch.equal(a, b) for la, lb in zip(none, native) for a, b in zip(la, lb))


def test_a_layer_probe_outside_the_target_or_without_a_translation_is_refused(setup):
    pair, translator, data = setup
    with pytest.raises(ValueError, match=r"layers \[2\] do not exist: layers must be among the target's 0\.\.1"):
        prefix_and_tails("translated", data, pair, translator, layers=(2,))
    with pytest.raises(ValueError, match="layers applies to the modes"):
        prefix_and_tails("direct", data, pair, layers=(0,))


def test_failure_modes_are_the_mean_replay_error_before_p_1_and_the_answer_kl_at_p_1():
    points = {
        "0.25": dict(replay_hidden_err=0.1, answer_kl=0.5),
        "0.5": dict(replay_hidden_err=0.3, answer_kl=0.7),
        "1.0": dict(replay_hidden_err=None, answer_kl=2.0),
    }
    assert depth.failure_modes(points) == dict(propagated_shift=pytest.approx(0.2), last_state_shift=2.0)
    assert depth.failure_modes({"0.5": dict(replay_hidden_err=0.3, answer_kl=0.7)})["last_state_shift"] is None


def run(variant, seed, shift, kl, w_ccl):
    points = {
        "0.5": dict(retention=0.9, acc=0.9, replay_hidden_err=shift, answer_kl=kl / 2),
        "1.0": dict(retention=0.8, acc=0.8, replay_hidden_err=None, answer_kl=kl),
    }
    layers = {"0": dict(retention=0.95, answer_kl=0.1), "1": dict(retention=0.85, answer_kl=kl)}
    sets = {"heldout_phrasing": dict(points=points, layers=layers, **depth.failure_modes(points))}
    return dict(
        source="s", target="t", variant=variant, seed=seed, eval_seed=5000, commit="a" * 40, dirty=False,
        overrides=dict(kind=variant.split(":")[0]), w_ccl=w_ccl, parameters=100, sets=sets,
    )  # fmt: skip


def test_the_summary_pairs_each_variant_with_its_no_ccl_twin_and_the_plot_shows_them(tmp_path):
    path = tmp_path / "depth.jsonl"
    rows = [run("mot", s, shift, kl, 1.0) for s, shift, kl in ((0, 0.2, 1.0), (1, 0.4, 1.2), (2, 0.3, 0.8))]
    rows += [run("mot:w_ccl=0.0", s, shift, kl, 0.0) for s, shift, kl in ((0, 0.3, 1.5), (1, 0.4, 1.0), (3, 0.9, 9.0))]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = depth.summarise(str(path))
    entry = summary["variants"]["mot"]
    assert entry["ccl"] is True and summary["variants"]["mot:w_ccl=0.0"]["ccl"] is False
    shift = entry["measures"]["heldout_phrasing/propagated_shift"]
    assert math.isclose(shift["mean"], 0.3) and math.isclose(shift["ci95"], 4.30 * 0.1 / math.sqrt(3))
    # paired over the seeds both ran (0 and 1): CCL minus no CCL
    diff = entry["differences"]["no_ccl"]["heldout_phrasing/last_state_shift"]
    assert diff["seeds"] == [0, 1] and math.isclose(diff["mean"], ((1.0 - 1.5) + (1.2 - 1.0)) / 2)
    assert math.isclose(diff["ci95"], 12.71 * statistics.stdev([-0.5, 0.2]) / math.sqrt(2))
    assert "no_ccl" not in summary["variants"]["mot:w_ccl=0.0"]["differences"]
    assert json.loads((tmp_path / "depth_summary.json").read_text()) == summary
    depth.plot(summary, str(tmp_path / "depth.png"))
    assert (tmp_path / "depth.png").stat().st_size > 10_000


def test_points_without_the_late_injection_are_a_usage_error(capsys):
    with pytest.raises(SystemExit):
        depth.main(["--points", "0.25,0.5", "--seeds", "0"])
    assert "including 1 (the late injection)" in capsys.readouterr().err
