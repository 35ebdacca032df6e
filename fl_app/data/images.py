"""Datasets by name, from the hub, a local path or the bundled offline sample; decoded once into uint8 tensors.

Sources never fall back into each other: ``data-source = "sample"`` reads the bundled CIFAR-10 sample, ``"hub"``
asks the Hugging Face hub, ``"local"`` reads ``data-path`` (``train.parquet``/``test.parquet`` in the hub's schema,
or an image folder with ``train/`` and ``test/`` subfolders of class folders).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from fl_app.io.files import write_new_file
from fl_app.io.resources import bundled_file

SAMPLE_DIR = Path(__file__).parent / "cifar10-sample"  # where experiments/tools/make_sample.py writes it


@dataclass(frozen=True)
class DatasetSpec:
    hub_name: str
    image_column: str
    label_column: str
    num_classes: int
    test_split: str = "test"


DATASETS = {
    "cifar10": DatasetSpec("uoft-cs/cifar10", "img", "label", 10),
    "cifar100": DatasetSpec("uoft-cs/cifar100", "img", "fine_label", 100),
    "cinic10": DatasetSpec("flwrlabs/cinic10", "image", "label", 10),
    "tinyimagenet": DatasetSpec("zh-plus/tiny-imagenet", "image", "label", 200, test_split="valid"),
}
DATA_SOURCES = ("sample", "hub", "local")
DECODE_VERSION = 1  # part of the decoded-cache key: bump when _decode changes what it produces


@dataclass
class ImageData:
    """Images as uint8 ``[N, 3, H, W]`` with int64 labels."""

    images: torch.Tensor
    labels: torch.Tensor

    def __len__(self) -> int:
        return len(self.labels)

    def subset(self, indices) -> "ImageData":
        return ImageData(take_rows(self.images, indices), take_rows(self.labels, indices))


def take_rows(tensor: torch.Tensor, indices) -> torch.Tensor:
    """``tensor[indices]`` along the first dimension (indices: a sequence, array or tensor of row numbers). On the
    CPU through NumPy, bit-identical and 10-20x faster: torch's advanced indexing of CIFAR rows costs 0.1-1.2 ms for
    64-600 rows on idle cores (2-9 ms under load), NumPy's 0.01-0.07 ms; a client pays it for every batch."""
    if tensor.device.type == "cpu" and not tensor.requires_grad:
        rows = indices.numpy() if isinstance(indices, torch.Tensor) else np.asarray(indices, dtype=np.int64)
        return torch.from_numpy(tensor.numpy()[rows.astype(np.int64, copy=False)])
    return tensor[torch.as_tensor(indices, dtype=torch.long, device=tensor.device)]  # lists, arrays, any tensor


def check_labels(labels, num_classes: int, where: str) -> np.ndarray:
    """Labels as int64, refused unless every one is an integer in [0, ``num_classes``): a label of 42 or -1 would
    otherwise fail only inside a client's training (or index the wrong logit)."""
    raw = np.asarray(labels)
    if (
        raw.dtype == object
        or raw.dtype.kind not in "iuf"
        or (raw.dtype.kind == "f" and not np.all(np.isfinite(raw) & (raw == np.round(raw))))
    ):
        raise ValueError(f"{where}: labels must be integers in [0, {num_classes - 1}]; found dtype {raw.dtype}")
    bad = np.flatnonzero((raw < 0) | (raw >= num_classes))
    if len(bad):
        shown = ", ".join(str(int(v)) for v in np.unique(raw[bad])[:5])
        raise ValueError(
            f"{where}: labels must be integers in [0, {num_classes - 1}] ({num_classes} classes); "
            f"{len(bad)} of {len(raw)} rows are out of range (values {shown}; first at row {bad[0]})"
        )
    return raw.astype(np.int64)


def _decode(dataset, spec: DatasetSpec, image_hw: int, where: str) -> ImageData:
    from PIL import Image

    images, labels = [], check_labels(dataset[spec.label_column], spec.num_classes, where)
    for img in dataset[spec.image_column]:
        img = img.convert("RGB")
        if img.size != (image_hw, image_hw):  # the supernet's costs assume its input size
            img = img.resize((image_hw, image_hw), Image.BILINEAR)
        images.append(np.asarray(img, dtype=np.uint8))
    array = np.stack(images).transpose(0, 3, 1, 2).copy()
    return ImageData(torch.from_numpy(array), torch.from_numpy(labels))


def _load_hf(dataset_name: str, source: str, data_path: str):
    import datasets

    spec = DATASETS[dataset_name]
    if source == "sample":
        if dataset_name != "cifar10":
            raise ValueError(
                f"data-source='sample' only bundles cifar10, not dataset='{dataset_name}'; "
                "use data-source='hub' or 'local'"
            )
        files = {split: str(bundled_file(f"data/cifar10-sample/{split}.parquet")) for split in ("train", "test")}
        return datasets.load_dataset("parquet", data_files=files), "test"
    if source == "hub":
        return datasets.load_dataset(spec.hub_name), spec.test_split
    root = Path(data_path).expanduser()
    if (root / "train.parquet").is_file() and (root / "test.parquet").is_file():
        files = {"train": str(root / "train.parquet"), "test": str(root / "test.parquet")}
        return datasets.load_dataset("parquet", data_files=files), "test"
    if (root / "train").is_dir() and (root / "test").is_dir():
        ds = datasets.load_dataset("imagefolder", data_dir=str(root))
        renames = {k: v for k, v in (("image", spec.image_column), ("label", spec.label_column)) if k != v}
        return (ds.rename_columns(renames) if renames else ds), "test"
    raise ValueError(
        f"data-path='{data_path}': expected train.parquet and test.parquet, or train/ and test/ image folders"
    )


