"""Equal-capacity sizing: every translator kind sized to a parameter count has that many parameters (counted on the
built module) within the tolerance, the defaults size back to themselves, and a target out of reach is an error
naming `params` and the reachable range."""

import os
import re
import sys

import pytest
import torch
from kvt_helpers import small_model

from kvtranslate.models import ModelPair
from kvtranslate.pipeline import TRANSLATOR_DEFAULTS
from kvtranslate.sizing import SIZE_TOLERANCE, WIDTH_KNOBS, size_to_params
from kvtranslate.translators import KINDS, KVTranslator

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "experiments", "translation"))

import kvtranslate_retention  # noqa: E402

# the main pair's cache shapes: tiny-gpt2 (2 layers, 4 KV heads of 32) -> tiny-qwen2 (2 layers, 2 KV heads of 32),
# target embeddings 128 wide
SOURCE = dict(layers=2, kv_heads=4, head_dim=32)
TARGET = dict(layers=2, kv_heads=2, head_dim=32)
EMBED = 128
ARCH = ("kind", "k_layers", "hidden", "n_experts", "gating", "top_k", "latent", "window", "embed_dim", "src_window")


def built_parameters(settings):
    """Parameters of the translator `settings` builds, counted on a real (CPU) module."""
    translator = KVTranslator(SOURCE, TARGET, EMBED, **{k: settings[k] for k in ARCH})
    return sum(p.numel() for p in translator.parameters())


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("params", [1_000_000, 1_600_000])
def test_each_kind_sized_to_a_count_has_it_within_tolerance(kind, params):
    settings = {**TRANSLATOR_DEFAULTS, "kind": kind}
    sized = size_to_params(SOURCE, TARGET, EMBED, settings, params)
    assert abs(built_parameters(sized) - params) <= SIZE_TOLERANCE * params
    # only the kind's width knobs moved, all to one width
    widths = {sized[k] for k in WIDTH_KNOBS[kind]}
    assert len(widths) == 1
    assert {k: v for k, v in sized.items() if k not in WIDTH_KNOBS[kind]} == {
        k: v for k, v in settings.items() if k not in WIDTH_KNOBS[kind]
    }


def test_kinds_at_one_target_differ_in_width_but_not_in_size():
    """The point of sizing: at their defaults MoT has 1.6x the single projector's parameters; sized to one count the
    two are within twice the tolerance of each other, the mixture with the narrower experts."""
    defaults = {k: built_parameters({**TRANSLATOR_DEFAULTS, "kind": k}) for k in ("mot", "single")}
    assert defaults["mot"] > 1.5 * defaults["single"]
    sized = {k: size_to_params(SOURCE, TARGET, EMBED, {**TRANSLATOR_DEFAULTS, "kind": k}, 1_000_000) for k in defaults}
    counts = {k: built_parameters(s) for k, s in sized.items()}
    assert abs(counts["mot"] - counts["single"]) <= 2 * SIZE_TOLERANCE * 1_000_000
    assert sized["mot"]["hidden"] < sized["single"]["hidden"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_default_translators_own_count_sizes_back_to_its_default_widths(kind):
    settings = {**TRANSLATOR_DEFAULTS, "kind": kind}
    sized = size_to_params(SOURCE, TARGET, EMBED, settings, built_parameters(settings))
    assert all(sized[k] == TRANSLATOR_DEFAULTS[k] == 256 for k in WIDTH_KNOBS[kind])


def test_a_knob_set_explicitly_stays_and_the_other_one_reaches_the_count():
    settings = {**TRANSLATOR_DEFAULTS, "kind": "shared-latent", "latent": 128}
    sized = size_to_params(SOURCE, TARGET, EMBED, settings, 1_000_000, fixed={"latent"})
    assert sized["latent"] == 128 and sized["hidden"] != 256
    assert abs(built_parameters(sized) - 1_000_000) <= SIZE_TOLERANCE * 1_000_000
    with pytest.raises(ValueError, match=r"params: kind 'single' has no width left to size"):
        size_to_params(SOURCE, TARGET, EMBED, {**TRANSLATOR_DEFAULTS, "kind": "single"}, 10**6, fixed={"hidden"})


@pytest.mark.parametrize("params", [1_000, 10**12])
def test_an_unreachable_count_names_params_and_the_allowed_range(params):
    settings = {**TRANSLATOR_DEFAULTS, "kind": "mot"}
    with pytest.raises(ValueError) as error:
        size_to_params(SOURCE, TARGET, EMBED, settings, params)
    message = str(error.value)
    assert message.startswith(f"params={params:,} is out of reach for kind 'mot'")
    low, high = (int(x.replace(",", "")) for x in re.search(r"give ([\d,]+) to ([\d,]+) parameters", message).groups())
    # the range is what the narrowest and the widest allowed widths build
    assert low == built_parameters({**settings, "hidden": 8}) and high > 10**8
    assert "allowed range of params" in message


def test_a_variant_string_sizes_for_the_pairs_shapes():
    assert kvtranslate_retention.parse_variant("mot:w_key=16.0:params=200000") == dict(
        kind="mot", w_key=16.0, params=200000
    )
    for bad in ("mot:params=1e6", "mot:params=0", "mot:params=-5"):
        with pytest.raises(ValueError, match="params must be a positive whole number"):
            kvtranslate_retention.parse_variant(bad)
    torch.manual_seed(0)
    # small random models of other shapes: the sizing reads the pair's own geometry
    pair = ModelPair(small_model("gpt2", layers=3, hidden=48), None, small_model("qwen2", hidden=64), None)
    overrides = kvtranslate_retention.parse_variant("mot-latent:params=300000")
    sized = kvtranslate_retention.sized_overrides(pair, overrides)
    assert "params" not in sized and sized["hidden"] == sized["latent"] != 256
    source, target = dict(layers=3, kv_heads=4, head_dim=12), dict(layers=2, kv_heads=2, head_dim=16)
    translator = KVTranslator(source, target, 64, **{**TRANSLATOR_DEFAULTS, **sized})
    assert abs(sum(p.numel() for p in translator.parameters()) - 300_000) <= SIZE_TOLERANCE * 300_000
    assert kvtranslate_retention.sized_overrides(pair, dict(kind="mot")) == dict(kind="mot")
