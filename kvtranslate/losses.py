"""Training objectives: KV reconstruction and the Context Correction Loss (CCL).

CCL: the target runs over the tokens after the injection point twice, once on the translated cache and once on
its native cache; the two trajectories are aligned on hidden states (MSE, scaled by the native hidden-state
variance) and next-token distributions (KL(native || translated)). Errors that a KV-only loss treats as small
but that the target's attention amplifies downstream are exactly what this term sees.
"""

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import PreTrainedModel

from .cache import KV, inject_kv
from .models import forward
from .scoring import pad_right


def kv_reconstruction_loss(
    pred_kv: KV, native_kv: KV, mask: Tensor, std: Tensor | None = None, key_weight: float = 1.0
) -> Tensor:
    """Mean squared error over real tokens, per channel standardised by `std` ([L, 1, 2*H*D]) when given; the key
    channels' squared errors count `key_weight` times (keys decide which fact the target's attention finds)."""
    total, weight = 0.0, mask.float()
    for j, ((pk, pv), (nk, nv)) in enumerate(zip(pred_kv, native_kv)):
        diff = (torch.cat([pk, pv], 1) - torch.cat([nk, nv], 1)).transpose(1, 2).flatten(2)  # [B, T, O]
        if std is not None:
            diff = diff / std[j]
        squared = diff**2
        if key_weight != 1.0:  # keys are the first H*D channels
            n_key = pk.shape[1] * pk.shape[3]
            squared = torch.cat([key_weight * squared[..., :n_key], squared[..., n_key:]], -1)
        total = total + (squared.mean(-1) * weight).sum() / weight.sum().clamp(min=1)
    return total / len(pred_kv)


def context_correction_loss(
    target: PreTrainedModel,
    translated_kv: KV,
    native_kv: KV,
    cache_mask: Tensor,
    tails: list[list[int]],
    pad_id: int,
    w_hidden: float = 1.0,
    w_kl: float = 1.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Align the target's trajectory over `tails` (token lists after the injection point) on the translated vs
    native cache. Returns (loss, {"hidden": ..., "kl": ...}); exactly zero when the two caches are equal."""
    ids, mask = pad_right(tails, pad_id, cache_mask.device)
    with torch.no_grad():
        native = forward(target, ids, mask, inject_kv(target, native_kv, cache_mask), cache_mask, hidden_states=True)
    trans = forward(target, ids, mask, inject_kv(target, translated_kv, cache_mask), cache_mask, hidden_states=True)
    weight = mask.float()
    denom = weight.sum().clamp(min=1)
    hidden = 0.0
    for hn, ht in zip(native.hidden_states[1:], trans.hidden_states[1:]):
        scale = hn.detach().var(dim=(0, 1), keepdim=True).mean().clamp(min=1e-6)
        hidden = hidden + (((ht - hn) ** 2).mean(-1) * weight).sum() / denom / scale
    hidden = hidden / (len(native.hidden_states) - 1)
    log_p_native = F.log_softmax(native.logits.float(), -1)
    log_p_trans = F.log_softmax(trans.logits.float(), -1)
    kl = ((log_p_native.exp() * (log_p_native - log_p_trans)).sum(-1) * weight).sum() / denom
    return w_hidden * hidden + w_kl * kl, {"hidden": hidden, "kl": kl}
