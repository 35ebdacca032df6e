import pytest
import torch
from kvt_helpers import small_model

from kvtranslate.cache import apply_rope, extract_kv, inject_kv, prefill_kv, strip_rope
from kvtranslate.models import forward, positions_from_mask

FAMILIES = ["gpt2", "opt", "qwen2"]


def left_padded_batch(vocab=64, length=12, pads=(0, 4, 7), seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, vocab, (len(pads), length), generator=g)
    mask = torch.ones_like(ids)
    for b, p in enumerate(pads):
        mask[b, :p] = 0
        ids[b, :p] = 1
    return ids, mask


@pytest.mark.parametrize("family", FAMILIES)
def test_cache_built_from_tensors_reproduces_forward(family):
    model = small_model(family)
    ids, mask = left_padded_batch()
    split = 8
    with torch.no_grad():
        kv = prefill_kv(model, ids[:, :split], mask[:, :split])
        # rebuild from plain tensors (clones), as a translator would hand them over
        kv = [(k.clone(), v.clone()) for k, v in kv]
        cache = inject_kv(model, kv, mask[:, :split])
        continued = forward(model, ids[:, split:], mask[:, split:], cache, mask[:, :split]).logits
        full = forward(model, ids, mask).logits[:, split:]
    assert torch.allclose(continued, full, atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_left_padding_matches_unpadded_forward(family):
    model = small_model(family)
    ids, mask = left_padded_batch()
    with torch.no_grad():
        padded = forward(model, ids, mask).logits
        for b in range(ids.shape[0]):
            real = mask[b].bool()
            alone = forward(model, ids[b : b + 1, real], torch.ones(1, int(real.sum()), dtype=torch.long)).logits
            assert torch.allclose(padded[b, real], alone[0], atol=1e-5)


def test_rope_strip_rotate_round_trip():
    model = small_model("qwen2")
    keys = torch.randn(3, 2, 12, 8)
    _, mask = left_padded_batch()
    positions = positions_from_mask(mask)
    stripped = strip_rope(model, keys, positions)
    assert not torch.allclose(stripped, keys)
    assert torch.allclose(apply_rope(model, stripped, positions), keys, atol=1e-5)


def test_extracted_qwen2_keys_are_pre_rope_projections():
    """Layer-0 keys after stripping equal k_proj(norm(embedding)): no position left in them."""
    model = small_model("qwen2")
    ids, mask = left_padded_batch()
    with torch.no_grad():
        kv = prefill_kv(model, ids, mask)
        layer = model.model.layers[0]
        h = layer.input_layernorm(model.model.embed_tokens(ids))
        k = layer.self_attn.k_proj(h).view(ids.shape[0], ids.shape[1], 2, -1).transpose(1, 2)
    real = mask.bool()[:, None, :, None].expand_as(k)
    assert torch.allclose(kv[0][0][real], k[real], atol=1e-5)


def test_inject_rejects_wrong_shapes():
    model = small_model("qwen2")
    mask = torch.ones(1, 5, dtype=torch.long)
    bad = [(torch.zeros(1, 4, 5, 8), torch.zeros(1, 4, 5, 8))] * 2  # 4 heads, model caches 2 KV heads
    with pytest.raises(ValueError, match="kv_heads"):
        inject_kv(model, bad, mask)
    with pytest.raises(ValueError, match="layers"):
        inject_kv(model, bad[:1], mask)


def test_extract_plain_family_is_identity():
    model = small_model("gpt2")
    ids, mask = left_padded_batch()
    with torch.no_grad():
        out = forward(model, ids, mask)
    kv = extract_kv(model, out.cache, mask)
    assert torch.equal(kv[1][0], out.cache.layers[1].keys)
