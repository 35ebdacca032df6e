"""A round's time split by phase (fl_app.run.phase_times): the timer, the log line and its reader, the server loop's
line per round, and a FEAST client call's line."""

from __future__ import annotations

import json
import logging
import time

import pytest
import torch
from flwr.app import ConfigRecord

from fl_app.run.config import validate_run_config
from fl_app.run.payload import state_to_record
from fl_app.run.phase_times import CLIENT_PHASES, SERVER_PHASES, PhaseTimer, read_phases
from fl_app.run.round_log import RoundLog
from fl_app.supernet_app import SupernetFamily, train_supernet_client
from strategies.skeleton import RoundSkeleton


def test_laps_add_up_per_phase_and_the_reader_sums_the_lines():
    timer = PhaseTimer()
    time.sleep(0.02)
    timer.lap("steps")
    timer.lap("encode")
    time.sleep(0.01)
    timer.lap("steps")
    assert list(timer.seconds) == ["steps", "encode"] and timer.seconds["steps"] >= 0.03
    line = timer.line("client", 4, 7)
    assert line.startswith("client phases: partition 7 round 4: steps=")
    text = "\n".join(["INFO : unrelated", f"DEBUG : {line}", "DEBUG : client phases: partition 2 round 4: steps=1.5"])
    text += "\nDEBUG : server phases: round 4: dispatch=0.2500 clients=2.0000"
    read = read_phases(text)
    assert read["client"]["lines"] == 2 and read["server"]["lines"] == 1
    assert read["client"]["steps"] == pytest.approx(1.5 + round(timer.seconds["steps"], 4))
    assert read["server"] == {"lines": 1, "dispatch": 0.25, "clients": 2.0}


class _SlowGrid:
    def send_and_receive(self, messages, timeout):
        time.sleep(0.05)  # the clients' work, as the server sees it
        return []


def test_the_round_loop_logs_every_server_phase_once_a_round_and_the_wait_is_the_clients(caplog):
    hooks = ("train_content", "metric_specs", "reply_shapes", "merge")
    body = {name: (lambda self, *args: None) for name in hooks}
    cls = type(
        "Sketch",
        (RoundSkeleton,),
        {
            "summary": lambda self: None,
            "prepare_rounds": lambda self, timeout: None,
            # one partition sampled, none answers (min-reply-fraction 0): the round closes without a merge
            "configure_train": lambda self, server_round, arrays, config, grid: (
                self.rounds.setdefault(server_round, RoundLog(sampled=[0])) and []
            ),
            **body,
        },
    )
    strategy = cls({0: 10}, 1, clients_per_round=1, seed=0, min_reply_fraction=0.0)
    caplog.set_level(logging.DEBUG, logger="flwr")
    strategy.start(_SlowGrid(), num_rounds=2)
    read = read_phases("\n".join(caplog.messages))
    assert read["server"]["lines"] == 2
    assert set(read["server"]) == {"lines", *SERVER_PHASES}
    assert read["server"]["clients"] >= 0.1 > read["server"]["dispatch"]


def test_a_feast_client_call_logs_its_phases(flower_ids, caplog):
    run = validate_run_config(
        {"clients-per-round": 2, "max-local-steps": 1, "batch-size": 8, "val-size": 64, "calib-size": 64}
    )
    family = SupernetFamily(run, {pid: {"node_id": 100 + pid} for pid in range(2)})
    torch.manual_seed(0)
    state = {
        k: v.numpy()
        for k, v in family.strategy.global_model().state_dict().items()
        if not k.endswith("num_batches_tracked")
    }
    message = next(iter(family.strategy.configure_train(1, state_to_record(state), ConfigRecord(), grid=None)))
    caplog.set_level(logging.DEBUG, logger="flwr")
    train_supernet_client(message, family.run, message.metadata.dst_node_id - 100, 2, context=None)
    read = read_phases("\n".join(caplog.messages))
    assert read["client"]["lines"] == 1 and set(read["client"]) == {"lines", *CLIENT_PHASES}
    assert read["client"]["steps"] > 0


def test_work_ratio_is_the_round_time_over_the_phases_a_plain_loop_also_has():
    from experiments.benchmarks.bench_overhead import work_ratio

    server = {"lines": 2, "dispatch": 1.0, "clients": 10.0, "screening": 0.5, "aggregation": 1.0, "evaluation": 2.0}
    client = {"lines": 4, "decode": 0.2, "model": 1.0, "data": 1.0, "steps": 6.0, "encode": 0.3}
    # work: dispatch 1 + aggregation 1 + evaluation 2 + model 1 + data 1 + steps 6 = 12 s; the rest is overhead
    assert work_ratio(15.0, {"server": {**server, "writes": 0.5}, "client": client}) == 1.25
    assert work_ratio(15.0, {"server": {"lines": 0}, "client": {"lines": 0}}) is None


def test_the_suite_mode_needs_both_the_suite_and_its_method(capsys):
    from experiments.benchmarks.bench_overhead import main

    with pytest.raises(SystemExit):
        main(["--suite", "experiments/suites/fedtopo-control-scarce.toml"])
    assert "--suite and --method go together" in capsys.readouterr().err


def test_the_phase_table_divides_by_rounds_and_client_calls_and_is_checked(tmp_path, capsys):
    from experiments.benchmarks import phase_table

    phases = {
        "server": {"lines": 4, "dispatch": 2.0, "clients": 40.0, "aggregation": 1.0, "evaluation": 8.0},
        "client": {"lines": 8, "model": 0.8, "data": 1.6, "steps": 32.0, "encode": 0.4},
    }
    result = {"suite": "experiments/suites/x.toml", "method": "fedtopo", "rounds": 4}
    result.update(flower_rounds_s=60.0, flower_phases_s=phases, work_ratio=1.42)
    (tmp_path / "r.json").write_text(json.dumps(result) + "\n")
    readme = tmp_path / "dev.md"
    readme.write_text("<!-- generated:round-phases (python -m x) -->\nold\n<!-- /generated:round-phases -->\n")
    assert phase_table.main([str(tmp_path / "r.json"), "--readme", str(readme)]) == 0
    line = "| `r.json` | `fedtopo` of `x.toml`, 4 rounds | 15.00 | – | – | 1.42 | 0.50 | 10.00 | 0.00 | 0.25 | 2.00 "
    line += "| 0.00 | 0.00 | 0.10 | 0.20 | 4.00 | 0.05 |"
    assert line in readme.read_text()
    assert phase_table.main([str(tmp_path / "r.json"), "--readme", str(readme), "--check"]) == 0
    (tmp_path / "r.json").write_text(json.dumps({**result, "flower_rounds_s": 80.0}) + "\n")
    assert phase_table.main([str(tmp_path / "r.json"), "--readme", str(readme), "--check"]) == 1
