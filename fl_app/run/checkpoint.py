"""Checkpoints that are verified before they are trusted: round checkpoints and resume for every method, and the
model files the model-heterogeneous methods' clients keep for a resume.

Verified files (any method, any model)::

    fingerprint = model_fingerprint(run, model_config)   # model_config: a plain dict that defines the model
    save_verified(path, blob, fingerprint, replace_if=None)
    blob = load_verified(path, fingerprint, what="resume-from='...'")

``save_verified`` adds an ``integrity`` record to ``blob``: the SHA-256 of its content (every tensor's dtype, shape and
bytes, every other value, in a canonical order) and the model fingerprint with what it was computed from. It writes
through ``fl_app.io.files.write_new_file`` (a fresh temporary file, fsynced, then moved into place), so a crash never
leaves a half file under the real name. It never replaces an existing file unless ``replace_if(existing_blob)``
says so for a verified file (e.g. an earlier round of the same run); anything else at the path (another file, a
symlink) is refused with ``FileExistsError``.
``load_verified`` reads with ``weights_only=True`` (no code is unpickled), recomputes the hash and compares the
fingerprint: a flipped byte, a truncated file or a checkpoint of another model is refused with ``ValueError`` naming
the file and what differs. The blob holds plain containers, numbers, strings and tensors; ``torch.load(path,
weights_only=True)`` still reads it directly.

The fingerprint covers ``model_config`` (e.g. the supernet config's ``to_dict()``, which catches a supernet JSON whose
content changed under the same name) and the run-config keys that define a model (``MODEL_RUN_KEYS``).

Round checkpoints (``write_run_checkpoint`` / ``load_run_checkpoint``, one file per run folder) hold the round, the
run config, the federation size, the method family's own state, the server's RNG states and the clients' statistics
(``client_records``: clients.csv's rows and each round's training FLOPs). The supernet methods' state is the global
model, the strategy's state (round logs, baseline bookkeeping) and the metrics measured so far
(``write_round_checkpoint`` / ``load_round_checkpoint``); the model-heterogeneous methods' is the strategy's state and
the run token naming their clients' model files. Resuming also demands the same run config (except
``RESUME_MAY_CHANGE``) and federation size, and the same data: a checkpoint records its run's data by content
(``DATA_RECORD``), so the data-path may differ when the files there are the same (``rewrite_run_config`` lets the
runner's ``park`` keep a checkpoint free of the paths of the machine that made it).

Client model files (model-heterogeneous methods): models never leave the clients, so each client saves its own model
after every round it trains (``save_model_file``, in ``client_model_dirs``) and a resumed run's clients reload the
newest one at or before the checkpoint's round (``restore_model_file``).
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import os
import random
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from fl_app.data.images import DATASETS
from fl_app.data.provenance import data_fingerprint
from fl_app.io.files import remember_written, write_new_file, wrote_here
from fl_app.models.multiarch import architecture_of
from fl_app.models.supernet_space import load_supernet_config
from fl_app.run.config import RunConfig
from fl_app.run.outputs import CLIENT_RECORDS_KEY

CHECKPOINT_FILE = "checkpoint.pt"
MODELS_DIR = "client-models"  # where clients keep model files for a resume (see ``client_model_dirs``)
# client config keys: the run's token (names its model files' folder in a state-dir and is recorded in each file), and
# the token of the run a resume continues ('' for a checkpoint written before runs had one)
RUN_TOKEN, RESUME_TOKEN = "run-token", "resume-run-token"
FORMAT_VERSION = 2  # 2: every file carries an integrity record
# keys that may differ between a checkpoint's run and the run resuming it: none of them changes what is computed
RESUME_MAY_CHANGE = ("output-dir", "resume-from", "checkpoint-every", "round-timeout", "tracker")
# run-config keys that decide which model (architecture and classes) a state belongs to
MODEL_RUN_KEYS = ("method", "dataset", "supernet", "model-family", "feature-dim")
# a round checkpoint's record of the data its run reads, by content (``run_data``): a resume may then read the same
# files at another data-path (another machine, or a checkpoint parked with a path relative to the repository)
DATA_RECORD = "data"
INTEGRITY = "integrity"


# -- verified files ------------------------------------------------------------------------------------------------
# Bounds on the walk over a loaded blob, so a small crafted file cannot make hashing run forever (shared nested
# lists: 2^depth paths) or overflow the stack (lists nested 200,000 deep). An honest checkpoint is a few levels deep.
MAX_DEPTH = 64
MAX_NODES = 10_000_000  # containers and values, each shared container counted once


def _feed(digest, value, what: str = "the checkpoint") -> None:
    """Hash ``value`` canonically: dict keys sorted, tensors by dtype, shape and raw bytes. The walk is iterative and
    bounded (``MAX_DEPTH``, ``MAX_NODES``); a container met again (shared, or a cycle) is fed as a reference to its
    first visit, so each is walked once. A tree without sharing hashes exactly as it always did."""
    seen: dict[int, int] = {}  # id of a container walked -> its ordinal
    nodes = 0
    stack: list = [(value, 0, None)]  # (value, depth, field path as (parent, key) links)
    while stack:
        value, depth, field = stack.pop()
        nodes += 1
        if nodes > MAX_NODES or depth > MAX_DEPTH:
            limit = f"more than {MAX_NODES} values" if nodes > MAX_NODES else f"nested deeper than {MAX_DEPTH} levels"
            raise ValueError(f"{what}: field {_field_name(field)} is {limit}; an app checkpoint never is")
        if isinstance(value, (dict, list, tuple)):
            if id(value) in seen:
                digest.update(b"s%d;" % seen[id(value)])
                continue
            seen[id(value)] = len(seen)
            if isinstance(value, dict):
                digest.update(b"d%d;" % len(value))
                items = []
                for key in sorted(value, key=repr):
                    items += [(key, depth + 1, (field, "<key>")), (value[key], depth + 1, (field, key))]
            else:
                digest.update(b"l%d;" % len(value))
                items = [(item, depth + 1, (field, i)) for i, item in enumerate(value)]
            stack.extend(reversed(items))
        elif isinstance(value, (torch.Tensor, np.ndarray)):
            tensor = torch.as_tensor(value).detach().cpu().contiguous()
            digest.update(f"t{tensor.dtype}{tuple(tensor.shape)};".encode())
            raw = tensor.view(torch.int16) if tensor.dtype == torch.bfloat16 else tensor
            digest.update(raw.numpy().tobytes())
        elif value is None or isinstance(value, (bool, int, float, str, np.generic)):
            digest.update(f"{type(value).__name__}:{value!r};".encode())
        else:
            raise TypeError(
                f"{what}: field {_field_name(field)}: a checkpoint holds containers, numbers, strings and tensors, "
                f"not {type(value).__name__}"
            )


def _field_name(field) -> str:
    keys = []
    while field is not None:
        field, key = field
        keys.append(key)
    shown = [repr(k)[:40] for k in reversed(keys)]
    if len(shown) > 6:
        shown = shown[:3] + [f"...{len(shown) - 5} more..."] + shown[-2:]
    return "[" + "][".join(shown) + "]" if shown else "(the whole blob)"


def content_hash(record: dict, what: str = "the checkpoint") -> str:
    """SHA-256 of everything in ``record`` but the hash itself (the fingerprint is covered too). A blob past the
    walk's bounds raises ``ValueError`` naming ``what`` and the field."""
    integrity = {k: v for k, v in record.get(INTEGRITY, {}).items() if k != "sha256"}
    digest = hashlib.sha256()
    _feed(digest, {**record, INTEGRITY: integrity}, what)
    return digest.hexdigest()


