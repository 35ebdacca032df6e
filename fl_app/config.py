"""The run config: every key, its default, what it accepts and what it means, validated before any training.

``pyproject.toml``'s ``[tool.flwr.app.config]`` carries the same defaults (Flower requires them there); a test keeps
the two in step, and another keeps the README's key table complete.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from fl_app.data import DATA_SOURCES, DATASETS
from fl_app.partition import PARTITIONERS
from fl_app.payload import PAYLOAD_DTYPES

# methods built on the elastic supernet (FEAST and its baselines) share the FEAST client and server run
SUPERNET_METHODS = ("feast", "superfednas", "deepfednas", "heterofl", "fedrolex", "fedavg-min")
METHODS = SUPERNET_METHODS + ("fedtopo", "local", "lg-fedavg", "fd", "fedproto", "fedtgp")
TRAIN_SUBNETS = ("max", "min", "random")


@dataclass(frozen=True)
class Key:
    default: Any
    help: str
    choices: tuple | None = None
    check: Callable[[Any], bool] | None = None
    rule: str = ""  # what ``check`` demands, for the error message


def _positive(x):
    return x > 0


def _non_negative(x):
    return x >= 0


def _fraction(x):
    return 0 < x <= 1


KEYS: dict[str, Key] = {
    "method": Key("feast", "federated method", METHODS),
    "dataset": Key("cifar10", "dataset name", tuple(DATASETS)),
    "data-source": Key("sample", "'sample' = bundled CIFAR-10 sample, 'hub' = Hugging Face hub, 'local' = data-path",
                       DATA_SOURCES),
    "data-path": Key("", "folder with train/test parquet files or image folders (data-source='local')"),
    "partitioner": Key("gamma", "how the training pool is split among clients", PARTITIONERS),
    "dirichlet-alpha": Key(1.0, "Dirichlet concentration of the label skew", None, _positive, "> 0"),
    "gamma": Key(1.0, "γ: client data share ∝ min(budget, max-training-macs)^γ (0 = plain Dirichlet)", None,
                 _non_negative, ">= 0"),
    "supernet": Key("cpu", "'cpu', 'paper' or a supernet JSON path"),
    "subnet-cache": Key("", "'cpu', 'paper' or a CSV path; empty = the cache named like the supernet"),
    "num-server-rounds": Key(25, "federated rounds", None, _positive, "> 0"),
    "clients-per-round": Key(0, "clients sampled per round (<= number of clients; 0 = half of them, at least 1)",
                             None, _non_negative, ">= 0"),
    "min-reply-fraction": Key(1.0, "fraction of sampled clients whose valid replies a round needs", None, _fraction,
                              "in (0, 1]"),
    "round-timeout": Key(3600.0, "seconds to wait for a round's replies", None, _positive, "> 0"),
    "local-epochs": Key(1, "local epochs per round", None, _positive, "> 0"),
    "max-local-steps": Key(40, "cap on local optimizer steps per round (0 = no cap: full epochs)", None,
                           _non_negative, ">= 0"),
    "batch-size": Key(32, "local mini-batch size", None, _positive, "> 0"),
    "lr": Key(0.05, "local SGD learning rate", None, _positive, "> 0"),
    "lr-schedule": Key("cosine", "learning rate over rounds", ("cosine", "constant")),
    "momentum": Key(0.9, "SGD momentum", None, lambda x: 0 <= x < 1, "in [0, 1)"),
    "weight-decay": Key(5e-4, "SGD weight decay", None, _non_negative, ">= 0"),
    "kd-ratio": Key(0.5, "ρ: weight of the soft loss to the max subnet for the smaller subnets", None,
                    lambda x: 0 <= x <= 1, "in [0, 1]"),
    "train-subnets": Key("max,min,random", "subnets trained per local step (comma list of max, min, random)"),
    "routing": Key(True, "send each client only its budget's sub-supernet (false = full supernet)"),
    "crop-flip": Key(True, "random crop + horizontal flip"),
    "randaugment": Key(False, "RandAugment on training batches"),
    "mixup-alpha": Key(0.0, "Mixup Beta(α, α) (0 = off)", None, _non_negative, ">= 0"),
    "cutmix-alpha": Key(0.0, "CutMix Beta(α, α) (0 = off)", None, _non_negative, ">= 0"),
    "budget-zipf-a": Key(1.2, "Zipf exponent of client budget ranks", None, _positive, "> 0"),
    "budget-max-macs": Key(0.0, "largest client budget in MACs (0 = the cache's largest subnet)", None,
                           _non_negative, ">= 0"),
    "budget-levels": Key(0, "number of budget ranks (0 = number of clients)", None, _non_negative, ">= 0"),
    "max-training-macs": Key(0.0, "cap on budgets in the γ data allocation (0 = no cap)", None, _non_negative, ">= 0"),
    "tiers": Key("", "reporting tiers as comma-separated MACs (empty = 4 log-spaced cached subnets)"),
    "aggregation-weights": Key("num-examples", "weights of the sparse average", ("num-examples", "uniform")),
    "payload-dtype": Key("float32", "dtype of arrays in messages", PAYLOAD_DTYPES),
    "eval-every": Key(5, "evaluate the tiers every N rounds (and after the last)", None, _positive, "> 0"),
    "val-size": Key(1000, "training images held out for validation", None, _non_negative, ">= 0"),
    "calib-size": Key(1000, "training images held out for BN recalibration", None, _positive, "> 0"),
    "seed": Key(0, "seed of budgets, partitions, sampling, init and data order", None, _non_negative, ">= 0"),
    "output-dir": Key("", "absolute output folder (empty = ~/fl_app_runs/<method>-<dataset>-s<seed>-<time>)"),
    "faulty-partitions": Key("", "fault injection: comma list of partition ids whose training raises"),
    "checkpoint-every": Key(5, "write <output-dir>/checkpoint.pt every N rounds (model, strategy state, RNG states, "
                            "metrics so far; 0 = never)", None, _non_negative, ">= 0"),
    "resume-from": Key("", "continue a run from its checkpoint.pt (or the folder holding it); the run config must "
                       "match the checkpoint's except for output-dir, resume-from, checkpoint-every, round-timeout"),
    "budget-constrained": Key(True, "superfednas/deepfednas: subnets limited to what each client can afford"),
    "maxnet-beta0": Key(0.9, "superfednas/deepfednas: MaxNet weight β₀ of the max-subnet client", None, _fraction,
                        "in (0, 1]"),
    "maxnet-final": Key(0.125, "superfednas/deepfednas: a, the final fraction of β₀ after the cosine decay", None,
                        lambda x: 0 <= x <= 1, "in [0, 1]"),
    "maxnet-decay-fraction": Key(0.8, "superfednas/deepfednas: T as a fraction of the rounds", None, _fraction,
                                 "in (0, 1]"),
    # FedTopo and the model-heterogeneous baselines (they partition with plain Dirichlet(dirichlet-alpha))
    "model-family": Key("cpu", "backbones of client i = family[i % 8]: 'cpu' small nets or 'paper' (CNN-4, "
                        "GoogLeNet, MobileNetV2, ResNet-18/34/50/101/152)", ("cpu", "paper")),
    "feature-dim": Key(64, "common feature dimension every backbone projects to before its head", None, _positive,
                       "> 0"),
    "test-fraction": Key(0.2, "share of each client's partition held out as its local test split", None,
                         lambda x: 0 < x < 1, "in (0, 1)"),
    "topo-tau": Key(0.1, "τ: temperature of the server's softmax over merged prototype-cosine relations", None, _positive, "> 0"),
    "topo-kappa": Key(20.0, "κ: shrinkage of a pair's merged relation toward the typical one at low support W "
                      "(W/(W+κ))", None, _non_negative, ">= 0"),
    "topo-beta": Key(0.5, "β: strength of topology-weighted negatives in the client loss (0 = plain CE ablation)",
                     None, _non_negative, ">= 0"),
    "topo-weighting": Key("support", "merge weights: 'support' = sqrt(n_j·n_k) + κ shrinkage, 'mean' = plain mean "
                          "(ablation)", ("support", "mean")),
    "topo-source": Key("prototypes", "topology from feature 'prototypes' or per-class mean 'logits' (ablation)",
                       ("prototypes", "logits")),
    "distill-lambda": Key(1.0, "λ of the FD distillation and FedProto/FedTGP prototype terms", None, _non_negative,
                          ">= 0"),
    "proto-max-samples": Key(0, "cap on local training images used for prototypes/class statistics (0 = all)",
                             None, _non_negative, ">= 0"),
    "tgp-server-epochs": Key(100, "FedTGP: server epochs of prototype-generator training per round", None, _positive,
                             "> 0"),
    "tgp-margin-cap": Key(100.0, "FedTGP: τ, cap of the adaptive margin δ", None, _positive, "> 0"),
    "tgp-margin": Key("class-gap", "FedTGP margin δ before the cap: 'class-gap' = largest of the per-class "
                      "nearest-centre distances (authors' code), 'max-pair' = largest centre distance (paper's "
                      "formula)", ("class-gap", "max-pair")),
    "tgp-server-lr": Key(0.01, "FedTGP: SGD learning rate of the prototype generator", None, _positive, "> 0"),
    "tgp-batch-size": Key(10, "FedTGP: client prototypes per mini-batch of generator training", None, _positive,
                          "> 0"),
}


@dataclass(frozen=True)
class RunConfig:
    values: dict = field(default_factory=dict)

    def __getitem__(self, key: str):
        return self.values[key]

    @property
    def train_subnets(self) -> tuple[str, ...]:
        return tuple(s.strip() for s in self["train-subnets"].split(","))

    @property
    def tier_targets(self) -> list[float]:
        return [float(t) for t in self["tiers"].split(",")] if self["tiers"].strip() else []

    @property
    def faulty_partitions(self) -> set[int]:
        return {int(p) for p in self["faulty-partitions"].split(",") if p.strip()}

    def clients_per_round(self, num_clients: int) -> int:
        """Clients sampled per round; raises before training when more are asked for than exist."""
        asked = self["clients-per-round"]
        if asked > num_clients:
            raise ValueError(f"clients-per-round={asked}: must be <= the number of clients ({num_clients}; set "
                             "num-supernodes in --federation-config), or 0 for half of them")
        return asked or max(1, num_clients // 2)

    @property
    def subnet_cache(self) -> str:
        return self["subnet-cache"] or self["supernet"]

    def to_dict(self) -> dict:
        return dict(self.values)


def _type_ok(value, default) -> bool:
    if isinstance(default, bool):
        return isinstance(value, bool)
    if isinstance(default, int):
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return isinstance(value, str)


def validate_run_config(raw: dict) -> RunConfig:
    """Check every key and value; raise ``ValueError`` naming the key and what it accepts."""
    errors = []
    for key in raw:
        if key not in KEYS:
            close = difflib.get_close_matches(key, KEYS, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            errors.append(f"unknown key '{key}'{hint}; allowed keys: {', '.join(KEYS)}")
    values = {}
    for key, spec in KEYS.items():
        value = raw.get(key, spec.default)
        if not _type_ok(value, spec.default):
            errors.append(f"{key}={value!r}: expected a {type(spec.default).__name__}")
            continue
        if isinstance(spec.default, float):
            value = float(value)
        if spec.choices and value not in spec.choices:
            errors.append(f"{key}={value!r}: allowed values are {list(spec.choices)}")
        if spec.check and not spec.check(value):
            errors.append(f"{key}={value!r}: must be {spec.rule}")
        values[key] = value
    if not errors:
        errors += _cross_checks(values)
    if errors:
        raise ValueError("invalid run config:\n  " + "\n  ".join(errors))
    return RunConfig(values)


def _cross_checks(v: dict) -> list[str]:
    errors = []
    subnets = [s.strip() for s in v["train-subnets"].split(",")]
    if not subnets or any(s not in TRAIN_SUBNETS for s in subnets) or "max" not in subnets:
        errors.append(f"train-subnets='{v['train-subnets']}': a comma list of {list(TRAIN_SUBNETS)} that "
                      "includes 'max' (the teacher of the others)")
    for key in ("tiers", "faulty-partitions"):
        try:
            [float(t) for t in v[key].split(",") if t.strip()]
        except ValueError:
            errors.append(f"{key}='{v[key]}': expected comma-separated numbers")
    if v["data-source"] == "local" and not v["data-path"]:
        errors.append("data-path: required when data-source='local'")
    if v["data-source"] != "local" and v["data-path"]:
        errors.append(f"data-path='{v['data-path']}' is only read with data-source='local' "
                      f"(data-source is '{v['data-source']}')")
    if v["data-source"] == "sample" and v["dataset"] != "cifar10":
        errors.append(f"dataset='{v['dataset']}': data-source='sample' only bundles cifar10; "
                      "use data-source='hub' or 'local'")
    if v["resume-from"] and not Path(v["resume-from"]).expanduser().is_absolute():
        errors.append(f"resume-from='{v['resume-from']}': must be an absolute path to a checkpoint.pt or its folder")
    if v["resume-from"] and v["method"] not in SUPERNET_METHODS:
        errors.append(f"resume-from: method='{v['method']}' does not checkpoint; resume works for "
                      f"{list(SUPERNET_METHODS)}")
    if v["output-dir"] and not Path(v["output-dir"]).expanduser().is_absolute():
        errors.append(f"output-dir='{v['output-dir']}': must be an absolute path (the ServerApp's working "
                      "directory is the SuperLink's, not yours), or empty for the default")
    return errors
