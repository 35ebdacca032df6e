"""Several source models feeding one target (`--source a+b`): the layer map, the translator reading every source,
the source-drop ablation, config checks, the pipeline and the study tables."""

import os

import pytest
import torch
from kvt_helpers import small_model

from experiments.translation.kvtranslate_controls import by_label, comparisons, kinds_table, sources_table
from kvtranslate.align import layer_map
from kvtranslate.cache import prefill_kv
from kvtranslate.config_check import check_config, parameter_count
from kvtranslate.corpus import make_dataset
from kvtranslate.models import CHECKPOINT_DIR, ModelPair, build_tiny, load_pair, source_geometry, source_names
from kvtranslate.pipeline import (
    TRANSLATOR_DEFAULTS,
    build_translator,
    check_fits,
    collate,
    encode_pair_items,
    prefill_sources,
    translate_batch,
)
from kvtranslate.tokenization import train_tokenizer
from kvtranslate.translators import KINDS, KVTranslator, segment_layer_map, segment_layers

TWO = dict(layers=5, kv_heads=2, head_dim=8, segments=[2, 3])  # a 2-layer and a 3-layer source side by side
TGT = dict(layers=2, kv_heads=2, head_dim=8)


def test_each_target_layer_reads_the_nearest_layer_of_every_source():
    # by hand: source A's 3 layers sit at depths 1/6, 1/2, 5/6, source B's 6 layers (numbered 3-8) at 1/12 ... 11/12;
    # the target's 2 layers at 1/4 and 3/4. Nearest to 1/4: A's layer 0 (1/12 away), B's layer 1 (exact) = 4;
    # nearest to 3/4: A's layer 2, B's layer 4 (exact) = 7
    assert segment_layer_map([3, 6], 2, 1) == [[0, 4], [2, 7]]
    # k is capped at each source's depth; one source is align.layer_map
    deep = layer_map(6, 2, 2)
    assert segment_layer_map([1, 6], 2, 2) == [[0, *(1 + i for i in deep[0])], [0, *(1 + i for i in deep[1])]]
    assert segment_layer_map([6], 3, 2) == layer_map(6, 3, 2)
    assert segment_layers([3, 6], 1) == tuple(range(3, 9))
    with pytest.raises(ValueError, match="source index must be in 0..1"):
        segment_layers([3, 6], 2)


def run(translator, feats, emb):
    with torch.no_grad():
        kv, _ = translator(feats, emb)
    return torch.cat([torch.cat([k, v], 1) for k, v in kv], 1)


@pytest.mark.parametrize("kind", ["mot", "single", "shared-latent"])
def test_a_translator_reads_every_source_and_dropping_one_removes_exactly_it(kind):
    torch.manual_seed(0)
    translator = KVTranslator(TWO, TGT, 16, kind=kind, k_layers=1, hidden=16, latent=16).eval()
    feats, emb = torch.randn(1, 4, 5, 32), torch.randn(1, 4, 16)
    base = run(translator, feats, emb)
    for i in (0, 1):
        changed = feats.clone()
        changed[:, :, list(segment_layers(TWO["segments"], i))] += 1.0
        assert not torch.allclose(run(translator, changed, emb), base)  # source i is read
        translator.zeroed_layers = segment_layers(TWO["segments"], i)
        dropped = run(translator, feats, emb)
        assert torch.equal(run(translator, changed, emb), dropped)  # ... and nothing of it once dropped
        assert not torch.allclose(dropped, base)
        translator.zeroed_layers = ()
    assert torch.equal(run(translator, feats, emb), base)  # the ablation is undone


@pytest.mark.parametrize("kind", KINDS)
def test_the_closed_form_parameter_count_holds_for_several_sources(kind):
    for k_layers in (1, 2, 3):
        args = dict(source_geom=TWO, target_geom=TGT, target_embed_dim=16, kind=kind, k_layers=k_layers, hidden=8)
        with torch.device("meta"):
            built = KVTranslator(**args)
        assert parameter_count(check_config("folder", args)) == sum(p.numel() for p in built.parameters())


@pytest.mark.parametrize(
    "segments, match",
    [([2, 2], r"\[2, 2\] must sum to source_geom.layers=5"), ([5], "two or more"), ([2, 0, 3], r"segments\[1\]")],
)
def test_a_config_whose_segments_do_not_describe_its_source_is_refused(segments, match):
    config = dict(source_geom={**TWO, "segments": segments}, target_geom=TGT, target_embed_dim=16)
    with pytest.raises(ValueError, match=match):
        check_config("folder", config)


def test_source_names_split_on_plus_unless_the_path_exists(tmp_path):
    assert source_names("tiny-qwen2-b+tiny-qwen2-deep") == ["tiny-qwen2-b", "tiny-qwen2-deep"]
    assert source_names("tiny-gpt2") == ["tiny-gpt2"]
    folder = tmp_path / "a+b"
    folder.mkdir()
    assert source_names(str(folder)) == [str(folder)]
    with pytest.raises(ValueError, match="an empty name"):
        source_names("tiny-qwen2-b++tiny-qwen2-deep")