def model_fingerprint(run: RunConfig | dict, model_config: dict) -> dict:
    """What a saved state belongs to: the model config and the model-defining run-config keys, with their hash."""
    values = run.to_dict() if isinstance(run, RunConfig) else dict(run)
    defined_by = {"model": model_config, "run": {k: values.get(k) for k in MODEL_RUN_KEYS}}
    return {"sha256": hashlib.sha256(json.dumps(defined_by, sort_keys=True).encode()).hexdigest(), **defined_by}


def supernet_fingerprint(run: RunConfig) -> dict:
    """The fingerprint of the supernet methods' model: the supernet config (from its name or JSON file)."""
    cfg = load_supernet_config(run["supernet"], n_classes=DATASETS[run["dataset"]].num_classes)
    return model_fingerprint(run, cfg.to_dict())


def multiarch_fingerprint(run: RunConfig, num_clients: int) -> dict:
    """What FedTopo-family checkpoints belong to: every client's architecture, the classes and the feature size."""
    return model_fingerprint(
        run,
        {
            "architectures": [architecture_of(run["model-family"], p, run["backbones"]) for p in range(num_clients)],
            "num-classes": DATASETS[run["dataset"]].num_classes,
            "feature-dim": run["feature-dim"],
            "num-clients": num_clients,
        },
    )


