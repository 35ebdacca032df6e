"""Routing diagnostics and balance terms of the mixture kinds (mot, mot-latent).

Gates are [L, N, M]: per target layer, per token, a distribution over M experts. The Switch-Transformer term
(`switch_balance`) is M * sum_m (share of tokens whose argmax is m) * (mean gate of m): it is 1.0 for balanced,
specialised routing and also 1.0 for uniform soft gates, so it cannot tell a router that routes from one that does
not. `gate_diagnostics` reports what can: the gate entropy relative to its maximum log M (1 = uniform), the mean
top gate (1/M = uniform), per-expert usage on hard (argmax) assignments and `hard_balance` = M * sum_m usage_m^2
(1 = balanced, M = all tokens on one expert). `sharp_balance` = switch_balance + relative entropy is a trainable
term whose minimum 1 is reached only by balanced, specialised routing (uniform soft gates: 2).
"""

import math

import torch
import torch.nn.functional as F
from torch import Tensor

BALANCES = ("switch", "sharp")  # the balance term a mixture trains with (train.TRAIN_DEFAULTS "balance")


def token_weights(n: int, mask: Tensor | None, device: torch.device) -> Tensor:
    """[N] weights of the real tokens summing to 1 (every token when no mask)."""
    weight = torch.ones(n, device=device) if mask is None else mask.reshape(-1).float()
    return weight / weight.sum().clamp(min=1)


def hard_usage(gates: Tensor, mask: Tensor | None = None) -> Tensor:
    """[L, M]: per layer, the share of real tokens whose largest gate is expert m."""
    L, N, M = gates.shape
    top1 = F.one_hot(gates.argmax(-1), M).float()
    return torch.einsum("lnm,n->lm", top1, token_weights(N, mask, gates.device))


def relative_entropy(gates: Tensor, mask: Tensor | None = None) -> Tensor:
    """Mean over layers and real tokens of the gate entropy / log M (0 = one expert per token, 1 = uniform)."""
    L, N, M = gates.shape
    entropy = -(gates * gates.clamp(min=1e-12).log()).sum(-1)  # [L, N]
    return (entropy @ token_weights(N, mask, gates.device)).mean() / math.log(M)


def switch_balance(gates: Tensor, mask: Tensor | None = None) -> Tensor:
    """Switch-Transformer load balancing: M * sum_m (fraction routed to m) * (mean router prob of m)."""
    L, N, M = gates.shape
    mean_prob = torch.einsum("lnm,n->lm", gates, token_weights(N, mask, gates.device))
    return M * (hard_usage(gates, mask) * mean_prob).sum(-1).mean()


def sharp_balance(gates: Tensor, mask: Tensor | None = None) -> Tensor:
    """switch_balance + relative_entropy: 1 only for balanced specialised routing, 2 for uniform soft gates."""
    return switch_balance(gates, mask) + relative_entropy(gates, mask)


BALANCE_TERMS = {"switch": switch_balance, "sharp": sharp_balance}


@torch.no_grad()
def gate_diagnostics(gates: Tensor, mask: Tensor | None = None) -> dict[str, float | list[float]]:
    """Entropy relative to log M, mean top gate, hard per-expert usage (mean over layers) and hard_balance."""
    L, N, M = gates.shape
    usage = hard_usage(gates, mask)  # [L, M]
    top = gates.max(-1).values @ token_weights(N, mask, gates.device)  # [L]
    return dict(
        gate_entropy=relative_entropy(gates, mask).item(),
        gate_top=top.mean().item(),
        hard_balance=(M * (usage**2).sum(-1)).mean().item(),
        expert_usage=usage.mean(0).tolist(),
    )


def merge_diagnostics(parts: list[tuple[dict[str, float | list[float]], float]]) -> dict[str, float | list[float]]:
    """Token-weighted mean of gate_diagnostics over batches ((diagnostics, real tokens) pairs)."""
    total = sum(w for _, w in parts)
    out: dict[str, float | list[float]] = {}
    for key in parts[0][0]:
        if isinstance(parts[0][0][key], list):
            out[key] = [sum(d[key][m] * w for d, w in parts) / total for m in range(len(parts[0][0][key]))]
        else:
            out[key] = sum(d[key] * w for d, w in parts) / total
    return out
