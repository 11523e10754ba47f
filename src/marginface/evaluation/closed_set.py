"""Closed-set accuracy: the class whose center is nearest in angle, and the L2 normalization that
cosines to centers start from."""

from __future__ import annotations

import numpy as np

from .._validation import check_int
from .arrays import ArrayLike, as_embeddings, as_int_vector

__all__ = ["closed_set_accuracy", "cosine_to_centers", "l2_normalize"]


def _normalize(rows: np.ndarray) -> np.ndarray:
    """Rows divided by their L2 norm (a zero row stays zero: all its cosines are 0)."""
    norms = np.linalg.norm(rows, axis=1, keepdims=True)  # (N, 1)
    return rows / np.maximum(norms, 1e-12)


def l2_normalize(embeddings: ArrayLike) -> np.ndarray:
    r"""Each row divided by its L2 norm: :math:`\hat x_i = x_i / \max(\|x_i\|_2, 10^{-12})`.

    A zero row stays zero (its cosine to anything is then 0), so no NaN appears.

    Args:
        embeddings: ``[N, D]`` finite real values, a torch tensor (any device; detached) or a
            NumPy array.

    Returns:
        ``float64[N, D]``, rows of norm 1 (or 0).

    Raises:
        TypeError: not a tensor or array, or not real numbers.
        ValueError: not 2-D, no rows or columns, or non-finite values.

    >>> l2_normalize(np.array([[3.0, 4.0], [0.0, 0.0]])).tolist()
    [[0.6, 0.8], [0.0, 0.0]]
    """
    return _normalize(as_embeddings("embeddings", embeddings))


def cosine_to_centers(
    embeddings: ArrayLike, centers: ArrayLike, *, sub_centers: int = 1
) -> np.ndarray:
    r"""Cosines between embeddings and class centers, max-pooled over sub-centers.

    .. math:: \cos\theta_{ij} = \max_k \frac{x_i^\top w_{jk}}{\|x_i\|\,\|w_{jk}\|}

    Args:
        embeddings: ``[N, D]`` (tensor or array).
        centers: ``[C·K, D]`` class centers, class-major as a loss's ``.weight``.
        sub_centers: ``K >= 1``. Default: 1.

    Returns:
        ``float64[N, C]``.
    """
    x = as_embeddings("embeddings", embeddings)
    w = as_embeddings("centers", centers)
    k = check_int("sub_centers", sub_centers, minimum=1)
    if w.shape[1] != x.shape[1]:
        raise ValueError(
            f"centers must have D = {x.shape[1]} columns like embeddings, got shape {w.shape}"
        )
    if w.shape[0] % k:
        raise ValueError(
            f"centers must have a multiple of sub_centers = {k} rows, got shape {w.shape}"
        )
    cosine = _normalize(x) @ _normalize(w).T  # (N, C·K)
    if k > 1:
        cosine = cosine.reshape(cosine.shape[0], -1, k).max(axis=2)  # (N, C)
    return cosine


def closed_set_accuracy(
    embeddings: ArrayLike, labels: ArrayLike, centers: ArrayLike, *, sub_centers: int = 1
) -> float:
    r"""Share of samples whose nearest class center (largest cosine) is their own class.

    .. math:: \text{acc} = \frac1N \sum_i [\arg\max_j \cos\theta_{ij} = y_i]

    The scale ``s`` of a margin loss does not change the argmax, so this equals the accuracy of
    a softmax classifier on ``s·cos θ``. Ties go to the lowest class index (``argmax``).

    Args:
        embeddings: ``[N, D]`` (tensor or array; not necessarily normalized).
        labels: ``int[N]`` in ``[0, C)``.
        centers: ``[C·K, D]``, e.g. a trained loss's ``.weight``.
        sub_centers: ``K`` centers per class (Sub-center ArcFace). Default: 1.

    Returns:
        The accuracy in [0, 1].
    """
    cosine = cosine_to_centers(embeddings, centers, sub_centers=sub_centers)  # (N, C)
    y = as_int_vector("labels", labels, length=cosine.shape[0])
    num_classes = cosine.shape[1]
    if y.min() < 0 or y.max() >= num_classes:
        bad = int(y.min()) if y.min() < 0 else int(y.max())
        raise ValueError(f"labels must lie in [0, {num_classes - 1}] (one per center), got {bad}")
    return float(np.mean(cosine.argmax(axis=1) == y))