def save_verified(
    path: str | Path, blob: dict, fingerprint: dict, replace_if: Callable[[dict], bool] | None = None
) -> Path:
    """Write ``blob`` with its integrity record atomically; see the module docstring for what may be replaced."""
    path = Path(path)
    record = {**blob, INTEGRITY: {"format": FORMAT_VERSION, "fingerprint": fingerprint}}
    record[INTEGRITY]["sha256"] = content_hash(record)
    if os.path.lexists(path):
        _refuse_unless_replaceable(path, replace_if)
    write_new_file(path, lambda out: torch.save(record, out), replace=replace_if is not None)
    remember_written(path)  # a round checkpoint replaces only what this run wrote (``same_run_earlier_round``)
    return path


def _refuse_unless_replaceable(path: Path, replace_if) -> None:
    if replace_if is None or path.is_symlink() or not path.is_file():
        raise FileExistsError(f"{path} exists; a checkpoint never replaces another file (choose a new path)")
    try:
        existing = load_verified(path)
    except ValueError as error:
        raise FileExistsError(f"{path} exists and is not a verified checkpoint, so it is kept: {error}") from None
    if not replace_if(existing):
        raise FileExistsError(f"{path} holds a checkpoint of another run (or a later round); it is kept")


def load_verified(path: str | Path, fingerprint: dict | None = None, what: str | None = None) -> dict:
    """Read a file written by ``save_verified``; refuse it (``ValueError``) unless its content hash matches and, when
    ``fingerprint`` is given, it belongs to that model. ``what`` names the file in messages (default: the path)."""
    return _read_verified(path, fingerprint, what)[0]


def _read_verified(path: str | Path, fingerprint: dict | None, what: str | None) -> tuple[dict, dict]:
    """``load_verified``'s content and the model fingerprint the file records."""
    what = what or str(path)
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # a truncated, damaged or foreign file
        raise ValueError(f"{what}: not a readable checkpoint ({type(error).__name__}: {error})") from error
    integrity = blob.get(INTEGRITY) if isinstance(blob, dict) else None
    if (
        not isinstance(integrity, dict)
        or integrity.get("format") != FORMAT_VERSION
        or not isinstance(integrity.get("fingerprint"), dict)
    ):
        raise ValueError(
            f"{what}: not a verified checkpoint of this app (no integrity record of format {FORMAT_VERSION})"
        )
    try:
        actual = content_hash(blob, what)
    except TypeError as error:
        raise ValueError(str(error)) from None
    if actual != integrity.get("sha256"):
        raise ValueError(
            f"{what}: content hash mismatch (recorded {str(integrity.get('sha256'))[:16]}..., "
            f"computed {actual[:16]}...): the file was altered or damaged; it is not used"
        )
    if fingerprint is not None and integrity["fingerprint"].get("sha256") != fingerprint["sha256"]:
        difference = _fingerprint_difference(integrity["fingerprint"], fingerprint)
        raise ValueError(f"{what}: a checkpoint of another model ({difference}); it is not used")
    return {k: v for k, v in blob.items() if k != INTEGRITY}, integrity["fingerprint"]


def rewrite_run_config(path: str | Path, change: Callable[[dict], dict]) -> bool:
    """Replace the run config a verified file records by ``change(run_config)`` and verify the file anew (same
    content otherwise, same model fingerprint); False when the run config stays as it was. The runner's ``park``
    uses it to keep a checkpoint free of the paths of the machine that made it. Raises ``ValueError`` for a file
    that does not verify."""
    blob, fingerprint = _read_verified(path, None, None)
    run_config = change(dict(blob["run_config"]))
    if run_config == blob["run_config"]:
        return False
    save_verified(path, {**blob, "run_config": run_config}, fingerprint, replace_if=lambda old: True)
    return True


