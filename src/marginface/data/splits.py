"""Splitting a labelled image collection into train/test: closed-set or identity-disjoint.

* ``"closed"``: each identity's images are shuffled and ``test_fraction`` of them (at least one,
  at most all but one, none for an identity with a single image) go to the test set; train and
  test share labels and ``class_names``, so closed-set accuracy applies.
* ``"open"``: the *identities* are shuffled and ``test_fraction`` of them (at least one, at most
  all but one) with all their images form the test set; each side is relabelled ``0..K-1`` and
  ``num_pairs`` balanced verification pairs are sampled over the test set
  (:func:`marginface.evaluation.sample_pairs`), so verification and retrieval apply.

``limit`` caps the number of *training* images (a seeded random subset, original order kept).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .base import DatasetBundle, ImageSet
from .pairs import sample_pairs

__all__ = [
    "SPLITS",
    "build_bundle",
    "check_limit",
    "check_split_options",
    "check_test_fraction",
    "closed_set_split",
    "limit_indices",
    "open_set_split",
    "relabel",
]

SPLITS = ("closed", "open")


def check_test_fraction(test_fraction: object) -> float:
    """``test_fraction`` as a float in (0, 1), else ``TypeError``/``ValueError`` naming it."""
    if isinstance(test_fraction, bool) or not isinstance(test_fraction, (int, float)):
        raise TypeError(f"test_fraction must be a float in (0, 1), got {test_fraction!r}")
    if not 0.0 < float(test_fraction) < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
    return float(test_fraction)


def check_limit(limit: object) -> int | None:
    """``limit`` as a positive int or None."""
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, (int, np.integer)):
        raise TypeError(f"limit must be a positive int or None, got {limit!r}")
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit!r}")
    return int(limit)


def check_split_options(split: object, test_fraction: object, limit: object) -> None:
    """Validate :func:`build_bundle`'s options up front (before any slow decoding)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}; got {split!r}")
    check_test_fraction(test_fraction)
    check_limit(limit)


def closed_set_split(
    labels: np.ndarray, test_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per-identity split: ``(train_indices, test_indices)``, each sorted ascending."""
    rng = np.random.default_rng(seed)
    train, test = [], []
    for identity in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == identity))
        n = len(members)
        n_test = 0 if n < 2 else min(n - 1, max(1, round(n * test_fraction)))
        test.extend(members[:n_test])
        train.extend(members[n_test:])
    return np.sort(np.asarray(train, dtype=np.int64)), np.sort(np.asarray(test, dtype=np.int64))


def open_set_split(
    labels: np.ndarray, test_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Identity-disjoint split: ``(train_indices, test_indices)``; needs two identities."""
    identities = np.unique(labels)
    if len(identities) < 2:
        raise ValueError(f"an open-set split needs at least two identities, got {len(identities)}")
    rng = np.random.default_rng(seed)
    shuffled = rng.permutation(identities)
    n_test = min(len(identities) - 1, max(1, round(len(identities) * test_fraction)))
    is_test = np.isin(labels, shuffled[:n_test])
    return np.flatnonzero(~is_test), np.flatnonzero(is_test)


def relabel(labels: np.ndarray, class_names: Sequence[str]) -> tuple[np.ndarray, tuple[str, ...]]:
    """Map the labels present to ``0..K-1`` (ascending) and keep their names."""
    present, contiguous = np.unique(labels, return_inverse=True)
    names = tuple(class_names[i] for i in present) if class_names else ()
    return contiguous.astype(np.int64), names


def limit_indices(indices: np.ndarray, limit: int | None, seed: int) -> np.ndarray:
    """A seeded random subset of ``limit`` of ``indices`` (all when None), order kept."""
    if limit is None or limit >= len(indices):
        return indices
    rng = np.random.default_rng(seed + 1)
    return np.sort(rng.choice(indices, size=limit, replace=False))


def build_bundle(
    name: str,
    images: np.ndarray,
    labels: np.ndarray,
    class_names: Sequence[str],
    *,
    split: str = "closed",
    test_fraction: float = 0.3,
    seed: int = 0,
    limit: int | None = None,
    num_pairs: int = 3000,
) -> DatasetBundle:
    """Split ``images``/``labels`` as described in this module into a :class:`DatasetBundle`.

    Args:
        name: registry name for the bundle.
        images: ``float32[N, C, H, W]`` in [0, 1].
        labels: ``int64[N]`` indices into ``class_names``.
        class_names: name of each identity.
        split: ``"closed"`` or ``"open"``.
        test_fraction: share of each identity's images (closed) or of identities (open).
        seed: seed of the split, the limit and the pairs.
        limit: cap on training images.
        num_pairs: verification pairs sampled over an open-set test set.
    """
    check_split_options(split, test_fraction, limit)
    test_fraction = check_test_fraction(test_fraction)
    limit = check_limit(limit)
    if split == "closed":
        train_idx, test_idx = closed_set_split(labels, test_fraction, seed)
        train_idx = limit_indices(train_idx, limit, seed)
        names = tuple(class_names)
        return DatasetBundle(
            name=name,
            train=ImageSet(images[train_idx], labels[train_idx], names),
            test=ImageSet(images[test_idx], labels[test_idx], names),
        )
    train_idx, test_idx = open_set_split(labels, test_fraction, seed)
    train_idx = limit_indices(train_idx, limit, seed)
    train_labels, train_names = relabel(labels[train_idx], class_names)
    test_labels, test_names = relabel(labels[test_idx], class_names)
    pairs = sample_pairs(test_labels, num_pairs, seed=seed)
    return DatasetBundle(
        name=name,
        train=ImageSet(images[train_idx], train_labels, train_names),
        test=ImageSet(images[test_idx], test_labels, test_names),
        pairs=pairs,
        open_set=True,
    )
