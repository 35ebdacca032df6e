"""`stop_processes` (tests/harness/deployment.py) stops what a test started: the process, what it spawned into
sessions of its own (as Flower does with SuperExec, ServerApp and ClientApp processes), and orphans whose command
line names the marker; nothing else. Found through psutil, by process id, parent links and command lines."""

from __future__ import annotations

import sys
import time

import psutil

from experiments.runner.flower_env import free_port
from fl_app.run import processes
from tests.harness import deployment as harness

# started by the test: a child in a session of its own that stays its child, and an orphan that names the marker
# (its parent exits at once), as a SuperExec whose SuperLink is gone would
PARENT = """
import subprocess, sys, time
marker = sys.argv[1]
sleep = "import time; time.sleep(120)"
subprocess.Popen([sys.executable, "-c", sleep, "flwr-child", marker], start_new_session=True)
args = [sys.executable, "-c", sleep, "flwr-orphan", marker]
orphan = f"import subprocess; subprocess.Popen({args!r}, start_new_session=True)"
subprocess.run([sys.executable, "-c", orphan], check=True)
time.sleep(120)
"""


def _wait_for(condition, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise TimeoutError("condition not reached")


def test_stop_processes_stops_the_tree_and_marked_orphans_only(tmp_path):
    marker = f"127.0.0.1:{free_port()}"
    other = f"127.0.0.1:{free_port()}"
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    proc = harness.start_process([sys.executable, str(script), marker], tmp_path / "logs" / "parent.log")
    bystander = psutil.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)", "flwr-bystander", other], start_new_session=True
    )
    try:

        def named() -> set[int]:  # by the argument itself: the intermediate's script names them too
            return {
                p.pid
                for p in psutil.process_iter(["cmdline"])
                if (p.info["cmdline"] or [])[3:5] in (["flwr-child", marker], ["flwr-orphan", marker])
            }

        _wait_for(lambda: len(named()) == 2)
        tree = processes.related_pids([proc.pid], (marker,))
        assert named() <= tree and proc.pid in tree and bystander.pid not in tree

        harness.stop_processes([proc], markers=(marker,), timeout=10)
        assert proc.poll() is not None
        assert all(processes.is_gone(pid) for pid in tree)
        assert bystander.is_running() and bystander.status() != psutil.STATUS_ZOMBIE  # another address: untouched
    finally:
        bystander.kill()
        bystander.wait(timeout=30)
        harness.stop_processes([proc], markers=(marker,), timeout=5)
