"""The run config: every key, its default, what it accepts and what it means, validated before any training.

``pyproject.toml``'s ``[tool.flwr.app.config]`` carries the same defaults (Flower requires them there); a test keeps
the two in step, and another keeps the README's key table complete.
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from fl_app.data.images import DATA_SOURCES, DATASETS
from fl_app.data.local_splits import LOCAL_PARTITIONERS, PATHOLOGICAL_SPLITS
from fl_app.data.partition import PARTITIONERS
from fl_app.models.multiarch import BACKBONES_PER_FAMILY, MODEL_FAMILIES
from fl_app.run.payload import PAYLOAD_DTYPES

# methods built on the elastic supernet (FEAST and its baselines) share one client and server run (fl_app.supernet_app)
SUPERNET_METHODS = ("feast", "superfednas", "deepfednas", "heterofl", "fedrolex", "fedavg-min", "fiarse", "scalefl")
METHODS = SUPERNET_METHODS + ("fedtopo", "local", "lg-fedavg", "fd", "fedproto", "fedtgp")
TRAIN_SUBNETS = ("max", "min", "random")
TOPO_WEIGHTINGS = ("support", "mean")
TOPO_SOURCES = ("prototypes", "logits")
TGP_MARGINS = ("class-gap", "max-pair")
# supernet family: a merge that limits what one reply can do (strategies.robust), or the plain sparse average
ROBUST_AGGREGATIONS = ("none", "clip", "trimmed-mean", "median")
# which affordable tier scores a client in the population-weighted accuracy (fl_app.supernet.evaluation)
POPULATION_TIERS = ("largest", "best-validation")
# how a baseline maps budgets: as the project does (its tiers) or as the FEAST repository does
FIARSE_MAPPINGS = ("tiers", "reference")
SCALEFL_LEVELS = ("tiers", "reference")


MAX_CLIENTS = 100_000  # upper bound of every client/partition count in the run config
MAX_MACS = 1e12  # upper bound of every MACs value (the paper supernet's largest subnet is ~0.6e9)
# The largest model or generator a run may build, in bytes of float32 parameters. The largest model the paper trains
# (the ResNet-152 backbone, ~60M parameters) takes 0.24 GB, and training holds a few copies of it (gradients,
# momentum); a size key far beyond that is a typo that would only show as an out-of-memory kill after the nodes
# started (feature-dim=65536 gives FedTGP a 32 GiB generator), so it is refused before training.
MAX_MODEL_BYTES = 2 * 2**30


@dataclass(frozen=True)
class Range:
    """A closed (or half-open) interval a number must lie in; NaN lies in none."""

    low: float
    high: float
    low_open: bool = False
    high_open: bool = False

    def __call__(self, x) -> bool:
        above = x > self.low if self.low_open else x >= self.low
        below = x < self.high if self.high_open else x <= self.high
        return bool(above and below)

    @property
    def rule(self) -> str:
        return (
            f"in {'(' if self.low_open else '['}{_number(self.low)}, {_number(self.high)}"
            f"{')' if self.high_open else ']'}"
        )


def _number(x) -> str:
    if isinstance(x, int):
        return str(x)
    mantissa, _, exponent = f"{x:g}".partition("e")
    return f"{mantissa}e{int(exponent)}" if exponent else mantissa


@dataclass(frozen=True)
class Key:
    default: Any
    help: str
    choices: tuple | None = None
    check: Range | None = None
    # list-valued keys: text -> parsed value, raising ValueError(what is wrong and what is allowed); the only parser
    parse: Callable[[str], Any] | None = None

    @property
    def rule(self) -> str:
        return self.check.rule if self.check else ""


def _comma_items(text: str, allowed: str) -> list[str]:
    if not text.strip():
        return []
    items = [t.strip() for t in text.split(",")]
    if not all(items):
        raise ValueError(f"an empty item; allowed: {allowed}")
    return items


TRAIN_SUBNETS_RULE = f"a comma list of {list(TRAIN_SUBNETS)} without repeats that includes 'max' (the teacher)"
MACS_RANGE = Range(1, MAX_MACS)
MACS_LIST_RULE = f"empty, or comma-separated MACs, each a number {MACS_RANGE.rule}"
PARTITION_IDS_RULE = f"empty, or comma-separated partition ids, each an integer in [0, {MAX_CLIENTS})"


def parse_train_subnets(text: str) -> tuple[str, ...]:
    subnets = _comma_items(text, TRAIN_SUBNETS_RULE)
    if (
        not subnets
        or any(s not in TRAIN_SUBNETS for s in subnets)
        or "max" not in subnets
        or len(set(subnets)) != len(subnets)
    ):
        raise ValueError(f"allowed: {TRAIN_SUBNETS_RULE}")
    return tuple(subnets)


def parse_macs_list(text: str) -> tuple[float, ...]:
    values = []
    for item in _comma_items(text, MACS_LIST_RULE):
        try:
            macs = float(item)
        except ValueError:
            raise ValueError(f"'{item}' is not a number; allowed: {MACS_LIST_RULE}") from None
        if not MACS_RANGE(macs):  # also refuses inf and nan
            raise ValueError(f"{item} is out of range; allowed: {MACS_LIST_RULE}")
        values.append(macs)
    return tuple(values)


TIERS_RULE = f"{MACS_LIST_RULE}, without repeats"


def parse_tiers(text: str) -> tuple[float, ...]:
    """Reporting tiers: MACs as ``parse_macs_list`` reads them; a repeated tier would be reported once, not twice."""
    tiers = parse_macs_list(text)
    repeated = sorted({_number(t) for t in tiers if tiers.count(t) > 1})
    if repeated:
        raise ValueError(f"{', '.join(repeated)} given more than once; allowed: {TIERS_RULE}")
    return tiers


def parse_partition_ids(text: str) -> frozenset[int]:
    ids = set()
    for item in _comma_items(text, PARTITION_IDS_RULE):
        if not re.fullmatch(r"[0-9]+", item) or int(item) >= MAX_CLIENTS:
            raise ValueError(f"'{item}' is not a partition id; allowed: {PARTITION_IDS_RULE}")
        ids.add(int(item))
    return frozenset(ids)


FRACTION = Range(0, 1, low_open=True)  # (0, 1]
UNIT = Range(0, 1)  # [0, 1]
ROUNDS = Range(1, 100_000)
MAX_CLASSES = max(d.num_classes for d in DATASETS.values())

KEYS: dict[str, Key] = {
    "method": Key("feast", "federated method", METHODS),
    "dataset": Key("cifar10", "dataset name", tuple(DATASETS)),
    "data-source": Key(
        "sample", "'sample' = bundled CIFAR-10 sample, 'hub' = Hugging Face hub, 'local' = data-path", DATA_SOURCES
    ),
    "data-path": Key("", "folder with train/test parquet files or image folders (data-source='local')"),
    "partitioner": Key("gamma-class-size", "how the training pool is split among clients", PARTITIONERS),
    "dirichlet-alpha": Key(1.0, "Dirichlet concentration of the label skew", check=Range(1e-3, 1e4)),
    "gamma": Key(
        1.0, "γ: client data share ∝ min(budget, max-training-macs)^γ (0 = plain Dirichlet)", check=Range(0.0, 10.0)
    ),
    "supernet": Key("cpu", "'cpu', 'paper' or a supernet JSON path"),
    "subnet-cache": Key("", "'cpu', 'paper' or a CSV path; empty = the cache named like the supernet"),
    "num-server-rounds": Key(25, "federated rounds", check=ROUNDS),
    "clients-per-round": Key(
        0, "clients sampled per round (<= number of clients; 0 = half of them, at least 1)", check=Range(0, MAX_CLIENTS)
    ),
    "min-reply-fraction": Key(1.0, "fraction of sampled clients whose valid replies a round needs", check=FRACTION),
    "round-timeout": Key(3600.0, "seconds to wait for a round's replies", check=Range(0.0, 7 * 86400.0, low_open=True)),
    "local-epochs": Key(1, "local epochs per round", check=Range(1, 1000)),
    "max-local-steps": Key(
        40, "cap on local optimizer steps per round (0 = no cap: full epochs)", check=Range(0, 10_000_000)
    ),
    "batch-size": Key(32, "local mini-batch size", check=Range(1, 65_536)),
    "lr": Key(0.05, "local SGD learning rate", check=Range(0.0, 10.0, low_open=True)),
    "lr-schedule": Key("cosine", "learning rate over rounds", ("cosine", "constant")),
    "momentum": Key(0.9, "SGD momentum", check=Range(0.0, 1.0, high_open=True)),
    "weight-decay": Key(5e-4, "SGD weight decay", check=Range(0.0, 1.0)),
    "kd-ratio": Key(0.5, "ρ: weight of the soft loss to the max subnet for the smaller subnets", check=UNIT),
    "train-subnets": Key(
        "max,min,random", "subnets trained per local step (comma list of max, min, random)", parse=parse_train_subnets
    ),
    "routing": Key(True, "send each client only its budget's sub-supernet (false = full supernet)"),
    "crop-flip": Key(True, "random crop + horizontal flip"),
    "randaugment": Key(False, "RandAugment on training batches"),
    "mixup-alpha": Key(0.0, "Mixup Beta(α, α) (0 = off)", check=Range(0.0, 100.0)),
    "cutmix-alpha": Key(0.0, "CutMix Beta(α, α) (0 = off)", check=Range(0.0, 100.0)),
    "budget-zipf-a": Key(1.2, "Zipf exponent of client budget ranks", check=Range(0.0, 100.0, low_open=True)),
    "budget-max-macs": Key(
        0.0, "largest client budget in MACs (0 = the cache's largest subnet)", check=Range(0.0, MAX_MACS)
    ),
    "budget-max-factor": Key(
        0.0,
        "largest client budget as a multiple of the whole supernet's MACs, instead of budget-max-macs (0 = off; "
        "above 1 some clients can afford more than the whole supernet and run it whole)",
        check=Range(0.0, 1e6),
    ),
    "budget-levels": Key(0, "number of budget ranks (0 = number of clients)", check=Range(0, MAX_CLIENTS)),
    "max-training-macs": Key(
        0.0,
        "cap on budgets in the γ data allocation (0 = the whole supernet's MACs: no budget counts beyond it)",
        check=Range(0.0, MAX_MACS),
    ),
    "tiers": Key(
        "",
        "reporting tiers as comma-separated MACs, each naming a different cached subnet (empty = 4 log-spaced "
        "cached subnets)",
        parse=parse_tiers,
    ),
    "aggregation-weights": Key("num-examples", "weights of the sparse average", ("num-examples", "uniform")),
    "robust-aggregation": Key(
        "none",
        "supernet methods: 'none' = the sparse average; 'clip' = each update scaled to at most the round's median "
        "update RMS; 'trimmed-mean' / 'median' = each element over the replies covering it (unweighted)",
        ROBUST_AGGREGATIONS,
    ),
    "payload-dtype": Key("float32", "dtype of arrays in messages", PAYLOAD_DTYPES),
    "eval-every": Key(5, "evaluate the tiers every N rounds (and after the last)", check=ROUNDS),
    "val-size": Key(1000, "training images held out for validation", check=Range(0, 10_000_000)),
    "test-size": Key(
        0,
        "supernet methods: test images the server scores the tiers on during the run, a seeded class-stratified "
        "sample of the test split (0 = all of it; fewer for quick runs and tests)",
        check=Range(0, 10_000_000),
    ),
    "population-tier": Key(
        "largest",
        "tier each client is scored with in the population-weighted accuracy: its "
        "largest affordable one, or the affordable one best on validation",
        POPULATION_TIERS,
    ),
    "calib-size": Key(1000, "training images held out for BN recalibration", check=Range(1, 10_000_000)),
    "seed": Key(0, "seed of budgets, partitions, sampling, init and data order", check=Range(0, 2**32 - 1)),
    "output-dir": Key("", "absolute output folder (empty = ~/fl_app_runs/<method>-<dataset>-s<seed>-<time>)"),
    "tracker": Key(
        "",
        "mirror the per-round metrics to an experiment tracker: '' = off, 'tensorboard' = event files in "
        "<output-dir>/tensorboard, 'wandb' = offline run in <output-dir>/wandb (needs wandb installed)",
        ("", "tensorboard", "wandb"),
    ),
    "faulty-partitions": Key(
        "", "fault injection: comma list of partition ids whose training raises", parse=parse_partition_ids
    ),
    "checkpoint-every": Key(
        5,
        "write <output-dir>/checkpoint.pt every N rounds (model, strategy state, RNG states, "
        "metrics so far; 0 = never)",
        check=Range(0, 100_000),
    ),
    "resume-from": Key(
        "",
        "continue a run from its checkpoint.pt (or the folder holding it); the run config must "
        "match the checkpoint's except for output-dir, resume-from, checkpoint-every, round-timeout, tracker",
    ),
    "budget-constrained": Key(True, "superfednas/deepfednas: subnets limited to what each client can afford"),
    "maxnet-beta0": Key(0.9, "superfednas/deepfednas: MaxNet weight β₀ of the max-subnet client", check=FRACTION),
    "maxnet-final": Key(
        0.125, "superfednas/deepfednas: a, the final fraction of β₀ after the cosine decay", check=UNIT
    ),
    "maxnet-decay-fraction": Key(0.8, "superfednas/deepfednas: T as a fraction of the rounds", check=FRACTION),
    "fiarse-mapping": Key(
        "tiers",
        "fiarse: each client's mask keeps the MACs of the largest HeteroFL tier it affords ('tiers'), or, as the FEAST "
        "repository, its own fraction of the parameters, budget / full-model MACs, trained with plain SGD "
        "('reference')",
        FIARSE_MAPPINGS,
    ),
    "scalefl-levels": Key(
        "tiers",
        "scalefl: level targets at HeteroFL's tiers' MACs ('tiers'), or, as the FEAST repository, 4 levels at 0.061, "
        "0.13, 0.25 and 1 of the full model's MACs (±15 %), only the levels some client trains reported ('reference')",
        SCALEFL_LEVELS,
    ),
    # FedTopo and the model-heterogeneous baselines (they split with local-partitioner)
    "model-family": Key(
        "cpu",
        "backbones of client i = family[i % backbones]: 'cpu' small nets or 'paper' (CNN-4, "
        "GoogLeNet, MobileNetV2, ResNet-18/34/50/101/152)",
        MODEL_FAMILIES,
    ),
    "backbones": Key(
        BACKBONES_PER_FAMILY,
        "client i trains the family's architecture number i % backbones: 8 = all eight, 1 = every client on CNN-4 "
        "(one backbone, the homogeneous control)",
        check=Range(1, BACKBONES_PER_FAMILY),
    ),
    "feature-dim": Key(
        64,
        "common feature dimension every backbone projects to before its head (fedtgp: its prototype generator "
        f"must fit in {MAX_MODEL_BYTES / 2**30:g} GiB)",
        check=Range(1, 65_536),
    ),
    "test-fraction": Key(
        0.2,
        "share of each client's partition held out as its local test split",
        check=Range(0.0, 1.0, low_open=True, high_open=True),
    ),
    "local-partitioner": Key(
        "dirichlet",
        "how the model-heterogeneous methods split the training set: 'dirichlet' = Dirichlet(dirichlet-alpha), "
        "'pathological' = classes-per-client classes per client dealt cyclically (HtFLlib's 'pat'), "
        "'pathological-random' = classes-per-client classes per client drawn at random (seeded; pairs overlap)",
        LOCAL_PARTITIONERS,
    ),
    "classes-per-client": Key(
        2,
        "local-partitioner='pathological' or 'pathological-random': classes each client holds (at most the "
        "dataset's classes)",
        check=Range(1, MAX_CLASSES),
    ),
    "client-data-fraction": Key(
        1.0,
        "model-heterogeneous methods: share of each client's local training split it trains on (seeded, "
        "label-stratified subsample; the local test split is kept whole)",
        check=FRACTION,
    ),
    "validation-fraction": Key(
        0.0,
        "model-heterogeneous methods: share of each client's partition taken from its training rows as a local "
        "validation split, scored at every evaluation; the best round is chosen on it (0 = off: no validation split, "
        "no best round)",
        check=Range(0.0, 0.5),
    ),
    "global-test-per-class": Key(
        0,
        "model-heterogeneous methods: images per class of the dataset's test split each client model is also scored "
        "on at every evaluation (global_accuracy: class-balanced, the same seeded sample for all); 0 = off",
        check=Range(0, 100_000),
    ),
    # τ >= 1e-3 keeps cos/τ <= 1000: the softmax stays finite (1e-45 made the topology NaN)
    "topo-tau": Key(
        0.1, "τ: temperature of the server's softmax over merged prototype-cosine relations", check=Range(1e-3, 100.0)
    ),
    "topo-kappa": Key(
        20.0,
        "κ: shrinkage of a pair's merged relation toward the typical one at low support W (W/(W+κ))",
        check=Range(0.0, 1e9),
    ),
    "topo-kappa-quantile": Key(
        0.0,
        "κ scaled to the support seen: > 0 sets each round's κ to this quantile of the support W of the pairs "
        "reported that round (0.5: the median pair is shrunk halfway); 0 = off, the fixed topo-kappa",
        check=Range(0.0, 1.0),
    ),
    "topo-beta": Key(
        0.5,
        "β: strength of topology-weighted negatives in the client loss (0 = plain CE ablation)",
        check=Range(0.0, 100.0),
    ),
    "topo-weighting": Key(
        "support",
        "merge weights: 'support' = sqrt(n_j·n_k) + κ shrinkage, 'mean' = plain mean (ablation)",
        TOPO_WEIGHTINGS,
    ),
    "topo-source": Key(
        "prototypes", "topology from feature 'prototypes' or per-class mean 'logits' (ablation)", TOPO_SOURCES
    ),
    "distill-lambda": Key(1.0, "λ of the FD distillation and FedProto/FedTGP prototype terms", check=Range(0.0, 100.0)),
    "proto-max-samples": Key(
        0, "cap on local training images used for prototypes/class statistics (0 = all)", check=Range(0, 100_000_000)
    ),
    "tgp-server-epochs": Key(
        100, "FedTGP: server epochs of prototype-generator training per round", check=Range(1, 10_000)
    ),
    "tgp-margin-cap": Key(100.0, "FedTGP: τ, cap of the adaptive margin δ", check=Range(0.0, 1e6, low_open=True)),
    "tgp-margin": Key(
        "class-gap",
        "FedTGP margin δ before the cap: 'class-gap' = largest of the per-class "
        "nearest-centre distances (authors' code), 'max-pair' = largest centre distance (paper's "
        "formula)",
        TGP_MARGINS,
    ),
    "tgp-server-lr": Key(
        0.01, "FedTGP: SGD learning rate of the prototype generator", check=Range(0.0, 10.0, low_open=True)
    ),
    "tgp-batch-size": Key(
        10, "FedTGP: client prototypes per mini-batch of generator training", check=Range(1, 100_000)
    ),
}


@dataclass(frozen=True)
class RunConfig:
    """Validated run-config values (as given, e.g. for checkpoints and summaries) and the parsed list-valued keys."""

    values: dict = field(default_factory=dict)
    parsed: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self):
        if not self.parsed:  # rebuilt from validated values (per-process caches key on the raw items)
            object.__setattr__(
                self,
                "parsed",
                {key: _parse(key, value) for key, value in self.values.items() if key in KEYS and KEYS[key].parse},
            )

    def __getitem__(self, key: str):
        return self.values[key]

    @property
    def train_subnets(self) -> tuple[str, ...]:
        return self.parsed["train-subnets"]

    @property
    def tier_targets(self) -> list[float]:
        return list(self.parsed["tiers"])

    @property
    def faulty_partitions(self) -> frozenset[int]:
        return self.parsed["faulty-partitions"]

    def check_federation(self, num_partitions: int) -> None:
        """Raise before training when the run config names clients or partitions the federation lacks."""
        asked = self["clients-per-round"]
        if asked > num_partitions:
            raise ValueError(
                f"clients-per-round={asked}: must be <= the number of clients ({num_partitions}; set "
                "num-supernodes in --federation-config), or 0 for half of them"
            )
        beyond = sorted(p for p in self.faulty_partitions if p >= num_partitions)
        if beyond:
            raise ValueError(
                f"faulty-partitions='{self['faulty-partitions']}': partition ids {beyond} do not exist; "
                f"allowed: ids in [0, {num_partitions})"
            )

    def clients_per_round(self, num_clients: int) -> int:
        """Clients sampled per round; raises before training when the federation cannot serve the run config."""
        self.check_federation(num_clients)
        return self["clients-per-round"] or max(1, num_clients // 2)

    @property
    def subnet_cache(self) -> str:
        return self["subnet-cache"] or self["supernet"]

    def to_dict(self) -> dict:
        return dict(self.values)


def _parse(key: str, value: str):
    try:
        return KEYS[key].parse(value)
    except ValueError as error:
        raise ValueError(f"{key}={value!r}: {error}") from None


TYPE_NAMES = {bool: "a bool (true or false)", int: "an integer", float: "a finite number", str: "a string"}


def is_kind(value, kind: type) -> bool:
    """Whether ``value`` is of ``kind`` (bool, int, float or str) as a config value must be: a bool is no number, an
    integral number is a float too, a float is finite."""
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def _type_ok(value, default) -> bool:
    return is_kind(value, type(default))


def _not_allowed(key: str, value) -> str:
    return f"{key}={value!r}: allowed values are {list(KEYS[key].choices)}"


def check_choice(key: str, value) -> None:
    """Raise the run config's own error unless ``value`` is one of ``key``'s allowed values: for code that can be
    called without a validated run config (strategies, clients, tests) and reads the allowed values from here."""
    if value not in KEYS[key].choices:
        raise ValueError(_not_allowed(key, value))


def validate_run_config(raw: dict) -> RunConfig:
    """Check every key and value, parse the list-valued keys; raise ``ValueError`` naming each bad key and what it
    accepts (all of them at once)."""
    errors = []
    for key in raw:
        if key not in KEYS:
            close = difflib.get_close_matches(key, KEYS, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            errors.append(f"unknown key '{key}'{hint}; allowed keys: {', '.join(KEYS)}")
    values, parsed = {}, {}
    for key, spec in KEYS.items():
        value = raw.get(key, spec.default)
        if not _type_ok(value, spec.default):
            errors.append(
                f"{key}={value!r}: expected {TYPE_NAMES[type(spec.default)]}" + (f" {spec.rule}" if spec.check else "")
            )
            continue
        if isinstance(spec.default, float):
            value = float(value)
        if spec.choices and value not in spec.choices:
            errors.append(_not_allowed(key, value))
        if spec.check and not spec.check(value):
            errors.append(f"{key}={value!r}: must be {spec.rule}")
        if spec.parse:
            try:
                parsed[key] = _parse(key, value)
            except ValueError as error:
                errors.append(str(error))
        values[key] = value
    if not errors:
        errors += _cross_checks(values)
    if errors:
        raise ValueError("invalid run config:\n  " + "\n  ".join(errors))
    return RunConfig(values, parsed)


def _fedtgp_generator_params(v: dict) -> int:
    """Parameters of FedTGP's prototype generator, Embedding(C, feature-dim) -> Linear -> ReLU -> Linear of width
    feature-dim (``strategies.fedtopo_baselines.PrototypeGenerator``; a test keeps the two in step)."""
    c, d = DATASETS[v["dataset"]].num_classes, v["feature-dim"]
    return c * d + 2 * (d * d + d)


# method -> what it builds whose size a key sets: (what, the key, float32 parameters given the run config). The
# model-heterogeneous backbones grow only linearly with feature-dim and stay under MAX_MODEL_BYTES over its whole
# range (tested); the supernet's size comes from its JSON and is checked where it is loaded (SupernetSetup.build).
MODEL_SIZES: dict[str, tuple[tuple[str, str, Callable[[dict], int]], ...]] = {
    "fedtgp": (("FedTGP's prototype generator", "feature-dim", _fedtgp_generator_params),),
}


def model_size_problems(v: dict) -> list[str]:
    """What the run would build beyond ``MAX_MODEL_BYTES``, naming the key and the largest value it allows."""
    errors = []
    for what, key, params_of in MODEL_SIZES.get(v["method"], ()):
        params = params_of(v)
        if 4 * params <= MAX_MODEL_BYTES:
            continue
        low, high = int(KEYS[key].check.low), v[key]  # the largest allowed value: params grow with the key
        while low < high:
            middle = (low + high + 1) // 2
            low, high = (middle, high) if 4 * params_of({**v, key: middle}) <= MAX_MODEL_BYTES else (low, middle - 1)
        errors.append(
            f"{key}={v[key]}: {what} would hold {params:,} float32 parameters ({4 * params / 2**30:.4g} GiB), "
            f"beyond the {MAX_MODEL_BYTES / 2**30:g} GiB ceiling on one model; allowed: {key} <= {low} "
            f"with dataset='{v['dataset']}'"
        )
    return errors


def _cross_checks(v: dict) -> list[str]:
    errors = model_size_problems(v)
    classes = DATASETS[v["dataset"]].num_classes
    if v["local-partitioner"] in PATHOLOGICAL_SPLITS and v["classes-per-client"] > classes:
        errors.append(
            f"classes-per-client={v['classes-per-client']}: allowed values are integers in [1, {classes}] "
            f"(dataset='{v['dataset']}' has {classes} classes)"
        )
    if v["test-fraction"] + v["validation-fraction"] >= 1:
        errors.append(
            f"validation-fraction={v['validation-fraction']:g} with test-fraction={v['test-fraction']:g} leaves no "
            "training rows; allowed: test-fraction + validation-fraction < 1"
        )
    if v["budget-max-factor"] and v["budget-max-macs"]:
        errors.append(
            f"budget-max-factor={v['budget-max-factor']:g} and budget-max-macs={v['budget-max-macs']:g} both set "
            "the largest client budget; allowed: at most one of them non-zero"
        )
    if v["data-source"] == "local" and not v["data-path"]:
        errors.append("data-path: required when data-source='local'")
    if v["data-source"] != "local" and v["data-path"]:
        errors.append(
            f"data-path='{v['data-path']}' is only read with data-source='local' (data-source is '{v['data-source']}')"
        )
    if v["data-source"] == "sample" and v["dataset"] != "cifar10":
        errors.append(
            f"dataset='{v['dataset']}': data-source='sample' only bundles cifar10; use data-source='hub' or 'local'"
        )
    if v["resume-from"] and not Path(v["resume-from"]).expanduser().is_absolute():
        errors.append(f"resume-from='{v['resume-from']}': must be an absolute path to a checkpoint.pt or its folder")
    if v["output-dir"] and not Path(v["output-dir"]).expanduser().is_absolute():
        errors.append(
            f"output-dir='{v['output-dir']}': must be an absolute path (the ServerApp's working "
            "directory is the SuperLink's, not yours), or empty for the default"
        )
    return errors
