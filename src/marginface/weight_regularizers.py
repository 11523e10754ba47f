r"""Regularizers of the class centers: a term the head adds to the loss from its weight
(``MarginSoftmaxLoss(..., weight_regularizer=...)``), not from a margin.

A weight regularizer sees the centers of the classes in the (global) batch, the mini-batch form
that SphereFace+'s authors use (ydwen/opensphere ``model/head/spherefaceplus.py``): the head
gathers one row per sample and sub-center (``Tensor[N·K, D]``) with each row's index in the full
weight, duplicates included, so that the term is computed without data-dependent shapes (one
``N·K × N·K`` Gram matrix; no ``torch.unique``, no ``C×C`` matrix). On a class-sharded head each
rank contributes the rows of the classes it owns and the rows are summed across the ranks, with
the gradient reaching each rank's own centers only (:func:`batch_centers`), so the term is the
one-process term exactly, on every rank.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ._validation import check_real
from .executors.sharding import ClassShard

__all__ = [
    "MinimumHypersphericalEnergy",
    "WeightRegularizer",
    "batch_centers",
    "check_weight_regularizer",
    "regularize_weight",
]


class WeightRegularizer:
    """Base of the head's weight regularizers: ``(centers[R, D], rows[R]) -> Tensor[]``.

    ``centers`` are the raw (unnormalized) class centers of the batch's classes, one per sample
    and sub-center; ``rows[R]`` (int64) their row index in the full ``C·K × D`` weight: equal
    indices are the same center (count it once). The result (0-dim, with gradient) is added to
    every sample's loss (so to the mean once).
    """

    def __call__(self, centers: Tensor, rows: Tensor) -> Tensor:
        raise NotImplementedError


class MinimumHypersphericalEnergy(WeightRegularizer):
    r"""The angular hyperspherical energy of the batch's class centers (Liu et al., "Learning
    towards Minimum Hyperspherical Energy", NeurIPS 2018; SphereFace+'s regularizer):

    .. math::
        E = \frac{\lambda}{U(U-1)/2}\sum_{a<b} \arccos(\hat w_a\cdot\hat w_b)^{-p}

    over the ``U`` distinct centers of the batch's classes, with ``ŵ·ŵ`` clamped to
    ``±(1 - 1e-5)`` (the authors' code). 0 when the batch has fewer than two distinct centers
    (the authors' code divides by 0 there).

    Args:
        weight: ``λ >= 0``. Default: 1.0 (the authors' ``lambda_MHE``).
        power: ``p > 0``, the exponent of the inverse angle. Default: 2.0 (the authors' code).
    """

    def __init__(self, weight: float = 1.0, power: float = 2.0) -> None:
        self.weight = check_real("weight", weight, nonnegative=True)
        self.power = check_real("power", power, positive=True)

    def __call__(self, centers: Tensor, rows: Tensor) -> Tensor:
        r = rows.shape[0]
        dtype = torch.float64 if centers.dtype == torch.float64 else torch.float32
        index = torch.arange(r, device=rows.device)
        same = rows.unsqueeze(1) == rows.unsqueeze(0)  # (R, R)
        # the first occurrence of each center counts; a pair (a, b) once, a < b
        first = ~(same & (index.unsqueeze(0) < index.unsqueeze(1))).any(dim=1)  # (R,)
        pairs = first.unsqueeze(1) & first.unsqueeze(0) & (index.unsqueeze(1) < index)  # (R, R)
        with torch.autocast(device_type=centers.device.type, enabled=False):
            unit = F.normalize(centers.to(dtype), dim=1)  # (R, D), float32 or float64
            gram = (unit @ unit.t()).clamp(-1.0 + 1e-5, 1.0 - 1e-5)  # (R, R)
            angles = torch.where(pairs, torch.acos(gram), 1.0)  # (R, R); 1: not a pair
            energy = torch.where(pairs, angles.pow(-self.power), 0.0)
            distinct = first.sum().to(dtype)
            count = distinct * (distinct - 1.0) / 2.0
            mean = energy.sum() / count.clamp_min(1.0)
            return self.weight * torch.where(count > 0, mean, 0.0)

    def __repr__(self) -> str:
        return f"MinimumHypersphericalEnergy(weight={self.weight}, power={self.power})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MinimumHypersphericalEnergy) and (self.weight, self.power) == (
            other.weight,
            other.power,
        )

    def __hash__(self) -> int:
        return hash((self.weight, self.power))


def batch_centers(
    weight: Tensor,
    labels: Tensor,
    sub_centers: int,
    class_range: tuple[int, int],
    shard: ClassShard | None,
) -> tuple[Tensor, Tensor]:
    """The centers of the batch's classes, ``(Tensor[N·K, D], rows int64[N·K])``.

    Args:
        weight: this head's ``Tensor[c·K, D]`` (its classes ``class_range``).
        labels: ``int64[N]`` global labels (the global batch's on a sharded head).
        sub_centers: ``K``.
        class_range: ``(start, stop)`` of ``weight``'s classes.
        shard: the head's :class:`~marginface.executors.sharding.ClassShard`, or None. Then each
            rank contributes its own classes' rows; the values are summed across the ranks and
            the gradient reaches this rank's rows only.
    """
    k, d = sub_centers, weight.shape[1]
    start, stop = class_range
    offsets = torch.arange(k, device=labels.device)  # (K,)
    rows = (labels.unsqueeze(1) * k + offsets).reshape(-1)  # (N·K,), rows of the full weight
    owned = ((labels >= start) & (labels < stop)).repeat_interleave(k)  # (N·K,)
    local = (rows - start * k).clamp(0, weight.shape[0] - 1)  # (N·K,)
    centers = weight[local.to(weight.device)]  # (N·K, D)
    centers = torch.where(owned.unsqueeze(1).to(centers.device), centers, 0.0)
    if shard is not None:
        everyone = shard.all_sum_(centers.detach().clone())  # (N·K, D), every rank's rows
        centers = centers + (everyone - centers.detach())
    assert centers.shape[1] == d
    return centers, rows


def check_weight_regularizer(value: object) -> WeightRegularizer | None:
    """``value`` if it is None or a :class:`WeightRegularizer`, else a ``TypeError``."""
    if value is not None and not isinstance(value, WeightRegularizer):
        raise TypeError(
            "weight_regularizer must be a marginface.weight_regularizers.WeightRegularizer or "
            f"None, got {value!r}"
        )
    return value


def regularize_weight(
    regularizer: WeightRegularizer, weight: Tensor, labels: Tensor, head: Any
) -> Tensor:
    """``regularizer`` on the centers of the batch's classes (0-dim): ``labels`` are this
    process's checked labels; ``head`` gives ``sub_centers``, ``class_range`` and ``shard`` (a
    sharded head's labels are gathered into the global batch's first, after the step gathered
    its metadata)."""
    labels = labels.reshape(-1).to(torch.int64)
    if head.shard is not None:
        labels = head.shard.gather_rows(labels)  # (N,), the global batch's
    centers, rows = batch_centers(weight, labels, head.sub_centers, head.class_range, head.shard)
    return regularizer(centers, rows)