@lru_cache(maxsize=4)
def load_dataset(
    dataset_name: str, source: str = "sample", data_path: str = "", image_hw: int = 32
) -> tuple[ImageData, ImageData]:
    """(train, test) for a named dataset; cached per process so a simulated client decodes it once, and for files
    on disk (sample, local parquet) also across processes (``decoded_cache_dir``)."""
    if dataset_name not in DATASETS:
        raise ValueError(f"dataset='{dataset_name}': allowed values are {sorted(DATASETS)}")
    if source not in DATA_SOURCES:
        raise ValueError(f"data-source='{source}': allowed values are {list(DATA_SOURCES)}")
    spec = DATASETS[dataset_name]
    cache_file = _decoded_cache_file(dataset_name, source, data_path, image_hw)
    # a link at the cache's name was not written here: decode from the source instead of reading through it
    if cache_file is not None and cache_file.is_file() and not cache_file.is_symlink():
        with np.load(cache_file) as cached:
            return tuple(
                ImageData(
                    torch.from_numpy(cached[f"{split}_images"]),
                    torch.from_numpy(
                        check_labels(
                            cached[f"{split}_labels"],
                            spec.num_classes,
                            f"{cache_file} (decoded {split} split; delete it to decode again)",
                        )
                    ),
                )
                for split in ("train", "test")
            )
    dataset, test_split = _load_hf(dataset_name, source, data_path)
    train, test = (
        _decode(dataset[split], spec, image_hw, _label_origin(dataset_name, source, data_path, split))
        for split in ("train", test_split)
    )
    if cache_file is not None:
        _write_decoded(cache_file, train, test)
    return train, test


def _label_origin(dataset_name: str, source: str, data_path: str, split: str) -> str:
    """Where a split's labels come from, for error messages: the file (or folder) and the column."""
    column = DATASETS[dataset_name].label_column
    if source == "sample":
        return f"{bundled_file(f'data/cifar10-sample/{split}.parquet')}, column '{column}'"
    if source == "hub":
        return f"hub dataset '{DATASETS[dataset_name].hub_name}' split '{split}', column '{column}'"
    root = Path(data_path).expanduser()
    if (root / f"{split}.parquet").is_file():
        return f"{root / f'{split}.parquet'}, column '{column}'"
    return f"image folder {root / split} (one class per subfolder)"


def decoded_cache_dir() -> Path:
    """Where decoded images are kept between processes (every simulated client and the server would otherwise
    decode the same PNGs): ``$FL_APP_CACHE`` or ``~/.cache/fl_app``."""
    return Path(os.environ.get("FL_APP_CACHE", Path.home() / ".cache" / "fl_app")) / "decoded"


def _decoded_cache_file(dataset_name: str, source: str, data_path: str, image_hw: int) -> Path | None:
    """A file named after the parquet files it was decoded from (path, size, modification time); None for
    sources that are not plain files here (hub, image folders)."""
    if source == "sample":
        files = [bundled_file(f"data/cifar10-sample/{split}.parquet") for split in ("train", "test")]
    elif source == "local" and (Path(data_path).expanduser() / "train.parquet").is_file():
        files = [Path(data_path).expanduser() / f"{split}.parquet" for split in ("train", "test")]
    else:
        return None
    key = "|".join(f"{f.resolve()}:{f.stat().st_size}:{f.stat().st_mtime_ns}" for f in files if f.is_file())
    digest = hashlib.sha256(f"{DECODE_VERSION}|{dataset_name}|{image_hw}|{key}".encode()).hexdigest()[:20]
    return decoded_cache_dir() / f"{dataset_name}-{image_hw}px-{digest}.npz"


def _write_decoded(path: Path, train: ImageData, test: ImageData) -> None:
    arrays = {
        "train_images": train.images.numpy(),
        "train_labels": train.labels.numpy(),
        "test_images": test.images.numpy(),
        "test_labels": test.labels.numpy(),
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # a random temporary name linked into place: readers never see half a file, a planted link is never followed
        write_new_file(path, lambda out: np.savez(out, **arrays))
    except OSError:  # taken already (another process decoded the same files first) or a read-only home: decode again
        pass


def stratified_holdout(labels: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """``size`` indices with (close to) the label distribution of ``labels``."""
    if size <= 0:
        return np.zeros(0, dtype=np.int64)
    order = rng.permutation(len(labels))
    # sorting a random permutation by label, then taking every k-th, spreads picks evenly over classes
    by_label = order[np.argsort(labels[order], kind="stable")]
    picks = by_label[np.linspace(0, len(labels) - 1, size).round().astype(int)]
    return np.sort(picks)


@dataclass
class Splits:
    """The server's held-out pieces of the training set and the pool that is partitioned among clients."""

    client_pool: np.ndarray
    validation: np.ndarray
    calibration: np.ndarray


def split_train(labels: np.ndarray, val_size: int, calib_size: int, seed: int) -> Splits:
    if val_size + calib_size >= len(labels):
        raise ValueError(
            f"val-size + calib-size = {val_size + calib_size} leaves no training data "
            f"(the training set has {len(labels)} images)"
        )
    rng = np.random.default_rng([seed, 31])
    held = stratified_holdout(labels, val_size + calib_size, rng)
    rest = np.setdiff1d(np.arange(len(labels)), held)
    shuffled = rng.permutation(held)
    return Splits(rest, np.sort(shuffled[:val_size]), np.sort(shuffled[val_size:]))
