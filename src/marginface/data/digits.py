"""scikit-learn's bundled 8×8 digits: the embedded default dataset (no download)."""

from __future__ import annotations

import numpy as np

from .base import DatasetBundle, ImageSet

__all__ = ["load_digits"]


def load_digits(*, test_fraction: float = 0.2, seed: int = 0) -> DatasetBundle:
    """The 1,797 8×8 grey digits of scikit-learn, split stratified into train and test.

    Args:
        test_fraction: share of each class held out for the closed-set test. Default: 0.2.
        seed: seed of the split.

    Returns:
        A closed-set :class:`DatasetBundle`: images ``float32[N, 1, 8, 8]`` in [0, 1] (the
        original 0..16 intensities divided by 16), labels 0..9.
    """
    from sklearn.datasets import load_digits as sklearn_digits
    from sklearn.model_selection import train_test_split

    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
    raw = sklearn_digits()
    images = (raw.images.astype(np.float32) / 16.0)[:, None, :, :]  # (N, 1, 8, 8)
    labels = raw.target.astype(np.int64)
    train_idx, test_idx = train_test_split(
        np.arange(len(labels)), test_size=test_fraction, random_state=seed, stratify=labels
    )
    names = tuple(str(d) for d in range(10))
    return DatasetBundle(
        name="digits",
        train=ImageSet(images[train_idx], labels[train_idx], names),
        test=ImageSet(images[test_idx], labels[test_idx], names),
    )
