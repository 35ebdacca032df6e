import pytest
import torch
from kvt_helpers import small_model

from kvtranslate.cache import prefill_kv, prefix_kv
from kvtranslate.corpus import make_dataset
from kvtranslate.evaluate import prefix_and_tails
from kvtranslate.losses import context_correction_loss, kv_reconstruction_loss
from kvtranslate.models import ModelPair, build_tiny
from kvtranslate.pipeline import build_translator, encode_pair_items
from kvtranslate.tokenization import train_tokenizer
from kvtranslate.train import TRAIN_DEFAULTS, training_loss
from kvtranslate.translators import KVTranslator, balance_loss, target_embeddings

SRC = dict(layers=3, kv_heads=4, head_dim=8)
TGT = dict(layers=2, kv_heads=2, head_dim=8)


@pytest.mark.parametrize("gating", ["softmax", "topk"])
def test_router_weights_sum_to_one(gating):
    torch.manual_seed(0)
    tr = KVTranslator(
        SRC, TGT, target_embed_dim=16, kind="mot", k_layers=2, hidden=16, n_experts=4, gating=gating, top_k=2
    )
    feats, emb = torch.randn(2, 5, 3, 2 * 4 * 8), torch.randn(2, 5, 16)
    kv, aux = tr(feats, emb)
    gates = aux["gates"]
    assert torch.allclose(gates.sum(-1), torch.ones(gates.shape[:-1]), atol=1e-6)
    if gating == "topk":
        assert ((gates > 0).sum(-1) == 2).all()
    assert kv[0][0].shape == (2, 2, 5, 8) and len(kv) == 2


def test_balance_loss_is_minimal_for_uniform_routing():
    uniform = torch.full((1, 8, 4), 0.25)
    collapsed = torch.zeros(1, 8, 4)
    collapsed[..., 0] = 1.0
    assert balance_loss(uniform) < balance_loss(collapsed)


def test_bad_translator_arguments_name_allowed_values():
    with pytest.raises(ValueError, match="kind must be one of"):
        KVTranslator(SRC, TGT, 16, kind="moe")
    with pytest.raises(ValueError, match="gating must be one of"):
        KVTranslator(SRC, TGT, 16, gating="hard")
    with pytest.raises(ValueError, match="top_k"):
        KVTranslator(SRC, TGT, 16, kind="mot", n_experts=2, gating="topk", top_k=3)
    with pytest.raises(ValueError, match="window and src_window must be >= 1"):
        KVTranslator(SRC, TGT, 16, window=0)
    with pytest.raises(ValueError, match="src_window=0"):
        KVTranslator(SRC, TGT, 16, src_window=0)


@pytest.mark.parametrize("kind", ["single", "mot-latent"])
def test_source_window_reads_the_source_part_of_each_token_and_its_predecessors(kind):
    """With src_window 3 the K/V written at token t change when the source K/V aligned to t - 2 change and not
    when those of t - 3 do; with src_window 1 only t's own source K/V count."""
    torch.manual_seed(0)
    feats, emb, mask = torch.randn(1, 6, SRC["layers"], 64), torch.randn(1, 6, 16), torch.ones(1, 6)

    def keys_at_last_token(translator, changed_position):
        moved = feats.clone()
        if changed_position is not None:
            moved[0, changed_position] += torch.randn(moved.shape[2:])  # not a constant: layer norms remove those
        with torch.no_grad():
            return translator(moved, emb, mask)[0][0][0][0, :, -1]

    for src_window, reaches in ((3, 3), (1, 5)):
        torch.manual_seed(1)
        translator = KVTranslator(SRC, TGT, 16, kind=kind, hidden=16, latent=16, src_window=src_window).eval()
        base = keys_at_last_token(translator, None)
        assert not torch.allclose(keys_at_last_token(translator, reaches), base)
        assert torch.equal(keys_at_last_token(translator, reaches - 1), base)


@pytest.mark.parametrize("mode", ["native-keys", "native-values"])
def test_probe_modes_put_the_targets_own_keys_or_values_into_the_translated_cache(tiny_pair, mode):
    pair = tiny_pair
    torch.manual_seed(0)
    translator = build_translator(pair, {**TRAIN_DEFAULTS, "hidden": 16}).eval()
    examples = encode_pair_items(pair, make_dataset(3, seed=5, split="eval"))
    probe, mask, _ = prefix_and_tails(mode, examples, pair, translator, 0.5)
    translated, _, _ = prefix_and_tails("translated", examples, pair, translator, 0.5)
    native, _, _ = prefix_and_tails("native", examples, pair, None, 0.5)
    own, other = (0, 1) if mode == "native-keys" else (1, 0)
    real = mask.bool()[:, None, :, None]
    for p, t, n in zip(probe, translated, native):
        assert torch.equal(p[own], n[own]) and torch.equal(p[other], t[other])
        assert not torch.equal(p[own].masked_select(real), t[own].masked_select(real))


