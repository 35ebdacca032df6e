"""Data sources: bundled sample, local parquet, local image folders, and errors instead of fallbacks."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image

from fl_app.data.images import decoded_cache_dir, load_dataset, split_train
from fl_app.io.resources import bundled_file


def test_bundled_sample_is_stratified_cifar10():
    train, test = load_dataset("cifar10", "sample")
    assert train.images.shape[1:] == (3, 32, 32) and str(train.images.dtype) == "torch.uint8"
    counts = np.bincount(train.labels.numpy(), minlength=10)
    assert counts.min() == counts.max()  # stratified
    assert len(test) > 0
    size = sum(bundled_file(f"data/cifar10-sample/{s}.parquet").stat().st_size for s in ("train", "test"))
    assert size < 12 * 2**20


def test_local_parquet_in_the_hub_schema(tmp_path):
    for split in ("train", "test"):
        table = pq.read_table(bundled_file(f"data/cifar10-sample/{split}.parquet")).slice(0, 40)
        pq.write_table(table, tmp_path / f"{split}.parquet")
    train, test = load_dataset("cifar10", "local", str(tmp_path))
    assert len(train) == 40 and len(test) == 40


def test_local_image_folder_is_resized_to_the_supernet_input(tmp_path):
    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        for label in ("cat", "dog"):
            folder = tmp_path / split / label
            folder.mkdir(parents=True)
            for i in range(3):
                Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(folder / f"{i}.png")
    train, test = load_dataset("cifar10", "local", str(tmp_path), 32)
    assert train.images.shape == (6, 3, 32, 32)
    assert sorted(set(train.labels.tolist())) == [0, 1]


def test_missing_local_data_is_an_error_not_a_fallback(tmp_path):
    with pytest.raises(ValueError, match="data-path="):
        load_dataset("cifar10", "local", str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match="only bundles cifar10"):
        load_dataset("cifar100", "sample")


def test_held_out_splits_are_disjoint_and_seeded():
    labels = np.repeat(np.arange(10), 100)
    a = split_train(labels, 100, 50, seed=1)
    b = split_train(labels, 100, 50, seed=1)
    assert np.array_equal(a.calibration, b.calibration)
    assert len(a.validation) == 100 and len(a.calibration) == 50
    assert not set(a.validation) & set(a.calibration)
    assert not set(a.client_pool) & (set(a.validation) | set(a.calibration))
    assert len(a.client_pool) + 150 == 1000
    assert np.bincount(labels[a.validation]).min() >= 8  # stratified
    with pytest.raises(ValueError, match="leaves no training data"):
        split_train(labels, 900, 100, seed=0)


def test_decoded_images_are_cached_across_processes_keyed_by_the_files(tmp_path, monkeypatch):
    monkeypatch.setenv("FL_APP_CACHE", str(tmp_path / "cache"))
    for split in ("train", "test"):
        table = pq.read_table(bundled_file(f"data/cifar10-sample/{split}.parquet")).slice(0, 40)
        pq.write_table(table, tmp_path / f"{split}.parquet")
    load_dataset.cache_clear()
    train, test = load_dataset("cifar10", "local", str(tmp_path))
    assert len(list(decoded_cache_dir().iterdir())) == 1
    load_dataset.cache_clear()  # as in a new process: read from the cache, the same tensors
    again_train, again_test = load_dataset("cifar10", "local", str(tmp_path))
    assert torch.equal(train.images, again_train.images) and torch.equal(test.labels, again_test.labels)
    # other files are another key, never the stale cache
    pq.write_table(pq.read_table(tmp_path / "test.parquet").slice(0, 10), tmp_path / "test.parquet")
    load_dataset.cache_clear()
    _, smaller = load_dataset("cifar10", "local", str(tmp_path))
    assert len(smaller) == 10 and len(list(decoded_cache_dir().iterdir())) == 2
    load_dataset.cache_clear()


def test_the_decoded_cache_never_writes_through_a_planted_link(tmp_path, monkeypatch):
    from fl_app.data.images import _decoded_cache_file

    monkeypatch.setenv("FL_APP_CACHE", str(tmp_path / "cache"))
    for split in ("train", "test"):
        table = pq.read_table(bundled_file(f"data/cifar10-sample/{split}.parquet")).slice(0, 20)
        pq.write_table(table, tmp_path / f"{split}.parquet")
    final = _decoded_cache_file("cifar10", "local", str(tmp_path), 32)
    final.parent.mkdir(parents=True)
    victim = tmp_path / "victim.txt"
    victim.write_text("kept")
    final.symlink_to(victim)  # at the final name; the temporary names are random (O_EXCL | O_NOFOLLOW)
    import os

    for name in (f"{final.stem}.{os.getpid()}.tmp.npz", f"{final.name}.tmp"):  # the predictable names of before
        (final.parent / name).symlink_to(victim)
    load_dataset.cache_clear()
    train, _ = load_dataset("cifar10", "local", str(tmp_path))
    load_dataset.cache_clear()
    assert len(train) == 20 and victim.read_text() == "kept" and final.is_symlink()


def _local_parquet(folder, train_labels=None, test_labels=None, rows=20):
    """The bundled sample's first rows as local train/test parquet files, optionally with other labels."""
    folder.mkdir(exist_ok=True)
    for split, labels in (("train", train_labels), ("test", test_labels)):
        table = pq.read_table(bundled_file(f"data/cifar10-sample/{split}.parquet")).slice(0, rows)
        if labels is not None:
            table = table.set_column(table.schema.get_field_index("label"), "label", pa.array(labels))
        pq.write_table(table, folder / f"{split}.parquet")
    return folder


