"""clients.csv and rounds.csv count only what the strategy credited (``RoundSkeleton.credit_listener``), keyed by
partition through the live node map, with training FLOPs the server computes from what it routed
(``RoundSkeleton.routed_work``), equal to what an honest client reports for itself, for every method of both families.
"""

from __future__ import annotations

import csv
import math
import uuid

import pytest
import torch
from flwr.app import Context, MessageType, MetricRecord, RecordDict

from experiments.runner import flops_per_round
from experiments.runner.flower_internals import set_message_id
from experiments.runner.in_process_grid import InProcessGrid, run_in_process
from fl_app.multiarch_app import MULTIARCH_METHODS, build_strategy, train_multiarch
from fl_app.run.config import validate_run_config
from fl_app.run.payload import state_to_record
from fl_app.supernet.shared_setup import SupernetSetup
from fl_app.supernet_app import SUPERNET_METHOD_TABLE, make_supernet_strategy, partition_reports, train_supernet_client
from tests.harness.in_process import TINY_RUN
from tests.harness.training import answered_round
from tests.hostile import answered_queries

LIARS = {"train-flops": 1e30, "peak-rss-mb": 1e300, "client-seconds": 6e5, "cuda-peak-mb": 1e300}


class ReplayingGrid(InProcessGrid):
    """Three partitions. Partition 1 claims absurd costs in every training reply, which is rejected (num-examples
    10^9); from round 2 on, partition 0's round-1 reply arrives again (a replay the strategy ignores); partition 2's
    node 102 leaves after round 1 and rejoins as node 202 (a new id). ``reported`` keeps each honest training reply's
    own train-flops: (round, partition) -> value."""

    def __init__(self, run):
        super().__init__(run, 3)
        self.round, self.first_replies, self.reported, self.queries = 0, {}, {}, {}

    def get_node_ids(self):
        if self.round == 1 and 102 in self.partition_of_node:
            del self.partition_of_node[102]
            self.partition_of_node[202] = 2
        return list(self.partition_of_node)

    def push_messages(self, messages):  # the partition query the rejoined node answers
        answers = answered_queries(messages, lambda node: (self.partition_of_node[node], 3))
        self.queries.update(answers)
        return list(answers)

    def pull_messages(self, ids):
        return [self.queries.pop(mid) for mid in list(ids) if mid in self.queries]

    def send_and_receive(self, messages, timeout=None):
        messages = list(messages)
        for msg in messages:
            set_message_id(msg, uuid.uuid4().hex)
        replies = super().send_and_receive(messages, timeout)
        if not messages or messages[0].metadata.message_type != MessageType.TRAIN:
            return replies
        self.round += 1
        for reply in replies:
            pid = self.partition_of_node[reply.metadata.src_node_id]
            metrics = reply.content.metric_records["metrics"]
            if pid == 1:
                reply.content.metric_records["metrics"] = MetricRecord({**metrics, **LIARS, "num-examples": 10**9})
            else:
                self.reported[(self.round, pid)] = metrics["train-flops"]
        self.first_replies = self.first_replies or {self.partition_of_node[r.metadata.src_node_id]: r for r in replies}
        return replies + ([self.first_replies[0]] if self.round > 1 else [])


def _csv(path):
    with open(path) as handle:
        return list(csv.DictReader(handle))


def test_records_count_only_credited_replies_by_partition_with_the_servers_flops(tmp_path):
    torch.set_num_threads(1)
    run = validate_run_config(
        {
            **TINY_RUN,
            "method": "fedtopo",
            "clients-per-round": 3,
            "min-reply-fraction": 0.5,
            "output-dir": str(tmp_path / "run"),
        }
    )
    grid = ReplayingGrid(run)
    run_in_process(run, 3, grid)
    assert grid.round == 3 and grid.reported[(3, 2)] > 0  # the rejoined node trained and answered
    clients = {int(row["partition_id"]): row for row in _csv(tmp_path / "run" / "clients.csv")}
    for pid in (0, 2):  # the replay is not counted; the node that rejoined under a new id counts for its partition
        row = clients[pid]
        assert (int(row["rounds_sampled"]), int(row["rounds_answered"])) == (3, 3), row
        assert float(row["train_flops"]) == sum(grid.reported[(r, pid)] for r in (1, 2, 3))
    liar = clients[1]  # every reply rejected: nothing it claimed is recorded
    assert (int(liar["rounds_sampled"]), int(liar["rounds_answered"])) == (3, 0), liar
    assert float(liar["train_flops"]) == 0 and float(liar["client_seconds"]) == 0
    assert math.isnan(float(liar["peak_rss_mb"])) and math.isnan(float(liar["cuda_peak_mb"]))
    rounds = _csv(tmp_path / "run" / "rounds.csv")
    honest = [grid.reported[(r, 0)] + grid.reported[(r, 2)] for r in (1, 2, 3)]
    assert [float(row["client_train_flops"]) for row in rounds] == honest
    assert flops_per_round(tmp_path / "run") == honest  # what compute matching reads (experiments.runner)


# -- the server's FLOPs of what it routed equal an honest client's own figure ------------------------------------
NUM = 4
TINY = {"clients-per-round": NUM, "max-local-steps": 2, "batch-size": 8, "min-reply-fraction": 1.0}


