"""MNIST and Fashion-MNIST: 28×28 grey images in IDX files, 10 classes, closed set.

* MNIST — Yann LeCun & Corinna Cortes, licence CC BY-SA 3.0. 60,000 training and 10,000 test
  images of handwritten digits 0-9.
* Fashion-MNIST — Zalando Research, MIT licence (c) 2017 Zalando SE. 60,000 training and 10,000
  test images of clothing in 10 classes; drop-in format replacement for MNIST.

Split: the publishers' train / test files, closed set (both sides share the 10 classes). Files are
looked for in ``<data_dir>/<name>/`` (or ``data_dir`` itself; ``.gz`` or un-gzipped) and, when
missing and ``download`` is True, fetched from the canonical mirrors and verified: sha256 for
MNIST and for the Fashion-MNIST label files, the publisher's md5 for the Fashion-MNIST image
files (their sha256 was not available to pin).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from .base import DatasetBundle, ImageSet
from .download import RemoteFile, ensure_files
from .idx import IdxFormatError, read_idx
from .imaging import check_image_size, resize_images
from .splits import check_limit, limit_indices

__all__ = [
    "FASHION_MNIST_CLASSES",
    "FASHION_MNIST_FILES",
    "MNIST_FILES",
    "load_fashion_mnist",
    "load_mnist",
]

_MNIST_MIRRORS = (
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "https://storage.googleapis.com/cvdf-datasets/mnist/",
    "http://yann.lecun.com/exdb/mnist/",
)
_FASHION_MIRRORS = (
    "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
    "https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/master/data/fashion/",
)


def _idx_file(name: str, mirrors: Sequence[str], **digest: str) -> RemoteFile:
    urls = tuple(f"{m.rstrip('/')}/{name}" for m in mirrors)
    return RemoteFile(name=name, urls=urls, aliases=(name.removesuffix(".gz"),), **digest)


# (train images, train labels, test images, test labels)
MNIST_FILES = (
    _idx_file(
        "train-images-idx3-ubyte.gz",
        _MNIST_MIRRORS,
        sha256="440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609",
    ),
    _idx_file(
        "train-labels-idx1-ubyte.gz",
        _MNIST_MIRRORS,
        sha256="3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c",
    ),
    _idx_file(
        "t10k-images-idx3-ubyte.gz",
        _MNIST_MIRRORS,
        sha256="8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
    ),
    _idx_file(
        "t10k-labels-idx1-ubyte.gz",
        _MNIST_MIRRORS,
        sha256="f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
    ),
)
FASHION_MNIST_FILES = (
    _idx_file(
        "train-images-idx3-ubyte.gz", _FASHION_MIRRORS, md5="8d4fb7e6c68d591d4c3dfef9ec88bf0d"
    ),
    _idx_file(
        "train-labels-idx1-ubyte.gz",
        _FASHION_MIRRORS,
        sha256="a04f17134ac03560a47e3764e11b92fc97de4d1bfaf8ba1a3aa29af54cc90845",
    ),
    _idx_file(
        "t10k-images-idx3-ubyte.gz", _FASHION_MIRRORS, md5="bef4ecab320f06d8554ea6380940ec79"
    ),
    _idx_file(
        "t10k-labels-idx1-ubyte.gz",
        _FASHION_MIRRORS,
        sha256="67da17c76eaffca5446c3361aaab5c3cd6d1c2608764d35dfb1850b086bf8dd5",
    ),
)
FASHION_MNIST_CLASSES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)


def _read_split(
    images_path: os.PathLike[str], labels_path: os.PathLike[str]
) -> tuple[np.ndarray, np.ndarray]:
    images = read_idx(images_path)
    labels = read_idx(labels_path)
    if images.ndim != 3 or images.dtype != np.uint8:
        raise IdxFormatError(
            f"{images_path}: expected uint8 images of shape (N, H, W), got {images.dtype} "
            f"{images.shape}"
        )
    if labels.ndim != 1 or labels.shape[0] != images.shape[0]:
        raise IdxFormatError(
            f"{labels_path}: expected {images.shape[0]} labels, got shape {labels.shape}"
        )
    if labels.size and (labels.min() < 0 or labels.max() > 9):
        raise IdxFormatError(f"{labels_path}: labels outside 0..9")
    return images, labels.astype(np.int64)


def _to_float(images: np.ndarray, image_size: int | None) -> np.ndarray:
    array = (images.astype(np.float32) / 255.0)[:, None, :, :]  # (N, 1, 28, 28)
    return array if image_size is None else resize_images(array, image_size)


def _load_idx_dataset(
    name: str,
    files: tuple[RemoteFile, ...],
    class_names: tuple[str, ...],
    *,
    data_dir: str | os.PathLike[str] | None,
    download: bool,
    image_size: int | None,
    seed: int,
    limit: int | None,
    mirrors: Sequence[str] | None,
) -> DatasetBundle:
    image_size = check_image_size(image_size)
    limit = check_limit(limit)
    paths = ensure_files(name, files, data_dir, download=download, mirrors=mirrors)
    train_images, train_labels = _read_split(paths[files[0].name], paths[files[1].name])
    test_images, test_labels = _read_split(paths[files[2].name], paths[files[3].name])
    keep = limit_indices(np.arange(len(train_labels)), limit, seed)
    return DatasetBundle(
        name=name,
        train=ImageSet(_to_float(train_images[keep], image_size), train_labels[keep], class_names),
        test=ImageSet(_to_float(test_images, image_size), test_labels, class_names),
    )


def load_mnist(
    *,
    data_dir: str | os.PathLike[str] | None = None,
    download: bool = True,
    image_size: int | None = None,
    seed: int = 0,
    limit: int | None = None,
    mirrors: Sequence[str] | None = None,
) -> DatasetBundle:
    """MNIST: train ``float32[60000, 1, 28, 28]``, test ``float32[10000, 1, 28, 28]`` in [0, 1].

    Args:
        data_dir: folder holding ``mnist/`` (default: ``$MARGINFACE_DATA``, else the cache).
        download: fetch missing files from the mirrors (verified, atomic). Default: True.
        image_size: resize to ``image_size × image_size`` (antialiased); None keeps 28.
        seed: seed of the ``limit`` subset.
        limit: keep a random ``limit`` of the 60,000 training images (test set unchanged).
        mirrors: base URLs to download from instead of the canonical mirrors.

    Returns:
        A closed-set :class:`DatasetBundle`, labels 0..9, ``class_names`` ``"0"``..``"9"``.
    """
    return _load_idx_dataset(
        "mnist",
        MNIST_FILES,
        tuple(str(d) for d in range(10)),
        data_dir=data_dir,
        download=download,
        image_size=image_size,
        seed=seed,
        limit=limit,
        mirrors=mirrors,
    )


def load_fashion_mnist(
    *,
    data_dir: str | os.PathLike[str] | None = None,
    download: bool = True,
    image_size: int | None = None,
    seed: int = 0,
    limit: int | None = None,
    mirrors: Sequence[str] | None = None,
) -> DatasetBundle:
    """Fashion-MNIST: same shapes and options as :func:`load_mnist`, files in ``fashion-mnist/``.

    Returns:
        A closed-set :class:`DatasetBundle`, labels 0..9 named :data:`FASHION_MNIST_CLASSES`.
    """
    return _load_idx_dataset(
        "fashion-mnist",
        FASHION_MNIST_FILES,
        FASHION_MNIST_CLASSES,
        data_dir=data_dir,
        download=download,
        image_size=image_size,
        seed=seed,
        limit=limit,
        mirrors=mirrors,
    )
