"""Angles between embeddings and class centers: what a margin acts on, seen directly."""

from __future__ import annotations

import numpy as np

from .._validation import check_int
from .arrays import ArrayLike, as_int_vector
from .closed_set import cosine_to_centers

__all__ = ["target_and_nearest_angles"]


def target_and_nearest_angles(
    embeddings: ArrayLike, labels: ArrayLike, centers: ArrayLike, *, sub_centers: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    r"""The angle of every sample to its own class center and to the nearest other center.

    .. math::

        \theta_{y_i} = \arccos \cos\theta_{i y_i}, \qquad
        \theta_{\text{other}, i} = \arccos \max_{j \ne y_i} \cos\theta_{ij}

    with :math:`\cos\theta_{ij}` as in :func:`~.closed_set.cosine_to_centers` (max-pooled over
    sub-centers). A margin loss pushes :math:`\theta_y` down and keeps the nearest other class
    at least the margin further away; a sample is classified correctly exactly when
    :math:`\theta_y < \theta_\text{other}`.

    Args:
        embeddings: ``[N, D]`` (tensor or array; not necessarily normalized).
        labels: ``int[N]`` in ``[0, C)``.
        centers: ``[C·K, D]`` class centers, class-major as a loss's ``.weight``; ``C >= 2``.
        sub_centers: ``K >= 1`` centers per class. Default: 1.

    Returns:
        ``(theta_target, theta_nearest_other)``: two ``float64[N]`` arrays in radians, in
        ``[0, π]``.
    """
    k = check_int("sub_centers", sub_centers, minimum=1)
    cosine = cosine_to_centers(embeddings, centers, sub_centers=k)  # (N, C)
    y = as_int_vector("labels", labels, length=cosine.shape[0])
    num_classes = cosine.shape[1]
    if num_classes < 2:
        raise ValueError(
            f"centers must hold at least 2 classes to have a non-target one, got {num_classes}"
        )
    if y.min() < 0 or y.max() >= num_classes:
        bad = int(y.min()) if y.min() < 0 else int(y.max())
        raise ValueError(f"labels must lie in [0, {num_classes - 1}] (one per center), got {bad}")
    rows = np.arange(len(y))
    target = cosine[rows, y]  # (N,)
    others = cosine.copy()
    others[rows, y] = -np.inf
    nearest = others.max(axis=1)  # (N,)
    return np.arccos(np.clip(target, -1.0, 1.0)), np.arccos(np.clip(nearest, -1.0, 1.0))
