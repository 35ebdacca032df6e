"""Fetch a finished run's output folder from the SuperLink's host, given the run id `flwr run` printed.

In a deployment the ServerApp runs beside the SuperLink and writes the run's files there; Flower 1.42 has no way of its
own to hand them to the user who started the run (`flwr pull` asks the SuperLink for a download link, which needs an
artifact provider that only Flower's enterprise edition ships). ``fetch_results`` does it in three steps:

1. ``flwr ls <connection> --run-id ID --format json``: the run exists on this connection's SuperLink and has finished
   (a running run's files are not complete yet);
2. its folder is found on the SuperLink's host under the given roots (default ``~/fl_app_runs``, where runs without
   ``output-dir`` go; for ``output-dir='/data/runs/exp1'`` give ``/data/runs``) by the ``flower_run.json`` the
   ServerApp writes beside the results (``fl_app.run.tracker``);
3. the folder is streamed as a tar archive and unpacked into a new local folder (0700), refusing links that point
   outside it and absolute names. With ``ssh=[USER@]HOST`` both the search and the archive run on that host through
   ``ssh`` (your usual keys and ``~/.ssh/config``); without it, on this machine (the SuperLink runs here, or its
   folders are mounted here).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from fl_app.deploy.files import PRIVATE_DIR, make_private_dir
from fl_app.run.flwr_status import run_status
from fl_app.run.tracker import RUN_RECORD

DEFAULT_RUNS = ("~/fl_app_runs",)
# On the SuperLink's host: for each root (argument), print "<folder>\n<flower_run.json on one line>\n" for the root
# itself and every folder directly below it that holds a run record. POSIX sh; no Python needed there.
LOCATE = r"""
for root in "$@"; do
  case "$root" in "~") root=$HOME ;; "~/"*) root=$HOME/${root#"~/"} ;; esac
  for record in "$root/flower_run.json" "$root"/*/flower_run.json; do
    if [ -f "$record" ] && [ ! -L "$record" ]; then
      printf '%s\n' "${record%/flower_run.json}"
      tr -d '\n' < "$record"
      printf '\n'
    fi
  done
done
"""


def _on_host(command: list[str], ssh: str | None) -> list[str]:
    """``command`` to run on the SuperLink's host: as it is here, or as one shell-quoted line through ssh."""
    return ["ssh", ssh, shlex.join(command)] if ssh else command


def locate_run(run_id: str, runs: list[str], ssh: str | None = None, timeout: float = 120.0) -> str:
    """The folder on the SuperLink's host whose flower_run.json names ``run_id``, searched in ``runs`` (and one level
    below each)."""
    proc = subprocess.run(
        _on_host(["sh", "-c", LOCATE, "sh", *runs], ssh),
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"searching {runs} on {ssh or 'this machine'} failed ({proc.returncode}): {proc.stderr}")
    lines = proc.stdout.splitlines()
    found = []
    for folder, record in zip(lines[::2], lines[1::2]):
        try:
            if str(json.loads(record).get("flower_run_id")) == str(run_id):
                found.append(folder)
        except (ValueError, AttributeError):
            continue  # not a record this project wrote
    if len(found) != 1:
        where = f"{', '.join(runs)} on {ssh or 'this machine'}"
        raise ValueError(
            f"run {run_id}: {'no run folder' if not found else f'{len(found)} run folders ({found})'} under {where} "
            f"hold{'s' if not found else ''} a {RUN_RECORD} naming it; pass --runs with the folder that holds the "
            "run's output-dir (default: ~/fl_app_runs)"
        )
    return found[0]


def copy_folder(folder: str, out: Path, run_id: str, ssh: str | None = None, timeout: float = 3600.0) -> Path:
    """Stream ``folder`` (on the SuperLink's host) as a tar archive into the new local folder ``out``, which appears
    only once the copy is whole and its run record names ``run_id``."""
    source = Path(folder)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        command = _on_host(["tar", "-C", str(source.parent), "-cf", "-", source.name], ssh)
        with subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL
        ) as proc:
            with tarfile.open(fileobj=proc.stdout, mode="r|") as archive:
                archive.extractall(staging, filter="data")  # no absolute names, no links leading outside
            error = proc.stderr.read().decode(errors="replace")
            code = proc.wait(timeout=timeout)
        if code != 0:
            raise RuntimeError(f"copying {folder} from {ssh or 'this machine'} failed ({code}): {error}")
        copied = staging / source.name
        record = json.loads((copied / RUN_RECORD).read_text())
        if str(record.get("flower_run_id")) != str(run_id):  # the folder was reused between the search and the copy
            raise ValueError(f"{folder}: its {RUN_RECORD} names run {record.get('flower_run_id')}, not {run_id}")
        os.chmod(copied, PRIVATE_DIR)
        os.rename(copied, out)  # fails if something took the name meanwhile
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def fetch_results(
    run_id: str,
    connection: str,
    out: str | Path,
    runs: list[str] | tuple[str, ...] = DEFAULT_RUNS,
    ssh: str | None = None,
    env: dict | None = None,
) -> dict:
    """Copy the output folder of the finished run ``run_id`` (on ``connection``'s SuperLink) into the new local folder
    ``out``; returns {"run_id", "status", "folder" (on the SuperLink's host), "out"}."""
    out = Path(out)
    if os.path.lexists(out):
        raise FileExistsError(f"--out {out} already exists; choose a new folder (nothing is ever overwritten)")
    status = run_status(run_id, connection, env)
    if not status.startswith("finished"):
        raise ValueError(
            f"run {run_id} is {status!r}: its files are complete once it has finished (wait for it, or "
            f"`flwr stop {run_id} {connection}`)"
        )
    folder = locate_run(run_id, list(runs), ssh)
    make_private_dir(out.parent)
    copy_folder(folder, out, run_id, ssh)
    return {"run_id": str(run_id), "status": status, "folder": folder, "out": str(out)}
