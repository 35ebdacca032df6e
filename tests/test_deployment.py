"""A real deployment on loopback: `flower-superlink` with TLS and SuperNode authentication, two registered
`flower-supernode`s (partition 0 and 1) and `flwr run` against it; a third SuperNode with an unregistered key is
refused; the run's output folder is fetched by its run id (`fl_app.deploy results`). Every process (and what it
spawns) is stopped by PID in the fixture's finalizer, even on failure.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from experiments.runner.flower_env import free_ports
from experiments.runner.flower_runs import APP_DIR, flwr_run
from fl_app import deploy
from tests.harness import deployment as harness

pytestmark = pytest.mark.slow  # real Flower processes: minutes; skipped by -m "not slow"
ROOT = Path(__file__).resolve().parents[1]
CONNECTION = "tls-deployment"
RUN_CONFIG = {
    "num-server-rounds": 2,
    "eval-every": 2,
    "max-local-steps": 3,
    "calib-size": 64,
    "val-size": 64,
    "test-size": 500,
}
NUM_NODES = 2


def _wait_for(condition, timeout: float, what: str, interval: float = 1.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"{what} not reached after {timeout:.0f} s")


@pytest.fixture
def tls_deployment(tmp_path, request):
    """CA + server certificate, 3 node key pairs (2 registered), a TLS SuperLink with node authentication and the
    `flwr` connection to it. SuperNodes are started by the test through `d.start_supernode` so they are tracked."""
    started = time.monotonic()
    procs: list = []
    superlink_port, *node_ports = free_ports(1 + NUM_NODES + 1)
    address = f"127.0.0.1:{superlink_port}"
    markers = (address, *(f"127.0.0.1:{port}" for port in node_ports))  # SuperExecs name these addresses

    def stop_all():
        harness.stop_processes(procs, markers=markers)
        print(f"[test_deployment] wall time with teardown {time.monotonic() - started:.1f} s")

    request.addfinalizer(stop_all)

    home = tmp_path / "flwr_home"
    env = harness.flower_env(home)
    certs = deploy.make_certs(tmp_path / "certs")
    keys = deploy.make_node_keys(tmp_path / "keys", NUM_NODES + 1)  # the last one is never registered

    superlink = harness.start_superlink(tmp_path / "superlink", tmp_path / "certs", superlink_port, env=env)
    procs.append(superlink)
    harness.wait_for_port("127.0.0.1", superlink_port, timeout=90, proc=superlink)
    deploy.write_connection(home, CONNECTION, address, certs["ca"])
    node_ids = [
        deploy.register_node(public, CONNECTION, env=env, name=f"partition-{i}")
        for i, (_, public) in enumerate(keys[:NUM_NODES])
    ]

    def start_supernode(index: int, partition_id: int, num_partitions: int, **kwargs):
        proc = harness.start_supernode(
            tmp_path / f"supernode-{index}" / "supernode.log",
            address,
            partition_id,
            num_partitions,
            node_ports[index],
            certs["ca"],
            keys[index][0],
            env=env,
            **kwargs,
        )
        procs.append(proc)
        return proc

    def logs() -> str:
        """The ends of the run's and the SuperLink's logs, for a failure message."""
        paths = [tmp_path / "flwr_run.log", tmp_path / "superlink" / "superlink.log"]
        tails = [p.read_text()[-3000:] if p.exists() else f"({p} not written)" for p in paths]
        return "\n--- SuperLink log ---\n".join(tails)

    yield SimpleNamespace(
        tmp=tmp_path,
        logs=logs,
        env=env,
        address=address,
        node_ids=node_ids,
        superlink=superlink,
        start_supernode=start_supernode,
        started=started,
    )


def test_tls_deployment_runs_and_refuses_unregistered_supernode(tls_deployment):
    d = tls_deployment
    assert APP_DIR == ROOT  # `flwr run` submits this repository's app

    # Registered but not yet connected.
    listed = deploy.list_nodes(CONNECTION, env=d.env)
    assert sorted(int(n["node-id"]) for n in listed) == sorted(d.node_ids)

    # A SuperNode whose public key was never registered is refused and exits.
    intruder = d.start_supernode(NUM_NODES, partition_id=NUM_NODES, num_partitions=NUM_NODES + 1, max_retries=2)
    returncode = intruder.wait(timeout=90)
    intruder_log = (d.tmp / f"supernode-{NUM_NODES}" / "supernode.log").read_text()
    assert returncode != 0, intruder_log[-2000:]
    assert "Failed to initialize the connection to the SuperLink" in intruder_log, intruder_log[-2000:]

    # The two registered SuperNodes connect.
    nodes = [d.start_supernode(i, partition_id=i, num_partitions=NUM_NODES) for i in range(NUM_NODES)]

    def all_online():
        for proc in nodes:
            assert proc.poll() is None, f"a SuperNode exited with {proc.returncode}"
        listing = deploy.list_nodes(CONNECTION, env=d.env)
        return len(listing) == NUM_NODES and all(n["status"] == "online" for n in listing)

    _wait_for(all_online, timeout=90, what="both SuperNodes online")

    out = d.tmp / "out"
    run_id, status = flwr_run(
        {**RUN_CONFIG, "output-dir": str(out)},
        federation=None,
        env=d.env,
        timeout=900,
        log_file=d.tmp / "flwr_run.log",
        superlink=CONNECTION,
    )
    assert status == "finished:completed", d.logs()

    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_clients"] == NUM_NODES

    # the user who started the run fetches its folder by run id (here the SuperLink's host is this machine)
    fetched = deploy.fetch_results(run_id, CONNECTION, d.tmp / "fetched", runs=[str(d.tmp)], env=d.env)
    assert fetched["status"] == "finished:completed" and fetched["folder"] == str(out)
    copied = {p.relative_to(d.tmp / "fetched"): p.read_bytes() for p in (d.tmp / "fetched").rglob("*") if p.is_file()}
    assert copied == {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert json.loads((d.tmp / "fetched" / "flower_run.json").read_text()) == {"flower_run_id": run_id}
    assert summary["failed_replies"] == 0
    assert summary["tiers"] and all(0 <= t["accuracy"] <= 1 for t in summary["tiers"])

    # `flwr ls` on the deployment connection shows the run; the SuperLink never listed the refused SuperNode.
    listing = deploy.flwr_cli(["ls", CONNECTION, "--run-id", run_id, "--format", "json"], env=d.env)
    assert json.loads(listing.stdout[listing.stdout.find("{") :])["runs"][0]["status"] == "finished:completed"
    assert sorted(int(n["node-id"]) for n in deploy.list_nodes(CONNECTION, env=d.env)) == sorted(d.node_ids)

    print(
        f"\n[test_deployment] run {run_id}: {status}, pwa={summary['population_weighted_accuracy']}, "
        f"wall time {time.monotonic() - d.started:.1f} s"
    )


def test_a_supernode_declaring_a_budget_above_the_supernet_trains_and_is_scored_with_it_whole(tls_deployment):
    """A device stronger than the model (budget-macs=1.4e7 over the 13.55 MMAC CPU supernet, the reference's normal
    case) joins the run: it trains the whole supernet and is scored with it."""
    import csv

    from fl_app.models.supernet_space import count_macs, load_supernet_config

    d = tls_deployment
    cfg = load_supernet_config("cpu")
    supernet = count_macs(cfg, cfg.max_subnet())
    above = 1.4e7
    assert above > supernet
    nodes = [
        d.start_supernode(0, partition_id=0, num_partitions=NUM_NODES, budget_macs=above),
        d.start_supernode(1, partition_id=1, num_partitions=NUM_NODES),
    ]

    def all_online():
        assert all(proc.poll() is None for proc in nodes), "a SuperNode exited"
        listing = deploy.list_nodes(CONNECTION, env=d.env)
        return len(listing) == NUM_NODES and all(n["status"] == "online" for n in listing)

    _wait_for(all_online, timeout=90, what="both SuperNodes online")
    out = d.tmp / "out"
    config = {**RUN_CONFIG, "num-server-rounds": 1, "eval-every": 1, "clients-per-round": 2, "output-dir": str(out)}
    _, status = flwr_run(
        config, federation=None, env=d.env, timeout=900, log_file=d.tmp / "flwr_run.log", superlink=CONNECTION
    )
    assert status == "finished:completed", d.logs()

    summary = json.loads((out / "summary.json").read_text())
    assert summary["budgets"][0] == above and summary["failed_replies"] == 0
    assert summary["client_subnets"][0]["macs"] == supernet  # scored with the whole supernet
    with open(out / "clients.csv") as handle:
        trained = {int(row["partition_id"]): float(row["trained_macs"]) for row in csv.DictReader(handle)}
    assert trained[0] == supernet  # trained the whole supernet (its local max)
