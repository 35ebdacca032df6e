"""What a run served by the ServerApp keeps beside its result files, besides the results themselves:

- ``flower_run.json``: the Flower run id, so a run's folder can be found from the id `flwr run` printed
  (``python -m fl_app.deploy results``);
- with the run-config key ``tracker``, the per-round metrics mirrored to an experiment tracker: ``'tensorboard'``
  (``torch.utils.tensorboard`` event files in ``<output-dir>/tensorboard``) or ``'wandb'`` (an offline run in
  ``<output-dir>/wandb``, synced later with ``wandb sync``). Off (``''``) by default.

The tracker only reads what ``rounds.csv`` and ``metrics.csv`` record, after they are written: every number of a
round's row in ``rounds.csv`` as ``rounds/<column>``, and of ``metrics.csv`` as ``metrics/<column>`` (with
``/<tier MMACs>M`` for a supernet-family tier's row), at step = round. Nothing it does feeds back into training.

``tracking(run, flower_run_id)`` (the ServerApp wraps a run in it) opens the session; ``record_rounds`` (called where
the round files are written) mirrors what is new since the last call.
"""

from __future__ import annotations

import importlib.util
import json
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from fl_app.io.files import write_own_file

RUN_RECORD = "flower_run.json"
ROUND_KEYS = ("round", "tier_macs")  # what says which row a number belongs to, not a metric


class TensorBoard:
    package = "tensorboard"

    def __init__(self, out_dir: Path, run) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(out_dir / "tensorboard"))

    def log(self, step: int, scalars: dict[str, float]) -> None:
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, value, step)
        self.writer.flush()  # a run that dies keeps what it logged

    def close(self) -> None:
        self.writer.close()


class WandbOffline:
    package = "wandb"

    def __init__(self, out_dir: Path, run) -> None:
        import wandb

        self.run = wandb.init(
            mode="offline", dir=str(out_dir), project="fl-app", name=out_dir.name, config=run.to_dict()
        )

    def log(self, step: int, scalars: dict[str, float]) -> None:
        self.run.log(scalars, step=step)

    def close(self) -> None:
        self.run.finish()


# run-config value -> tracker ('' = off)
TRACKERS = {"tensorboard": TensorBoard, "wandb": WandbOffline}


def check_tracker(name: str) -> None:
    """Raise ``ValueError`` naming the key and its values when ``name`` is unknown or its package is missing."""
    allowed = ["", *TRACKERS]
    if name == "":
        return
    if name not in TRACKERS:
        raise ValueError(f"tracker={name!r}: allowed values are {allowed} ('' = off)")
    package = TRACKERS[name].package
    if importlib.util.find_spec(package) is None:
        raise ValueError(
            f"tracker={name!r}: the {package} package is not installed (pip install {package}); "
            f"allowed values are {allowed} ('' = off)"
        )


def round_scalars(metrics_rows: list[dict], round_rows: list[dict]) -> dict[int, dict[str, float]]:
    """round -> {tag: value}: the numbers of the rows of rounds.csv (``round_rows``) and metrics.csv."""
    out: dict[int, dict[str, float]] = {}
    for row in round_rows:
        out.setdefault(int(row["round"]), {}).update(_numbers("rounds", row))
    for row in metrics_rows:
        tier = row.get("tier_macs")
        suffix = f"/{tier / 1e6:.2f}M" if _is_number(tier) else ""
        out.setdefault(int(row["round"]), {}).update(_numbers("metrics", row, suffix))
    return out


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _numbers(prefix: str, row: dict, suffix: str = "") -> dict[str, float]:
    return {f"{prefix}/{k}{suffix}": float(v) for k, v in row.items() if k not in ROUND_KEYS and _is_number(v)}


class Session:
    """One ServerApp run: its Flower run id, its tracker and what it has mirrored per output folder."""

    def __init__(self, run, flower_run_id: int | None) -> None:
        self.run, self.flower_run_id, self.name = run, flower_run_id, run["tracker"]
        self.trackers: dict[Path, object] = {}
        self.logged: dict[Path, set[tuple[int, str]]] = {}

    def record(self, out_dir: Path, metrics_rows: list[dict], round_rows: list[dict]) -> None:
        if out_dir not in self.logged:
            self.logged[out_dir] = set()
            if self.flower_run_id is not None:
                record = json.dumps({"flower_run_id": str(self.flower_run_id)}) + "\n"
                write_own_file(out_dir / RUN_RECORD, record.encode())
            if self.name:
                self.trackers[out_dir] = TRACKERS[self.name](out_dir, self.run)
        tracker, logged = self.trackers.get(out_dir), self.logged[out_dir]
        if tracker is None:
            return
        for step, scalars in sorted(round_scalars(metrics_rows, round_rows).items()):
            new = {tag: value for tag, value in scalars.items() if (step, tag) not in logged}
            if new:
                tracker.log(step, new)
                logged.update((step, tag) for tag in new)

    def close(self) -> None:
        for tracker in self.trackers.values():
            tracker.close()


_sessions: list[Session] = []  # the innermost open session records (a ServerApp runs one run at a time)


@contextmanager
def tracking(run, flower_run_id: int | None = None) -> Iterator[Session]:
    """Open the session of one run; its tracker's package is checked here, before any training."""
    check_tracker(run["tracker"])
    session = Session(run, flower_run_id)
    _sessions.append(session)
    try:
        yield session
    finally:
        _sessions.remove(session)
        session.close()


def record_rounds(out_dir: Path, metrics_rows: list[dict], round_rows: list[dict]) -> None:
    """Mirror what is new in the rows just written to ``out_dir``'s metrics.csv and rounds.csv (no-op outside a
    ``tracking`` session)."""
    if _sessions:
        _sessions[-1].record(Path(out_dir), metrics_rows, round_rows)
