"""Server and client wiring of the supernet family: FEAST and the methods built on the supernet (SuperFedNAS,
DeepFedNAS, HeteroFL, FedRolex, ScaleFL, FIARSE, FedAvg on the smallest model), one row each in
``SUPERNET_METHOD_TABLE``. The server routes, aggregates, evaluates tiers and writes results (``run_supernet``: a
``FederatedRun`` told what this family does differently by ``SupernetFamily``); clients train what they are routed
(``train_supernet_client``)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import lru_cache, partial
from logging import DEBUG
from pathlib import Path
from typing import Callable

import torch
from flwr.app import Context, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from clients.feast import train_subnets
from clients.fiarse import fiarse_settings, masked_train_costs, train_masked
from clients.local_training import LocalSettings
from clients.scalefl import train_scalefl
from clients.supernet_instruction import read_instruction
from fl_app.data.images import DATASETS
from fl_app.models.elastic_resnet import ElasticResNet
from fl_app.models.supernet_space import load_supernet_config, width_sliced_config
from fl_app.run.checkpoint import save_verified, supernet_checkpoint_state, supernet_fingerprint, supernet_state_of
from fl_app.run.config import RunConfig
from fl_app.run.lifecycle import FederatedRun, MethodFamily
from fl_app.run.node_query import BUDGET_MACS, NODE_ID
from fl_app.run.outputs import metrics_with_round_costs, plot_accuracy_vs_macs
from fl_app.run.payload import record_to_state, state_to_record
from fl_app.run.phase_times import PhaseTimer
from fl_app.run.records import ARRAYS_RECORD, METRICS_RECORD
from fl_app.run.seeds import derived_seed
from fl_app.supernet.evaluation import TierEvaluator
from fl_app.supernet.shared_setup import (
    SupernetSetup,
    client_data,
    dataset_for,
    partition_rows,
    server_splits,
    server_test_set,
)
from fl_app.supernet.slicing import slice_state, subnet_shapes
from fl_app.supernet.subnets import SubnetPlan, plan_subnets
from fl_app.supernet.training_costs import train_costs
from strategies.feast import FeastStrategy
from strategies.fedavg_min import FedAvgMinStrategy
from strategies.fiarse import FiarseStrategy
from strategies.heterofl import FedRolexStrategy, HeteroFLStrategy, rate_tiers
from strategies.rounds import round_options
from strategies.scalefl import ScaleFLStrategy
from strategies.superfednas import SuperFedNASStrategy
from strategies.supernet_base import SupernetStrategy


# -- the methods: one row each ------------------------------------------------------------------------------------
def cached_tiers(run: RunConfig, setup: SupernetSetup, strategy: SupernetStrategy) -> list:
    """The cached subnets the run's ``tiers`` name (methods whose clients run searched subnets)."""
    return setup.tiers(run)


def own_tiers(run: RunConfig, setup: SupernetSetup, strategy: SupernetStrategy) -> list:
    """The strategy's own levels: width rates (HeteroFL, FedRolex), ScaleFL's levels, FIARSE's mask levels."""
    return strategy.tiers


def smallest_tier(run: RunConfig, setup: SupernetSetup, strategy: SupernetStrategy) -> list:
    """The one fixed model every client trains (FedAvg on the smallest cached subnet)."""
    return setup.cache.entries[:1]


def maxnet_options(run: RunConfig, setup: SupernetSetup, subnet_source: str) -> dict:
    """SuperFedNAS / DeepFedNAS: the MaxNet schedule over the run, subnets drawn from the space or the cache, and no
    slicing to the budget (every client receives the whole supernet)."""
    return dict(
        num_rounds=run["num-server-rounds"],
        budget_constrained=run["budget-constrained"],
        subnet_source=subnet_source,
        beta0=run["maxnet-beta0"],
        beta_final=run["maxnet-final"],
        decay_fraction=run["maxnet-decay-fraction"],
        slice_to_budget=False,
    )


def fiarse_options(run: RunConfig, setup: SupernetSetup) -> dict:
    """One magnitude-mask level per HeteroFL tier's MACs: the width-sliced baselines' budgets (under the reference
    mapping, the reporting tiers only: each client has its own mask size)."""
    return {"levels": [t.macs for t in rate_tiers(width_sliced_config(setup.cfg))], "mapping": run["fiarse-mapping"]}


@dataclass(frozen=True)
class SupernetMethod:
    """How the server builds one supernet-family method and what it reports."""

    strategy: type[SupernetStrategy]
    tiers: Callable[[RunConfig, SupernetSetup, SupernetStrategy], list]  # the reporting tiers
    options: Callable[[RunConfig, SupernetSetup], dict] = lambda run, setup: {}  # the strategy's own keyword arguments
    # clients deploy any cached subnet their budget affords, so each is also scored with its own largest one (the
    # other methods' clients run a width level or the fixed smallest model, which their tiers already are)
    clients_run_cached_subnets: bool = False