def test_sources_with_other_head_widths_are_refused_naming_the_key():
    narrow, wide = small_model("qwen2", hidden=32, heads=4), small_model("qwen2", hidden=48, heads=4)
    target = small_model("qwen2")
    with pytest.raises(ValueError, match="head_dim 8 vs 12"):
        source_geometry(ModelPair(narrow, None, target, None, more_sources=(wide,)))


@pytest.fixture(scope="module")
def two_source_pair():
    tok_a, tok_b = train_tokenizer(300), train_tokenizer(420)
    first, _ = build_tiny("tiny-qwen2-b", seed=0, tokenizer=tok_a)
    second, _ = build_tiny("tiny-qwen2-deep", seed=2, tokenizer=tok_a)
    target, _ = build_tiny("tiny-qwen2", seed=1, tokenizer=tok_b)
    return ModelPair(first, tok_a, target, tok_b, more_sources=(second,))


def test_the_pipeline_translates_from_both_caches_and_a_saved_translator_fits_only_its_sources(
    two_source_pair, tmp_path
):
    pair = two_source_pair
    assert source_geometry(pair)["segments"] == [3, 6] and source_geometry(pair)["layers"] == 9
    batch = collate(pair, encode_pair_items(pair, make_dataset(3, seed=4, split="train")))
    joined = prefill_sources(pair, batch["src_ids"], batch["src_mask"])
    alone = [prefill_kv(m, batch["src_ids"], batch["src_mask"]) for m in pair.sources]
    assert len(joined) == 9 and all(torch.equal(a[0], b[0]) for a, b in zip(joined, alone[0] + alone[1]))
    torch.manual_seed(0)
    translator = build_translator(pair, {**TRANSLATOR_DEFAULTS, "kind": "mot", "k_layers": 1, "hidden": 16})
    assert translator.layer_map == [[0, 4], [2, 7]]
    kv, _ = translate_batch(translator, pair, batch)
    assert kv[0][0].shape == (3, 2, batch["tgt_ids"].shape[1], 32)
    translator.save_pretrained(str(tmp_path / "t"))
    loaded = KVTranslator.from_pretrained(str(tmp_path / "t"))
    assert loaded.config["source_geom"]["segments"] == [3, 6]
    check_fits(loaded, pair, "t")
    one_source = ModelPair(pair.source, pair.source_tok, pair.target, pair.target_tok)
    with pytest.raises(ValueError, match="was made for a source cache of"):
        check_fits(loaded, one_source, "t")


def row(variant, seed, retention, without=None, eval_seed=11):
    r = dict(variant=variant, seed=seed, eval_seed=eval_seed, parameters=10, hidden=8)
    for s in ("training_phrasing", "heldout_phrasing", "long"):
        r[f"{s}_retention"] = retention
        for name, value in (without or {}).items():
            r[f"{s}_without_{name}_retention"] = value
    return r


def test_the_tables_show_each_source_dropped_and_compare_with_each_source_alone():
    rows = [row("mot:k=1", s, 0.6 + s / 100, {"a": 0.2, "b-deep": 0.5}) for s in (0, 1)]
    rows += [row("no-source:k=1", s, 0.1) for s in (0, 1)]
    assert by_label(rows, "long_retention")["mot, without b-deep"] == {0: 0.5, 1: 0.5}
    assert ("mot, without a", "mot") in comparisons(rows) and ("mot, without b-deep", "mot") in comparisons(rows)
    assert "| `mot`, without a at evaluation | same |  | 0, 1 |" in kinds_table(rows)
    alone = {"a": [row("mot:k=1", s, 0.5) for s in (0, 1)], "b-deep": [row("mot:k=1", 0, 0.7)]}
    text = sources_table(rows, alone)
    assert "| `mot` | `mot` from `a` alone | 2 | 0.105 ± 0.064 (0.041 to 0.169) | beyond the interval, higher |" in text
    assert "| `mot` | `mot` from `b-deep` alone | 1 | -0.100 (one seed) | one seed: no interval |" in text
    with pytest.raises(ValueError, match="evaluation seeds differ"):
        sources_table(rows, {"a": [row("mot:k=1", 0, 0.5, eval_seed=99)]})


@pytest.mark.skipif(
    not all(os.path.isdir(os.path.join(CHECKPOINT_DIR, n)) for n in ("tiny-gpt2", "tiny-qwen2-b", "tiny-qwen2-deep")),
    reason="run `python -m kvtranslate pretrain` first",
)
def test_load_pair_joins_sources_that_share_a_tokenizer_and_refuses_others():
    pair = load_pair("tiny-qwen2-b+tiny-qwen2-deep", "tiny-qwen2")
    assert len(pair.sources) == 2 and source_geometry(pair)["segments"] == [3, 6]
    with pytest.raises(ValueError, match="tiny-qwen2-b and tiny-gpt2 use different tokenizers"):
        load_pair("tiny-gpt2+tiny-qwen2-b", "tiny-qwen2")