def _fingerprint_difference(saved: dict, current: dict) -> str:
    differences = [
        f"run-config {k}: checkpoint {saved.get('run', {}).get(k)!r} vs now {v!r}"
        for k, v in current["run"].items()
        if saved.get("run", {}).get(k) != v
    ]
    saved_model, model = saved.get("model") or {}, current["model"] or {}
    if isinstance(saved_model, dict) and isinstance(model, dict):
        differences += [
            f"model {k}: checkpoint {saved_model.get(k)!r} vs now {model.get(k)!r}"
            for k in sorted(set(saved_model) | set(model), key=str)
            if saved_model.get(k) != model.get(k)
        ]
    return "; ".join(differences) or "fingerprints differ"


# -- round checkpoints ---------------------------------------------------------------------------------------------
def capture_rng() -> dict:
    numpy_state = np.random.get_state(legacy=False)
    return {
        "torch": torch.get_rng_state(),
        "numpy": {
            "bit_generator": numpy_state["bit_generator"],
            "key": torch.from_numpy(numpy_state["state"]["key"].astype(np.int64)),
            "pos": int(numpy_state["state"]["pos"]),
            "has_gauss": int(numpy_state["has_gauss"]),
            "gauss": float(numpy_state["gauss"]),
        },
        "python": [random.getstate()[0], list(random.getstate()[1]), random.getstate()[2]],
    }


def restore_rng(saved: dict) -> None:
    torch.set_rng_state(saved["torch"])
    numpy_saved = saved["numpy"]
    np.random.set_state(
        {
            "bit_generator": numpy_saved["bit_generator"],
            "state": {"key": numpy_saved["key"].numpy().astype(np.uint32), "pos": numpy_saved["pos"]},
            "has_gauss": numpy_saved["has_gauss"],
            "gauss": numpy_saved["gauss"],
        }
    )
    version, internal, gauss = saved["python"]
    random.setstate((version, tuple(internal), gauss))


def run_config_differences(saved: dict, current: dict, data_checked: bool = False) -> list[str]:
    """The run-config keys that differ and may not (``RESUME_MAY_CHANGE``; also data-path once the data was compared
    by content, ``data_checked``)."""
    may_change = RESUME_MAY_CHANGE + (("data-path",) if data_checked else ())
    return sorted(k for k in set(saved) | set(current) if k not in may_change and saved.get(k) != current.get(k))


def run_data(run: RunConfig) -> dict:
    """What ``run`` reads, by content (``data_fingerprint``): the round checkpoints' ``DATA_RECORD``. Hashed once a
    process (an image folder may be large; every checkpoint of the run records the same)."""
    return copy.deepcopy(_data_fingerprint_once(run["dataset"], run["data-source"], run["data-path"]))


@functools.lru_cache(maxsize=8)
def _data_fingerprint_once(dataset: str, source: str, data_path: str) -> dict:
    return data_fingerprint(dataset, source, data_path)


def same_run_earlier_round(run: RunConfig, server_round: int, path: Path | None = None) -> Callable[[dict], bool]:
    """``replace_if`` for round checkpoints: only an earlier round of a run with this run config is replaced, and,
    given the ``path``, only the file this run (this process) wrote there, not another run's with the same config."""
    current = run.to_dict()
    return lambda old: (
        (path is None or wrote_here(path))
        and not run_config_differences(old.get("run_config", {}), current)
        and old.get("round", server_round) < server_round
    )


