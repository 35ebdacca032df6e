"""FedTopo through a real `flwr run` (local SuperLink, Ray simulation): the one end-to-end check of the wiring.

Own FLWR_HOME and free ports; the SuperLink is stopped by PID at the end.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY = ("method='fedtopo' num-server-rounds=2 clients-per-round=2 max-local-steps=2 batch-size=16 eval-every=1 "
        "proto-max-samples=64 test-fraction=0.05")
FEDERATION = "num-supernodes=3 client-resources-num-cpus=1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def flwr_env(tmp_path_factory):
    home = tmp_path_factory.mktemp("flwr_home_fedtopo")
    env = {**os.environ, "FLWR_HOME": str(home), "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
           "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(_free_port()),
           "FLWR_LOCAL_CONTROL_API_PORT": str(_free_port())}
    yield env
    for pid_dir in Path("/proc").glob("[0-9]*"):  # the detached SuperLink started for this FLWR_HOME only
        try:
            cmdline = (pid_dir / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if "flower-superlink" in cmdline and str(home) in cmdline:
            try:
                os.killpg(os.getpgid(int(pid_dir.name)), signal.SIGTERM)
            except ProcessLookupError:
                pass


def test_fedtopo_flwr_run_writes_a_summary(flwr_env, tmp_path):
    out = tmp_path / "fedtopo"
    proc = subprocess.run(["flwr", "run", str(ROOT), "--stream", "--run-config", f"{TINY} output-dir='{out}'",
                           "--federation-config", FEDERATION], env=flwr_env, capture_output=True, text=True,
                          timeout=600)
    found = re.search(r"Successfully started run (\d+)", proc.stdout + proc.stderr)
    assert found, proc.stdout[-3000:] + proc.stderr[-3000:]
    status = ""
    for _ in range(30):  # the status settles right after the stream ends
        listing = subprocess.run(["flwr", "ls", "--run-id", found.group(1), "--format", "json"], env=flwr_env,
                                 capture_output=True, text=True, timeout=60)
        status = json.loads(listing.stdout)["runs"][0]["status"]
        if status.startswith("finished"):
            break
        time.sleep(1)
    assert status == "finished:completed", proc.stdout[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["method"] == "fedtopo" and summary["num_clients"] == 3
    assert 0 <= summary["mean_client_accuracy"] <= 1 and 0 <= summary["pooled_accuracy"] <= 1
    assert summary["bytes_up"] > 0 and summary["bytes_down"] > 0
    assert [h["round"] for h in summary["history"]] == [1, 2]
    assert (out / "metrics.csv").exists() and (out / "accuracy_per_round.png").exists()
