"""Subnet extraction, BatchNorm recalibration and accuracy."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from typing import Mapping

import numpy as np
import torch
from flwr.app import MetricRecord

from fl_app.data.augment import normalize
from fl_app.data.images import ImageData
from fl_app.models.elastic_resnet import DynamicBatchNorm2d, ElasticResNet
from fl_app.models.supernet_space import Subnet, SupernetConfig
from fl_app.models.threads import one_thread_per_op
from fl_app.run.config import POPULATION_TIERS
from fl_app.run.device import preferred_device
from fl_app.run.stats import client_tier_scores
from fl_app.supernet.slicing import slice_subnet


def extract_subnet(cfg: SupernetConfig, supernet_state: Mapping, arch: Subnet) -> ElasticResNet:
    """A standalone model of ``arch`` whose tensors are the prefix slices of the supernet's."""
    model = ElasticResNet(cfg, bounds=arch)
    sliced = {k: torch.as_tensor(np.asarray(v)) for k, v in slice_subnet(cfg, supernet_state, arch).items()}
    model.load_state_dict(sliced, strict=False)  # num_batches_tracked is not part of the state on the wire
    return model


@torch.no_grad()
def recalibrate_bn(
    model: ElasticResNet, images: torch.Tensor, arch: Subnet | None = None, batch_size: int = 256
) -> None:
    """Re-estimate every BatchNorm's running statistics for ``arch`` as an exact average over ``images``."""
    bns = [m for m in model.modules() if isinstance(m, DynamicBatchNorm2d)]
    saved = [bn.momentum for bn in bns]
    for bn in bns:
        bn.reset_running_stats()
        bn.momentum = None
    model.train()
    device = next(model.parameters()).device
    for start in range(0, len(images), batch_size):
        model(normalize(images[start : start + batch_size]).to(device), arch)
    for bn, momentum in zip(bns, saved):
        bn.momentum = momentum
    model.eval()


def correct_predictions(
    model: ElasticResNet, data: ImageData, arch: Subnet | None = None, batch_size: int = 500
) -> np.ndarray:
    """Whether ``model`` (eval mode) classifies each example of ``data`` right (bool per example).

    On the CPU the batches run side by side, one per core torch may use (``torch.get_num_threads()``), each op on one
    thread, instead of one batch at a time with every op split over the cores: the same cores, without an
    operation-wide barrier per op, which stalls whenever another process holds one of the cores. Eval-mode
    inference gives bit-identical logits whatever the number of threads (tested); training-mode BatchNorm does not,
    so ``recalibrate_bn`` keeps the process's setting."""
    model.eval()
    device = next(model.parameters()).device

    def correct(start: int) -> np.ndarray:
        with torch.no_grad():  # per thread: grad mode is thread-local
            logits = model(normalize(data.images[start : start + batch_size]).to(device), arch)
        return (logits.argmax(1).cpu() == data.labels[start : start + batch_size]).numpy()

    starts = range(0, len(data), batch_size)
    workers = min(torch.get_num_threads(), len(starts)) if device.type == "cpu" else 1
    if workers <= 1:
        parts = list(map(correct, starts))
    else:
        with one_thread_per_op(), ThreadPoolExecutor(workers) as pool:
            parts = list(pool.map(correct, starts))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=bool)


def accuracy(model: ElasticResNet, data: ImageData, arch: Subnet | None = None, batch_size: int = 500) -> float:
    """Top-1 accuracy of ``model`` (eval mode) on ``data`` (see ``correct_predictions``)."""
    return int(correct_predictions(model, data, arch, batch_size).sum()) / max(len(data), 1)


def subnet_correct(
    cfg: SupernetConfig, supernet_state: Mapping, arch: Subnet, calibration: ImageData, split: ImageData
) -> np.ndarray:
    """Extract ``arch``, recalibrate its BN on ``calibration``, return which examples of ``split`` it gets right."""
    model = extract_subnet(cfg, supernet_state, arch).to(preferred_device())
    recalibrate_bn(model, calibration.images)
    return correct_predictions(model, split)


def evaluate_subnet(
    cfg: SupernetConfig, supernet_state: Mapping, arch: Subnet, calibration: ImageData, *splits: ImageData
) -> list[float]:
    """Extract ``arch``, recalibrate its BN on ``calibration``, return its accuracy on each split."""
    model = extract_subnet(cfg, supernet_state, arch).to(preferred_device())
    recalibrate_bn(model, calibration.images)
    return [accuracy(model, split) for split in splits]


