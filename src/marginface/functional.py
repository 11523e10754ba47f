"""Functional API: margins on precomputed cosines, and the margins' formulas as plain functions.

``margin_logits`` and ``margin_cross_entropy`` take a cosine matrix the caller computed however
it likes (a dense matmul, one shard of a class-parallel layer, a retrieval index), so a margin
can drive any executor unchanged.
"""

from __future__ import annotations

from torch import Tensor

from ._validation import check_choice, check_labels
from .executors.margin_loss import REDUCTIONS, logits_cross_entropy
from .margins.adacos import adacos_dynamic_scale, adacos_fixed_scale
from .margins.adaface import adaface_target
from .margins.arcface import additive_angular_margin
from .margins.base import Margin, check_cosine, check_norms
from .margins.combined import combined_margin
from .margins.cosface import additive_cosine_margin
from .margins.curricularface import curricular_negative
from .margins.elasticface import assign_elastic_plus
from .margins.magface import magface_margin, magface_regularizer
from .margins.sphereface import chebyshev_cos_multiple, sphereface_psi

__all__ = [
    "adacos_dynamic_scale",
    "adacos_fixed_scale",
    "adaface_target",
    "additive_angular_margin",
    "additive_cosine_margin",
    "assign_elastic_plus",
    "chebyshev_cos_multiple",
    "combined_margin",
    "curricular_negative",
    "magface_margin",
    "magface_regularizer",
    "margin_cross_entropy",
    "margin_logits",
    "sphereface_psi",
]


def margin_logits(
    cosine: Tensor, labels: Tensor, margin: Margin, norms: Tensor | None = None
) -> Tensor:
    """Margin-adjusted scaled logits from precomputed cosines.

    Args:
        cosine: ``Tensor[N, C]`` of cosines in [-1, 1].
        labels: ``Tensor[N]`` int64 in ``[0, C)``; -1 marks a row whose class is not among
            these C columns (it gets no margin).
        margin: any :class:`~marginface.margins.Margin`.
        norms: ``Tensor[N]`` feature norms, for margins that need them.

    Returns:
        ``Tensor[N, C]``.
    """
    if not isinstance(margin, Margin):
        raise TypeError(f"margin must be a marginface Margin, got {type(margin).__name__}")
    return margin(cosine, labels, norms)


def margin_cross_entropy(
    cosine: Tensor,
    labels: Tensor,
    margin: Margin,
    norms: Tensor | None = None,
    *,
    reduction: str = "mean",
) -> Tensor:
    """Softmax cross-entropy of :func:`margin_logits`, plus the margin's regularizer (MagFace).

    Args:
        cosine: ``Tensor[N, C]``.
        labels: ``Tensor[N]`` int64 in ``[0, C)``.
        margin: the margin.
        norms: ``Tensor[N]``, for margins that need them.
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"``.
    """
    if not isinstance(margin, Margin):
        raise TypeError(f"margin must be a marginface Margin, got {type(margin).__name__}")
    check_choice("reduction", reduction, REDUCTIONS)
    check_cosine(cosine)
    labels = check_labels(labels, cosine.shape[0], cosine.shape[1])
    check_norms(norms, cosine.shape[0], required=margin.requires_norms)
    logits = margin.apply(cosine, labels, norms)  # (N, C)
    return logits_cross_entropy(logits, labels, margin, norms, reduction=reduction)
