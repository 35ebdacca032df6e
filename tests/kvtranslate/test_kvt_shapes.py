"""Any GPT-2 / OPT / Qwen2 geometry on either side: small random models of varied shapes (depths, head counts and
widths, GQA down to one KV head, vocabularies, learned vs rotary positions, same or different tokenizers) go
through a few translator training steps and an evaluation; the translated cache has the target's cache shape and
the target's forward and generate accept it."""

import pytest
import torch
from kvt_helpers import small_model

from kvtranslate.corpus import make_dataset
from kvtranslate.evaluate import prefix_and_tails, qa_scores
from kvtranslate.models import ModelPair, kv_geometry
from kvtranslate.pipeline import encode_pair_items
from kvtranslate.scoring import run_tail
from kvtranslate.tokenization import train_tokenizer
from kvtranslate.train import train_translator

TOKENIZER_SIZES = (300, 420, 520)
# (source, target): family, layers, hidden, query heads, KV heads (Qwen2 only), tokenizer index; translator kind
MATRIX = [
    (("gpt2", 3, 48, 4, 4, 0), ("qwen2", 2, 64, 4, 1, 1), "mot"),  # learned -> RoPE, MHA -> 1 KV head
    (("opt", 1, 32, 2, 2, 1), ("gpt2", 3, 24, 3, 3, 2), "single"),  # one source layer, head width 16 -> 8
    (("qwen2", 3, 48, 6, 2, 2), ("opt", 2, 40, 5, 5, 0), "shared-latent"),  # RoPE -> learned, GQA -> MHA
    (("qwen2", 1, 32, 2, 1, 0), ("qwen2", 4, 64, 8, 2, 0), "mot"),  # same tokenizer, 1 -> 4 layers
    (("opt", 2, 64, 4, 4, 2), ("opt", 3, 48, 2, 2, 1), "mot"),  # OPT -> OPT, 4 -> 2 heads
]


@pytest.fixture(scope="module")
def tokenizers():
    return [train_tokenizer(n) for n in TOKENIZER_SIZES]


def build(spec, tokenizers, seed):
    family, layers, hidden, heads, kv_heads, tok = spec
    tokenizer = tokenizers[tok]
    model = small_model(
        family,
        layers,
        hidden,
        heads,
        kv_heads,
        vocab=len(tokenizer),
        positions=256,
        seed=seed,
        eos_id=tokenizer.eos_token_id,
        pad_id=tokenizer.pad_token_id,
    )
    return model, tokenizer


def last_logits(out, mask):
    return out.logits[torch.arange(mask.shape[0]), mask.sum(1) - 1]


@pytest.mark.parametrize("source_spec,target_spec,kind", MATRIX, ids=[f"{s[0]}-{t[0]}-{k}" for s, t, k in MATRIX])
def test_any_geometry_trains_evaluates_and_injects(tokenizers, source_spec, target_spec, kind):
    source, source_tok = build(source_spec, tokenizers, seed=0)
    target, target_tok = build(target_spec, tokenizers, seed=1)
    pair = ModelPair(source, source_tok, target, target_tok)
    translator, history, _ = train_translator(
        pair,
        log=lambda line: None,
        kind=kind,
        steps=3,
        batch=4,
        n_train=8,
        hidden=16,
        window=3,
        ccl_start=0.3,
    )
    assert all(torch.isfinite(torch.tensor(h["loss"])) for h in history)
    data = encode_pair_items(pair, make_dataset(4, seed=5, split="eval"))

    # shape: one (K, V) per target layer, [batch, target KV heads, longest context, target head width]
    kv, kv_mask, tails = prefix_and_tails("translated", data, pair, translator)
    g = kv_geometry(target)
    longest = max(len(e["tgt"]) for e in data)
    assert len(kv) == g["layers"]
    for k, v in kv:
        assert k.shape == v.shape == (len(data), g["kv_heads"], longest, g["head_dim"])
    assert kv_mask.sum(1).tolist() == [len(e["tgt"]) for e in data]

    # positions: the target's own cache, injected the same way, continues exactly like direct reading
    native, native_mask, native_tails = prefix_and_tails("native", data, pair)
    pad = target_tok.pad_token_id
    with torch.no_grad():
        cached, _, tail_mask = run_tail(target, native, native_mask, native_tails, pad)
        direct, _, direct_mask = run_tail(target, None, None, [e["tgt"] + e["question"] for e in data], pad)
        assert torch.allclose(last_logits(cached, tail_mask), last_logits(direct, direct_mask), atol=1e-4)
        # the translated cache is accepted by the target's forward ...
        out, _, tail_mask = run_tail(target, kv, kv_mask, tails, pad)
        assert out.logits.shape[:2] == tail_mask.shape and torch.isfinite(out.logits).all()
        # ... and by its generate (one unpadded row: the cache holds the context, the prompt adds the question)
        from kvtranslate.cache import inject_kv

        n = len(data[0]["tgt"])
        row_kv = [(k[:1, :, -n:], v[:1, :, -n:]) for k, v in kv]
        prompt = torch.tensor([data[0]["tgt"] + data[0]["question"]])
        generated = target.generate(
            input_ids=prompt,
            attention_mask=torch.ones_like(prompt),
            cache=inject_kv(target, row_kv, torch.ones(1, n, dtype=torch.long)),
            max_new_tokens=2,
            min_new_tokens=2,
            do_sample=False,
            pad_token_id=pad,
        )
    assert generated.shape == (1, prompt.shape[1] + 2)

    scores, predictions = qa_scores(data, "translated", pair, translator)
    assert 0.0 <= scores["acc"] <= 1.0 and 0.0 <= scores["f1"] <= 1.0 and len(predictions) == len(data)


@pytest.mark.parametrize("family", ["gpt2", "opt"])
def test_reading_past_a_learned_position_table_is_a_clear_error(family):
    from kvtranslate.models import forward

    model = small_model(family, positions=16)
    ids = torch.randint(2, 60, (2, 12))
    forward(model, ids, torch.ones_like(ids))  # fits
    cache = forward(model, ids, torch.ones_like(ids)).cache
    with pytest.raises(ValueError, match="exceed the 16 positions"):
        forward(model, ids[:, :5], torch.ones(2, 5, dtype=torch.long), cache, torch.ones_like(ids))
