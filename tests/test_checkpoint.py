"""Checkpoints are verified before they are trusted: content hash, model fingerprint, atomic writes, no overwrites."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

import fl_app.run.checkpoint as checkpoint
from fl_app.run.checkpoint import (
    load_round_checkpoint,
    load_verified,
    model_fingerprint,
    save_verified,
    write_round_checkpoint,
)
from fl_app.run.config import validate_run_config

SUPERNET_JSON = Path(__file__).resolve().parents[1] / "fl_app" / "supernet_configs" / "cpu.json"


def _state() -> dict[str, np.ndarray]:
    # small and recognisable: the test finds these bytes in the file
    return {
        "stem_conv.weight": np.arange(64, dtype=np.float32).reshape(4, 16) + 1000.0,
        "classifier.bias": np.zeros(10, dtype=np.float32),
    }


def _run(**kw):
    return validate_run_config({"num-server-rounds": 6, **kw})


def _flip(path: Path, needle: bytes, offsets=(5, 9)) -> None:
    data = bytearray(path.read_bytes())
    start = data.index(needle)
    for offset in offsets:
        data[start + offset] ^= 0xFF
    path.write_bytes(bytes(data))


def test_flipped_bytes_are_refused_on_resume(tmp_path):
    run = _run()
    write_round_checkpoint(tmp_path, 2, run, 4, _state(), {}, {})
    assert load_round_checkpoint(tmp_path, run, 4)["round"] == 2
    _flip(tmp_path / "checkpoint.pt", _state()["stem_conv.weight"].tobytes())
    damaged = torch.load(tmp_path / "checkpoint.pt", weights_only=True)["global_state"]["stem_conv.weight"]
    assert not np.array_equal(damaged.numpy(), _state()["stem_conv.weight"])  # torch alone reads a wrong tensor
    with pytest.raises(ValueError, match=r"resume-from='.*': content hash mismatch .*altered or damaged"):
        load_round_checkpoint(tmp_path, run, 4)


def test_a_checkpoint_of_another_supernet_with_the_same_run_config_is_refused(tmp_path):
    net = tmp_path / "net.json"
    net.write_text(SUPERNET_JSON.read_text())
    run = _run(supernet=str(net))
    write_round_checkpoint(tmp_path, 2, run, 4, _state(), {}, {})
    other = json.loads(net.read_text())
    other["original_stage_base_channels"] = [16, 32, 64, 256]
    net.write_text(json.dumps(other))  # same path, same run config, another supernet
    with pytest.raises(
        ValueError,
        match=r"a checkpoint of another model \(model original_stage_base_channels: "
        r"checkpoint \[16, 32, 64, 128\] vs now \[16, 32, 64, 256\]\)",
    ):
        load_round_checkpoint(tmp_path, run, 4)


def test_truncated_and_unverified_files_are_refused(tmp_path):
    run = _run()
    path = write_round_checkpoint(tmp_path, 2, run, 4, _state(), {}, {})
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(ValueError, match="not a readable checkpoint"):
        load_round_checkpoint(tmp_path, run, 4)
    path.unlink()
    torch.save({"format": 1, "round": 2, "run_config": run.to_dict(), "num_clients": 4, "global_state": {}}, path)
    with pytest.raises(ValueError, match="not a verified checkpoint of this app"):
        load_round_checkpoint(tmp_path, run, 4)


def test_a_crash_while_writing_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    run = _run()
    write_round_checkpoint(tmp_path, 2, run, 4, _state(), {}, {})
    real_save = torch.save

    def crash_half_way(obj, handle):
        real_save(obj, handle)
        handle.truncate(100)
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint.torch, "save", crash_half_way)
    with pytest.raises(OSError, match="disk full"):
        write_round_checkpoint(tmp_path, 4, run, 4, _state(), {}, {})
    monkeypatch.undo()
    assert load_round_checkpoint(tmp_path, run, 4)["round"] == 2
    assert sorted(os.listdir(tmp_path)) == ["checkpoint.pt"]  # no temporary file left behind


def test_nothing_saved_is_overwritten_unexpectedly(tmp_path):
    run = _run()
    path = write_round_checkpoint(tmp_path, 2, run, 4, _state(), {}, {})
    write_round_checkpoint(tmp_path, 4, run, 4, _state(), {}, {})  # a later round of the same run replaces it
    assert load_round_checkpoint(tmp_path, run, 4)["round"] == 4
    before = path.read_bytes()
    with pytest.raises(FileExistsError, match="another run"):  # an earlier round never replaces a later one
        write_round_checkpoint(tmp_path, 2, run, 4, _state(), {}, {})
    with pytest.raises(FileExistsError, match="another run"):  # nor does another run's checkpoint
        write_round_checkpoint(tmp_path, 5, _run(lr=0.1), 4, _state(), {}, {})
    assert path.read_bytes() == before
    with pytest.raises(FileExistsError, match="never replaces"):  # the plain API never replaces anything
        save_verified(path, {"x": torch.zeros(1)}, model_fingerprint(run, {}))
    assert path.read_bytes() == before

    other = tmp_path / "other"
    other.mkdir()
    (other / "checkpoint.pt").write_text("my notes")
    with pytest.raises(FileExistsError, match="not a verified checkpoint, so it is kept"):
        write_round_checkpoint(other, 2, run, 4, _state(), {}, {})
    assert (other / "checkpoint.pt").read_text() == "my notes"
    planted = tmp_path / "planted"
    planted.mkdir()
    (planted / "checkpoint.pt").symlink_to(path)
    with pytest.raises(FileExistsError):
        write_round_checkpoint(planted, 6, run, 4, _state(), {}, {})
    assert path.read_bytes() == before


def test_the_verified_file_api_for_other_model_families(tmp_path):
    run = _run(method="fedtopo", **{"feature-dim": 32})
    model = {"architectures": ["cnn4", "mobilenetv2"], "num_classes": 10}
    blob = {"round": 3, "client_models": {"0": {"w": torch.ones(2, 2)}}, "topology": torch.eye(3)}
    path = save_verified(tmp_path / "fedtopo.pt", blob, model_fingerprint(run, model))
    loaded = load_verified(path, model_fingerprint(run, model))
    assert loaded["round"] == 3 and torch.equal(loaded["topology"], torch.eye(3))
    assert torch.load(path, weights_only=True)["round"] == 3  # plain torch still reads it
    with pytest.raises(ValueError, match=r"run-config feature-dim: checkpoint 32 vs now 64"):
        load_verified(path, model_fingerprint(_run(method="fedtopo"), model))
    with pytest.raises(ValueError, match=r"model architectures: checkpoint \['cnn4', 'mobilenetv2'\] vs now"):
        load_verified(path, model_fingerprint(run, {**model, "architectures": ["cnn4", "resnet18"]}))


def _crafted_file(path: Path, nested) -> Path:
    """A file that claims to be a verified checkpoint (integrity record, any hash) around ``nested``."""
    blob = {"state_dict": {}, "nested": nested, checkpoint.INTEGRITY: {"format": 2, "fingerprint": {}, "sha256": "0"}}
    limit = __import__("sys").getrecursionlimit()
    __import__("sys").setrecursionlimit(20_000)  # pickling deep lists recurses; loading and hashing must not
    try:
        torch.save(blob, path)
    finally:
        __import__("sys").setrecursionlimit(limit)
    return path


class _CountingDigest:
    """A digest that stops a walk doing more than ``budget`` updates (the bound the walk must stay under)."""

    def __init__(self, budget: int):
        self.updates, self.budget = 0, budget

    def update(self, data: bytes) -> None:
        self.updates += 1
        assert self.updates <= self.budget, "the hash walk visits far more nodes than the blob holds"


def test_hashing_shared_nested_lists_walks_each_container_once():
    shared = []
    for _ in range(60):  # 61 lists in memory, 2^60 paths through them
        shared = [shared, shared]
    digest = _CountingDigest(budget=1000)
    checkpoint._feed(digest, {"nested": shared})
    assert digest.updates < 200
    # a tree without sharing hashes as before: the references only replace repeats
    assert checkpoint.content_hash({"a": [[1], [1]]}) != checkpoint.content_hash({"a": [[1], [2]]})


def test_deeply_nested_checkpoints_are_refused_naming_file_and_field(tmp_path, capsys):
    import fl_app.extract as extract

    deep = []
    for _ in range(3000):  # deeper than the interpreter's recursion limit
        deep = [deep]
    path = _crafted_file(tmp_path / "supernet.pt", deep)
    with pytest.raises(ValueError, match=r"supernet.pt: field \['nested'\]\[0\].*nested deeper than"):
        checkpoint.load_verified(path)
    with pytest.raises(SystemExit):  # the command's own error line, not a traceback
        extract.main(["--checkpoint", str(path), "--macs", "1e6", "--out", str(tmp_path / "subnet.pt")])
    assert "nested deeper than" in capsys.readouterr().err
    # the runner reads an interrupted copy's checkpoint to choose where to resume: a reason, not a crash
    from experiments.runner import CHECKPOINT, checkpoint_round

    path.rename(tmp_path / CHECKPOINT)
    number, why = checkpoint_round(tmp_path)
    assert number is None and "nested deeper than" in why


def _data_folder(path: Path, extra: bytes = b"") -> str:
    """A local data folder holding the bundled sample's parquet files (``extra`` appended: other content)."""
    sample = Path(checkpoint.__file__).parents[1] / "data" / "cifar10-sample"
    path.mkdir(parents=True)
    for name in ("train.parquet", "test.parquet"):
        (path / name).write_bytes((sample / name).read_bytes() + extra)
    return str(path)


