"""A stopped suite resumes safely: one runner per OUT (``suite_lock``), no link followed inside OUT
(``refuse_links``), Flower runs left by a dead runner stopped (``stop_left_running``), an interrupted run moved
aside and continued from its latest usable checkpoint (``resume_point``), and a stopped suite's unfinished runs made
continuable from committed files on another machine (``park_unfinished``)."""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
from pathlib import Path

from experiments.runner.flower_env import is_alive, stop_in_flight
from experiments.runner.planning import PlannedRun, differing_keys
from experiments.runner.records import (
    RUN_RECORD,
    RUNNING,
    make_summary_portable,
    portable_record_config,
    read_record,
)
from experiments.runner.suite import SuiteMismatch
from fl_app.io.files import first_link
from fl_app.run.config import SUPERNET_METHODS
from fl_app.run.outputs import write_json

CHECKPOINT = "checkpoint.pt"  # fl_app.run.checkpoint.CHECKPOINT_FILE (not imported here: it loads torch)
LOCK_FILE = ".runner.lock"  # in OUT: held (flock) by the one runner writing that suite folder


def move_aside(folder: Path) -> Path:
    """Keep an interrupted or failed run's partial files under a new name instead of deleting them."""
    k = next(k for k in itertools.count(1) if not folder.with_name(f"{folder.name}.interrupted-{k}").exists())
    target = folder.with_name(f"{folder.name}.interrupted-{k}")
    folder.rename(target)
    return target


def interrupted_copies(folder: Path) -> list[Path]:
    """The interrupted or failed earlier attempts at ``folder``'s run (``move_aside``), oldest first."""
    copies = folder.parent.glob(f"{folder.name}.interrupted-*")
    numbered = [p for p in copies if p.name.rsplit("-", 1)[1].isdigit()]
    return sorted(numbered, key=lambda p: int(p.name.rsplit("-", 1)[1]))


def read_checkpoint(folder: Path) -> tuple[dict | None, str]:
    """(content, '') of the verified checkpoint in ``folder``, or (None, why it cannot be used): read and hashed once
    for all that is asked of it (its round, its data record)."""
    from fl_app.run.checkpoint import load_verified

    path = folder / CHECKPOINT
    if path.is_symlink() or not path.is_file():
        return None, f"no {CHECKPOINT}"
    try:
        saved = load_verified(path, what=str(path))
    except ValueError as error:
        return None, str(error)
    return (saved, "") if isinstance(saved.get("round"), int) else (None, f"{path}: no round recorded")


def checkpoint_round(folder: Path) -> tuple[int | None, str]:
    """(round, '') of the verified checkpoint in ``folder``, or (None, why it cannot be used)."""
    saved, why = read_checkpoint(folder)
    return (saved["round"], "") if saved is not None else (None, why)


def resume_point(run: PlannedRun, commit: str) -> tuple[Path | None, int, list[str]]:
    """The interrupted copy of ``run`` to continue from: the one whose checkpoint has the latest round among those
    made with the run's settings (``differing_keys``) at this commit, before the last round. Returns (folder,
    round, why the other copies are not used); (None, 0, ...) when none is usable, so the run starts at round 1.
    The app checks the checkpoint again (content hash, model, run config, federation) before it trains.

    The model-heterogeneous methods keep each client's model in the folder of the run that last trained it, so a
    copy that itself continued another is never continued again (its clients' files are partly in the older copy):
    those methods continue only from a run that started at round 1."""
    best, best_round, skipped = None, 0, []
    for folder in interrupted_copies(run.folder):
        record = read_record(folder)
        if record is None:
            skipped.append(f"{folder.name}: no {RUN_RECORD}")
            continue
        differences = differing_keys(record, run)
        saved, why = read_checkpoint(folder)
        number = saved["round"] if saved is not None else None
        if differences:
            why = "other settings: " + "; ".join(differences)
        elif record.get("commit") != commit:
            why = f"made at commit {str(record.get('commit'))[:7]}, this tree is at {commit[:7]}"
        elif record.get("resumed_from") and run.run_config["method"] not in SUPERNET_METHODS:
            why = f"it continued {record['resumed_from']} (client model files lie in both)"
        elif number is not None and number >= run.run_config["num-server-rounds"]:
            why = f"its checkpoint is at the last round ({number})"
        elif number is not None:
            why = data_path_mismatch(saved, run)
        if why:
            skipped.append(f"{folder.name}: {why}")
        elif number >= best_round:
            best, best_round = folder, number
    return best, best_round, skipped