def write_run_checkpoint(
    out_dir: Path,
    server_round: int,
    run: RunConfig,
    num_clients: int,
    fingerprint: dict,
    state: dict,
    client_records: dict | None = None,
) -> Path:
    """``out_dir``/checkpoint.pt after ``server_round``: the round, the run config, the federation size, the method
    family's ``state``, the server's RNG states and the clients' statistics. It replaces only an earlier round's
    checkpoint this run wrote (``same_run_earlier_round``)."""
    path = Path(out_dir) / CHECKPOINT_FILE
    extra = {} if client_records is None else {CLIENT_RECORDS_KEY: client_records}
    return save_verified(
        path,
        {
            "format": FORMAT_VERSION,
            "round": server_round,
            "run_config": run.to_dict(),
            "num_clients": num_clients,
            DATA_RECORD: run_data(run),
            **state,
            "rng": capture_rng(),
            **extra,
        },
        fingerprint,
        replace_if=same_run_earlier_round(run, server_round, path),
    )


def supernet_checkpoint_state(global_state: dict[str, np.ndarray], strategy_state: dict, metrics: dict) -> dict:
    """The supernet methods' part of a round checkpoint: the global model, the strategy's state and the metrics."""
    return {
        "global_state": {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in global_state.items()},
        "strategy": strategy_state,
        "metrics": metrics,
    }


def write_round_checkpoint(
    out_dir: Path,
    server_round: int,
    run: RunConfig,
    num_clients: int,
    global_state: dict[str, np.ndarray],
    strategy_state: dict,
    metrics: dict,
    client_records: dict | None = None,
) -> Path:
    """A supernet method's round checkpoint (``write_run_checkpoint`` with ``supernet_checkpoint_state``)."""
    state = supernet_checkpoint_state(global_state, strategy_state, metrics)
    return write_run_checkpoint(
        out_dir, server_round, run, num_clients, supernet_fingerprint(run), state, client_records
    )


def load_run_checkpoint(location: str | Path, run: RunConfig, num_clients: int, fingerprint: dict) -> tuple[Path, dict]:
    """(the file, its content) of the checkpoint at ``location`` (a file or the run folder holding it), after checking
    that ``run`` may continue it: content hash and model ``fingerprint``, the run config (only ``RESUME_MAY_CHANGE``
    may differ), the federation size and a round before the last. Any method's resume uses it; raises
    ``ValueError`` naming what is wrong before any training starts."""
    path = Path(location).expanduser()
    if path.is_dir():
        path = path / CHECKPOINT_FILE
    what = f"resume-from='{location}'"
    if not path.is_file():
        raise ValueError(f"{what}: no {CHECKPOINT_FILE} there")
    blob = load_verified(path, fingerprint, what=what)
    saved, current = blob["run_config"], run.to_dict()
    saved_data = blob.get(DATA_RECORD)  # none in a checkpoint written before checkpoints recorded their data
    if saved_data is not None and saved_data != run_data(run):
        raise ValueError(
            f"{what}: data-path={run['data-path']!r} holds other data than the checkpoint's run read "
            f"(by content: {saved_data} vs {run_data(run)})"
        )
    differing = run_config_differences(saved, current, data_checked=saved_data is not None)
    if differing:
        details = ", ".join(f"{k}: checkpoint {saved.get(k)!r} vs now {current.get(k)!r}" for k in differing)
        raise ValueError(
            f"{what}: the run config differs from the checkpoint's ({details}); "
            f"only {list(RESUME_MAY_CHANGE)} may change"
        )
    if blob["num_clients"] != num_clients:
        raise ValueError(
            f"{what}: the checkpoint's federation has {blob['num_clients']} clients, this one "
            f"{num_clients} (num-supernodes)"
        )
    if blob["round"] >= run["num-server-rounds"]:
        raise ValueError(
            f"{what}: the checkpoint is at round {blob['round']}, the run has only "
            f"num-server-rounds={run['num-server-rounds']}"
        )
    return path, blob


def load_round_checkpoint(location: str | Path, run: RunConfig, num_clients: int) -> dict:
    """The supernet methods' round checkpoint at ``location``, checked by ``load_run_checkpoint``."""
    _, blob = load_run_checkpoint(location, run, num_clients, supernet_fingerprint(run))
    return supernet_state_of(blob)


def supernet_state_of(blob: dict) -> dict:
    """A supernet method's checkpoint content with its global model as numpy arrays (as the strategy holds it)."""
    blob["global_state"] = {k: v.numpy() for k, v in blob["global_state"].items()}
    return blob


