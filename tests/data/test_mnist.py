"""MNIST / Fashion-MNIST loaders on the real files, a local mirror, and bad input."""

from __future__ import annotations

import gzip
import shutil

import numpy as np
import pytest

from marginface.data import load_dataset
from marginface.data.download import DataFilesMissingError
from marginface.data.idx import IdxFormatError
from marginface.data.mnist import FASHION_MNIST_CLASSES, MNIST_FILES


@pytest.fixture(scope="module")
def mnist_small(shared_file, shared_data):
    shared_file("mnist", "train-images-idx3-ubyte.gz")
    return load_dataset("mnist", data_dir=shared_data, download=False, limit=500, seed=3)


def test_mnist_shapes_and_ranges(mnist_small):
    bundle = mnist_small
    assert bundle.name == "mnist" and not bundle.open_set and bundle.pairs is None
    assert bundle.train.images.shape == (500, 1, 28, 28)
    assert bundle.test.images.shape == (10000, 1, 28, 28)
    assert bundle.train.images.dtype == np.float32
    assert bundle.test.images.min() == 0.0 and bundle.test.images.max() == 1.0
    assert bundle.test.num_classes == 10 == bundle.train.num_classes
    assert np.bincount(bundle.test.labels).tolist()[:2] == [980, 1135]


def test_mnist_limit_is_seeded(shared_file, shared_data):
    shared_file("mnist", "train-images-idx3-ubyte.gz")
    a = load_dataset("mnist", data_dir=shared_data, download=False, limit=50, seed=1)
    b = load_dataset("mnist", data_dir=shared_data, download=False, limit=50, seed=1)
    c = load_dataset("mnist", data_dir=shared_data, download=False, limit=50, seed=2)
    np.testing.assert_array_equal(a.train.images, b.train.images)
    assert not np.array_equal(a.train.labels, c.train.labels)


def test_mnist_resize(tmp_path, shared_file):
    _copy_mnist(tmp_path, shared_file)
    bundle = load_dataset("mnist", data_dir=tmp_path, download=False, limit=10, image_size=14)
    assert bundle.train.images.shape == (10, 1, 14, 14)
    assert bundle.test.images.shape == (10000, 1, 14, 14)
    assert bundle.test.images.min() >= 0.0 and bundle.test.images.max() <= 1.0


def _copy_mnist(folder, shared_file):
    (folder / "mnist").mkdir(parents=True, exist_ok=True)
    for remote in MNIST_FILES:
        shutil.copy(shared_file("mnist", remote.name), folder / "mnist" / remote.name)


def test_mnist_downloaded_from_local_mirror(local_mirror, tmp_path, shared_file):
    for remote in MNIST_FILES:
        shutil.copy(shared_file("mnist", remote.name), local_mirror.root / remote.name)
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    bundle = load_dataset(
        "mnist", data_dir=data_dir, mirrors=[local_mirror.url], limit=20, download=True
    )
    assert bundle.train.images.shape == (20, 1, 28, 28)
    assert sorted(p.name for p in (data_dir / "mnist").iterdir()) == sorted(
        r.name for r in MNIST_FILES
    )
    # second call: files are found, nothing is requested again
    before = len(local_mirror.requests)
    load_dataset("mnist", data_dir=data_dir, mirrors=[local_mirror.url], limit=20)
    assert len(local_mirror.requests) == before


def test_mnist_missing_files(tmp_path):
    with pytest.raises(DataFilesMissingError, match=r"train-images-idx3-ubyte\.gz"):
        load_dataset("mnist", data_dir=tmp_path, download=False)


def test_mnist_corrupt_idx(tmp_path, shared_file):
    _copy_mnist(tmp_path, shared_file)
    (tmp_path / "mnist" / "t10k-labels-idx1-ubyte.gz").write_bytes(
        gzip.compress(b"\x00\x00\x08\x01\x00\x00\x27\x10" + b"\x00" * 10)
    )
    with pytest.raises(IdxFormatError, match="t10k-labels"):
        load_dataset("mnist", data_dir=tmp_path, download=False)


def test_mnist_label_count_mismatch(tmp_path, shared_file):
    _copy_mnist(tmp_path, shared_file)
    shutil.copy(
        shared_file("mnist", "train-labels-idx1-ubyte.gz"),
        tmp_path / "mnist" / "t10k-labels-idx1-ubyte.gz",
    )
    with pytest.raises(IdxFormatError, match="expected 10000 labels"):
        load_dataset("mnist", data_dir=tmp_path, download=False)


@pytest.mark.parametrize(
    ("option", "value", "error"),
    [
        ("image_size", 0, ValueError),
        ("image_size", 2.5, TypeError),
        ("limit", 0, ValueError),
        ("limit", "10", TypeError),
        ("data_dir", 5, TypeError),
    ],
)
def test_mnist_bad_options(tmp_path, option, value, error):
    with pytest.raises(error, match=option):
        load_dataset("mnist", **{"data_dir": tmp_path, "download": False, option: value})


def test_mnist_nonexistent_data_dir(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_dataset("mnist", data_dir=tmp_path / "missing")


def test_fashion_mnist_labels_and_missing_images(shared_file, shared_data):
    shared_file("fashion-mnist", "train-labels-idx1-ubyte.gz")
    # the label files parse (6000 per class) ...
    from marginface.data.idx import read_idx

    for name, per_class in (
        ("train-labels-idx1-ubyte.gz", 6000),
        ("t10k-labels-idx1-ubyte.gz", 1000),
    ):
        labels = read_idx(shared_data / "fashion-mnist" / name)
        assert np.bincount(labels).tolist() == [per_class] * 10
    # ... and the absent image files give the "put them here" error
    with pytest.raises(DataFilesMissingError) as info:
        load_dataset("fashion-mnist", data_dir=shared_data, download=False)
    message = str(info.value)
    assert "train-images-idx3-ubyte.gz" in message and "t10k-images-idx3-ubyte.gz" in message
    assert "labels" not in message.split("Put them")[0]
    assert len(FASHION_MNIST_CLASSES) == 10
