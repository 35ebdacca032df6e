"""ServerApp: validates the run config, maps nodes to partitions, wires the method's strategy, writes results."""

from __future__ import annotations

import time
from logging import INFO

import torch
from flwr.app import Context, Message
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp

from fl_app.data.images import DATASETS
from fl_app.models.elastic_resnet import ElasticResNet
from fl_app.run.checkpoint import (
    load_round_checkpoint,
    restore_rng,
    save_verified,
    supernet_fingerprint,
    write_round_checkpoint,
)
from fl_app.run.config import SUPERNET_METHODS, RunConfig, validate_run_config
from fl_app.run.lr_schedule import lr_schedule
from fl_app.run.outputs import (
    ClientRecords,
    memory_mb,
    plot_accuracy_vs_macs,
    prepare_output_dir,
    write_json,
    write_round_files,
)
from fl_app.run.payload import record_to_state, state_to_record
from fl_app.supernet.evaluation import TierEvaluator
from fl_app.supernet.federation import Federation, dataset_for, partition_rows, server_splits
from fl_app.supernet.slicing import subnet_shapes
from fl_app.supernet.space import load_supernet_config
from strategies.feast import FeastStrategy
from strategies.fedavg_min import FedAvgMinStrategy
from strategies.heterofl import FedRolexStrategy, HeteroFLStrategy
from strategies.rounds import partition_info, partition_query, round_totals
from strategies.superfednas import SuperFedNASStrategy

app = ServerApp()


def discover_nodes(grid: Grid, timeout: float = 60.0, while_waiting=None, settle: float = 1.0) -> dict[int, dict]:
    """Ask every connected node for its partition id (and optional budget); returns partition id -> info.

    The queries go out as soon as a node is seen; ``while_waiting()`` (the server's own preparation) runs while the
    nodes start their ClientApps and answer. Nodes that connect later are asked too, until every query is answered
    and no new node has appeared for ``settle`` seconds (SuperNodes of a deployment connect one by one).
    ``timeout`` bounds the wait for a first node and, counted after the preparation, the wait for the answers."""
    deadline = time.time() + timeout
    while not grid.get_node_ids() and time.time() < deadline:  # in a deployment SuperNodes may still be connecting
        time.sleep(0.2)
    asked: set[int] = set()
    pending: set[str] = set()  # ids of queries without a reply yet (a pulled reply is gone from the grid)
    replies: list[Message] = []

    last_new = time.time()

    def ask_new_nodes() -> None:
        nonlocal last_new
        new = sorted(set(grid.get_node_ids()) - asked)
        if new:
            asked.update(new)
            last_new = time.time()
            pending.update(grid.push_messages([partition_query(n) for n in new]))

    ask_new_nodes()
    if not asked:
        raise RuntimeError("no SuperNode connected")
    if while_waiting is not None:
        while_waiting()
    deadline = time.time() + timeout  # many simulated nodes share few actors: answers may take a while
    while time.time() < deadline:
        ask_new_nodes()
        pulled = list(grid.pull_messages(pending)) if pending else []
        pending.difference_update(reply.metadata.reply_to_message_id for reply in pulled)
        replies += pulled
        if not pending and time.time() - last_new >= settle:
            break
        time.sleep(0.1)
    nodes = {}
    for reply in replies:
        info = partition_info(reply)
        pid = info["partition-id"]
        if pid in nodes:
            raise ValueError(f"two SuperNodes claim partition-id={pid} (node-config)")
        nodes[pid] = info
    if len(nodes) < len(asked):
        raise RuntimeError(
            f"{len(asked) - len(nodes)} of {len(asked)} nodes did not answer the partition query within {timeout:.0f}s"
        )
    return nodes


def check_federation(nodes: dict[int, dict]) -> None:
    """The SuperNodes that answered must hold partitions 0..N-1 of one federation of N: each one's num-partitions
    is N (a node set up for another federation would train on the wrong rows)."""
    n = len(nodes)
    if sorted(nodes) != list(range(n)):
        raise ValueError(f"partition-id values {sorted(nodes)} must be 0..{n - 1} (node-config)")
    for pid, info in sorted(nodes.items()):
        if info["num-partitions"] != n:
            raise ValueError(
                f"SuperNode {info['node_id']} (partition-id={pid}) has num-partitions="
                f"{info['num-partitions']} in its node-config, but {n} SuperNodes answered (partition-id "
                f"0..{n - 1}): every SuperNode needs num-partitions={n}"
            )


@app.main()
def main(grid: Grid, context: Context) -> None:
    run = validate_run_config(dict(context.run_config))
    nodes = discover_nodes(
        grid, timeout=run["round-timeout"], while_waiting=lambda: SERVER_PREPARE.get(run["method"], lambda r: None)(run)
    )
    check_federation(nodes)
    SERVER_RUNS[run["method"]](grid, run, nodes)


