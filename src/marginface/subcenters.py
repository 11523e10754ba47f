"""Sub-center ArcFace's clean-up (Deng et al., ECCV 2020, Sec. 3.2): dominant sub-centers,
outlier samples, and the step back to one center per class.

With ``K`` sub-centers per class, most clean samples of a class gather around one of them (the
*dominant* sub-center); noisy samples drift to the others or far from every center. Once the
model discriminates well, the paper drops the non-dominant sub-centers (``K → 1``) and the
high-confidence noise: samples farther than 75° from their class's dominant sub-center.

* :func:`sub_center_counts` -- ``counts[c, k]``: samples of class ``c`` whose nearest
  sub-center of their own class is ``k``.
* :func:`dominant_sub_centers` -- per class, the sub-center with the most samples nearest to it.
* :func:`find_outliers` -- the samples whose angle to their class's dominant sub-center exceeds a
  threshold (degrees; default 75, the paper's).
* :func:`keep_dominant_centers` -- the ``Tensor[C, D]`` of dominant centers, the weight of a
  one-center-per-class head (:meth:`~marginface.head.MarginSoftmaxLoss.drop_non_dominant_centers`
  puts it in place).

Every function takes the class centers as the head stores them, ``weight[C·K, D]`` class-major
(rows ``c·K … c·K + K - 1`` are class ``c``), and runs without gradient in float64, over blocks
of :data:`ROWS_PER_BLOCK` samples: beyond the embeddings given, memory is ``O(N·K)`` (e.g. MS1M's
5.8 M training embeddings with ``K = 3``), not ``O(N·K·D)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ._validation import check_embeddings, check_int, check_labels, check_real

__all__ = [
    "PAPER_OUTLIER_DEGREES",
    "ROWS_PER_BLOCK",
    "Outliers",
    "dominant_sub_centers",
    "find_outliers",
    "keep_dominant_centers",
    "sub_center_counts",
]

ROWS_PER_BLOCK = 32768
"""Samples per block of the float64 computations (about 400 MB of temporaries at K = 3,
D = 512); the results do not depend on it (every quantity is per sample)."""

PAPER_OUTLIER_DEGREES = 75.0
"""The paper's angle threshold (degrees) between a sample and its class's dominant sub-center
beyond which the sample is taken for label noise."""


@dataclass
class Outliers:
    """What :func:`find_outliers` found.

    Attributes:
        indices: ``int64[M]``, positions (among the samples given) of the flagged samples, in
            increasing order.
        angles: ``float64[N]``, every sample's angle to its class's dominant sub-center, in
            **degrees** (NaN for a sample not judged: a sharded head's other classes).
        dominant: ``int64[C]``, each class's dominant sub-center in ``[0, K)``.
        counts: ``int64[C, K]``, :func:`sub_center_counts`.
        threshold_degrees: the threshold used.
    """

    indices: Tensor
    angles: Tensor
    dominant: Tensor
    counts: Tensor
    threshold_degrees: float


def _check(embeddings: object, labels: object, weight: object, sub_centers: object):
    """Checked ``(x[N, D] as given, labels[N], w[C, K, D] float64, K)``."""
    k = check_int("sub_centers", sub_centers, minimum=1)
    if not isinstance(weight, Tensor) or not weight.is_floating_point() or weight.dim() != 2:
        raise TypeError(f"weight must be a floating Tensor of shape (C·K, D), got {weight!r}")
    if weight.shape[0] % k or weight.shape[0] == 0:
        raise ValueError(
            f"weight must have C·K rows with K = sub_centers = {k}, got shape {tuple(weight.shape)}"
        )
    x = check_embeddings(embeddings, weight.shape[1])
    num_classes = weight.shape[0] // k
    labels = check_labels(labels, x.shape[0], num_classes)
    w = weight.detach().to(device=x.device, dtype=torch.float64).view(num_classes, k, -1)
    return x.detach(), labels.to(x.device), w, k


def _blocks(count: int) -> range:
    return range(0, count, ROWS_PER_BLOCK)


def _own_class_cosines(x: Tensor, labels: Tensor, w: Tensor) -> Tensor:
    """``cos(x_i, w_{y_i, k})`` for every sample and sub-center of its own class: ``float64[N,
    K]``, computed :data:`ROWS_PER_BLOCK` samples at a time."""
    out = torch.empty(x.shape[0], w.shape[1], dtype=torch.float64, device=x.device)
    w_hat = F.normalize(w, dim=2)  # (C, K, D), once
    for start in _blocks(x.shape[0]):
        rows = slice(start, start + ROWS_PER_BLOCK)
        x_hat = F.normalize(x[rows].to(torch.float64), dim=1)  # (b, D)
        out[rows] = torch.einsum("nd,nkd->nk", x_hat, w_hat[labels[rows]])  # (b, K)
    return out


@torch.no_grad()
def sub_center_counts(
    embeddings: Tensor, labels: Tensor, weight: Tensor, sub_centers: int
) -> Tensor:
    """``counts[c, k]``: how many samples of class ``c`` have sub-center ``k`` as their nearest
    (largest cosine) among the ``K`` sub-centers of their own class.

    Args:
        embeddings: ``Tensor[N, D]`` (normalization does not matter).
        labels: ``Tensor[N]`` of class indices in ``[0, C)``.
        weight: ``Tensor[C·K, D]``, class-major.
        sub_centers: ``K >= 1``.

    Returns:
        ``int64[C, K]``; each row sums to the number of samples of that class.
    """
    x, labels, w, k = _check(embeddings, labels, weight, sub_centers)
    nearest = _own_class_cosines(x, labels, w).argmax(dim=1)  # (N,), first maximum on ties
    counts = torch.zeros(w.shape[0] * k, dtype=torch.int64, device=x.device)
    counts.index_add_(0, labels * k + nearest, torch.ones_like(nearest))
    return counts.view(w.shape[0], k)


@torch.no_grad()
def dominant_sub_centers(
    embeddings: Tensor, labels: Tensor, weight: Tensor, sub_centers: int
) -> Tensor:
    """Each class's dominant sub-center: the one with the most samples nearest to it
    (:func:`sub_center_counts`); ties go to the lowest index, and a class without samples keeps
    sub-center 0.

    Returns:
        ``int64[C]`` in ``[0, K)``.
    """
    return sub_center_counts(embeddings, labels, weight, sub_centers).argmax(dim=1)


@torch.no_grad()
def find_outliers(
    embeddings: Tensor,
    labels: Tensor,
    weight: Tensor,
    sub_centers: int,
    *,
    threshold_degrees: float = PAPER_OUTLIER_DEGREES,
    dominant: Tensor | None = None,
) -> Outliers:
    r"""Samples whose angle to their class's dominant sub-center exceeds ``threshold_degrees``:

    .. math:: \angle_i = \arccos\frac{x_i^\top w_{y_i, k^*(y_i)}}{\|x_i\|\,\|w_{y_i,k^*(y_i)}\|}
              \cdot\frac{180}{\pi} > \text{threshold}

    with ``k*(c)`` the dominant sub-center of class ``c`` (:func:`dominant_sub_centers`). With
    ``K = 1`` this is the angle to the class center.

    Args:
        embeddings: ``Tensor[N, D]``, typically the training set's.
        labels: ``Tensor[N]`` in ``[0, C)``.
        weight: ``Tensor[C·K, D]``, class-major.
        sub_centers: ``K``.
        threshold_degrees: in ``[0, 180]``, **degrees**. Default: 75 (paper).
        dominant: ``int64[C]`` to use instead of computing it from these samples.

    Returns:
        :class:`Outliers`.
    """
    threshold = check_real("threshold_degrees", threshold_degrees, nonnegative=True, at_most=180.0)
    x, labels, w, k = _check(embeddings, labels, weight, sub_centers)
    counts = sub_center_counts(x, labels, weight, k)
    if dominant is None:
        dominant = counts.argmax(dim=1)
    else:
        dominant = _check_dominant(dominant, w.shape[0], k).to(x.device)
    centers = F.normalize(w[torch.arange(w.shape[0], device=x.device), dominant], dim=1)  # (C, D)
    cosine = torch.empty(x.shape[0], dtype=torch.float64, device=x.device)  # (N,)
    for start in _blocks(x.shape[0]):
        rows = slice(start, start + ROWS_PER_BLOCK)
        x_hat = F.normalize(x[rows].to(torch.float64), dim=1)  # (b, D)
        cosine[rows] = (x_hat * centers[labels[rows]]).sum(dim=1)
    angles = torch.rad2deg(torch.arccos(cosine.clamp(-1.0, 1.0)))  # (N,) degrees
    indices = (angles > threshold).nonzero().squeeze(1)
    return Outliers(indices, angles, dominant, counts, threshold)


def _check_dominant(dominant: object, num_classes: int, sub_centers: int) -> Tensor:
    if (
        not isinstance(dominant, Tensor)
        or dominant.is_floating_point()
        or dominant.dtype == (torch.bool)
    ):
        raise TypeError(f"dominant must be an integer Tensor of shape (C,), got {dominant!r}")
    if tuple(dominant.shape) != (num_classes,):
        raise ValueError(
            f"dominant must have shape ({num_classes},) (one sub-center per class), got "
            f"{tuple(dominant.shape)}"
        )
    if dominant.numel() and (int(dominant.min()) < 0 or int(dominant.max()) >= sub_centers):
        raise ValueError(
            f"dominant must lie in [0, {sub_centers - 1}] for sub_centers = {sub_centers}, got "
            f"values in [{int(dominant.min())}, {int(dominant.max())}]"
        )
    return dominant.to(torch.int64)


@torch.no_grad()
def keep_dominant_centers(weight: Tensor, dominant: Tensor, sub_centers: int) -> Tensor:
    """The dominant sub-center of every class, ``Tensor[C, D]`` (a copy, ``weight``'s dtype and
    device): the weight of a one-center-per-class head.

    Args:
        weight: ``Tensor[C·K, D]``, class-major.
        dominant: ``int64[C]`` in ``[0, K)`` (:func:`dominant_sub_centers`).
        sub_centers: ``K``.
    """
    k = check_int("sub_centers", sub_centers, minimum=1)
    if not isinstance(weight, Tensor) or weight.dim() != 2 or weight.shape[0] % k:
        raise ValueError(f"weight must have shape (C·K, D) with K = {k}, got {weight!r}")
    num_classes = weight.shape[0] // k
    dominant = _check_dominant(dominant, num_classes, k).to(weight.device)
    rows = torch.arange(num_classes, device=weight.device) * k + dominant  # (C,)
    return weight.detach()[rows].clone()
