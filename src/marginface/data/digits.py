"""scikit-learn's bundled 8×8 digits: the embedded default dataset (no download)."""

from __future__ import annotations

import numpy as np

from .base import DatasetBundle, ImageSet
from .imaging import check_image_size, resize_images
from .splits import check_limit, limit_indices

__all__ = ["load_digits"]


def load_digits(
    *,
    test_fraction: float = 0.2,
    seed: int = 0,
    image_size: int | None = None,
    limit: int | None = None,
    data_dir: object = None,
    download: bool = False,
) -> DatasetBundle:
    """The 1,797 8×8 grey digits of scikit-learn, split stratified into train and test.

    Source: scikit-learn's bundled copy of the UCI "Optical Recognition of Handwritten Digits"
    test set (BSD-3 with scikit-learn; the UCI data is CC BY 4.0). No download.

    Args:
        test_fraction: share of each class held out for the closed-set test. Default: 0.2.
        seed: seed of the split and of the ``limit`` subset.
        image_size: resize to ``image_size × image_size`` (antialiased); None keeps 8.
        limit: cap on training images (seeded random subset).
        data_dir: ignored (the data ships with scikit-learn); accepted for a uniform interface.
        download: ignored, as ``data_dir``.

    Returns:
        A closed-set :class:`DatasetBundle`: images ``float32[N, 1, 8, 8]`` in [0, 1] (the
        original 0..16 intensities divided by 16), labels 0..9.
    """
    from sklearn.datasets import load_digits as sklearn_digits
    from sklearn.model_selection import train_test_split

    del data_dir, download
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
    image_size = check_image_size(image_size)
    limit = check_limit(limit)
    raw = sklearn_digits()
    images = (raw.images.astype(np.float32) / 16.0)[:, None, :, :]  # (N, 1, 8, 8)
    labels = raw.target.astype(np.int64)
    train_idx, test_idx = train_test_split(
        np.arange(len(labels)), test_size=test_fraction, random_state=seed, stratify=labels
    )
    train_idx = limit_indices(train_idx, limit, seed)  # unchanged order when limit is None
    if image_size is not None:
        images = resize_images(images, image_size)
    names = tuple(str(d) for d in range(10))
    return DatasetBundle(
        name="digits",
        train=ImageSet(images[train_idx], labels[train_idx], names),
        test=ImageSet(images[test_idx], labels[test_idx], names),
    )
