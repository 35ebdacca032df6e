"""Datasets by name, from the hub, a local path or the bundled offline sample; decoded once into uint8 tensors.

Sources never fall back into each other: ``data-source = "sample"`` reads the bundled CIFAR-10 sample, ``"hub"``
asks the Hugging Face hub, ``"local"`` reads ``data-path`` (``train.parquet``/``test.parquet`` in the hub's schema,
or an image folder with ``train/`` and ``test/`` subfolders of class folders).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from fl_app.resources import bundled_file

SAMPLE_DIR = Path(__file__).parent / "data" / "cifar10-sample"  # where experiments/make_sample.py writes it


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


@dataclass
class ImageData:
    """Images as uint8 ``[N, 3, H, W]`` with int64 labels."""

    images: torch.Tensor
    labels: torch.Tensor

    def __len__(self) -> int:
        return len(self.labels)

    def subset(self, indices) -> "ImageData":
        idx = torch.as_tensor(np.asarray(indices), dtype=torch.long)
        return ImageData(self.images[idx], self.labels[idx])


def _decode(dataset, spec: DatasetSpec, image_hw: int) -> ImageData:
    from PIL import Image

    images, labels = [], np.asarray(dataset[spec.label_column], dtype=np.int64)
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
            raise ValueError(f"data-source='sample' only bundles cifar10, not dataset='{dataset_name}'; "
                             "use data-source='hub' or 'local'")
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
    raise ValueError(f"data-path='{data_path}': expected train.parquet and test.parquet, or train/ and test/ "
                     "image folders")


@lru_cache(maxsize=4)
def load_dataset(dataset_name: str, source: str = "sample", data_path: str = "",
                 image_hw: int = 32) -> tuple[ImageData, ImageData]:
    """(train, test) for a named dataset; cached per process so a simulated client decodes it once."""
    if dataset_name not in DATASETS:
        raise ValueError(f"dataset='{dataset_name}': allowed values are {sorted(DATASETS)}")
    if source not in DATA_SOURCES:
        raise ValueError(f"data-source='{source}': allowed values are {list(DATA_SOURCES)}")
    dataset, test_split = _load_hf(dataset_name, source, data_path)
    spec = DATASETS[dataset_name]
    return _decode(dataset["train"], spec, image_hw), _decode(dataset[test_split], spec, image_hw)


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
        raise ValueError(f"val-size + calib-size = {val_size + calib_size} leaves no training data "
                         f"(the training set has {len(labels)} images)")
    rng = np.random.default_rng([seed, 31])
    held = stratified_holdout(labels, val_size + calib_size, rng)
    rest = np.setdiff1d(np.arange(len(labels)), held)
    shuffled = rng.permutation(held)
    return Splits(rest, np.sort(shuffled[:val_size]), np.sort(shuffled[val_size:]))
