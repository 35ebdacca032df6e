"""End to end through `flwr run`: a real local SuperLink, Ray simulation, run status, outputs, extraction.

One SuperLink (own FLWR_HOME, free ports; the `flwr_env` fixture) serves the session and is stopped by PID.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from experiments.runner.flower_runs import start_run
from fl_app.models.elastic_resnet import ElasticResNet
from fl_app.run.checkpoint import load_verified, supernet_fingerprint
from fl_app.run.config import validate_run_config
from tests.harness.stopping import saved_round, stop_after_checkpoint
from tests.harness.tiny_runs import FEDERATION, TINY, flwr_run

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow  # real Flower processes: minutes; skipped by -m "not slow"


@pytest.fixture(scope="module")
def feast_run(flwr_env, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "feast"
    run_id, status = flwr_run(flwr_env, f"{TINY} output-dir='{out}'")
    return out, status


def test_feast_run_succeeds_and_writes_results(feast_run):
    out, status = feast_run
    assert status == "finished:completed"
    summary = json.loads((out / "summary.json").read_text())
    for key in (
        "method",
        "dataset",
        "rounds",
        "seed",
        "tiers",
        "population_weighted_accuracy",
        "bytes_down",
        "bytes_up",
    ):
        assert key in summary
    assert summary["method"] == "feast" and summary["rounds"] == 2
    assert len(summary["tiers"]) == 3
    macs = [t["macs"] for t in summary["tiers"]]
    assert macs == sorted(macs)
    assert all(0 <= t["accuracy"] <= 1 for t in summary["tiers"])
    assert summary["bytes_down"] > 0 and summary["bytes_up"] > 0
    rows = (out / "metrics.csv").read_text().strip().splitlines()
    assert len(rows) == 1 + 2 * 3  # header + rounds x tiers
    assert (out / "accuracy_vs_macs.png").read_bytes()[:4] == b"\x89PNG"
    with open(out / "rounds.csv") as handle:
        per_round = list(csv.DictReader(handle))
    assert [int(r["round"]) for r in per_round] == [1, 2]
    assert all(int(r["sampled"]) == int(r["replies"]) == 2 and float(r["seconds"]) > 0 for r in per_round)
    assert all(float(r["server_peak_rss_mb"]) >= float(r["server_rss_mb"]) > 50 for r in per_round)
    assert sum(int(r["bytes_down"]) for r in per_round) == summary["bytes_down"]
    state = torch.load(out / "supernet.pt", weights_only=True)["state_dict"]
    assert "classifier.weight" in state
    verified = load_verified(out / "supernet.pt", supernet_fingerprint(validate_run_config(summary["run_config"])))
    assert verified["state_dict"].keys() == state.keys()  # a verified file of this run's supernet


def test_same_seed_gives_identical_metrics(flwr_env, feast_run, tmp_path):
    out, _ = feast_run
    _, status = flwr_run(flwr_env, f"{TINY} output-dir='{tmp_path / 'again'}'")
    assert status == "finished:completed"
    first = json.loads((out / "summary.json").read_text())
    second = json.loads((tmp_path / "again" / "summary.json").read_text())
    assert first["tiers"] == second["tiers"]
    assert first["bytes_down"] == second["bytes_down"]
    assert (out / "metrics.csv").read_text().split("\n")[1:] == (tmp_path / "again" / "metrics.csv").read_text().split(
        "\n"
    )[1:]


def test_extraction_cli_matches_the_tier_and_loads_standalone(feast_run, tmp_path):
    out, _ = feast_run
    summary = json.loads((out / "summary.json").read_text())
    tier = summary["tiers"][1]
    target = tmp_path / "subnet.pt"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "fl_app.extract",
            "--checkpoint",
            str(out / "supernet.pt"),
            "--macs",
            str(tier["macs"]),
            "--out",
            str(target),
            "--from-cache",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["macs"] == tier["macs"] and result["params"] == tier["params"]
    # same slices, same calibration split, same test set: the same accuracy the run reported
    assert result["accuracy"] == pytest.approx(tier["accuracy"])
    model = ElasticResNet.load_standalone(target)
    assert sum(p.numel() for p in model.parameters()) == tier["params"]


def test_a_killed_run_resumed_from_its_checkpoint_ends_like_an_uninterrupted_one(flwr_env, feast_run, tmp_path):
    """Stop a run once it has written its round-1 checkpoint, resume it in a new folder: same final metrics and
    weights as the uninterrupted run (`feast_run`, same seed and config)."""
    straight, _ = feast_run
    resumed, killed = tmp_path / "resumed", tmp_path / "killed"
    run_id = start_run(f"{TINY} output-dir='{killed}'", FEDERATION, flwr_env, [])  # the id from --format json
    assert stop_after_checkpoint(killed, 1, flwr_env, run_id) == 1
    # the log stream ends with the run: nothing writes into its folder after this
    subprocess.run(["flwr", "log", run_id, "--stream"], env=flwr_env, capture_output=True, timeout=300)
    assert saved_round(killed) == 1
    # the stop may land while the ServerApp still runs its `finally` (FederatedRun.execute): then its summary says
    # that the run did not complete, never that it did
    if (killed / "summary.json").exists():
        assert json.loads((killed / "summary.json").read_text()).get("completed") is False

    _, status = flwr_run(flwr_env, f"{TINY} output-dir='{resumed}' resume-from='{killed}'")
    assert status == "finished:completed"
    first = json.loads((straight / "summary.json").read_text())
    second = json.loads((resumed / "summary.json").read_text())
    assert second["resumed_after_round"] == 1
    for key in ("tiers", "population_weighted_accuracy", "bytes_down", "bytes_up", "failed_replies"):
        assert first[key] == second[key], key
    assert (straight / "metrics.csv").read_text() == (resumed / "metrics.csv").read_text()
    weights = torch.load(straight / "supernet.pt", weights_only=True)["state_dict"]
    again = torch.load(resumed / "supernet.pt", weights_only=True)["state_dict"]
    assert all(torch.equal(weights[k], again[k]) for k in weights)


def test_resume_with_another_config_fails_before_training_and_keeps_the_checkpoint(flwr_env, feast_run, tmp_path):
    straight, _ = feast_run
    saved = (straight / "checkpoint.pt").read_bytes()
    _, status = flwr_run(flwr_env, f"{TINY} lr=0.1 output-dir='{tmp_path / 'other'}' resume-from='{straight}'")
    assert status == "finished:failed"
    assert not (tmp_path / "other").exists()
    assert (straight / "checkpoint.pt").read_bytes() == saved


def test_a_failing_client_is_counted_and_the_round_completes_with_the_others(flwr_env, tmp_path):
    from strategies.rounds import sample_partitions

    faulty = sample_partitions(range(4), 2, 0, 1)[0]  # sampled in round 1 (seed 0, 2 of 4 clients)
    out = tmp_path / "partial"
    _, status = flwr_run(flwr_env, f"{TINY} faulty-partitions='{faulty}' min-reply-fraction=0.5 output-dir='{out}'")
    assert status == "finished:completed"
    with open(out / "rounds.csv") as handle:
        per_round = {int(r["round"]): r for r in csv.DictReader(handle)}
    assert int(per_round[1]["failed"]) == 1 and int(per_round[1]["replies"]) == 1
    expected_failures = sum(faulty in sample_partitions(range(4), 2, 0, r) for r in (1, 2))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["failed_replies"] == expected_failures  # each failure once, against the faulty partition
    assert summary["failed_by_partition"] == {str(faulty): expected_failures}


def test_failing_clients_make_a_failed_run_that_keeps_its_counts(flwr_env, tmp_path):
    _, status = flwr_run(flwr_env, f"{TINY} faulty-partitions='0,1,2,3' output-dir='{tmp_path / 'fail'}'")
    assert status == "finished:failed"
    summary = json.loads((tmp_path / "fail" / "summary.json").read_text())
    assert summary["completed"] is False and "round 1: 0 valid replies of 2 sampled" in summary["error"]
    assert summary["failed_replies"] == 2 and summary["accepted_replies"] == 0
    with open(tmp_path / "fail" / "rounds.csv") as handle:
        (round_1,) = list(csv.DictReader(handle))
    assert int(round_1["failed"]) == 2 and int(round_1["replies"]) == 0


def test_bad_run_config_fails_before_training(flwr_env, tmp_path):
    _, status = flwr_run(flwr_env, f"{TINY} gamma=-1.0 output-dir='{tmp_path / 'bad'}'")
    assert status == "finished:failed"
    assert not (tmp_path / "bad").exists()
