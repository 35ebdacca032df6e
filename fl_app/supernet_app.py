"""Server and client wiring of the supernet family: FEAST and the methods built on the supernet (SuperFedNAS,
DeepFedNAS, HeteroFL, FedRolex, FedAvg on the smallest model). The server routes, aggregates, evaluates tiers and
writes results (``run_feast``); clients train what they are routed (``train_feast``)."""

from __future__ import annotations

import time
from functools import lru_cache
from logging import DEBUG, INFO

import torch
from flwr.app import Context, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from clients.feast import SubnetPlan, plan_subnets, read_routed, train_subnets
from clients.fiarse import masked_train_costs, train_masked
from clients.local_training import LocalSettings
from clients.scalefl import train_scalefl
from fl_app.data.images import DATASETS
from fl_app.models.elastic_resnet import ElasticResNet
from fl_app.run.checkpoint import (
    load_round_checkpoint,
    restore_rng,
    save_verified,
    supernet_fingerprint,
    write_round_checkpoint,
)
from fl_app.run.config import RunConfig
from fl_app.run.outputs import (
    ClientRecords,
    memory_mb,
    metrics_with_round_costs,
    plot_accuracy_vs_macs,
    prepare_output_dir,
    resume_client_records,
    summary_head,
    write_results,
    write_round_files,
)
from fl_app.run.payload import record_to_state, state_to_record
from fl_app.run.seeds import derived_seed
from fl_app.supernet.evaluation import TierEvaluator
from fl_app.supernet.federation import Federation, client_data, dataset_for, partition_rows, server_splits
from fl_app.supernet.slicing import slice_state, subnet_shapes
from fl_app.supernet.space import load_supernet_config, width_sliced_config
from fl_app.supernet.training_costs import train_costs
from strategies.feast import FeastStrategy
from strategies.fedavg_min import FedAvgMinStrategy
from strategies.fiarse import FiarseStrategy
from strategies.heterofl import FedRolexStrategy, HeteroFLStrategy, rate_tiers
from strategies.rounds import round_options, round_totals
from strategies.scalefl import ScaleFLStrategy
from strategies.superfednas import SuperFedNASStrategy


# -- server ------------------------------------------------------------------------------------------------------
def make_supernet_strategy(
    run: RunConfig,
    fed: Federation,
    budgets: dict[int, float],
    node_of_partition: dict[int, int],
    examples_of_partition: dict[int, int] | None = None,
    labels_of_partition: dict[int, list[int]] | None = None,
) -> FeastStrategy:
    common = dict(
        **round_options(run, len(budgets)),
        routing=run["routing"],
        weighting=run["aggregation-weights"],
        examples_of_partition=examples_of_partition,
        labels_of_partition=labels_of_partition,
    )
    args = (fed.cfg, fed.cache, budgets, node_of_partition)
    method = run["method"]
    if method in ("superfednas", "deepfednas"):
        return SuperFedNASStrategy(
            *args,
            num_rounds=run["num-server-rounds"],
            budget_constrained=run["budget-constrained"],
            subnet_source="space" if method == "superfednas" else "cache",
            beta0=run["maxnet-beta0"],
            beta_final=run["maxnet-final"],
            decay_fraction=run["maxnet-decay-fraction"],
            **{**common, "routing": False},
        )
    if method == "fiarse":  # one magnitude-mask level per HeteroFL tier's MACs: the width-sliced baselines' budgets
        return FiarseStrategy(*args, levels=[t.macs for t in rate_tiers(width_sliced_config(fed.cfg))], **common)
    strategy_class = {
        "feast": FeastStrategy,
        "heterofl": HeteroFLStrategy,
        "fedrolex": FedRolexStrategy,
        "fedavg-min": FedAvgMinStrategy,
        "scalefl": ScaleFLStrategy,
    }[method]
    return strategy_class(*args, **common)