def population_weighted_accuracy(
    budgets, tier_macs: list[int], tier_accuracy: list[float], choose_by: list[float] | None = None
) -> float:
    """Mean over clients of the accuracy of the tier each client runs (``client_tier_scores``: its largest affordable
    tier, or with ``choose_by`` the affordable one with the best score; 0 when it can afford none)."""
    scores = client_tier_scores(budgets, tier_macs, tier_accuracy, choose_by)
    return float(np.mean(scores)) if scores else 0.0


# the three population-weighted accuracies every run reports (``population_accuracies``): the anchor each client is
# scored with among those it affords
POPULATION_RULES = ("largest", "best-validation", "best-test")


def population_accuracies(budgets, anchors: list[dict]) -> dict[str, float | None]:
    """Mean test accuracy over clients, each scored with one affordable anchor (``macs``, ``val_accuracy``,
    ``accuracy``: the evaluated tiers and client subnets), three ways: ``largest`` (the most MACs), ``best-validation``
    (the best validation accuracy, the larger on ties: no test-set selection) and
    ``best-test`` (the highest test accuracy: the FEAST repository's ``scripts/evaluate_pop_weighted.py``, which
    selects on the accuracy it reports). A client that affords no anchor is scored with the cheapest one, as that
    script does. None where a rule cannot be applied (no validation split, no anchor)."""
    has_validation = all(math.isfinite(a["val_accuracy"]) for a in anchors)
    keys = {
        "largest": lambda a: a["macs"],
        "best-validation": lambda a: (a["val_accuracy"], a["macs"]),
        "best-test": lambda a: a["accuracy"],
    }
    result: dict[str, float | None] = {}
    for rule, key in keys.items():
        if not anchors or not budgets or (rule == "best-validation" and not has_validation):
            result[rule] = None
            continue
        cheapest = min(anchors, key=lambda a: a["macs"])
        scores = []
        for budget in budgets:
            affordable = [a for a in anchors if a["macs"] <= budget]
            scores.append(max(affordable, key=key)["accuracy"] if affordable else cheapest["accuracy"])
        result[rule] = float(np.mean(scores))
    return result


def population_columns(accuracies: dict[str, float | None]) -> dict[str, float]:
    """metrics.csv's columns of ``population_accuracies``: ``population_accuracy_<rule>`` (nan where None)."""
    return {
        f"population_accuracy_{rule.replace('-', '_')}": math.nan if value is None else value
        for rule, value in accuracies.items()
    }


class TierScoring:
    """How a method's reporting tiers are scored, declared by its strategy
    (``strategies.supernet_base.SupernetStrategy`` and so every supernet-family strategy implements it;
    ``TierEvaluator`` calls it): the state a tier is cut from, and the tier's accuracy on each split. The defaults: the
    global state itself, scored by ``evaluate_subnet``."""

    def tier_state(self, tier, state: dict) -> dict:
        """The state ``tier`` is evaluated on (FIARSE masks the full model per tier)."""
        return state

    def evaluate_tier(self, cfg: SupernetConfig, state, arch: Subnet, calibration: ImageData, *splits) -> list[float]:
        """Accuracy of ``arch`` cut from ``state`` on each split, its BN recalibrated on ``calibration`` (ScaleFL:
        a level's deepest exit)."""
        return evaluate_subnet(cfg, state, arch, calibration, *splits)  # looked up at each call


