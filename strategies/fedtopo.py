"""Server side of FedTopo: a reliability-aware merge of the relation topologies clients upload (the shared
model-heterogeneous base is ``strategies.multiarch_base``)."""

from __future__ import annotations

import numpy as np

from fl_app.run.config import check_choice
from fl_app.run.round_log import RoundLog
from strategies.multiarch_base import MultiArchStrategy


# -- FedTopo merge -------------------------------------------------------------------------------------------------
def uniform_topology(num_classes: int) -> np.ndarray:
    """U[j, k] = 1/(C−1) for k != j, 0 on the diagonal: 'no class is more similar to j than another'."""
    u = np.full((num_classes, num_classes), 1.0 / (num_classes - 1))
    np.fill_diagonal(u, 0.0)
    return u


def pair_weights(counts: np.ndarray, weighting: str = "support") -> tuple[np.ndarray, np.ndarray]:
    """(valid [M, C, C]: client m holds both classes of the pair, j != k; its weight w [M, C, C]): ``support`` weighs
    a client's pair sqrt(n_j·n_k), ``mean`` weighs it 1. Summed over clients, w is the pair's support W."""
    counts = np.asarray(counts, dtype=np.float64)
    held = counts > 0
    valid = held[:, :, None] & held[:, None, :] & ~np.eye(counts.shape[-1], dtype=bool)
    w = np.sqrt(counts[:, :, None] * counts[:, None, :]) * valid if weighting == "support" else valid * 1.0
    return valid, w


def reported_support(total: np.ndarray) -> np.ndarray:
    """The support W of every reported pair j < k (each pair once; a pair nobody reports has none)."""
    upper = np.triu(np.ones(total.shape, dtype=bool), k=1)
    return total[upper & (total > 0)]


def support_kappa(total: np.ndarray, kappa: float, quantile: float) -> float:
    """κ of the round: the fixed ``kappa`` (``topo-kappa``) when ``quantile`` is 0, else that quantile of the support
    W of the pairs reported this round (``topo-kappa-quantile``), so the shrinkage W/(W+κ) acts at whatever support
    the federation has: at the 0.5 quantile, the median pair is shrunk halfway. No reported pair: κ = 0."""
    if quantile <= 0:
        return float(kappa)
    support = reported_support(total)
    return float(np.quantile(support, quantile)) if support.size else 0.0


WEAK_SHRINK = 0.9  # a pair whose W/(W+κ) is below this is pulled measurably toward the typical score


def weak_pair_fraction(total: np.ndarray, kappa: float, weighting: str = "support") -> float:
    """Share of the reported pairs the reliability weighting acts on: W/(W+κ) < ``WEAK_SHRINK`` (0 without shrinkage,
    NaN when no pair is reported). Near 0, the weighting is inactive: every pair keeps its own score."""
    support = reported_support(total)
    if not support.size:
        return float("nan")
    if weighting != "support" or kappa <= 0:
        return 0.0
    return float(np.mean(support / (support + kappa) < WEAK_SHRINK))


def merge_relations(
    relations: np.ndarray, counts: np.ndarray, tau: float, weighting: str = "support", kappa: float = 0.0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Merge client relation scores [M, C, C] (cosines, see ``clients.fedtopo.relation_scores``) into the topology
    R̄ [C, C]; returns (R̄, merged scores S̃ [C, C], total support W [C, C]).

    A client holding classes j and k (true counts n_j, n_k > 0) reports S[j, k]; ``support`` weighs it
    w = sqrt(n_j·n_k), ``mean`` weighs it 1. S̄ = Σ w·S / Σ w over the reporting clients. With ``support`` each pair is
    then shrunk toward the typical score s₀ (the support-weighted mean of all reported pairs):
    S̃ = W/(W+κ)·S̄ + κ/(W+κ)·s₀, so a weakly supported pair neither stands out as similar nor as dissimilar; a pair
    nobody reports gets s₀. Only then is each row normalised over all classes: R̄[j, k] = softmax_{k≠j}(S̃[j, k]/τ).
    Because the softmax comes after the merge, which classes happen to share a client does not shape R̄.
    """
    check_choice("topo-weighting", weighting)
    relations = np.asarray(relations, dtype=np.float64)
    c = relations.shape[-1]
    off = ~np.eye(c, dtype=bool)
    valid, w = pair_weights(counts, weighting)
    total = w.sum(axis=0)
    summed = (w * np.where(valid, relations, 0.0)).sum(axis=0)
    mean = np.divide(summed, total, out=np.zeros((c, c)), where=total > 0)
    typical = float(summed.sum() / total.sum()) if total.sum() > 0 else 0.0
    shrink = total / (total + kappa) if weighting == "support" and kappa > 0 else (total > 0) * 1.0
    scores = shrink * mean + (1 - shrink) * typical
    logits = np.where(off, scores / tau, -np.inf)
    logits -= logits.max(axis=1, keepdims=True)
    merged = np.exp(logits)
    return merged / merged.sum(axis=1, keepdims=True), np.where(off, scores, 0.0), total


# -- screening of what clients upload --------------------------------------------------------------------------
RELATION_TOLERANCE = 1e-4  # float32 rounding of cosines and of S[j, k] vs S[k, j]


def relations_problem(relations: np.ndarray, counts: np.ndarray) -> str | None:
    """FedTopo's invariant: cosines in [-1, 1], symmetric, zero on the diagonal and wherever a class is absent."""
    held = counts > 0
    pairs = held[:, None] & held[None, :] & ~np.eye(len(counts), dtype=bool)
    if np.any(np.abs(relations) > 1 + RELATION_TOLERANCE):
        return "'relations' outside [-1, 1]"
    if np.any(relations[~pairs] != 0):
        return "'relations' non-zero on the diagonal or for a class with count 0"
    if np.any(np.abs(relations - relations.T) > RELATION_TOLERANCE):
        return "'relations' not symmetric"
    return None


class FedTopoStrategy(MultiArchStrategy):
    """Broadcast R̄ (uniform before the first merge); merge uploaded relation scores with reliability weighting."""

    name = "fedtopo"

    def __init__(
        self, *args, tau: float, weighting: str = "support", kappa: float = 0.0, kappa_quantile: float = 0.0, **kw
    ):
        super().__init__(*args, **kw)
        self.tau, self.weighting, self.kappa, self.kappa_quantile = tau, weighting, kappa, kappa_quantile
        self.global_arrays = {"topology": uniform_topology(self.num_classes).astype(np.float32)}

    def expected_upload(self):
        return {"relations": (self.num_classes, self.num_classes), "counts": (self.num_classes,)}

    def upload_problem(self, partition_id, upload):
        return self.partition_counts_problem(partition_id, upload["counts"]) or relations_problem(
            upload["relations"], upload["counts"]
        )

    def aggregate_uploads(self, server_round, uploads):
        if not uploads:
            return
        relations = np.stack([u["relations"] for _, u, _ in uploads])
        counts = np.stack([u["counts"] for _, u, _ in uploads])
        total = pair_weights(counts, self.weighting)[1].sum(axis=0)
        kappa = support_kappa(total, self.kappa, self.kappa_quantile) if self.weighting == "support" else self.kappa
        merged, _, _ = merge_relations(relations, counts, self.tau, self.weighting, kappa)
        self.global_arrays = {"topology": merged.astype(np.float32)}
        # the round's record shows whether the reliability weighting acted (rounds.csv)
        self.rounds.setdefault(server_round, RoundLog()).diagnostics = {
            "topo_kappa": kappa,
            "weak_pair_fraction": weak_pair_fraction(total, kappa, self.weighting),
        }