def partition_reports(
    run: RunConfig, fed: Federation, budgets: dict[int, float]
) -> tuple[dict[int, int], dict[int, list[int]]]:
    """What each client must report as num-examples and labels: its partition's size and label set (the server
    splits the data from the seed and the budgets as the clients do)."""
    rows_of = partition_rows(run, len(budgets), [budgets[p] for p in range(len(budgets))])
    train_labels = dataset_for(run, fed.cfg)[0].labels
    examples = {pid: len(rows) for pid, rows in enumerate(rows_of)}
    held = {
        pid: sorted(int(c) for c in torch.unique(train_labels[torch.as_tensor(rows, dtype=torch.long)]))
        for pid, rows in enumerate(rows_of)
    }
    return examples, held


# methods whose clients deploy any cached subnet their budget affords (the others run a width level or the fixed
# smallest model, which their tiers already are): each client is scored with its own largest one
CLIENTS_RUN_CACHED_SUBNETS = ("feast", "superfednas", "deepfednas")


def strategy_tiers(run: RunConfig, fed: Federation, strategy: FeastStrategy):
    """Reporting tiers: the width rates for width-sliced methods, the single fixed model for fedavg-min,
    cached subnets otherwise."""
    if isinstance(strategy, (HeteroFLStrategy, ScaleFLStrategy)):  # ScaleFL: its levels
        return strategy.tiers
    if isinstance(strategy, FedAvgMinStrategy):
        return fed.cache.entries[:1]
    if isinstance(strategy, FiarseStrategy):  # the full model masked at each level's MACs
        return strategy.tiers
    return fed.tiers(run)


def prepare_feast(run: RunConfig) -> None:
    """Decode the dataset and build the subnet shapes (the meta-device model) before the nodes have answered."""
    cfg = load_supernet_config(run["supernet"], n_classes=DATASETS[run["dataset"]].num_classes)
    dataset_for(run, cfg)
    subnet_shapes(cfg, cfg.max_subnet())