class TierEvaluator:
    """Central evaluation of the reporting tiers, usable as a Flower ``evaluate_fn``; keeps every row it measured.
    The method's strategy says how a tier is scored (``scoring``: a ``TierScoring``)."""

    def __init__(
        self,
        cfg: SupernetConfig,
        tiers,
        budgets,
        calibration: ImageData,
        validation: ImageData,
        test: ImageData,
        eval_every: int,
        num_rounds: int,
        decode_state,
        population_tier: str = "largest",
        scoring: TierScoring | None = None,
        client_subnets=None,
    ):
        if population_tier not in POPULATION_TIERS:
            raise ValueError(f"population-tier='{population_tier}': allowed values are {list(POPULATION_TIERS)}")
        if population_tier == "best-validation" and not len(validation):
            raise ValueError("population-tier='best-validation' needs a validation split (val-size > 0)")
        self.cfg, self.tiers, self.budgets = cfg, tiers, list(budgets)
        self.population_tier = population_tier
        self.calibration, self.validation, self.test = calibration, validation, test
        self.eval_every, self.num_rounds, self.decode_state = eval_every, num_rounds, decode_state
        self.rows: list[dict] = []
        self.last: dict = {}
        self.scoring = scoring if scoring is not None else TierScoring()
        # each client's largest affordable cached subnet (``SubnetCache.local_max``), one per budget, for methods
        # whose clients deploy any cached subnet (FEAST, SuperFedNAS, DeepFedNAS): the reference's population-weighted
        # accuracy scores a 12.19 MMAC client with its own subnet, not the nearest reporting tier. None: the tiers are
        # what the clients run (a width level, the fixed smallest model), so the tier-based accuracy is that score
        self.client_subnets = client_subnets

    def due(self, server_round: int) -> bool:
        return server_round > 0 and (server_round % self.eval_every == 0 or server_round == self.num_rounds)

    def __call__(self, server_round: int, arrays):
        if not self.due(server_round):
            return None
        state = self.decode_state(arrays)
        tier_results = []
        for tier in self.tiers:
            splits = [self.validation, self.test] if len(self.validation) else [self.test]
            tier_state = self.scoring.tier_state(tier, state)
            accs = self.scoring.evaluate_tier(self.cfg, tier_state, tier.arch, self.calibration, *splits)
            val_acc, test_acc = accs if len(accs) == 2 else [float("nan"), accs[0]]
            tier_results.append(
                {"macs": tier.macs, "params": tier.params, "val_accuracy": val_acc, "accuracy": test_acc}
            )
        choose_by = [t["val_accuracy"] for t in tier_results] if self.population_tier == "best-validation" else None
        pwa = population_weighted_accuracy(
            self.budgets, [t["macs"] for t in tier_results], [t["accuracy"] for t in tier_results], choose_by
        )
        subnet_results = self.score_client_subnets(state, tier_results)
        client_accuracy = (
            pwa
            if subnet_results is None
            else float(np.mean([subnet_results[c.arch]["accuracy"] for c in self.client_subnets]))
        )
        population = population_accuracies(self.budgets, self.anchors(tier_results, subnet_results))
        columns = population_columns(population)
        for row in self.rows:  # rows restored from a checkpoint written before these columns existed
            for key in columns:
                row.setdefault(key, math.nan)
        for t in tier_results:
            self.rows.append(
                {
                    "round": server_round,
                    "tier_macs": t["macs"],
                    "tier_params": t["params"],
                    "val_accuracy": t["val_accuracy"],
                    "test_accuracy": t["accuracy"],
                    "population_weighted_accuracy": pwa,
                    "client_subnet_accuracy": client_accuracy,
                    **columns,
                }
            )
        self.last = {
            "round": server_round,
            "tiers": tier_results,
            "population_weighted_accuracy": pwa,
            "client_subnet_accuracy": client_accuracy,
            "population_accuracies": population,
            **({"client_subnets": self.client_subnet_rows(subnet_results)} if subnet_results is not None else {}),
        }
        metrics = {f"acc@{t['macs'] / 1e6:.2f}M": t["accuracy"] for t in tier_results}
        metrics["population-weighted-accuracy"] = pwa
        metrics["client-subnet-accuracy"] = client_accuracy
        metrics.update({f"population-accuracy-{rule}": v for rule, v in population.items() if v is not None})
        return MetricRecord(metrics)

    def anchors(self, tier_results: list[dict], subnet_results: dict | None) -> list[dict]:
        """What a client may be scored with: the tiers and, for the cache-scored methods, the distinct client
        subnets (their MACs, validation and test accuracy)."""
        anchors = {(t["macs"], tier.arch): t for tier, t in zip(self.tiers, tier_results)}
        for subnet in self.client_subnets or []:
            anchors.setdefault((subnet.macs, subnet.arch), {"macs": subnet.macs, **subnet_results[subnet.arch]})
        return list(anchors.values())

    def score_client_subnets(self, state, tier_results: list[dict]) -> dict | None:
        """Validation and test accuracy of every distinct client subnet (arch -> {val_accuracy, accuracy}), each
        recalibrated once; a subnet that is also a reporting tier reuses the tier's scores. None without client
        subnets."""
        if self.client_subnets is None:
            return None
        scores = {
            tier.arch: {"val_accuracy": r["val_accuracy"], "accuracy": r["accuracy"]}
            for tier, r in zip(self.tiers, tier_results)
        }
        splits = [self.validation, self.test] if len(self.validation) else [self.test]
        for subnet in self.client_subnets:
            if subnet.arch not in scores:
                accs = self.scoring.evaluate_tier(self.cfg, state, subnet.arch, self.calibration, *splits)
                val = accs[0] if len(accs) == 2 else float("nan")
                scores[subnet.arch] = {"val_accuracy": val, "accuracy": accs[-1]}
        return scores

    def client_subnet_rows(self, scores: dict) -> list[dict]:
        """One row per client: its subnet's MACs and test accuracy (summary.json's ``client_subnets``)."""
        return [
            {"macs": c.macs, "params": c.params, "accuracy": scores[c.arch]["accuracy"]} for c in self.client_subnets
        ]