def test_a_resume_compares_the_data_by_content_so_the_data_path_may_differ(tmp_path):
    """A checkpoint records what its run read by content: the same files at another data-path (another machine, or a
    checkpoint whose data-path ``park`` made relative) continue it; other files at the same name do not."""
    here = _data_folder(tmp_path / "here" / "cifar10")
    run = _run(**{"data-source": "local", "data-path": here})
    path = write_round_checkpoint(tmp_path, 2, run, 4, _state(), {}, {})
    assert torch.load(path, weights_only=True)[checkpoint.DATA_RECORD]["sha256"]["train.parquet"]
    assert checkpoint.rewrite_run_config(path, lambda config: {**config, "data-path": "../shared/cifar10"})
    assert not checkpoint.rewrite_run_config(path, lambda config: config)  # nothing to change: the file stays
    assert load_verified(path)["run_config"]["data-path"] == "../shared/cifar10"  # verified anew
    assert str(tmp_path) not in path.read_bytes().decode("latin-1")
    elsewhere = _run(**{"data-source": "local", "data-path": _data_folder(tmp_path / "elsewhere" / "cifar10")})
    assert load_round_checkpoint(path, elsewhere, 4)["round"] == 2
    np.testing.assert_array_equal(load_round_checkpoint(path, elsewhere, 4)["global_state"]["classifier.bias"], 0)
    other = _run(**{"data-source": "local", "data-path": _data_folder(tmp_path / "other" / "cifar10", b"x")})
    with pytest.raises(ValueError, match=r"data-path='.*other/cifar10' holds other data than the checkpoint's run"):
        load_round_checkpoint(path, other, 4)
    with pytest.raises(ValueError, match=r"the run config differs .*eval-every"):
        load_round_checkpoint(path, _run(**{"data-source": "local", "data-path": here, "eval-every": 3}), 4)


def test_a_checkpoint_without_a_data_record_continues_only_at_its_own_data_path(tmp_path):
    here = _data_folder(tmp_path / "here")
    run = _run(**{"data-source": "local", "data-path": here})
    path = write_round_checkpoint(tmp_path, 2, run, 4, _state(), {}, {})
    blob, fingerprint = checkpoint._read_verified(path, None, None)
    del blob[checkpoint.DATA_RECORD]  # as a checkpoint written before checkpoints recorded their data
    save_verified(path, blob, fingerprint, replace_if=lambda old: True)
    assert load_round_checkpoint(path, run, 4)["round"] == 2
    elsewhere = _run(**{"data-source": "local", "data-path": _data_folder(tmp_path / "elsewhere")})
    with pytest.raises(ValueError, match=r"data-path: checkpoint '.*here' vs now '.*elsewhere'"):
        load_round_checkpoint(path, elsewhere, 4)
