"""Round checkpoints and resume: everything a run needs to continue exactly where it stopped.

A checkpoint holds the global model, the strategy's state (round logs, baseline bookkeeping), the server's RNG
states, the metrics measured so far and the run config. It is written to a temporary name and renamed, so a run killed
while writing leaves the previous checkpoint intact. Only plain containers and tensors are stored, so loading never
unpickles code (``weights_only=True``).
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch

from fl_app.config import RunConfig
from fl_app.outputs import save_checkpoint

CHECKPOINT_FILE = "checkpoint.pt"
FORMAT_VERSION = 1
# keys that may differ between a checkpoint's run and the run resuming it: none of them changes what is computed
RESUME_MAY_CHANGE = ("output-dir", "resume-from", "checkpoint-every", "round-timeout")


def capture_rng() -> dict:
    numpy_state = np.random.get_state(legacy=False)
    return {
        "torch": torch.get_rng_state(),
        "numpy": {"bit_generator": numpy_state["bit_generator"],
                  "key": torch.from_numpy(numpy_state["state"]["key"].astype(np.int64)),
                  "pos": int(numpy_state["state"]["pos"]), "has_gauss": int(numpy_state["has_gauss"]),
                  "gauss": float(numpy_state["gauss"])},
        "python": [random.getstate()[0], list(random.getstate()[1]), random.getstate()[2]],
    }


def restore_rng(saved: dict) -> None:
    torch.set_rng_state(saved["torch"])
    numpy_saved = saved["numpy"]
    np.random.set_state({"bit_generator": numpy_saved["bit_generator"],
                         "state": {"key": numpy_saved["key"].numpy().astype(np.uint32), "pos": numpy_saved["pos"]},
                         "has_gauss": numpy_saved["has_gauss"], "gauss": numpy_saved["gauss"]})
    version, internal, gauss = saved["python"]
    random.setstate((version, tuple(internal), gauss))


def write_round_checkpoint(out_dir: Path, server_round: int, run: RunConfig, num_clients: int,
                           global_state: dict[str, np.ndarray], strategy_state: dict, metrics: dict) -> Path:
    path = out_dir / CHECKPOINT_FILE
    save_checkpoint(path, {
        "format": FORMAT_VERSION, "round": server_round, "run_config": run.to_dict(), "num_clients": num_clients,
        "global_state": {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in global_state.items()},
        "strategy": strategy_state, "metrics": metrics, "rng": capture_rng(),
    })
    return path


def load_round_checkpoint(location: str | Path, run: RunConfig, num_clients: int) -> dict:
    """Read a checkpoint (a file or the run folder holding it) and check that ``run`` may continue it.

    Raises ``ValueError`` naming every mismatching key before any training starts."""
    path = Path(location).expanduser()
    if path.is_dir():
        path = path / CHECKPOINT_FILE
    if not path.is_file():
        raise ValueError(f"resume-from='{location}': no {CHECKPOINT_FILE} there")
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # a truncated or foreign file
        raise ValueError(f"resume-from='{location}': not a readable checkpoint ({error})") from error
    if not isinstance(blob, dict) or blob.get("format") != FORMAT_VERSION:
        raise ValueError(f"resume-from='{location}': not a checkpoint of this app (format "
                         f"{blob.get('format') if isinstance(blob, dict) else '?'}, expected {FORMAT_VERSION})")
    saved, current = blob["run_config"], run.to_dict()
    differing = sorted(k for k in set(saved) | set(current)
                       if k not in RESUME_MAY_CHANGE and saved.get(k) != current.get(k))
    if differing:
        details = ", ".join(f"{k}: checkpoint {saved.get(k)!r} vs now {current.get(k)!r}" for k in differing)
        raise ValueError(f"resume-from='{location}': the run config differs from the checkpoint's ({details}); "
                         f"only {list(RESUME_MAY_CHANGE)} may change")
    if blob["num_clients"] != num_clients:
        raise ValueError(f"resume-from='{location}': the checkpoint's federation has {blob['num_clients']} "
                         f"clients, this one {num_clients} (num-supernodes)")
    if blob["round"] >= run["num-server-rounds"]:
        raise ValueError(f"resume-from='{location}': the checkpoint is at round {blob['round']}, the run has only "
                         f"num-server-rounds={run['num-server-rounds']}")
    blob["global_state"] = {k: v.numpy() for k, v in blob["global_state"].items()}
    return blob
