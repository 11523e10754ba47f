"""Sub-center clean-up on a head's centers: each class's dominant sub-center, the outliers far
from it, and keeping the dominant centers only (Sub-center ArcFace; the math is in
:mod:`marginface.subcenters`, this module maps a head's samples and class block onto it).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..subcenters import Outliers, find_outliers, keep_dominant_centers
from .inputs import checked_batch


def own_samples(
    embeddings: Tensor,
    labels: Tensor,
    *,
    embedding_dim: int,
    class_range: tuple[int, int],
    num_classes: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """The samples whose labels lie in ``class_range``: ``(positions int64[n], x Tensor[n, D],
    local labels int64[n])`` (unsharded: every sample, no copy of the embeddings).

    Raises:
        ValueError: no sample has a label in ``class_range`` (or a bad batch).
    """
    labels = checked_batch(embeddings, labels, embedding_dim, num_classes)
    start, stop = class_range
    if start == 0 and stop == num_classes:  # unsharded: no copy of the embeddings
        return torch.arange(labels.shape[0], device=labels.device), embeddings, labels
    positions = ((labels >= start) & (labels < stop)).nonzero().squeeze(1)  # (n,)
    if positions.numel() == 0:
        raise ValueError(
            f"no sample has a label in this head's classes [{start}, {stop}); a sharded "
            "head judges its own classes: pass the same samples on every rank"
        )
    return positions, embeddings[positions], labels[positions] - start


def outliers_of_all(
    positions: Tensor,
    x: Tensor,
    local: Tensor,
    weight: Tensor,
    sub_centers: int,
    *,
    total: int,
    threshold_degrees: float,
) -> Outliers:
    """:func:`~marginface.subcenters.find_outliers` on the samples ``x`` (at ``positions`` of
    the ``total`` given), reported against all ``total``: ``indices`` among them, ``angles``
    ``float64[total]`` with NaN for the samples of other ranks' classes."""
    found = find_outliers(x, local, weight, sub_centers, threshold_degrees=threshold_degrees)
    angles = torch.full((total,), float("nan"), dtype=torch.float64, device=found.angles.device)
    angles[positions.to(angles.device)] = found.angles
    indices = positions.to(found.indices.device)[found.indices]
    return Outliers(indices, angles, found.dominant, found.counts, found.threshold_degrees)


def dominant_only(
    weight: Tensor,
    dominant: Tensor,
    sub_centers: int,
    *,
    class_range: tuple[int, int],
    num_classes: int,
    sharded: bool,
) -> Tensor:
    """The centers ``Tensor[c, D]`` that keep each class's dominant sub-center: ``dominant`` is
    ``int64[c]`` (this head's classes) or, on a sharded head, also ``int64[C]`` (every class;
    this head's block ``class_range`` is taken).

    Raises:
        ValueError: ``sub_centers`` is 1 already, or ``dominant`` has a wrong shape or values.
    """
    if sub_centers == 1:
        raise ValueError("this head has one center per class already (sub_centers = 1)")
    start, stop = class_range
    if isinstance(dominant, Tensor) and sharded and tuple(dominant.shape) == (num_classes,):
        dominant = dominant[start:stop]
    return keep_dominant_centers(weight, dominant, sub_centers)  # (c, D)