# -- client model files (model-heterogeneous methods) --------------------------------------------------------------
def run_folder(state_dir: str, token: str) -> str:
    """The folder of one run's model files in a node's ``state-dir``: every run keeps its own (named by the run
    token, which a resumed run takes over from its checkpoint), so runs sharing a node never replace each other's
    files. No token (a checkpoint written before runs had one): the ``state-dir`` itself."""
    return str(Path(state_dir) / f"run-{token}") if token else state_dir


def client_model_dirs(config, node_config) -> tuple[str, str]:
    """(folder to save this client's model files in, folder to resume them from); '' = none. A node's own
    ``state-dir`` (node config: a deployment, where only the node can reach its disk) wins over the folders the
    server names (``client-models-dir`` / ``resume-models-dir``: simulation, one filesystem, inside the run's own
    output folder); in a ``state-dir`` each run has its own folder (``run_folder``)."""
    own = str(node_config.get("state-dir", ""))
    if own:
        return run_folder(own, str(config.get(RUN_TOKEN, ""))), run_folder(own, str(config.get(RESUME_TOKEN, "")))
    return str(config.get("client-models-dir", "")), str(config.get("resume-models-dir", ""))


def client_model_file(folder: str, pid: int, server_round: int) -> Path:
    """Where partition ``pid``'s model after ``server_round`` is kept in ``folder``."""
    return Path(folder) / f"partition-{pid}-round-{server_round}.pt"


def _saved_rounds(folder: str, pid: int) -> list[int]:
    return sorted(
        int(f.stem.rsplit("-", 1)[1])
        for f in Path(folder).glob(f"partition-{pid}-round-*.pt")
        if f.stem.rsplit("-", 1)[1].isdigit()
    )


def save_model_file(run: RunConfig, pid: int, num: int, model, folder: str, server_round: int, token: str = "") -> None:
    """The client's model after ``server_round`` as a verified file recording the run ``token``; files no checkpoint
    can need any more are removed (the newest one at or before the last checkpoint round before this one is kept,
    and all later). A file there for the same round is replaced only when it is this run's (its token; a resumed
    run training that round again), never another run's."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    if Path(folder).is_symlink():
        raise ValueError(f"{folder}: a symlink where this run keeps its model files; nothing is written through it")
    save_verified(
        client_model_file(folder, pid, server_round),
        {
            "round": server_round,
            "run_config": run.to_dict(),
            "run_token": token,
            "model": {k: v.detach().cpu().clone() for k, v in model.state_dict().items()},
        },
        multiarch_fingerprint(run, num),
        replace_if=lambda old: old.get("round") == server_round and old.get("run_token", "") == token,
    )
    every = run["checkpoint-every"]
    last_checkpoint = (server_round - 1) // every * every if every else server_round - 1
    kept = [r for r in _saved_rounds(folder, pid) if r <= last_checkpoint][-1:]
    for r in _saved_rounds(folder, pid):
        if r < server_round and r <= last_checkpoint and r not in kept:
            client_model_file(folder, pid, r).unlink(missing_ok=True)


def restore_model_file(
    run: RunConfig, pid: int, num: int, model, folder: str, resume_round: int, token: str = ""
) -> bool:
    """Load this client's newest model file from a round <= ``resume_round`` (the checkpoint being resumed);
    False when there is none (the client never trained before it). A damaged file or one of another run (run
    config, or run ``token`` when the checkpoint has one) or model raises (``ValueError`` naming it): a resume never
    silently continues from the wrong model."""
    rounds = [r for r in _saved_rounds(folder, pid) if r <= resume_round] if folder else []
    if not rounds:
        return False
    path = client_model_file(folder, pid, rounds[-1])
    blob = load_verified(path, multiarch_fingerprint(run, num))
    if token and blob.get("run_token") != token:
        raise ValueError(f"{path}: saved by another run (run token {blob.get('run_token')!r}, resuming {token!r})")
    # a file of the checkpoint's own run (its token) reads the data the checkpoint's check compared by content
    differing = run_config_differences(blob["run_config"], run.to_dict(), data_checked=bool(token))
    if differing:
        raise ValueError(f"{path}: saved by a run with other {differing}")
    model.load_state_dict(blob["model"])
    return True