def test_embedding_window_holds_each_token_and_its_predecessors():
    """Slot i of token t is the lookup of the real token i places before t, zeros where there is none
    (before the first real token of a left-padded row)."""
    model = small_model("qwen2")
    ids = torch.tensor([[1, 1, 5, 6, 7], [3, 4, 5, 6, 7]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    table = model.get_input_embeddings().weight
    E = table.shape[1]
    with torch.no_grad():
        win = target_embeddings(model, ids, mask, window=3).view(2, 5, 3, E)
    assert torch.equal(win[0, 4, 0], table[7]) and torch.equal(win[0, 4, 1], table[6])
    assert torch.equal(win[0, 4, 2], table[5]) and torch.equal(win[1, 4, 2], table[5])
    assert torch.equal(win[0, 3, 2], torch.zeros(E)) and torch.equal(win[1, 3, 2], table[4])
    assert torch.equal(win[0, 2, 1], torch.zeros(E)) and torch.equal(win[1, 0, 1], torch.zeros(E))


def test_correction_loss_zero_iff_caches_equal():
    model = small_model("qwen2")
    ids = torch.randint(2, 64, (2, 10))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        kv = prefill_kv(model, ids, mask)
    tails = [[5, 6, 7], [8, 9]]
    loss, parts = context_correction_loss(model, kv, kv, mask, tails, pad_id=1)
    assert loss.item() == 0.0
    noisy = [(k + 0.5 * torch.randn_like(k), v) for k, v in kv]
    loss, parts = context_correction_loss(model, noisy, kv, mask, tails, pad_id=1)
    assert parts["hidden"].item() > 0 and parts["kl"].item() > 0
    assert kv_reconstruction_loss(kv, kv, mask).item() == 0.0


@pytest.mark.parametrize("key_weight", [1.0, 4.0])
def test_key_weight_scales_the_key_channels_of_the_reconstruction_loss(key_weight):
    """Keys off by 1 and values off by 2 on the real tokens: per token the mean over the channels (half keys, half
    values) is (key_weight * 1 + 4) / 2; padding counts nothing."""
    native = [(torch.randn(2, 3, 4, 5), torch.randn(2, 3, 4, 5)) for _ in range(2)]
    pred = [(k + 1.0, v + 2.0) for k, v in native]
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    loss = kv_reconstruction_loss(pred, native, mask, key_weight=key_weight)
    assert loss.item() == pytest.approx((key_weight + 4.0) / 2)


def test_prefix_kv_keeps_first_tokens_of_each_example():
    k = torch.arange(2 * 6, dtype=torch.float).view(2, 1, 6, 1)
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    out, new_mask = prefix_kv([(k, k)], mask, [2, 3])
    assert new_mask.tolist() == [[0, 1, 1], [1, 1, 1]]
    assert out[0][0][0, 0, 1:, 0].tolist() == [2.0, 3.0]
    assert out[0][0][1, 0, :, 0].tolist() == [6.0, 7.0, 8.0]


@pytest.fixture(scope="module")
def tiny_pair():
    tok_a, tok_b = train_tokenizer(300), train_tokenizer(420)
    source, _ = build_tiny("tiny-gpt2", seed=0, tokenizer=tok_a)
    target, _ = build_tiny("tiny-qwen2", seed=1, tokenizer=tok_b)
    return ModelPair(source, tok_a, target, tok_b)


@pytest.mark.parametrize("kind", ["mot", "single", "shared-latent", "mot-latent"])
def test_two_training_steps_lower_the_loss(tiny_pair, kind):
    pair = tiny_pair
    for p in list(pair.source.parameters()) + list(pair.target.parameters()):
        p.requires_grad_(False)
    cfg = {**TRAIN_DEFAULTS, "kind": kind, "hidden": 32}
    torch.manual_seed(0)
    translator = build_translator(pair, cfg)
    examples = encode_pair_items(pair, make_dataset(8, seed=3, split="train"))
    opt = torch.optim.Adam(translator.parameters(), lr=3e-3)
    before, _ = training_loss(translator, pair, examples, cfg, 0.5)
    for _ in range(2):
        loss, _ = training_loss(translator, pair, examples, cfg, 0.5)
        opt.zero_grad()
        loss.backward()
        opt.step()
    after, _ = training_loss(translator, pair, examples, cfg, 0.5)
    assert after.item() < before.item()