@pytest.mark.parametrize("bad", [42, -1, 10])
def test_out_of_range_labels_are_refused_at_load_naming_file_column_and_range(tmp_path, monkeypatch, bad):
    monkeypatch.setenv("FL_APP_CACHE", str(tmp_path / "cache"))
    labels = [i % 10 for i in range(20)]
    labels[7] = bad
    root = _local_parquet(tmp_path / "data", train_labels=labels)
    load_dataset.cache_clear()
    with pytest.raises(ValueError) as err:
        load_dataset("cifar10", "local", str(root))
    message = str(err.value)
    assert f"{root / 'train.parquet'}, column 'label'" in message
    assert "labels must be integers in [0, 9] (10 classes)" in message
    assert f"1 of 20 rows are out of range (values {bad}; first at row 7)" in message
    assert not (tmp_path / "cache").exists()  # nothing decoded or cached from a bad file
    load_dataset.cache_clear()


def test_fractional_labels_are_refused_not_truncated(tmp_path, monkeypatch):
    monkeypatch.setenv("FL_APP_CACHE", str(tmp_path / "cache"))
    root = _local_parquet(tmp_path / "data", train_labels=[1.5] + [1.0] * 19)
    load_dataset.cache_clear()
    with pytest.raises(
        ValueError,
        match=r"train\.parquet, column 'label': labels must be integers in \[0, 9\]; "
        "found dtype float64",
    ):
        load_dataset("cifar10", "local", str(root))
    load_dataset.cache_clear()


def test_bundled_sample_labels_are_checked_too(tmp_path, monkeypatch):
    monkeypatch.setenv("FL_APP_CACHE", str(tmp_path / "cache"))
    root = _local_parquet(tmp_path / "sample", train_labels=[-1] * 20)
    monkeypatch.setattr("fl_app.data.images.bundled_file", lambda name: root / name.rsplit("/", 1)[-1])
    load_dataset.cache_clear()
    with pytest.raises(ValueError, match=r"sample/train\.parquet, column 'label': labels must be integers in \[0, 9\]"):
        load_dataset("cifar10", "sample")
    load_dataset.cache_clear()


def test_a_decoded_cache_with_bad_labels_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("FL_APP_CACHE", str(tmp_path / "cache"))
    root = _local_parquet(tmp_path / "data")
    load_dataset.cache_clear()
    load_dataset("cifar10", "local", str(root))
    (cache_file,) = decoded_cache_dir().iterdir()
    with np.load(cache_file) as cached:
        arrays = dict(cached)
    arrays["test_labels"][3] = 42
    np.savez(cache_file, **arrays)
    load_dataset.cache_clear()
    with pytest.raises(
        ValueError,
        match=r"decoded test split; delete it to decode again\): labels must be "
        r"integers in \[0, 9\] .*\(values 42; first at row 3\)",
    ):
        load_dataset("cifar10", "local", str(root))
    load_dataset.cache_clear()


def test_a_missing_bundled_file_names_every_place_looked(monkeypatch, tmp_path):
    """A FAB copy carries no CSVs: when neither the copy nor the installed checkout holds the file, the error says
    where it looked, so a run started from another checkout than the installed one is told which."""
    from fl_app.io import resources

    copy, installed = tmp_path / "fab" / "fl_app", tmp_path / "checkout" / "fl_app"
    (installed / "supernet_configs").mkdir(parents=True)
    (installed / "supernet_configs" / "x.csv").write_text("macs\n")
    monkeypatch.setattr(resources, "PACKAGE_DIR", copy)
    monkeypatch.setattr(resources, "_installed_package_dir", lambda: installed)
    assert resources.bundled_file("supernet_configs/x.csv") == installed / "supernet_configs" / "x.csv"
    with pytest.raises(FileNotFoundError) as raised:
        resources.bundled_file("supernet_configs/y.csv")
    assert str(copy) in str(raised.value) and str(installed) in str(raised.value)