def _server_matches_client(strategy, answered, run):
    seen = []
    strategy.credit_listener = lambda r, sampled, credited: seen.extend(credited)
    strategy.aggregate_train(1, [reply for _, reply in answered])  # min-reply-fraction 1.0: every reply credited
    assert sorted(pid for pid, _ in seen) == sorted(pid for pid, _ in answered)
    for pid, reply in answered:
        metrics = reply.content.metric_records["metrics"]
        server = dict(seen)[pid]
        assert metrics["local-steps"] == run["max-local-steps"]  # the run's bound, reached by an honest client
        assert (server["train-flops"], server["trained-macs"]) == (metrics["train-flops"], metrics["trained-macs"])
        assert server["train-flops"] > 0
        if "train-flops-dense" in metrics:  # FIARSE: the executed convention too, the full model's MACs per step
            assert server["train-flops-dense"] == metrics["train-flops-dense"] > server["train-flops"]


REFERENCE_MAPPINGS = [("scalefl", {"scalefl-levels": "reference"}), ("fiarse", {"fiarse-mapping": "reference"})]


@pytest.mark.parametrize(
    "method, options", [(m, {}) for m in sorted(SUPERNET_METHOD_TABLE)] + REFERENCE_MAPPINGS, ids=str
)
def test_the_servers_flops_equal_an_honest_supernet_clients_own(flower_ids, method, options):
    torch.set_num_threads(1)
    payload = "bfloat16" if method == "fiarse" else "float32"  # FIARSE's mask is costed on what was received
    run = validate_run_config({**TINY, "method": method, "payload-dtype": payload, **options})
    setup = SupernetSetup.build(run, NUM)
    budgets = setup.client_budgets(run, {})
    examples, held = partition_reports(run, setup, budgets)
    strategy = make_supernet_strategy(run, setup, budgets, {p: 100 + p for p in range(NUM)}, examples, held)
    torch.manual_seed(0)
    model = strategy.global_model()
    state = {k: v.numpy() for k, v in model.state_dict().items() if not k.endswith("num_batches_tracked")}
    answered = answered_round(
        strategy, state_to_record(state), lambda m, pid: train_supernet_client(m, run, pid, NUM, None)
    )
    _server_matches_client(strategy, answered, run)


@pytest.mark.parametrize("method", MULTIARCH_METHODS)
def test_the_servers_flops_equal_an_honest_model_heterogeneous_clients_own(flower_ids, method):
    torch.set_num_threads(1)
    run = validate_run_config({**TINY_RUN, **TINY, "method": method})
    strategy = build_strategy(run, {p: 100 + p for p in range(NUM)})
    contexts = {
        p: Context(run_id=1, node_id=100 + p, state=RecordDict(), run_config={}, node_config={}) for p in range(NUM)
    }
    answered = answered_round(
        strategy, state_to_record({}), lambda m, pid: train_multiarch(m, run, pid, NUM, contexts[pid])
    )
    _server_matches_client(strategy, answered, run)


def test_a_step_count_beyond_what_the_run_allows_is_refused():
    run = validate_run_config({**TINY, "method": "feast"})
    setup = SupernetSetup.build(run, NUM)
    budgets = setup.client_budgets(run, {})
    examples, held = partition_reports(run, setup, budgets)
    strategy = make_supernet_strategy(run, setup, budgets, {p: 100 + p for p in range(NUM)}, examples, held)
    spec = strategy.metric_specs(0)["local-steps"]
    assert spec.problem("local-steps", 2) is None
    assert spec.problem("local-steps", 3) == "metric 'local-steps'=3 outside 0..2"
    assert spec.problem("local-steps", True) == "metric 'local-steps'=True is not an int"
    for key in ("train-flops", "peak-rss-mb", "cuda-peak-mb", "client-seconds", "train-loss"):
        assert strategy.metric_specs(0)[key].problem(key, 1e300) is not None, key


def test_costing_what_was_routed_that_raises_never_ends_the_round(flower_ids, caplog):
    run = validate_run_config({**TINY, "method": "heterofl"})
    setup = SupernetSetup.build(run, NUM)
    budgets = setup.client_budgets(run, {})
    examples, held = partition_reports(run, setup, budgets)
    strategy = make_supernet_strategy(run, setup, budgets, {p: 100 + p for p in range(NUM)}, examples, held)
    torch.manual_seed(0)
    state = {k: v.numpy() for k, v in strategy.global_model().state_dict().items() if "num_batches" not in k}
    answered = answered_round(
        strategy, state_to_record(state), lambda m, pid: train_supernet_client(m, run, pid, NUM, None)
    )

    def broken(pid):
        raise KeyError(pid)

    strategy.routed_macs = broken
    seen = []
    strategy.credit_listener = lambda r, sampled, credited: seen.extend(credited)
    strategy.aggregate_train(1, [reply for _, reply in answered])
    assert strategy.rounds[1].accepted == list(range(NUM))
    assert [pid for pid, _ in seen] == list(range(NUM))
    assert all("train-flops" not in values and "train-loss" in values for _, values in seen)
    assert any("the cost of what it was routed is unknown" in m for m in caplog.messages)
