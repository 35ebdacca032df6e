"""Routing diagnostics on hand-made gate matrices [L, N, M] and the uniform-gate ablation."""

import math

import pytest
import torch

from kvtranslate.routing import gate_diagnostics, merge_diagnostics, sharp_balance, switch_balance
from kvtranslate.translators import KVTranslator

M = 4
UNIFORM = torch.full((1, 8, M), 1 / M)  # the router decides nothing
SPECIALISED = torch.eye(M).repeat(2, 1)[None]  # each token on one expert, every expert used by 2 of 8 tokens
COLLAPSED = torch.zeros(1, 8, M).index_fill_(2, torch.tensor([0]), 1.0)  # every token on expert 0


def test_entropy_top_gate_and_usage_of_hand_made_gates():
    uniform, specialised = gate_diagnostics(UNIFORM), gate_diagnostics(SPECIALISED)
    assert uniform["gate_entropy"] == pytest.approx(1.0) and specialised["gate_entropy"] == pytest.approx(0.0)
    assert uniform["gate_top"] == pytest.approx(0.25) and specialised["gate_top"] == pytest.approx(1.0)
    assert specialised["expert_usage"] == pytest.approx([0.25] * M)
    assert gate_diagnostics(COLLAPSED)["expert_usage"] == pytest.approx([1.0, 0, 0, 0])
    mixed = torch.tensor([[[0.5, 0.5, 0.0, 0.0], [0.7, 0.1, 0.1, 0.1]]])
    expected = (math.log(2) - (0.7 * math.log(0.7) + 3 * 0.1 * math.log(0.1))) / 2 / math.log(M)
    assert gate_diagnostics(mixed)["gate_entropy"] == pytest.approx(expected)
    assert gate_diagnostics(mixed)["gate_top"] == pytest.approx(0.6)


def test_padding_tokens_are_not_counted():
    gates = torch.cat([SPECIALISED[:, :4], COLLAPSED[:, :4]], 1)
    mask = torch.tensor([[1, 1, 1, 1, 0, 0, 0, 0]])
    assert gate_diagnostics(gates, mask)["expert_usage"] == pytest.approx([0.25] * M)


def test_hard_balance_tells_collapse_from_specialisation():
    assert gate_diagnostics(SPECIALISED)["hard_balance"] == pytest.approx(1.0)
    assert gate_diagnostics(COLLAPSED)["hard_balance"] == pytest.approx(M)


def test_sharp_balance_tells_uniform_soft_gates_from_specialised_routing():
    # the Switch term cannot: it is 1 for both
    assert switch_balance(UNIFORM).item() == pytest.approx(1.0) == switch_balance(SPECIALISED).item()
    assert sharp_balance(SPECIALISED).item() == pytest.approx(1.0)
    assert sharp_balance(UNIFORM).item() == pytest.approx(2.0)
    assert sharp_balance(COLLAPSED).item() == pytest.approx(M)


def test_merge_weights_batches_by_tokens():
    merged = merge_diagnostics([(gate_diagnostics(UNIFORM), 3.0), (gate_diagnostics(SPECIALISED), 1.0)])
    assert merged["gate_entropy"] == pytest.approx(0.75)
    assert merged["expert_usage"][1] == pytest.approx(0.25 / 4)  # uniform's argmax is expert 0


def test_uniform_gate_ablation_weights_every_expert_equally():
    torch.manual_seed(0)
    tr = KVTranslator(dict(layers=2, kv_heads=2, head_dim=8), dict(layers=2, kv_heads=2, head_dim=8), 16, hidden=8)
    feats, emb = torch.randn(1, 5, 2, 32), torch.randn(1, 5, 16)
    kv, aux = tr(feats, emb)
    tr.uniform_gates = True
    kv_uniform, aux_uniform = tr(feats, emb)
    assert torch.equal(aux_uniform["gates"], torch.full_like(aux["gates"], 0.25))
    assert not torch.allclose(kv[0][0], kv_uniform[0][0])
    assert torch.equal(aux["router_probs"], aux_uniform["router_probs"])