def run_feast(grid: Grid, run: RunConfig, nodes: dict[int, dict]) -> None:
    """FEAST and the methods built on the supernet: route, train, aggregate, evaluate tiers, write results."""
    num_clients = len(nodes)
    fed = Federation.build(run, num_clients)
    # a node's declared budget outside the supernet's range fails the run here, before training, as a malformed
    # partition answer does at discovery (the budgets are fixed for the run: the γ-allocation splits rows by them)
    budgets = fed.client_budgets(
        run,
        {pid: info["budget-macs"] for pid, info in nodes.items() if "budget-macs" in info},
        {pid: info["node_id"] for pid, info in nodes.items()},
    )
    examples, held = partition_reports(run, fed, budgets)
    strategy = make_supernet_strategy(
        run, fed, budgets, {pid: info["node_id"] for pid, info in nodes.items()}, examples, held
    )
    tiers = strategy_tiers(run, fed, strategy)
    resumed = load_round_checkpoint(run["resume-from"], run, num_clients) if run["resume-from"] else None
    out_dir = prepare_output_dir(run["output-dir"], run["method"], run["dataset"], run["seed"])

    train, test = dataset_for(run, fed.cfg)
    splits = server_splits(run, train)
    torch.manual_seed(run["seed"])
    initial = strategy.global_model().state_dict()
    initial = {k: v for k, v in initial.items() if not k.endswith("num_batches_tracked")}
    log(
        INFO,
        "%s on %s: %d clients, budgets %s MMACs, tiers %s MMACs, output %s",
        run["method"],
        run["dataset"],
        num_clients,
        [round(b / 1e6, 2) for b in budgets.values()],
        [round(t.macs / 1e6, 2) for t in tiers],
        out_dir,
    )
    evaluator = TierEvaluator(
        strategy.model_cfg,
        tiers,
        budgets.values(),
        train.subset(splits.calibration),
        train.subset(splits.validation),
        test,
        run["eval-every"],
        run["num-server-rounds"],
        record_to_state,
        population_tier=run["population-tier"],
        state_of_tier=getattr(strategy, "tier_state", None),
        evaluate=getattr(strategy, "evaluate_tier", None),  # ScaleFL scores a level's deepest exit
        client_subnets=(
            [fed.cache.local_max(budgets[p]) for p in sorted(budgets)]
            if run["method"] in CLIENTS_RUN_CACHED_SUBNETS
            else None
        ),
    )
    first_round = 1
    if resumed is not None:
        strategy.restore_state(resumed["strategy"])
        evaluator.rows, evaluator.last = resumed["metrics"]["rows"], resumed["metrics"]["last"]
        initial, first_round = resumed["global_state"], resumed["round"] + 1
        restore_rng(resumed["rng"])
        log(INFO, "Resuming from %s after round %d", run["resume-from"], resumed["round"])

    round_started = time.time()

    def metrics_rows() -> list[dict]:  # metrics.csv: the evaluated tiers with their round's loss and bytes
        return metrics_with_round_costs(evaluator.rows, strategy.rounds)

    def round_done(server_round: int) -> None:
        nonlocal round_started
        log_ = strategy.rounds[server_round]
        log_.seconds, round_started = time.time() - round_started, time.time()
        log_.server_rss_mb, log_.server_peak_rss_mb = memory_mb()
        log(
            INFO,
            "round %d: %.1fs, server memory %.0f MiB (peak %.0f)",
            server_round,
            log_.seconds,
            log_.server_rss_mb,
            log_.server_peak_rss_mb,
        )
        write_round_files(out_dir, metrics_rows(), strategy.rounds, clients)
        every = run["checkpoint-every"]
        if every and server_round % every == 0 and server_round < run["num-server-rounds"]:
            path = write_round_checkpoint(
                out_dir,
                server_round,
                run,
                num_clients,
                strategy.global_state,
                strategy.checkpoint_state(),
                {"rows": evaluator.rows, "last": evaluator.last},
                clients.checkpoint_state(),
            )
            log(INFO, "Checkpoint after round %d: %s", server_round, path)

    started = time.time()
    clients = ClientRecords(
        {pid: info["node_id"] for pid, info in nodes.items()}, budget_macs=budgets, num_examples=examples
    )
    if resumed is not None:
        resume_client_records(clients, resumed, run["resume-from"])

    def summary_of(error: str | None) -> dict:
        return {
            **summary_head(run, error),
            "supernet": fed.cfg.name,
            "num_clients": num_clients,
            "clients_per_round": run.clients_per_round(num_clients),
            "tiers": evaluator.last.get("tiers", []),
            "population_weighted_accuracy": evaluator.last.get("population_weighted_accuracy"),
            "client_subnet_accuracy": evaluator.last.get("client_subnet_accuracy"),
            **({"client_subnets": evaluator.last["client_subnets"]} if "client_subnets" in evaluator.last else {}),
            **round_totals(strategy.rounds),
            "budgets": [budgets[p] for p in sorted(budgets)],
            "wall_seconds": round(time.time() - started, 1),
            "resumed_after_round": first_round - 1,
            "run_config": run.to_dict(),
        }

    try:
        result = strategy.start(
            clients.wrap(grid),
            state_to_record(initial),
            num_rounds=run["num-server-rounds"],
            timeout=run["round-timeout"],
            evaluate_fn=evaluator,
            first_round=first_round,
            round_done=round_done,
        )
    except Exception as failure:  # keep what the finished rounds and the failed one counted, then fail the run
        summary = summary_of(f"{type(failure).__name__}: {failure}")
        write_results(out_dir, summary, metrics_rows(), strategy.rounds, clients)
        raise
    elapsed = time.time() - started

    final_state = strategy.global_state or record_to_state(result.arrays)
    summary = summary_of(None)
    save_verified(
        out_dir / "supernet.pt",
        {
            "supernet": strategy.model_cfg.to_dict(),
            "state_dict": {k: torch.from_numpy(v) for k, v in final_state.items()},
            "run_config": run.to_dict(),
            "num_clients": num_clients,
            "budgets": summary["budgets"],
        },
        supernet_fingerprint(run),
    )
    plot_accuracy_vs_macs(
        out_dir / "accuracy_vs_macs.png",
        {run["method"]: [(t["macs"], t["accuracy"]) for t in summary["tiers"]]},
        f"{run['method']} on {run['dataset']} ({run['num-server-rounds']} rounds)",
    )
    write_results(out_dir, summary, metrics_rows(), strategy.rounds, clients)
    tiers_text = ", ".join(f"{t['macs'] / 1e6:.2f}M: {100 * t['accuracy']:.1f}%" for t in summary["tiers"])
    log(
        INFO,
        "Done in %.0fs. Tier accuracy: %s; population-weighted %.1f%% by tier, %.1f%% by each client's subnet",
        elapsed,
        tiers_text,
        100 * (summary["population_weighted_accuracy"] or 0),
        100 * (summary["client_subnet_accuracy"] or 0),
    )
    log(INFO, "Results written to %s", out_dir)


