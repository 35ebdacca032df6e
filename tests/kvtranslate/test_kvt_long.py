"""Long passages: the evaluation set is unchanged by the new options, and the long training passages
(`long_mix`) read only training names and templates, mix lengths and fit the models' positions."""

import os
import random

import pytest

from kvtranslate.corpus import (
    TEMPLATES,
    make_dataset,
    make_item,
    make_long_dataset,
    split_names,
    split_templates,
    template_words,
)
from kvtranslate.models import CHECKPOINT_DIR, TINY_SPECS, load_pair
from kvtranslate.pipeline import encode_pair_items, position_limit
from kvtranslate.train import TRAIN_DEFAULTS, long_training_data, train_translator

HAVE_CHECKPOINTS = all(os.path.isdir(os.path.join(CHECKPOINT_DIR, n)) for n in TINY_SPECS)
needs_checkpoints = pytest.mark.skipif(not HAVE_CHECKPOINTS, reason="run `python -m kvtranslate pretrain` first")


@pytest.fixture(scope="module")
def pair():
    return load_pair("tiny-gpt2", "tiny-qwen2")


def test_long_evaluation_set_is_unchanged_without_the_new_options():
    """Without min_facts / template_split / phrase_mix the long set draws exactly what it drew before (the
    committed long-context results were scored on it)."""
    rng = random.Random(5)
    before = [make_item(rng, 22, "eval", 4, max_people=11) for _ in range(6)]
    assert [i.passage for i in make_long_dataset(6, seed=5, n_facts=22)] == [i.passage for i in before]


def test_long_passages_mix_lengths_and_keep_the_split():
    items = make_long_dataset(40, seed=2, split="train", n_facts=22, min_facts=7)
    counts = [len(i.facts) for i in items]
    assert min(counts) >= 7 and max(counts) <= 22 and len(set(counts)) > 5
    train_names = set(split_names("train"))
    for item in items:
        assert {f[0] for f in item.facts} <= train_names
        sentences = item.passage.strip().split(". ")
        for sentence, (person, attr, value) in zip(sentences, item.facts):
            phrasings = [t.format(n=person, v=value).rstrip(".") for t in split_templates(TEMPLATES[attr][0], "train")]
            assert sentence.rstrip(".") in phrasings


@needs_checkpoints
def test_long_training_data_reads_no_held_out_name_or_template_and_fits(pair):
    cfg = {**TRAIN_DEFAULTS, "n_train": 64, "batch": 16, "long_mix": 0.5, "long_batch": 4, "phrase_mix": 0.5}
    data = long_training_data(pair, cfg)
    assert len(data) == round(64 * 0.5 * 4 / 16)
    limit = position_limit(pair.target)
    held_out_only = set(template_words("eval")) - set(template_words("train"))
    eval_names = set(split_names("eval"))
    for e in data:
        assert len(e["tgt"]) + len(e["question"]) + len(e["answer"]) <= limit
        text = pair.target_tok.decode(e["tgt"])
        assert not set(text.replace(".", " ").split()) & (held_out_only | eval_names)
    short = encode_pair_items(pair, make_dataset(200, seed=1, split="train"))
    assert max(len(e["tgt"]) for e in data) > 2 * max(len(e["tgt"]) for e in short)


@needs_checkpoints
@pytest.mark.parametrize("bad", [dict(long_mix=1.5), dict(long_mix=0.5, long_batch=0), dict(long_facts=3)])
def test_bad_long_settings_fail_before_training(pair, bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        train_translator(pair, log=lambda line: None, steps=1, **bad)