def earlier_segments(copy: Path, resumed_after_round: int) -> list[dict]:
    """Where the rounds a run continued from ``copy`` (its checkpoint of round ``resumed_after_round``) takes over
    were trained, oldest first: each segment's folder, first and last kept round, commit, start and machine (the
    copies that ``copy`` itself continued come first). The continued run's record lists them beside its own machine,
    so a run trained on two machines says which processor trained which rounds (the last bits of a result may differ
    between processors: ``machine.differences``); the rounds a segment trained after its last checkpoint were
    trained again and are not counted."""
    record = read_record(copy) or {}
    before = record.get("earlier_segments")
    machine = {k: v for k, v in (record.get("machine") or {}).items() if k != "load_average_at_end"}
    segment = {
        "folder": copy.name,
        "rounds": [int(record.get("resumed_after_round") or 0) + 1, resumed_after_round],
        "commit": record.get("commit"),
        "started_at": record.get("started_at"),
        "machine": machine or None,
    }
    return [*(before if isinstance(before, list) else []), segment]


def data_path_mismatch(saved: dict, run: PlannedRun) -> str:
    """Why the app would refuse the checkpoint ``saved`` (``read_checkpoint``) for ``run`` by its data-path, or '': a
    checkpoint written before checkpoints recorded their data by content continues only at the data-path it names."""
    from fl_app.run.checkpoint import DATA_RECORD

    named, here = saved["run_config"].get("data-path", ""), run.launch_config().get("data-path", "")
    if DATA_RECORD in saved or named == here:
        return ""
    return f"its checkpoint records its data by path only, {named!r}, and this run reads {here!r}"


LIVE_FIELDS = ("flower", "runner")  # what a running run's record says of this machine's processes


def stop_left_running(runs: list[PlannedRun], out: Path, printer=print) -> None:
    """Before anything trains: a run whose record says it is running was left by a runner that died (SIGKILL, out of
    memory) and its detached SuperLink may still be training it, writing into the folder the runner is about to
    reuse. Stop it (the processes its record names, by pid and start time, and what they spawned) and say so;
    refuse when the runner that owns the record is still alive, or when its processes do not stop."""
    for run in runs:
        record = read_record(run.folder) if run.action in ("train", "pending") else None
        if not record or record.get("status") != RUNNING:
            continue
        where = run.folder / RUN_RECORD
        runner = record.get("runner")
        if isinstance(runner, dict) and runner.get("pid") != os.getpid() and is_alive(runner):
            raise SuiteMismatch(
                f"{where}: runner process {runner.get('pid')} is training this run now; "
                "wait for it to end (or stop it), then run again"
            )
        flower = record.get("flower")
        if not isinstance(flower, dict):
            continue
        left = stop_in_flight(flower)
        if left:
            raise SuiteMismatch(
                f"{where}: the Flower run {flower.get('run_id')} left running did not stop (pids {left})"
            )
        printer(
            f"{run.name} seed={run.seed}: stopped Flower run {flower.get('run_id')}, left running by a runner that "
            f"died, before retrying it ({run.folder.relative_to(out)})",
            flush=True,
        )
        stopped = {k: v for k, v in record.items() if k not in LIVE_FIELDS}
        write_json(run.folder / RUN_RECORD, {**stopped, "status": "stopped: its runner died"}, replace=True)