SUPERNET_METHOD_TABLE = {
    "feast": SupernetMethod(FeastStrategy, cached_tiers, clients_run_cached_subnets=True),
    "superfednas": SupernetMethod(
        SuperFedNASStrategy,
        cached_tiers,
        partial(maxnet_options, subnet_source="space"),
        clients_run_cached_subnets=True,
    ),
    "deepfednas": SupernetMethod(
        SuperFedNASStrategy,
        cached_tiers,
        partial(maxnet_options, subnet_source="cache"),
        clients_run_cached_subnets=True,
    ),
    "heterofl": SupernetMethod(HeteroFLStrategy, own_tiers),
    "fedrolex": SupernetMethod(FedRolexStrategy, own_tiers),
    "scalefl": SupernetMethod(ScaleFLStrategy, own_tiers, lambda run, setup: {"rule": run["scalefl-levels"]}),
    "fiarse": SupernetMethod(FiarseStrategy, own_tiers, fiarse_options),
    "fedavg-min": SupernetMethod(FedAvgMinStrategy, smallest_tier),
}


def supernet_method(run: RunConfig) -> SupernetMethod:
    if run["method"] not in SUPERNET_METHOD_TABLE:
        raise ValueError(f"method='{run['method']}': allowed supernet-family methods are {list(SUPERNET_METHOD_TABLE)}")
    return SUPERNET_METHOD_TABLE[run["method"]]


# -- server ------------------------------------------------------------------------------------------------------
def make_supernet_strategy(
    run: RunConfig,
    setup: SupernetSetup,
    budgets: dict[int, float],
    node_of_partition: dict[int, int],
    examples_of_partition: dict[int, int] | None = None,
    labels_of_partition: dict[int, list[int]] | None = None,
) -> SupernetStrategy:
    """The method's strategy (``SUPERNET_METHOD_TABLE``) with the options every supernet method takes."""
    method = supernet_method(run)
    common = dict(
        **round_options(run, len(budgets)),
        slice_to_budget=run["routing"],
        weighting=run["aggregation-weights"],
        robust_aggregation=run["robust-aggregation"],
        examples_of_partition=examples_of_partition,
        labels_of_partition=labels_of_partition,
        train_subnets=run.train_subnets,
    )
    return method.strategy(
        setup.cfg, setup.cache, budgets, node_of_partition, **{**common, **method.options(run, setup)}
    )


def partition_reports(
    run: RunConfig, setup: SupernetSetup, budgets: dict[int, float]
) -> tuple[dict[int, int], dict[int, list[int]]]:
    """What each client must report as num-examples and labels: its partition's size and label set (the server
    splits the data from the seed and the budgets as the clients do)."""
    rows_of = partition_rows(run, len(budgets), [budgets[p] for p in range(len(budgets))])
    train_labels = dataset_for(run, setup.cfg)[0].labels
    examples = {pid: len(rows) for pid, rows in enumerate(rows_of)}
    held = {
        pid: sorted(int(c) for c in torch.unique(train_labels[torch.as_tensor(rows, dtype=torch.long)]))
        for pid, rows in enumerate(rows_of)
    }
    return examples, held


def prepare_supernet(run: RunConfig) -> None:
    """Decode the dataset and build the subnet shapes (the meta-device model) before the nodes have answered."""
    cfg = load_supernet_config(run["supernet"], n_classes=DATASETS[run["dataset"]].num_classes)
    dataset_for(run, cfg)
    subnet_shapes(cfg, cfg.max_subnet())


