"""What the server derives, it checks exactly, and honest clients pass: the server splits the data from the seed as the
clients do, so a supernet-family client's num-examples and labels, and a FedTopo-family client's per-class counts,
must equal what the server derives for its partition (the hostile matrices hold the replies that differ:
``labels-*``, ``counts-moved-between-classes``; real FedTopo-family clients pass in
tests/test_hostile_fedtopo.py::test_honest_models_and_global_state_equal_the_run_without_the_poisoner)."""

from __future__ import annotations

import pytest
import torch
from flwr.app import ConfigRecord

from experiments.runner.flower_internals import set_message_id, set_reply_source
from fl_app.models.elastic_resnet import ElasticResNet
from fl_app.run.config import validate_run_config
from fl_app.run.payload import state_to_record
from fl_app.supernet.shared_setup import SupernetSetup, client_data
from fl_app.supernet_app import make_supernet_strategy, partition_reports, train_supernet_client

NUM = 4
TINY = {"clients-per-round": NUM, "max-local-steps": 1, "batch-size": 8, "min-reply-fraction": 1.0}


@pytest.mark.parametrize("method", ["heterofl", "feast"])
def test_real_supernet_clients_report_exactly_what_the_server_derives(flower_ids, method):
    run = validate_run_config({**TINY, "method": method})
    setup = SupernetSetup.build(run, NUM)
    budgets = setup.client_budgets(run, {})
    examples, held = partition_reports(run, setup, budgets)
    for pid in range(NUM):  # what a client of that partition trains on
        data = client_data(run, pid, NUM, [budgets[p] for p in range(NUM)])
        assert examples[pid] == len(data) and held[pid] == sorted(int(c) for c in torch.unique(data.labels))
    strategy = make_supernet_strategy(run, setup, budgets, {p: 100 + p for p in range(NUM)}, examples, held)
    torch.manual_seed(0)
    state = {
        k: v.numpy()
        for k, v in ElasticResNet(strategy.model_cfg).state_dict().items()
        if not k.endswith("num_batches_tracked")
    }
    replies = []
    for i, message in enumerate(strategy.configure_train(1, state_to_record(state), ConfigRecord(), grid=None)):
        set_message_id(message, f"message-{i}")
        pid = message.metadata.dst_node_id - 100
        reply = train_supernet_client(message, run, pid, NUM, None)
        set_reply_source(reply, message.metadata.dst_node_id)
        replies.append(reply)
    strategy.aggregate_train(1, replies)  # min-reply-fraction 1.0: a rejected honest reply fails the round
    assert strategy.rounds[1].accepted == list(range(NUM)) and strategy.rounds[1].rejected == []
