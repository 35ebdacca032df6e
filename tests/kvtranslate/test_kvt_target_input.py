"""target_input "positions": the translator reads the source cache and the target's positions, not its token
embeddings, so what it writes about the tokens can only come from the source."""

import pytest
import torch

from kvtranslate.corpus import make_dataset
from kvtranslate.models import ModelPair, build_tiny
from kvtranslate.pipeline import TRANSLATOR_DEFAULTS, build_translator, collate, encode_pair_items, translate_batch
from kvtranslate.tokenization import train_tokenizer
from kvtranslate.translators import KVTranslator


@pytest.fixture(scope="module")
def pair_and_batch():
    tok_a, tok_b = train_tokenizer(300), train_tokenizer(420)
    source, _ = build_tiny("tiny-gpt2", seed=0, tokenizer=tok_a)
    target, _ = build_tiny("tiny-qwen2", seed=1, tokenizer=tok_b)
    pair = ModelPair(source, tok_a, target, tok_b)
    return pair, collate(pair, encode_pair_items(pair, make_dataset(3, seed=5, split="eval")))


def written(pair, batch, target_input, tgt_ids=None, src_ids=None):
    torch.manual_seed(0)
    translator = build_translator(pair, {**TRANSLATOR_DEFAULTS, "hidden": 16, "target_input": target_input}).eval()
    batch = {**batch, "tgt_ids": batch["tgt_ids"] if tgt_ids is None else tgt_ids}
    batch = {**batch, "src_ids": batch["src_ids"] if src_ids is None else src_ids}
    with torch.no_grad():
        kv, _ = translate_batch(translator, pair, batch)
    return torch.stack([torch.cat([k, v]) for k, v in kv])


@pytest.mark.parametrize("target_input,reads_tokens", [("positions", False), ("embeddings", True)])
def test_positions_option_removes_the_target_token_input(pair_and_batch, target_input, reads_tokens):
    pair, batch = pair_and_batch
    other_tokens = torch.where(batch["tgt_mask"].bool(), (batch["tgt_ids"] + 7) % 400 + 2, batch["tgt_ids"])
    base = written(pair, batch, target_input)
    assert (not torch.equal(base, written(pair, batch, target_input, tgt_ids=other_tokens))) == reads_tokens
    other_source = torch.where(batch["src_mask"].bool(), (batch["src_ids"] + 5) % 280 + 2, batch["src_ids"])
    assert not torch.equal(base, written(pair, batch, target_input, src_ids=other_source))  # the source is read


def test_target_input_is_saved_and_checked(tmp_path):
    geom = dict(layers=2, kv_heads=2, head_dim=8)
    KVTranslator(geom, geom, 16, hidden=8, target_input="positions").save_pretrained(str(tmp_path / "t"))
    assert KVTranslator.from_pretrained(str(tmp_path / "t")).target_input == "positions"
    with pytest.raises(ValueError, match="target_input must be one of"):
        KVTranslator(geom, geom, 16, target_input="tokens")
