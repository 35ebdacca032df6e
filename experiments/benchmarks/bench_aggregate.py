"""Sparse aggregation of routed sub-supernets versus dense FedAvg of full copies, at paper scale.

    python -m experiments.benchmarks.bench_aggregate           # paper supernet (55.6M parameters), 10 clients

Each client's budget comes from the Zipf draw (``fl_app.data.partition.draw_budgets``), its reply is the
sub-supernet routed to that budget (``route_bounds`` -> ``subnet_shapes``), as an ``ArrayRecord`` like the ones a
round receives.
Sparse: decode the replies and ``strategies.sparse.sparse_average`` them into the global model, encode the result
(what ``SupernetStrategy.aggregate_train`` does). Dense: Flower's own FedAvg aggregation
(``aggregate_arrayrecords``) of 10 full copies. Each side runs in its own process, inputs built first; the timer and
the peak-memory counter (Linux ``VmHWM``, reset through ``/proc/self/clear_refs``) cover only the aggregation.
``peak_rss_mb`` is the aggregation's working memory above the inputs it was handed (the replies a round holds
anyway); ``peak_total_rss_mb`` the process peak. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import time

import numpy as np

from experiments.studies.traffic import supernet_parser
from fl_app.run.outputs import memory_mb


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")  # resets VmHWM to the current RSS


def _inputs(supernet: str, cache_name: str, clients: int, seed: int, max_macs: float, dense: bool):
    from fl_app.data.partition import draw_budgets
    from fl_app.models.supernet_space import load_supernet_config
    from fl_app.run.payload import state_to_record
    from fl_app.supernet.slicing import slice_state, subnet_shapes
    from fl_app.supernet.subnets import SubnetCache

    cfg = load_supernet_config(supernet)
    cache = SubnetCache.load(cfg, cache_name)
    rng = np.random.default_rng(seed)
    full_shapes = subnet_shapes(cfg, cfg.max_subnet())
    global_state = {k: rng.standard_normal(s, dtype=np.float32) for k, s in full_shapes.items()}
    budgets = draw_budgets(clients, cache.min_macs, max_macs or cache.max_macs, 1.2, seed)
    replies = []
    for i, budget in enumerate(budgets):
        shapes = full_shapes if dense else subnet_shapes(cfg, cache.route_bounds(budget))
        # a reply: the routed slice, moved a little by "training"
        replies.append(
            (
                state_to_record({k: v + 0.01 * (i + 1) for k, v in slice_state(global_state, shapes).items()}),
                float(rng.integers(100, 1000)),
            )
        )
    return global_state, replies


def measure(side: str, supernet: str, cache: str, clients: int, seed: int, max_macs: float) -> dict:
    from flwr.app import MetricRecord, RecordDict
    from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords

    from fl_app.run.payload import RecordState, state_to_record
    from strategies.sparse import sparse_average

    global_state, replies = _inputs(supernet, cache, clients, seed, max_macs, dense=side == "dense")
    model_mb = sum(v.nbytes for v in global_state.values()) / 2**20
    reply_mb = sum(record.count_bytes() for record, _ in replies) / 2**20
    if side == "dense":
        records = [
            RecordDict({"arrays": record, "metrics": MetricRecord({"num-examples": w})}) for record, w in replies
        ]
        del global_state
    gc.collect()
    base, _ = memory_mb()
    _reset_peak()
    started = time.perf_counter()
    if side == "dense":
        result = aggregate_arrayrecords(records, "num-examples")
    else:
        updates = [(RecordState(record), w) for record, w in replies]
        result = state_to_record(sparse_average(global_state, updates))
    seconds = time.perf_counter() - started
    _, peak = memory_mb()
    assert len(result) > 0
    return {
        "seconds": seconds,
        "peak_rss_mb": peak - base,
        "peak_total_rss_mb": peak,
        "model_mb": model_mb,
        "replies_mb": reply_mb,
    }


def build_parser() -> argparse.ArgumentParser:
    parser = supernet_parser(__doc__, clients=10, module="experiments.benchmarks.bench_aggregate")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights and the clients' budget draw")
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes per side; the fastest counts")
    parser.add_argument("--side", choices=["sparse", "dense"], help=argparse.SUPPRESS)  # one measurement, internal
    return parser


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    cache = args.cache or args.supernet
    if args.side:
        print(json.dumps(measure(args.side, args.supernet, cache, args.clients, args.seed, args.max_macs)))
        return {}

    runs = {}
    for side in ("sparse", "dense"):
        for _ in range(args.repeats):
            command = [
                sys.executable,
                "-m",
                "experiments.benchmarks.bench_aggregate",
                "--side",
                side,
                "--supernet",
                args.supernet,
                "--cache",
                cache,
                "--clients",
                str(args.clients),
                "--seed",
                str(args.seed),
                "--max-macs",
                str(args.max_macs),
            ]
            out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
            runs.setdefault(side, []).append(json.loads(out.strip().splitlines()[-1]))
    best = {side: min(r, key=lambda m: m["seconds"]) for side, r in runs.items()}
    result = {
        "supernet": args.supernet,
        "clients": args.clients,
        "sparse_s": round(best["sparse"]["seconds"], 3),
        "dense_s": round(best["dense"]["seconds"], 3),
        "ratio": round(best["sparse"]["seconds"] / best["dense"]["seconds"], 3),
        "peak_rss_mb": round(best["sparse"]["peak_rss_mb"], 1),
        "dense_peak_rss_mb": round(best["dense"]["peak_rss_mb"], 1),
        "peak_total_rss_mb": round(best["sparse"]["peak_total_rss_mb"], 1),
        "model_mb": round(best["sparse"]["model_mb"], 1),
        "replies_mb_sparse": round(best["sparse"]["replies_mb"], 1),
        "replies_mb_dense": round(best["dense"]["replies_mb"], 1),
        "sparse_s_all": [round(r["seconds"], 3) for r in runs["sparse"]],
        "dense_s_all": [round(r["seconds"], 3) for r in runs["dense"]],
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
