"""ClientApp: answers the partition query and runs the method's local training on the node's partition."""

from __future__ import annotations

import os

import torch
from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from fl_app.multiarch_app import MULTIARCH_METHODS, evaluate_multiarch, train_multiarch
from fl_app.run.config import MACS_RANGE, SUPERNET_METHODS, validate_run_config
from fl_app.run.node_query import BUDGET_MACS, NUM_PARTITIONS, PARTITION_ID, partition_answer
from fl_app.supernet_app import train_supernet_client

app = ClientApp()


def node_partition(context: Context) -> tuple[int, int]:
    return int(context.node_config[PARTITION_ID]), int(context.node_config[NUM_PARTITIONS])


def declared_budget(value) -> float:
    """The node config's ``budget-macs`` as a number the server can use; the server checks it against the
    supernet's range (``SupernetSetup.client_budgets``) and fails the run before training when it is outside."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not MACS_RANGE(value):
        raise ValueError(f"node-config budget-macs={value!r}: expected a number {MACS_RANGE.rule}")
    return float(value)


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Tell the server which partition this node holds (and its budget, when the node config sets one): the
    answer ``fl_app.run.node_query`` defines."""
    pid, num = node_partition(context)
    budget = declared_budget(context.node_config[BUDGET_MACS]) if BUDGET_MACS in context.node_config else None
    return partition_answer(msg, pid, num, budget)


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


# method -> client training; every method in fl_app.run.config.METHODS has an entry

CLIENT_TRAINING = {
    **dict.fromkeys(SUPERNET_METHODS, train_supernet_client),
    **dict.fromkeys(MULTIARCH_METHODS, train_multiarch),
}
CLIENT_EVALUATION = dict.fromkeys(MULTIARCH_METHODS, evaluate_multiarch)
