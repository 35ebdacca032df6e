"""ClientApp: answers the partition query and runs the method's local training on the node's partition."""

from __future__ import annotations

import os
import time
from functools import lru_cache

import numpy as np
import torch
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from clients.feast import SubnetPlan, plan_subnets, train_subnets
from clients.local_training import LocalSettings
from fl_app.models.elastic_resnet import ElasticResNet
from fl_app.run.config import SUPERNET_METHODS, RunConfig, validate_run_config
from fl_app.run.payload import record_to_state, state_to_record
from fl_app.supernet.federation import Federation, client_data
from fl_app.supernet.slicing import slice_state, subnet_shapes
from fl_app.supernet.space import Subnet, width_sliced_config
from fl_app.supernet.training_costs import train_costs

app = ClientApp()


@lru_cache(maxsize=2)
def _federation(run_items: tuple, num_partitions: int) -> Federation:
    return Federation.build(RunConfig(dict(run_items)), num_partitions)


def node_partition(context: Context) -> tuple[int, int]:
    return int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Tell the server which partition this node holds (and its budget, when the node config sets one)."""
    pid, num = node_partition(context)
    info = {"partition-id": pid, "num-partitions": num}
    if "budget-macs" in context.node_config:
        info["budget-macs"] = float(context.node_config["budget-macs"])
    return Message(RecordDict({"config": ConfigRecord(info)}), reply_to=msg)


def local_seed(seed: int, server_round: int, partition_id: int) -> int:
    return int(np.random.SeedSequence([seed, server_round, partition_id]).generate_state(1)[0])


def use_node_threads(context: Context) -> None:
    # the node config's num-threads, else what Ray gave the actor (OMP_NUM_THREADS), else one: several simulated
    # clients share the CPU cores; oversubscribed OpenMP threads slow small convolutions down by an order of magnitude
    torch.set_num_threads(int(context.node_config.get("num-threads", os.environ.get("OMP_NUM_THREADS", 1))))


@app.train()
def train(msg: Message, context: Context) -> Message:
    use_node_threads(context)
    run = validate_run_config(dict(context.run_config))
    pid, num = node_partition(context)
    if pid in run.faulty_partitions:
        raise RuntimeError(f"fault injection: partition {pid} is listed in faulty-partitions")
    return CLIENT_TRAINING[run["method"]](msg, run, pid, num, context)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Client-side evaluation (the model-heterogeneous methods; FEAST evaluates its tiers on the server)."""
    use_node_threads(context)
    run = validate_run_config(dict(context.run_config))
    if run["method"] not in CLIENT_EVALUATION:
        raise ValueError(f"method='{run['method']}' evaluates on the server, not on clients")
    pid, num = node_partition(context)
    return CLIENT_EVALUATION[run["method"]](msg, run, pid, num, context)


def train_feast(msg: Message, run: RunConfig, pid: int, num: int, context: Context) -> Message:
    """FEAST and the supernet / width-sliced baselines: the server says what is routed and, for the baselines,
    which single subnet to train; FEAST clients plan their max/min/random step themselves. Stateless between rounds
    (``context`` unused): everything arrives with the message."""
    started = time.perf_counter()
    fed = _federation(tuple(sorted(run.values.items())), num)
    config = msg.content.config_records["config"]
    dtype = str(config["payload-dtype"])
    cfg = width_sliced_config(fed.cfg) if config.get("model", "supernet") == "width-sliced" else fed.cfg
    bounds = Subnet(config["bounds-d"], config["bounds-e"], config["bounds-w"])

    model = ElasticResNet(cfg, bounds)
    received = record_to_state(msg.content.array_records["arrays"], dtype)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in received.items()}, strict=False)
    model.set_width_scaler(float(config.get("width-rate", 1.0)))
    if "arch-d" in config:
        arch = Subnet(config["arch-d"], config["arch-e"], config["arch-w"])
        plan, returned = SubnetPlan(arch, None, []), subnet_shapes(cfg, arch)
    else:
        plan = plan_subnets(fed.cache, float(config["budget-macs"]), bounds, run.train_subnets)
        returned = {k: v.shape for k, v in received.items()}
    data = client_data(run, pid, num, config.get("partition-budgets"))  # declared budgets shape the split
    labels = sorted(int(c) for c in torch.unique(data.labels))
    logit_mask = None
    if config.get("mask-labels", False):  # HeteroFL: only the classifier rows of labels held here are trained
        logit_mask = torch.zeros(cfg.n_classes, dtype=torch.bool)
        logit_mask[labels] = True
    settings = LocalSettings.from_run(
        run, float(config["lr"]), local_seed(run["seed"], int(config["server-round"]), pid)
    )
    metrics = train_subnets(model, plan, data, settings, logit_mask)

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
                    **train_costs(
                        cfg, plan.largest, plan.smallest, plan.between, metrics["local-steps"] * settings.batch_size
                    ),
                    "client-seconds": time.perf_counter() - started,
                }
            ),
        }
    )
    return Message(reply, reply_to=msg)


# method -> client training; every method in fl_app.run.config.METHODS has an entry
from fl_app.hetero_app import HETERO_METHODS, evaluate_hetero, train_hetero  # noqa: E402  (model-heterogeneous)

CLIENT_TRAINING = {**dict.fromkeys(SUPERNET_METHODS, train_feast), **dict.fromkeys(HETERO_METHODS, train_hetero)}
CLIENT_EVALUATION = dict.fromkeys(HETERO_METHODS, evaluate_hetero)