class SupernetFamily(MethodFamily):
    """What the supernet methods do in a ``FederatedRun``: every client has a budget (its node's declared
    ``budget-macs``, else the drawn one), the server evaluates the reporting tiers on its held-out data after each
    ``eval-every`` rounds (metrics.csv), checkpoints carry the global model and the metrics so far, a finished run
    writes the global model to supernet.pt, and the summary reports the tiers' accuracy (``summary_fields``)."""

    def __init__(self, run: RunConfig, nodes: dict[int, dict]):
        self.run, self.method, self.num_clients = run, supernet_method(run), len(nodes)
        node_of_partition = {pid: info[NODE_ID] for pid, info in nodes.items()}
        self.setup = SupernetSetup.build(run, self.num_clients)
        # a node's declared budget outside the supernet's range fails the run here, before training, as a malformed
        # partition answer does at discovery (the budgets are fixed for the run: the γ-allocation splits rows by them)
        declared = {pid: info[BUDGET_MACS] for pid, info in nodes.items() if BUDGET_MACS in info}
        self.budgets = self.setup.client_budgets(run, declared, node_of_partition)
        examples, held = partition_reports(run, self.setup, self.budgets)
        self.strategy = make_supernet_strategy(run, self.setup, self.budgets, node_of_partition, examples, held)
        self.tiers = self.method.tiers(run, self.setup, self.strategy)
        self.fingerprint = supernet_fingerprint(run)
        self.client_columns = {"budget_macs": self.budgets, "num_examples": examples}

    def prepare(self, out_dir: Path) -> None:
        run, setup, strategy = self.run, self.setup, self.strategy
        train, test = dataset_for(run, setup.cfg)
        splits = server_splits(run, train)
        torch.manual_seed(run["seed"])  # the global model's initial weights
        initial = strategy.global_model().state_dict()
        self.initial = {k: v for k, v in initial.items() if not k.endswith("num_batches_tracked")}
        self.evaluate_fn = TierEvaluator(
            strategy.model_cfg,
            self.tiers,
            self.budgets.values(),
            train.subset(splits.calibration),
            train.subset(splits.validation),
            server_test_set(run, test),
            run["eval-every"],
            run["num-server-rounds"],
            record_to_state,
            population_tier=run["population-tier"],
            scoring=strategy,  # how the method scores a tier (FIARSE masks it, ScaleFL scores its deepest exit)
            client_subnets=(
                [setup.cache.local_max(self.budgets[p]) for p in sorted(self.budgets)]
                if self.method.clients_run_cached_subnets
                else None
            ),
        )

    def restore(self, blob: dict, path: Path) -> None:
        blob = supernet_state_of(blob)
        self.strategy.restore_state(blob["strategy"])
        self.evaluate_fn.rows, self.evaluate_fn.last = blob["metrics"]["rows"], blob["metrics"]["last"]
        self.initial = blob["global_state"]

    def describe(self) -> str:
        budgets = [round(b / 1e6, 2) for b in self.budgets.values()]
        return f"budgets {budgets} MMACs, tiers {[round(t.macs / 1e6, 2) for t in self.tiers]} MMACs"

    def initial_arrays(self):
        return state_to_record(self.initial)

    def metrics_rows(self) -> list[dict]:  # the evaluated tiers with their round's loss and bytes
        return metrics_with_round_costs(self.evaluate_fn.rows, self.strategy.rounds)

    def checkpoint_state(self) -> dict:
        metrics = {"rows": self.evaluate_fn.rows, "last": self.evaluate_fn.last}
        return supernet_checkpoint_state(self.strategy.global_state, self.strategy.checkpoint_state(), metrics)

    def summary_fields(self) -> dict:
        last = self.evaluate_fn.last
        return {
            "supernet": self.setup.cfg.name,
            "tiers": last.get("tiers", []),
            "population_weighted_accuracy": last.get("population_weighted_accuracy"),
            "client_subnet_accuracy": last.get("client_subnet_accuracy"),
            "population_accuracies": last.get("population_accuracies"),
            **({"client_subnets": last["client_subnets"]} if "client_subnets" in last else {}),
            "budgets": [self.budgets[p] for p in sorted(self.budgets)],
        }

    def save_final(self, out_dir: Path, result) -> None:
        final_state = self.strategy.global_state or record_to_state(result.arrays)
        blob = {
            "supernet": self.strategy.model_cfg.to_dict(),
            "state_dict": {k: torch.from_numpy(v) for k, v in final_state.items()},
            "run_config": self.run.to_dict(),
            "num_clients": self.num_clients,
            "budgets": [self.budgets[p] for p in sorted(self.budgets)],
        }
        save_verified(out_dir / "supernet.pt", blob, self.fingerprint)

    def plot(self, out_dir: Path, summary: dict) -> None:
        run = self.run
        plot_accuracy_vs_macs(
            out_dir / "accuracy_vs_macs.png",
            {run["method"]: [(t["macs"], t["accuracy"]) for t in summary["tiers"]]},
            f"{run['method']} on {run['dataset']} ({run['num-server-rounds']} rounds)",
        )

    def outcome(self, summary: dict) -> str:
        tiers = ", ".join(f"{t['macs'] / 1e6:.2f}M: {100 * t['accuracy']:.1f}%" for t in summary["tiers"])
        by_tier, by_client = summary["population_weighted_accuracy"], summary["client_subnet_accuracy"]
        return (
            f". Tier accuracy: {tiers}; population-weighted {100 * (by_tier or 0):.1f}% by tier, "
            f"{100 * (by_client or 0):.1f}% by each client's subnet"
        )


