"""Extracting and injecting KV caches (transformers 5.x DynamicCache), with RoPE handled explicitly.

Layout used throughout the package: a list over layers of (keys, values), each [batch, kv_heads, seq, head_dim],
left-padded, plus a mask [batch, seq] (1 = real token). Keys are kept *pre-RoPE*: Qwen2 caches rotated keys, so
extraction un-rotates them at their positions and injection rotates them at the target's positions. GPT-2/OPT
keys carry position only through their learned input embeddings and pass through unchanged.
"""

import torch
from torch import Tensor
from transformers import DynamicCache, PreTrainedModel

from .models import family_of, forward, kv_geometry, positions_from_mask

KV = list[tuple[Tensor, Tensor]]  # per layer (keys, values), each [batch, kv_heads, seq, head_dim]


def uses_rope(model: PreTrainedModel) -> bool:
    """Whether the family rotates keys by position (its cache holds rotated keys)."""
    return family_of(model) == "qwen2"


def rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def rope_cos_sin(
    model: PreTrainedModel, positions: Tensor, dtype: torch.dtype = torch.float32
) -> tuple[Tensor, Tensor]:
    """cos/sin [B, T, head_dim] of the model's own rotary embedding at `positions` [B, T]."""
    dummy = torch.zeros(1, dtype=dtype, device=positions.device)
    return model.model.rotary_emb(dummy, positions)


def apply_rope(model: PreTrainedModel, keys: Tensor, positions: Tensor) -> Tensor:
    cos, sin = rope_cos_sin(model, positions, keys.dtype)
    return keys * cos[:, None] + rotate_half(keys) * sin[:, None]


def strip_rope(model: PreTrainedModel, keys: Tensor, positions: Tensor) -> Tensor:
    # a rotation by -angle undoes the rotation by +angle
    cos, sin = rope_cos_sin(model, positions, keys.dtype)
    return keys * cos[:, None] - rotate_half(keys) * sin[:, None]


def check_kv(model: PreTrainedModel, kv: KV, mask: Tensor) -> None:
    g = kv_geometry(model)
    if len(kv) != g["layers"]:
        raise ValueError(f"kv has {len(kv)} layers but the model has {g['layers']}")
    for i, (k, v) in enumerate(kv):
        want = (mask.shape[0], g["kv_heads"], mask.shape[1], g["head_dim"])
        if tuple(k.shape) != want or tuple(v.shape) != want:
            raise ValueError(
                f"layer {i}: keys {tuple(k.shape)} / values {tuple(v.shape)} do not match the "
                f"model's cache shape [batch, kv_heads, seq, head_dim] = {want}"
            )


def extract_kv(model: PreTrainedModel, cache: DynamicCache, mask: Tensor) -> KV:
    """DynamicCache -> list of pre-RoPE (keys, values)."""
    kv = [(layer.keys, layer.values) for layer in cache.layers]
    if uses_rope(model):
        positions = positions_from_mask(mask)
        kv = [(strip_rope(model, k, positions), v) for k, v in kv]
    return kv


def inject_kv(model: PreTrainedModel, kv: KV, mask: Tensor) -> DynamicCache:
    """List of pre-RoPE (keys, values) -> fresh DynamicCache (a cache is mutated by the next forward)."""
    check_kv(model, kv, mask)
    # a translator computes in its own dtype (float32) beside a bfloat16 / float16 model: the cache takes the
    # model's (no copy when they agree)
    kv = [(k.to(model.dtype), v.to(model.dtype)) for k, v in kv]
    if uses_rope(model):
        positions = positions_from_mask(mask)
        kv = [(apply_rope(model, k, positions), v) for k, v in kv]
    return DynamicCache(ddp_cache_data=[(k, v) for k, v in kv])


def prefill_kv(model: PreTrainedModel, ids: Tensor, mask: Tensor) -> KV:
    """Run the model on a (left-padded) context and return its pre-RoPE KV."""
    out = forward(model, ids, mask)
    return extract_kv(model, out.cache, mask)


def prefix_kv(kv: KV, mask: Tensor, lengths: list[int]) -> tuple[KV, Tensor]:
    """Keep the first lengths[b] real tokens of each left-padded example, re-left-padded (differentiable)."""
    B, T = mask.shape
    P = max(1, max(lengths))
    real = mask.sum(1)
    q = torch.arange(P, device=mask.device)[None, :]
    lengths_t = torch.tensor(lengths, device=mask.device)[:, None]
    src = (T - real)[:, None] + lengths_t - P + q
    valid = q >= P - lengths_t
    src = src.clamp(0, T - 1)
    out = []
    for k, v in kv:
        idx = src[:, None, :, None].expand(-1, k.shape[1], -1, k.shape[-1])
        out.append((k.gather(2, idx) * valid[:, None, :, None], v.gather(2, idx) * valid[:, None, :, None]))
    return out, valid.long()


def repeat_kv_batch(kv: KV, mask: Tensor, n: int) -> tuple[KV, Tensor]:
    """Repeat each example n times (closed-set scoring runs one row per candidate)."""
    return [(k.repeat_interleave(n, 0), v.repeat_interleave(n, 0)) for k, v in kv], mask.repeat_interleave(n, 0)
