"""Where a run's data come from, said so that it holds on any machine: a content fingerprint (SHA-256 of the files
a run reads) that records and reuse checks compare instead of a path. Imports no torch, so that planning a suite
stays quick."""

from __future__ import annotations

import hashlib
from pathlib import Path

from fl_app.io.resources import bundled_file


def hub_name(dataset_name: str) -> str:
    from fl_app.data.images import DATASETS  # the dataset table lives with the loader

    return DATASETS[dataset_name].hub_name


_FILE_HASHES: dict[tuple[str, int, int], str] = {}  # (resolved path, size, mtime) -> SHA-256, per process


def file_sha256(path: Path) -> str:
    """SHA-256 of a file, remembered per process by path, size and modification time (a suite hashes the same
    files once per run it plans; hashing CIFAR-10's 55 MB of parquet takes about 0.1 s)."""
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _FILE_HASHES:
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            while block := handle.read(1 << 20):
                digest.update(block)
        _FILE_HASHES[key] = digest.hexdigest()
    return _FILE_HASHES[key]


def _folder_sha256(folder: Path) -> str:
    """One digest for an image folder: SHA-256 over its files' relative paths and contents, in path order."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(f"{path.relative_to(folder).as_posix()}\0{file_sha256(path)}\n".encode())
    return digest.hexdigest()


def data_fingerprint(dataset_name: str, source: str = "sample", data_path: str = "") -> dict:
    """What a run reads, by content rather than by path, so that the same files at another path (another machine,
    a clone elsewhere) are recognised as the same data: ``{"sha256": {file: digest}}`` for parquet files (the
    bundled sample or a local folder), ``{"sha256": {"train/": digest, "test/": digest}}`` for image folders, and
    ``{"hub": id}`` for the hub, whose copy is not pinned here (no content is hashed)."""
    if source == "hub":
        return {"hub": hub_name(dataset_name)}
    if source == "sample":
        names = [f"{split}.parquet" for split in ("train", "test")]
        return {"sha256": {name: file_sha256(bundled_file(f"data/cifar10-sample/{name}")) for name in names}}
    root = Path(data_path).expanduser()
    if (root / "train.parquet").is_file() and (root / "test.parquet").is_file():
        return {"sha256": {f"{split}.parquet": file_sha256(root / f"{split}.parquet") for split in ("train", "test")}}
    if (root / "train").is_dir() and (root / "test").is_dir():
        return {"sha256": {f"{split}/": _folder_sha256(root / split) for split in ("train", "test")}}
    raise ValueError(
        f"data-path='{data_path}': expected train.parquet and test.parquet, or train/ and test/ image folders "
        "(the README's section 'Data' says how to make the CIFAR-10 folder)"
    )