def run_supernet(grid: Grid, run: RunConfig, nodes: dict[int, dict]) -> dict:
    """FEAST and the methods built on the supernet: route, train, aggregate, evaluate tiers, write results; how
    their runs differ from the other family's is ``SupernetFamily``."""
    return FederatedRun(run, nodes, SupernetFamily(run, nodes)).execute(grid)


# -- client ------------------------------------------------------------------------------------------------------
@lru_cache(maxsize=2)
def _supernet_setup(run_items: tuple, num_partitions: int) -> SupernetSetup:
    return SupernetSetup.build(RunConfig(dict(run_items)), num_partitions)


def _subnet_plan(instruction, setup: SupernetSetup, run: RunConfig) -> tuple[SubnetPlan, dict]:
    """(what this client trains, the shapes it sends back): the one subnet the server assigned (the baselines) and
    its slice, else its own max/min/random plan within the routed bounds and everything received."""
    if instruction.arch is not None:
        return SubnetPlan(instruction.arch, None, []), subnet_shapes(instruction.cfg, instruction.arch)
    plan = plan_subnets(setup.cache, instruction.budget, instruction.bounds, run.train_subnets)
    return plan, {k: v.shape for k, v in instruction.received.items()}


def _logit_mask(n_classes: int, labels: list[int]) -> torch.Tensor:
    """HeteroFL: only the classifier rows of the labels held here are trained."""
    mask = torch.zeros(n_classes, dtype=torch.bool)
    mask[labels] = True
    return mask


def train_supernet_client(msg: Message, run: RunConfig, pid: int, num: int, context: Context) -> Message:
    """FEAST and the supernet / width-sliced baselines: the server says what is routed and, for the baselines,
    which single subnet to train; FEAST clients plan their max/min/random step themselves. Stateless between rounds
    (``context`` unused): everything arrives with the message."""
    started, began, timer = time.perf_counter(), time.time(), PhaseTimer()
    setup = _supernet_setup(tuple(sorted(run.values.items())), num)
    # what the server sent, checked before anything is trained (a bad broadcast raises: an error reply)
    instruction = read_instruction(msg.content, run, setup.cfg, setup.budget_range, pid, num)
    timer.lap("decode")
    if run["method"] == "scalefl":  # a level with its early exits, trained by self-distillation
        return train_scalefl(msg, instruction, run, pid, num, started)
    cfg, bounds, received, dtype = instruction.cfg, instruction.bounds, instruction.received, instruction.dtype

    model = ElasticResNet(cfg, bounds)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in received.items()}, strict=False)
    model.set_width_scaler(instruction.width_rate)
    plan, returned = _subnet_plan(instruction, setup, run)
    timer.lap("model")
    data = client_data(run, pid, num, instruction.partition_budgets)  # declared budgets shape the split
    labels = sorted(int(c) for c in torch.unique(data.labels))
    logit_mask = _logit_mask(cfg.n_classes, labels) if instruction.mask_labels else None
    settings = LocalSettings.from_run(run, instruction.lr, derived_seed(run["seed"], instruction.server_round, pid))
    timer.lap("data")
    if instruction.threshold is None:
        metrics = train_subnets(model, plan, data, settings, logit_mask)
        samples = metrics["local-steps"] * settings.batch_size
        costs = train_costs(cfg, plan.largest, plan.smallest, plan.between, samples)
    else:  # FIARSE: the full model under its magnitude mask, costed by the MACs the mask keeps
        settings = fiarse_settings(run, settings)
        metrics = train_masked(model, instruction.threshold, data, settings)
        costs = masked_train_costs(cfg, received, instruction.threshold, metrics["local-steps"] * settings.batch_size)

    timer.lap("steps")
    # send back exactly what was received, cut to the trained subnet when one was assigned
    trained = slice_state(model.state_dict(), {k: v for k, v in returned.items() if k in received})
    reply = RecordDict(
        {
            ARRAYS_RECORD: state_to_record(trained, dtype),
            METRICS_RECORD: MetricRecord(
                {
                    "num-examples": len(data),
                    "partition-id": pid,
                    "labels": labels,
                    **metrics,
                    **costs,
                    "client-seconds": time.perf_counter() - started,
                }
            ),
        }
    )
    timer.lap("encode")
    log(DEBUG, timer.line("client", instruction.server_round, pid))
    # wall-clock span of this client's work, for a run's timeline (experiments.benchmarks.bench_default_run --timeline)
    log(
        DEBUG,
        "client timeline: partition %d round %s from %.3f to %.3f",
        pid,
        instruction.server_round,
        began,
        time.time(),
    )
    return Message(reply, reply_to=msg)