def make_supernet_strategy(
    run: RunConfig,
    fed: Federation,
    budgets: dict[int, float],
    node_of_partition: dict[int, int],
    examples_of_partition: dict[int, int] | None = None,
) -> FeastStrategy:
    common = dict(
        clients_per_round=run.clients_per_round(len(budgets)),
        seed=run["seed"],
        routing=run["routing"],
        payload_dtype=run["payload-dtype"],
        weighting=run["aggregation-weights"],
        min_reply_fraction=run["min-reply-fraction"],
        lr_of_round=lr_schedule(run),
        examples_of_partition=examples_of_partition,
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
    strategy_class = {
        "feast": FeastStrategy,
        "heterofl": HeteroFLStrategy,
        "fedrolex": FedRolexStrategy,
        "fedavg-min": FedAvgMinStrategy,
    }[method]
    return strategy_class(*args, **common)


def strategy_tiers(run: RunConfig, fed: Federation, strategy: FeastStrategy):
    """Reporting tiers: the width rates for width-sliced methods, the single fixed model for fedavg-min,
    cached subnets otherwise."""
    if isinstance(strategy, HeteroFLStrategy):
        return strategy.tiers
    if isinstance(strategy, FedAvgMinStrategy):
        return fed.cache.entries[:1]
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
    budgets = fed.client_budgets(
        run, {pid: info["budget-macs"] for pid, info in nodes.items() if "budget-macs" in info}
    )
    examples = {
        pid: len(rows)
        for pid, rows in enumerate(partition_rows(run, num_clients, [budgets[p] for p in range(num_clients)]))
    }
    strategy = make_supernet_strategy(
        run, fed, budgets, {pid: info["node_id"] for pid, info in nodes.items()}, examples
    )
    tiers = strategy_tiers(run, fed, strategy)
    resumed = load_round_checkpoint(run["resume-from"], run, num_clients) if run["resume-from"] else None
    out_dir = prepare_output_dir(run["output-dir"], run["method"], run["dataset"], run["seed"])

    train, test = dataset_for(run, fed.cfg)
    splits = server_splits(run, train)
    torch.manual_seed(run["seed"])
    initial = ElasticResNet(strategy.model_cfg).state_dict()
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
    )
    first_round = 1
    if resumed is not None:
        strategy.restore_state(resumed["strategy"])
        evaluator.rows, evaluator.last = resumed["metrics"]["rows"], resumed["metrics"]["last"]
        initial, first_round = resumed["global_state"], resumed["round"] + 1
        restore_rng(resumed["rng"])
        log(INFO, "Resuming from %s after round %d", run["resume-from"], resumed["round"])

    round_started = time.time()

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
        write_round_files(out_dir, evaluator.rows, strategy.rounds, clients)
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
            )
            log(INFO, "Checkpoint after round %d: %s", server_round, path)

    started = time.time()
    clients = ClientRecords(budgets, examples, {pid: info["node_id"] for pid, info in nodes.items()})

    def summary_of(error: str | None) -> dict:
        return {
            "method": run["method"],
            "dataset": run["dataset"],
            "rounds": run["num-server-rounds"],
            "seed": run["seed"],
            "completed": error is None,
            "error": error,
            "supernet": fed.cfg.name,
            "num_clients": num_clients,
            "clients_per_round": run.clients_per_round(num_clients),
            "tiers": evaluator.last.get("tiers", []),
            "population_weighted_accuracy": evaluator.last.get("population_weighted_accuracy"),
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
        write_round_files(out_dir, evaluator.rows, strategy.rounds, clients)
        write_json(out_dir / "summary.json", summary_of(f"{type(failure).__name__}: {failure}"))
        raise
    elapsed = time.time() - started

    final_state = strategy.global_state or record_to_state(result.arrays)
    rounds = strategy.rounds
    summary = summary_of(None)
    write_round_files(out_dir, evaluator.rows, rounds, clients)
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
    write_json(out_dir / "summary.json", summary)
    tiers_text = ", ".join(f"{t['macs'] / 1e6:.2f}M: {100 * t['accuracy']:.1f}%" for t in summary["tiers"])
    log(
        INFO,
        "Done in %.0fs. Tier accuracy: %s; population-weighted %.1f%%",
        elapsed,
        tiers_text,
        100 * (summary["population_weighted_accuracy"] or 0),
    )
    log(INFO, "Results written to %s", out_dir)


# method -> server run; every method in fl_app.run.config.METHODS has an entry
from fl_app.hetero_app import HETERO_METHODS, run_hetero  # noqa: E402  (model-heterogeneous methods)

SERVER_RUNS = {**dict.fromkeys(SUPERNET_METHODS, run_feast), **dict.fromkeys(HETERO_METHODS, run_hetero)}
# work a server run can do before it knows its nodes, done while they start up (results are cached per process)
SERVER_PREPARE = dict.fromkeys(SUPERNET_METHODS, prepare_feast)
