"""A real deployment on loopback in which a SuperNode dies and comes back (not collected by pytest: minutes long).

`python -m tests.deployment_churn [--rounds 6] [--out DIR]`: a TLS SuperLink with SuperNode authentication, three
registered SuperNodes (partitions 0-2) and `flwr run` of FEAST with every client sampled each round. After round 1
has finished the SuperNode of partition 1 is killed with SIGKILL (its whole process group); after round 3 it is
started again with the same key (with SuperNode authentication it keeps its node id). Prints one JSON
object: per round (from rounds.csv) sampled / replies / failed /
bytes, and the summary's failure counts. What it shows: the miss is counted once, against partition 1; the node is
not sampled while it is gone; it is used again after it rejoins. Every process started here is stopped by PID.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import tempfile
import threading
import time
from pathlib import Path

from experiments.runner.flower_env import free_ports
from experiments.runner.flower_runs import flwr_run
from fl_app import deploy
from tests.harness import deployment as harness

CONNECTION = "churn-deployment"
NUM_NODES = 3


def finished_rounds(out: Path) -> int:
    try:
        with open(out / "rounds.csv") as handle:
            return len(list(csv.DictReader(handle)))
    except FileNotFoundError:
        return 0


def wait_until(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached after {timeout:.0f} s")
        time.sleep(1.0)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--out", type=Path, default=None, help="work folder (default: a new temporary one)")
    args = parser.parse_args(argv)
    tmp = args.out or Path(tempfile.mkdtemp(prefix="deployment-churn-"))
    procs: list = []
    superlink_port, *node_ports = free_ports(1 + NUM_NODES + 1)
    address = f"127.0.0.1:{superlink_port}"
    markers = (address, *(f"127.0.0.1:{port}" for port in node_ports))
    try:
        env = harness.flower_env(tmp / "flwr_home")
        certs = deploy.make_certs(tmp / "certs")
        keys = deploy.make_node_keys(tmp / "keys", NUM_NODES)
        # state in memory (harness.start_superlink's default): on a loaded machine the state file was seen locked
        # ("database is locked"), which fails the ServerApp's heartbeat and ends the run before any node dies
        procs.append(harness.start_superlink(tmp / "superlink", tmp / "certs", superlink_port, env=env))
        harness.wait_for_port("127.0.0.1", superlink_port, timeout=90, proc=procs[0])
        deploy.write_connection(tmp / "flwr_home", CONNECTION, address, certs["ca"])
        for i, (_, public) in enumerate(keys):
            deploy.register_node(public, CONNECTION, env=env, name=f"partition-{i}")

        def start(i: int, port: int):
            proc = harness.start_supernode(
                tmp / f"supernode-{i}-{port}" / "supernode.log",
                address,
                i,
                NUM_NODES,
                port,
                certs["ca"],
                keys[i][0],
                env=env,
            )
            procs.append(proc)
            return proc

        nodes = [start(i, node_ports[i]) for i in range(NUM_NODES)]
        wait_until(
            lambda: sum(n["status"] == "online" for n in deploy.list_nodes(CONNECTION, env=env)) == NUM_NODES,
            120,
            "three SuperNodes online",
        )

        out = tmp / "out"
        run_config = {
            "num-server-rounds": args.rounds,
            "clients-per-round": NUM_NODES,
            "min-reply-fraction": 0.3,
            "eval-every": args.rounds,
            "max-local-steps": 2,
            "calib-size": 64,
            "val-size": 64,
            "test-size": 500,
            "round-timeout": 600.0,
            "output-dir": str(out),
        }
        result = {}
        runner = threading.Thread(
            target=lambda: result.update(
                zip(
                    ("run_id", "status"),
                    flwr_run(
                        run_config,
                        federation=None,
                        env=env,
                        timeout=1800,
                        log_file=tmp / "flwr_run.log",
                        superlink=CONNECTION,
                    ),
                )
            )
        )
        started = time.monotonic()
        runner.start()
        wait_until(lambda: finished_rounds(out) >= 1, 900, "round 1 finished")
        os.killpg(nodes[1].pid, signal.SIGKILL)  # the SuperNode and the ClientApps it started
        killed_at = time.monotonic() - started
        wait_until(lambda: finished_rounds(out) >= 3, 900, "round 3 finished")
        start(1, node_ports[NUM_NODES])  # the same partition and key, a new process
        restarted_at = time.monotonic() - started
        runner.join(timeout=1800)
        with open(out / "rounds.csv") as handle:
            rounds = [
                {
                    k: row[k]
                    for k in (
                        "round",
                        "sampled",
                        "replies",
                        "failed",
                        "rejected",
                        "bytes_down",
                        "bytes_down_unanswered",
                        "seconds",
                    )
                }
                for row in csv.DictReader(handle)
            ]
        summary = json.loads((out / "summary.json").read_text())
        server_log = (tmp / "flwr_run.log").read_text(errors="replace")
        report = {
            "status": result.get("status"),
            "killed_after_s": round(killed_at, 1),
            "restarted_after_s": round(restarted_at, 1),
            "rounds": rounds,
            **{
                k: summary.get(k)
                for k in (
                    "failed_replies",
                    "failed_by_partition",
                    "rejected_replies",
                    "accepted_replies",
                    "bytes_down_unanswered",
                    "completed",
                )
            },
            "log_lines": [
                line.strip()[-160:]
                for line in server_log.splitlines()
                if any(event in line for event in ("failed:", "is gone", "is back", "is on node", "no reply"))
            ],
        }
        print(json.dumps(report))
        return report
    finally:
        harness.stop_processes(procs, markers=markers)


if __name__ == "__main__":
    main()
