"""FedTopo's pieces against hand computations: prototypes, relation topology, masking, the reliability merge, the
topology-guided loss; the baselines' server-side merges; every backbone's common feature dimension."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from clients.fedtopo import class_prototypes, negative_weights, relation_topology, topology_loss
from fl_app.models.hetero import CPU_FAMILY, PAPER_FAMILY, architecture_of, build_model, family_names
from strategies.fedtopo import merge_topologies, uniform_topology
from strategies.fedtopo_baselines import (PrototypeGenerator, adaptive_margin, margin_contrastive_loss,
                                          train_generator, weighted_class_means)


# -- prototypes and topology ---------------------------------------------------------------------------------------
def test_prototypes_are_means_of_normalised_features():
    feats = torch.tensor([[3.0, 0.0], [0.0, 2.0], [0.0, 5.0], [1.0, 1.0]])
    labels = torch.tensor([0, 0, 2, 2])
    protos, counts = class_prototypes(feats, labels, 3)
    assert counts.tolist() == [2, 0, 2]
    s = 1 / math.sqrt(2)
    np.testing.assert_allclose(protos.numpy(), [[0.5, 0.5], [0, 0], [s / 2, (1 + s) / 2]], atol=1e-6)


def test_topology_of_hand_built_prototypes():
    s = 1 / math.sqrt(2)
    protos = torch.tensor([[1.0, 0.0], [0.0, 1.0], [s, s]])
    r, mask = relation_topology(protos, torch.tensor([5.0, 5.0, 5.0]), tau=0.5)
    assert mask.tolist() == [True, True, True]
    # cos(0,1) = 0, cos(0,2) = cos(1,2) = 1/sqrt(2); row j = softmax over k != j of cos/τ
    a, b = math.exp(0 / 0.5), math.exp(s / 0.5)
    expected = [[0, a / (a + b), b / (a + b)],
                [a / (a + b), 0, b / (a + b)],
                [0.5, 0.5, 0]]
    np.testing.assert_allclose(r.numpy(), expected, atol=1e-6)
    # the class in the middle relates equally to both; classes 0 and 1 find 2 more similar than each other
    assert r[0, 2] > r[0, 1]


def test_absent_classes_are_masked():
    torch.manual_seed(0)
    protos = torch.randn(4, 8)
    r, mask = relation_topology(protos, torch.tensor([3.0, 0.0, 2.0, 7.0]), tau=0.1)
    assert mask.tolist() == [True, False, True, True]
    assert torch.all(r[1] == 0) and torch.all(r[:, 1] == 0)
    assert torch.all(r.diagonal() == 0)
    np.testing.assert_allclose(r[[0, 2, 3]].sum(1).numpy(), 1.0, atol=1e-6)
    # the absent class's (random) prototype has no influence on the others
    protos2 = protos.clone()
    protos2[1] = torch.randn(8) * 100
    assert torch.allclose(relation_topology(protos2, torch.tensor([3.0, 0.0, 2.0, 7.0]), 0.1)[0], r)
    # a client holding a single class has no relations at all
    single, _ = relation_topology(protos, torch.tensor([0.0, 4.0, 0.0, 0.0]), 0.1)
    assert torch.all(single == 0)


# -- reliability-aware merge ---------------------------------------------------------------------------------------
def _two_clients():
    # client A holds classes 0, 1, 2 with many samples; client B holds 0 and 1 with few
    ra = np.array([[0, 0.8, 0.2], [0.6, 0, 0.4], [0.3, 0.7, 0]])
    rb = np.array([[0, 1.0, 0], [1.0, 0, 0], [0, 0, 0]])
    counts = np.array([[100, 25, 4], [1, 4, 0]], dtype=float)
    masks = (counts > 0).astype(float)
    return np.stack([ra, rb]), masks, counts


def test_support_merge_matches_hand_computation():
    topo, masks, counts = _two_clients()
    kappa = 10.0
    merged, support = merge_topologies(topo, masks, counts, "support", kappa)
    u = 0.5  # uniform row value for C = 3
    # entry (0, 1): A weighs sqrt(100·25) = 50, B weighs sqrt(1·4) = 2
    w = np.array([[0, 50 + 2, 20], [50 + 2, 0, 10], [20, 10, 0]], dtype=float)
    np.testing.assert_allclose(support, w)
    raw = np.array([[0, (50 * 0.8 + 2 * 1.0) / 52, 0.2], [(50 * 0.6 + 2 * 1.0) / 52, 0, 0.4], [0.3, 0.7, 0]])
    shrunk = w / (w + kappa) * raw + kappa / (w + kappa) * u
    np.fill_diagonal(shrunk, 0)
    expected = shrunk / shrunk.sum(1, keepdims=True)
    np.testing.assert_allclose(merged, expected, rtol=1e-9)


def test_poorly_supported_entry_moves_toward_uniform():
    topo, masks, counts = _two_clients()
    plain, _ = merge_topologies(topo, masks, counts, "support", kappa=0.0)
    shrunk, support = merge_topologies(topo, masks, counts, "support", kappa=10.0)
    # row 2's entries have support 20 and 10 (vs. 52 for (0, 1)): both move toward 0.5, the weaker one more
    assert abs(shrunk[2, 1] - 0.5) < abs(plain[2, 1] - 0.5)
    assert support[1, 2] < support[0, 1]
    # in row 1 the weak entry (1, 2) is pulled up toward uniform relative to the strong (1, 0)
    assert shrunk[1, 2] / shrunk[1, 0] > plain[1, 2] / plain[1, 0]
    # a pair nobody holds is uniform, and a huge κ makes everything uniform
    none_hold = np.zeros_like(topo[:1])
    np.testing.assert_allclose(merge_topologies(none_hold, np.zeros((1, 3)), np.zeros((1, 3)))[0], uniform_topology(3))
    np.testing.assert_allclose(merge_topologies(topo, masks, counts, "support", 1e12)[0], uniform_topology(3),
                               atol=1e-9)


def test_mean_weighting_is_the_plain_mean_over_holders():
    topo, masks, counts = _two_clients()
    merged, _ = merge_topologies(topo, masks, counts, "mean", kappa=10.0)  # κ is not used by the ablation
    raw = np.array([[0, 0.9, 0.2], [0.8, 0, 0.4], [0.3, 0.7, 0]])
    np.testing.assert_allclose(merged, raw / raw.sum(1, keepdims=True))
    with pytest.raises(ValueError, match="topo-weighting='median': allowed values are"):
        merge_topologies(topo, masks, counts, "median")


# -- loss ----------------------------------------------------------------------------------------------------------
def test_loss_is_plain_cross_entropy_when_beta_is_zero():
    torch.manual_seed(0)
    logits, labels = torch.randn(16, 10), torch.randint(0, 10, (16,))
    rbar = torch.softmax(torch.randn(10, 10), 1).fill_diagonal_(0)
    assert torch.allclose(topology_loss(logits, labels, rbar, 0.0), F.cross_entropy(logits, labels))
    assert not torch.allclose(topology_loss(logits, labels, rbar, 1.0), F.cross_entropy(logits, labels))


def test_loss_matches_the_formula_and_pushes_similar_classes_harder():
    torch.manual_seed(1)
    c, beta = 4, 0.7
    logits, labels = torch.randn(5, c, requires_grad=True), torch.tensor([0, 1, 2, 3, 0])
    rbar = torch.tensor(uniform_topology(c), dtype=torch.float32)
    rbar[0] = torch.tensor([0.0, 0.8, 0.1, 0.1])
    loss = topology_loss(logits, labels, rbar, beta)
    expected = 0.0
    for z, y in zip(logits, labels):
        neg = sum((1 + beta * (c - 1) * rbar[y, k]) * torch.exp(z[k]) for k in range(c) if k != y)
        expected = expected - torch.log(torch.exp(z[y]) / (torch.exp(z[y]) + neg))
    assert torch.allclose(loss, expected / len(labels), atol=1e-6)
    w = negative_weights(rbar, beta)
    assert torch.all(w.diagonal() == 1) and w[0, 1] > w[0, 2]
    # the gradient pushes the logit of the class most similar to y = 0 down harder than the others
    logits.grad = None
    topology_loss(logits[:1], labels[:1], rbar, beta).backward()
    g_topo = logits.grad[0].clone()
    logits.grad = None
    F.cross_entropy(logits[:1], labels[:1]).backward()
    g_ce = logits.grad[0]
    assert (g_topo[1] / g_ce[1]) > (g_topo[2] / g_ce[2])


# -- baselines' server-side merges ---------------------------------------------------------------------------------
def test_class_means_are_count_weighted_over_holders():
    means = np.array([[[1.0], [5.0], [0.0]], [[3.0], [0.0], [0.0]]])
    counts = np.array([[1, 2, 0], [3, 0, 0]], dtype=float)
    merged, held = weighted_class_means(means, counts)
    np.testing.assert_allclose(merged[:, 0], [2.5, 5.0, 0.0])
    assert held.tolist() == [True, True, False]


def test_fedtgp_margin_and_generator_training():
    centers = torch.tensor([[0.0, 0.0], [3.0, 4.0], [100.0, 100.0]])
    assert adaptive_margin(centers, torch.tensor([True, True, False]), cap=100.0) == pytest.approx(5.0)
    assert adaptive_margin(centers, torch.tensor([True, True, True]), cap=100.0) == 100.0  # capped at τ
    torch.manual_seed(0)
    client = torch.tensor([[2.0, 0.0], [2.2, 0.1], [0.0, 2.0], [-2.0, 0.0]])
    labels = torch.tensor([0, 0, 1, 2])
    gen = PrototypeGenerator(3, 2)
    before = margin_contrastive_loss(gen(), client, labels, 1.0).item()
    after = train_generator(gen, client, labels, margin=1.0, epochs=100)
    assert after < before
    with torch.no_grad():
        dist = torch.cdist(client, gen())
    assert dist.argmin(1).tolist() == labels.tolist()  # each client prototype is nearest its class's prototype


# -- backbones -----------------------------------------------------------------------------------------------------
def test_family_assignment_wraps_every_eight_clients():
    assert len(family_names("cpu")) == len(family_names("paper")) == 8
    assert architecture_of("paper", 0) == "cnn4" and architecture_of("paper", 9) == "googlenet"
    assert architecture_of("cpu", 3) == architecture_of("cpu", 11)
    with pytest.raises(ValueError, match="model-family='gpu': allowed values are"):
        family_names("gpu")


@pytest.mark.parametrize("name", list(CPU_FAMILY))
def test_cpu_backbones_produce_the_common_feature_dim(name):
    torch.manual_seed(0)
    model = build_model("cpu", name, num_classes=10, feature_dim=24)
    logits, feats = model(torch.randn(3, 3, 32, 32), with_features=True)
    assert feats.shape == (3, 24) and logits.shape == (3, 10)
    assert model.head.weight.shape == (10, 24)  # the shared-size head
    assert torch.isfinite(logits).all()


def test_cpu_family_architectures_differ():
    shapes = {name: tuple((k, tuple(v.shape)) for k, v in build_model("cpu", name, 10, 16).extractor.state_dict().items())
              for name in CPU_FAMILY}
    assert len(set(shapes.values())) == len(CPU_FAMILY)


@pytest.mark.parametrize("name", list(PAPER_FAMILY))
def test_paper_backbones_produce_the_common_feature_dim(name):
    # shapes only, on the meta device: the large ResNets are too slow to run for real in a unit test
    with torch.device("meta"):
        model = build_model("paper", name, num_classes=100, feature_dim=512).eval()
        logits, feats = model(torch.empty(2, 3, 32, 32), with_features=True)
    assert feats.shape == (2, 512) and logits.shape == (2, 100)
    assert model.head.weight.shape == (100, 512)


@pytest.mark.parametrize("name", ["cnn4", "resnet18"])
def test_small_paper_backbones_run_for_real(name):
    torch.manual_seed(0)
    model = build_model("paper", name, num_classes=10, feature_dim=32).eval()
    with torch.no_grad():
        logits, feats = model(torch.randn(2, 3, 32, 32), with_features=True)
    assert feats.shape == (2, 32) and torch.isfinite(logits).all()