# -- client ------------------------------------------------------------------------------------------------------
@lru_cache(maxsize=2)
def _federation(run_items: tuple, num_partitions: int) -> Federation:
    return Federation.build(RunConfig(dict(run_items)), num_partitions)


def train_feast(msg: Message, run: RunConfig, pid: int, num: int, context: Context) -> Message:
    """FEAST and the supernet / width-sliced baselines: the server says what is routed and, for the baselines,
    which single subnet to train; FEAST clients plan their max/min/random step themselves. Stateless between rounds
    (``context`` unused): everything arrives with the message."""
    started, began = time.perf_counter(), time.time()
    fed = _federation(tuple(sorted(run.values.items())), num)
    # what the server sent, checked before anything is trained (a bad broadcast raises: an error reply)
    routed = read_routed(msg.content, run, fed.cfg, fed.budget_range, pid, num)
    if run["method"] == "scalefl":  # a level with its early exits, trained by self-distillation
        return train_scalefl(msg, routed, run, pid, num, started)
    cfg, bounds, received, dtype = routed.cfg, routed.bounds, routed.received, routed.dtype

    model = ElasticResNet(cfg, bounds)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in received.items()}, strict=False)
    model.set_width_scaler(routed.width_rate)
    if routed.arch is not None:
        plan, returned = SubnetPlan(routed.arch, None, []), subnet_shapes(cfg, routed.arch)
    else:
        plan = plan_subnets(fed.cache, routed.budget, bounds, run.train_subnets)
        returned = {k: v.shape for k, v in received.items()}
    data = client_data(run, pid, num, routed.partition_budgets)  # declared budgets shape the split
    labels = sorted(int(c) for c in torch.unique(data.labels))
    logit_mask = None
    if routed.mask_labels:  # HeteroFL: only the classifier rows of labels held here are trained
        logit_mask = torch.zeros(cfg.n_classes, dtype=torch.bool)
        logit_mask[labels] = True
    settings = LocalSettings.from_run(run, routed.lr, derived_seed(run["seed"], routed.server_round, pid))
    if routed.threshold is None:
        metrics = train_subnets(model, plan, data, settings, logit_mask)
        samples = metrics["local-steps"] * settings.batch_size
        costs = train_costs(cfg, plan.largest, plan.smallest, plan.between, samples)
    else:  # FIARSE: the full model under its magnitude mask, costed by the MACs the mask keeps
        metrics = train_masked(model, routed.threshold, data, settings)
        costs = masked_train_costs(cfg, received, routed.threshold, metrics["local-steps"] * settings.batch_size)

    # send back exactly what was received, cut to the trained subnet when one was assigned
    trained = slice_state(model.state_dict(), {k: v for k, v in returned.items() if k in received})
    reply = RecordDict(
        {
            "arrays": state_to_record(trained, dtype),
            "metrics": MetricRecord(
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
    # wall-clock span of this client's work, for the run's timeline (experiments.bench_default_run --timeline)
    log(
        DEBUG,
        "client timeline: partition %d round %s from %.3f to %.3f",
        pid,
        routed.server_round,
        began,
        time.time(),
    )
    return Message(reply, reply_to=msg)