def park_unfinished(runs: list[PlannedRun], out: Path, printer=print) -> list[Path]:
    """Make a stopped suite continuable on another machine from committed files: each unfinished run of ``runs``
    with a usable checkpoint is moved aside now, as the next ``run`` would move it (``move_aside``), its record keeps
    no trace of this machine's processes (``LIVE_FIELDS``: pids, FLWR_HOME, ports), and neither its summary, its
    checkpoint nor its clients' model files hold an absolute path (``make_checkpoint_portable``). Returns the files to
    commit: the results' .gitignore leaves checkpoints out, so they are committed with ``git add -f``. A run left
    training by a dead runner is stopped first (``stop_left_running``); one without a usable checkpoint stays where
    it is, said so (it trains from round 1 next time); one whose checkpoint can continue only at this machine's
    paths is parked but not listed, said so."""
    stop_left_running(runs, out, printer)
    parked = []
    for run in runs:
        if run.action not in ("train", "pending") or not run.folder.exists():
            continue
        saved, why = read_checkpoint(run.folder)
        if saved is None:
            printer(f"{run.name} seed={run.seed}: not parked ({why}); it trains from round 1 next time", flush=True)
            continue
        number = saved["round"]
        copy = move_aside(run.folder)
        record = {k: v for k, v in (read_record(copy) or {}).items() if k not in LIVE_FIELDS}
        write_json(copy / RUN_RECORD, {**record, "status": f"parked after round {number}"}, replace=True)
        make_summary_portable(copy)
        where = f"{run.name} seed={run.seed}: parked as {copy.relative_to(out)} (checkpoint of round {number})"
        try:
            parked += make_checkpoint_portable(copy, saved)
        except ValueError as error:
            printer(f"{where}, to be continued on this machine only: {error}", flush=True)
            continue
        printer(where)
    return parked


def make_checkpoint_portable(folder: Path, saved: dict) -> list[Path]:
    """Rewrite the run config in a parked run's checkpoint (its content ``saved``, ``read_checkpoint``) and its
    clients' model files into the portable form (``portable_record_config``: data-path relative to the repository,
    output-dir '.'), each file verified anew. Returns the files. Raises ``ValueError`` for a checkpoint that records
    its data by path only (written before checkpoints recorded it by content): another data-path would not continue
    it, so it stays as it is."""
    from fl_app.run.checkpoint import DATA_RECORD, MODELS_DIR, rewrite_run_config

    checkpoint = folder / CHECKPOINT
    if DATA_RECORD not in saved:
        raise ValueError(f"{checkpoint.name} records its data by path only (written before checkpoints held it)")
    files = [checkpoint, *sorted((folder / MODELS_DIR).rglob("*.pt"))]
    for path in files:
        if path.is_symlink():
            raise ValueError(f"{path.relative_to(folder)} is a link; nothing is written through it")
        rewrite_run_config(path, lambda run_config: portable_record_config(run_config, folder))
    return files


class SuiteBusy(SuiteMismatch):
    pass


@contextlib.contextmanager
def suite_lock(out: Path):
    """Hold OUT's lock file (``LOCK_FILE``, ``flock``) while a runner plans and writes there: a second runner on the
    same OUT is refused at once, before it reads or moves anything. The lock ends with the process, however it
    ends, so a killed runner leaves nothing to clean up."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as error:
        raise SuiteMismatch(
            f"{path}: cannot be opened as the runner's lock ({error.strerror}); nothing was changed"
        ) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SuiteBusy(
                f"--out {out}: another runner is writing this suite folder (it holds {LOCK_FILE}); nothing was "
                "read, moved or written; run again when it has ended, or choose another --out"
            ) from None
        yield
    finally:
        os.close(fd)


def refuse_links(runs: list[PlannedRun], out: Path) -> None:
    """A link inside OUT on the way to a run folder (runs/, runs/<label>, seed<N>) is refused before anything is
    moved or written: the runner never follows one out of its folder."""
    for run in runs:
        for folder in (run.folder, *interrupted_copies(run.folder)):
            link = first_link(out, folder)
            if link is not None:
                raise SuiteMismatch(
                    f"{link}: a symbolic link inside --out {out}; the runner never follows links in its output "
                    "folder (replace it with a real folder)"
                )
