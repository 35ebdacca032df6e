"""FedTopo's pieces against hand computations: prototypes, relation topology, masking, the reliability merge, the
topology-guided loss; the baselines' server-side merges; every backbone's common feature dimension."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from clients.fedtopo import capped_rows, class_prototypes, negative_weights, relation_scores, topology_loss
from clients.fedtopo_baselines import FdLoss
from fl_app.models.multiarch import CPU_FAMILY, PAPER_FAMILY, architecture_of, build_model, family_names
from strategies.fedtopo import merge_relations, uniform_topology
from strategies.fedtopo_baselines import (
    FdStrategy,
    FedProtoStrategy,
    FedTgpStrategy,
    PrototypeGenerator,
    adaptive_margin,
    margin_contrastive_loss,
    train_generator,
    weighted_class_means,
)


# -- prototypes and topology ---------------------------------------------------------------------------------------
def test_prototypes_are_means_of_normalised_features():
    feats = torch.tensor([[3.0, 0.0], [0.0, 2.0], [0.0, 5.0], [1.0, 1.0]])
    labels = torch.tensor([0, 0, 2, 2])
    protos, counts = class_prototypes(feats, labels, 3)
    assert counts.tolist() == [2, 0, 2]
    s = 1 / math.sqrt(2)
    np.testing.assert_allclose(protos.numpy(), [[0.5, 0.5], [0, 0], [s / 2, (1 + s) / 2]], atol=1e-6)


def test_relation_scores_of_hand_built_prototypes():
    s = 1 / math.sqrt(2)
    protos = torch.tensor([[1.0, 0.0], [0.0, 1.0], [s, s]])
    scores = relation_scores(protos, torch.tensor([5.0, 5.0, 5.0]))
    # cos(0,1) = 0, cos(0,2) = cos(1,2) = 1/sqrt(2); the diagonal is not a relation
    np.testing.assert_allclose(scores.numpy(), [[0, 0, s], [0, 0, s], [s, s, 0]], atol=1e-6)
    # a pair's score does not depend on which other classes the client holds (unlike a row-wise softmax)
    pair_only = relation_scores(protos, torch.tensor([5.0, 5.0, 0.0]))
    assert pair_only[0, 1] == scores[0, 1] and torch.all(pair_only[2] == 0)


def test_absent_classes_are_masked():
    torch.manual_seed(0)
    protos = torch.randn(4, 8)
    counts = torch.tensor([3.0, 0.0, 2.0, 7.0])
    scores = relation_scores(protos, counts)
    assert torch.all(scores[1] == 0) and torch.all(scores[:, 1] == 0) and torch.all(scores.diagonal() == 0)
    assert torch.allclose(scores, scores.T) and scores.abs().max() <= 1
    # the absent class's (random) prototype has no influence on the others
    protos2 = protos.clone()
    protos2[1] = torch.randn(8) * 100
    assert torch.equal(relation_scores(protos2, counts), scores)
    # a client holding a single class has no relations at all
    assert torch.all(relation_scores(protos, torch.tensor([0.0, 4.0, 0.0, 0.0])) == 0)


def test_capped_sample_keeps_every_class_and_counts_stay_true():
    labels = np.array([0] * 500 + [1] * 3 + [2] * 1)
    rows = capped_rows(labels, 50, seed=0)
    assert len(rows) <= 52 and set(labels[rows]) == {0, 1, 2}  # the rare classes are kept
    np.testing.assert_array_equal(rows, capped_rows(labels, 50, seed=0))  # seeded
    assert np.bincount(labels[rows]).tolist() == [49, 1, 1]  # proportional quotas, at least one each
    np.testing.assert_array_equal(capped_rows(labels, 0, seed=0), np.arange(len(labels)))


# -- the merge: relation scores averaged with their support, normalised over all classes afterwards ---------------
def _two_clients():
    # client A holds classes 0, 1, 2 with many samples; client B holds 0 and 1 with few
    sa = np.array([[0, 0.5, -0.2], [0.5, 0, 0.1], [-0.2, 0.1, 0]])
    sb = np.array([[0, -0.6, 0], [-0.6, 0, 0], [0, 0, 0]])
    counts = np.array([[100, 25, 4], [1, 4, 0]], dtype=float)
    return np.stack([sa, sb]), counts


def _row_softmax(scores, tau):
    e = np.exp(scores / tau)
    np.fill_diagonal(e, 0)
    return e / e.sum(1, keepdims=True)


def test_support_merge_matches_hand_computation():
    relations, counts = _two_clients()
    kappa, tau = 10.0, 0.5
    merged, scores, support = merge_relations(relations, counts, tau, "support", kappa)
    # pair (0, 1): A weighs sqrt(100·25) = 50, B weighs sqrt(1·4) = 2; (0, 2): sqrt(100·4) = 20; (1, 2): 10
    w = np.array([[0, 52, 20], [52, 0, 10], [20, 10, 0]], dtype=float)
    np.testing.assert_allclose(support, w)
    mean = np.array([[0, (50 * 0.5 - 2 * 0.6) / 52, -0.2], [(50 * 0.5 - 2 * 0.6) / 52, 0, 0.1], [-0.2, 0.1, 0]])
    typical = (50 * 0.5 - 2 * 0.6 - 20 * 0.2 + 10 * 0.1) / (52 + 20 + 10)  # support-weighted mean of all reports
    shrunk = w / (w + kappa) * mean + kappa / (w + kappa) * typical
    np.fill_diagonal(shrunk, 0)
    np.testing.assert_allclose(scores, shrunk, rtol=1e-12)
    np.testing.assert_allclose(merged, _row_softmax(shrunk, tau), rtol=1e-12)
    np.testing.assert_allclose(merged.sum(1), 1.0) and np.testing.assert_array_equal(merged.diagonal(), 0)


def test_opposite_prototypes_on_a_two_class_client_are_not_made_similar():
    """The co-occurrence counter-example: a client holding only {0, 1} whose prototypes point in opposite
    directions. A per-client row softmax gave class 1 all of class 0's mass on that client (and then the largest
    share of the merged row); the merged scores must keep class 1 the *least* similar class to 0."""
    e = torch.eye(3)
    a = relation_scores(torch.stack([e[0], -e[0], e[1], e[2]]), torch.tensor([100.0, 100.0, 0.0, 0.0]))
    b = relation_scores(torch.stack([e[0], e[1], 0.2 * e[0] + e[1], e[2]]), torch.tensor([100.0, 0.0, 100.0, 100.0]))
    assert a[0, 1] == -1
    merged, _, _ = merge_relations(
        np.stack([a.numpy(), b.numpy()]), np.array([[100, 100, 0, 0], [100, 0, 100, 100]]), tau=0.1, kappa=20.0
    )
    row = merged[0]
    assert row[1] == min(row[1:]) and row[1] < row[3] < row[2]
    np.testing.assert_allclose(merged.sum(1), 1.0)


def test_merged_topology_does_not_depend_on_how_pairs_are_spread_over_clients():
    rng = np.random.default_rng(3)
    c = 5
    g = rng.uniform(-1, 1, (c, c))
    g = (g + g.T) / 2
    np.fill_diagonal(g, 0)

    def client(classes):
        held = np.zeros(c, bool)
        held[list(classes)] = True
        return np.where(held[:, None] & held[None, :], g, 0.0), held * 10.0

    def merge(subsets):
        rel, cnt = zip(*(client(s) for s in subsets))
        return merge_relations(np.stack(rel), np.stack(cnt), tau=0.2, kappa=5.0)[0]

    one_client = merge([range(c)])
    pairs = merge([(j, k) for j in range(c) for k in range(j + 1, c)])
    mixed = merge([(0, 1, 2), (2, 3, 4), (0, 3), (0, 4), (1, 3), (1, 4)])  # every pair reported once, support 10
    np.testing.assert_allclose(pairs, one_client, rtol=1e-12)
    np.testing.assert_allclose(mixed, one_client, rtol=1e-12)


def test_weakly_supported_pairs_are_pulled_toward_the_typical_score():
    def merged_with(n):  # pair (0, 1) is very similar (0.9) but reported by a client with n samples per class
        relations = np.zeros((3, 3, 3))  # clients holding {0, 1}, {0, 2}, {1, 2}; the other pairs score 0
        relations[0, 0, 1] = relations[0, 1, 0] = 0.9
        counts = np.array([[n, n, 0], [100, 0, 100], [0, 100, 100]], dtype=float)
        return merge_relations(relations, counts, tau=0.5, kappa=20.0)

    weak, weak_scores, _ = merged_with(1)
    strong, strong_scores, _ = merged_with(100)
    # the typical score is the support-weighted mean of the three reports: 0.9·n / (n + 100 + 100)
    assert weak_scores[0, 1] == pytest.approx(1 / 21 * 0.9 + 20 / 21 * 0.9 / 201)
    assert strong_scores[0, 1] == pytest.approx(100 / 120 * 0.9 + 20 / 120 * 0.3)
    assert weak_scores[0, 2] == pytest.approx(20 / 120 * 0.9 / 201)
    assert weak[0, 1] < strong[0, 1]
    assert weak[0, 1] > 0.5  # still a little above the other entry of row 0, which has no evidence of similarity
    # a huge κ makes every pair typical: the uniform topology; nobody reporting anything gives it too
    relations, counts = _two_clients()
    np.testing.assert_allclose(
        merge_relations(relations, counts, 0.5, "support", 1e12)[0], uniform_topology(3), atol=1e-9
    )
    np.testing.assert_allclose(merge_relations(np.zeros((1, 3, 3)), np.zeros((1, 3)), 0.5)[0], uniform_topology(3))


def test_mean_weighting_is_the_plain_mean_over_holders():
    relations, counts = _two_clients()
    merged, scores, _ = merge_relations(relations, counts, 0.5, "mean", kappa=10.0)  # κ is not used by the ablation
    expected = np.array([[0, (0.5 - 0.6) / 2, -0.2], [(0.5 - 0.6) / 2, 0, 0.1], [-0.2, 0.1, 0]])
    np.testing.assert_allclose(scores, expected, atol=1e-12)
    np.testing.assert_allclose(merged, _row_softmax(expected, 0.5))
    with pytest.raises(ValueError, match="topo-weighting='median': allowed values are"):
        merge_relations(relations, counts, 0.5, "median")


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


def test_fd_strategy_takes_the_plain_mean_over_holders_and_fedproto_the_count_weighted_one(flower_ids):
    nodes = {0: 100, 1: 101}
    means = [np.array([[1.0, 0.0], [7.0, 0.0]]), np.array([[3.0, 0.0], [0.0, 0.0]])]
    counts = [np.array([1.0, 2.0]), np.array([3.0, 0.0])]
    uploads = [(pid, {"means": m, "counts": c}, 1) for pid, m, c in zip(nodes, means, counts)]
    fd = FdStrategy(nodes, 2, clients_per_round=2, seed=0, num_rounds=1)
    fd.aggregate_uploads(1, uploads)
    proto = FedProtoStrategy(nodes, 2, clients_per_round=2, seed=0, num_rounds=1)
    proto.aggregate_uploads(1, uploads)
    np.testing.assert_allclose(fd.global_arrays["soft-labels"][:, 0], [(1 + 3) / 2, 7])
    np.testing.assert_allclose(proto.global_arrays["prototypes"][:, 0], [(1 * 1 + 3 * 3) / 4, 7])


def test_fd_loss_and_upload_match_the_formula():
    torch.manual_seed(0)
    soft = torch.tensor([[2.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    fd = FdLoss({"soft-labels": soft.numpy(), "has": np.array([1.0, 1.0, 0.0])}, lam=0.5, num_classes=3)
    logits, labels = torch.randn(4, 3), torch.tensor([0, 1, 2, 0])
    loss = fd(logits, None, labels)
    teacher = torch.softmax(soft, 1)
    distill = [-(teacher[y] * torch.log_softmax(z, 0)).sum() if y < 2 else 0.0 for z, y in zip(logits, labels)]
    # the distillation term is averaged over the whole batch; class 2 has no global logit and adds nothing
    assert loss.item() == pytest.approx((F.cross_entropy(logits, labels) + 0.5 * sum(distill) / 4).item(), rel=1e-6)
    fd(logits[:1] + 1.0, None, labels[:1])  # a second batch: class 0 seen three times in all
    upload = fd.upload(torch.tensor([10.0, 4.0, 2.0]))
    np.testing.assert_allclose(upload["means"][0], ((logits[0] + logits[3] + logits[0] + 1) / 3).numpy(), rtol=1e-6)
    np.testing.assert_allclose(upload["means"][1], logits[1].numpy(), rtol=1e-6)
    assert upload["counts"].tolist() == [10, 4, 2]  # the true counts of the classes seen in training
    unseen = FdLoss({}, lam=0.5, num_classes=3)
    unseen(logits[:2], None, labels[:2])
    assert unseen.upload(torch.tensor([10.0, 4.0, 2.0]))["counts"].tolist() == [10, 4, 0]
    assert unseen(logits, None, labels).item() == pytest.approx(F.cross_entropy(logits, labels).item())


def test_fedtgp_margins_by_hand():
    # d(0,1) = 5, d(0,2) = 10, d(1,2) = sqrt(45) = 6.708
    centers = torch.tensor([[0.0, 0.0], [3.0, 4.0], [0.0, 10.0], [100.0, 100.0]])
    held = torch.tensor([True, True, True, False])
    # authors' code: nearest other centre per class (5, 5, 6.708), then the largest of those
    assert adaptive_margin(centers, held, cap=100.0) == pytest.approx(math.sqrt(45), rel=1e-6)
    assert adaptive_margin(centers, held, cap=100.0, rule="max-pair") == pytest.approx(10.0)  # paper's formula
    assert adaptive_margin(centers, held, cap=6.0) == 6.0 and adaptive_margin(centers, held, 6.0, "max-pair") == 6.0
    assert adaptive_margin(centers, torch.tensor([True, False, False, False]), cap=100.0) == 0.0
    with pytest.raises(ValueError, match="tgp-margin='mean': allowed values are"):
        adaptive_margin(centers, held, 100.0, "mean")


def test_fedtgp_generator_is_trained_by_sgd_on_mini_batches(monkeypatch):
    client = torch.tensor([[2.0, 0.0], [2.2, 0.1], [0.0, 2.0], [-2.0, 0.0]] * 6)  # 24 client prototypes
    labels = torch.tensor([0, 0, 1, 2] * 6)
    # one full-batch epoch is one SGD step: θ ← θ − lr·∇L(θ)
    torch.manual_seed(0)
    gen = PrototypeGenerator(3, 2)
    loss = margin_contrastive_loss(gen(), client, labels, 1.0)
    grads = torch.autograd.grad(loss, list(gen.parameters()))
    expected = [p.detach() - 0.1 * g for p, g in zip(gen.parameters(), grads)]
    train_generator(gen, client, labels, margin=1.0, epochs=1, lr=0.1, batch_size=len(labels))
    for p, e in zip(gen.parameters(), expected):
        torch.testing.assert_close(p.detach(), e)
    # batches of 10 over 24 prototypes: 3 steps per epoch
    steps = []
    original = torch.optim.SGD.step
    monkeypatch.setattr(torch.optim.SGD, "step", lambda self, *a, **k: (steps.append(1), original(self, *a, **k))[1])
    before = margin_contrastive_loss(gen(), client, labels, 1.0).item()
    train_generator(gen, client, labels, margin=1.0, epochs=50, lr=0.1, batch_size=10, seed=1)
    assert len(steps) == 150
    assert margin_contrastive_loss(gen(), client, labels, 1.0).item() < before
    with torch.no_grad():
        assert torch.cdist(client, gen()).argmin(1).tolist() == labels.tolist()


def test_fedtgp_broadcast_does_not_depend_on_the_servers_thread_count():
    # sizes at which two threads and one add in another order: the server's core count changed the prototypes
    rng = np.random.default_rng(0)
    uploads = [
        (p, {"means": rng.normal(size=(10, 64)).astype(np.float32), "counts": rng.integers(0, 3, 10) * 10}, None)
        for p in range(20)
    ]
    broadcast = []
    before = torch.get_num_threads()
    for threads in (1, 2):
        torch.set_num_threads(threads)
        strategy = FedTgpStrategy({p: p for p in range(20)}, 10, clients_per_round=20, seed=0, num_rounds=2)
        strategy.server_epochs = 20
        strategy.aggregate_uploads(1, uploads)
        assert torch.get_num_threads() == threads  # the server's setting is restored
        broadcast.append(strategy.global_arrays["prototypes"])
    torch.set_num_threads(before)
    assert np.array_equal(broadcast[0], broadcast[1])


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
    shapes = {
        name: tuple((k, tuple(v.shape)) for k, v in build_model("cpu", name, 10, 16).extractor.state_dict().items())
        for name in CPU_FAMILY
    }
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
