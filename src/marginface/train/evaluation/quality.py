"""The feature norm as a quality score (MagFace's magnitude): the error-versus-reject curve a
run's evaluation adds when its margin declares
:attr:`~marginface.margins.base.Margin.feature_norm_is_quality`."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...data import PairSet
from ...evaluation import ErrorVersusReject, error_versus_reject, pair_quality, pair_scores
from ...margins.base import Margin

__all__ = [
    "ERC_REPORTED_FRACTIONS",
    "magnitude_quality_curve",
    "norm_is_quality",
    "quality_metrics",
]

ERC_REPORTED_FRACTIONS = (0.1, 0.2, 0.3, 0.5)
"""Rejected fractions whose accuracy the metrics list when the feature norm is a quality score
(MagFace; ``erc_accuracy@reject=0.10`` ...); the whole curve is the evaluation's ``erc``."""


def magnitude_quality_curve(embeddings: np.ndarray, pairs: PairSet) -> ErrorVersusReject:
    """MagFace's feature magnitude as a quality score: verification accuracy of ``pairs`` as the
    lowest-quality fraction is rejected (:func:`~marginface.evaluation.error_versus_reject`),
    a pair's quality being the smaller of its two embeddings' norms ``‖x‖`` (the embeddings as
    evaluated: flip-averaged when the evaluation flips), the threshold fixed at the one of
    highest accuracy on all pairs."""
    magnitudes = np.linalg.norm(np.asarray(embeddings, dtype=np.float64), axis=1)  # (N,)
    quality = pair_quality(magnitudes, pairs.index)  # (P,)
    scores = pair_scores(embeddings, pairs.index)  # (P,)
    return error_versus_reject(scores, pairs.same, quality)


def norm_is_quality(head: Any) -> bool:
    """Whether ``head``'s margin declares its feature norm a quality score (MagFace:
    :attr:`~marginface.margins.base.Margin.feature_norm_is_quality`); False for a head without
    a margin."""
    margin = getattr(head, "margin", None)
    return isinstance(margin, Margin) and margin.feature_norm_is_quality


def quality_metrics(
    head: Any, embeddings: np.ndarray, pairs: PairSet
) -> tuple[ErrorVersusReject | None, dict[str, float]]:
    """``(curve, metrics)``: for a head whose margin declares its norm a quality score
    (:func:`norm_is_quality`), :func:`magnitude_quality_curve` and its accuracy at
    :data:`ERC_REPORTED_FRACTIONS` (``erc_accuracy@reject=0.10`` ...); else ``(None, {})``."""
    if not norm_is_quality(head):
        return None, {}
    curve = magnitude_quality_curve(embeddings, pairs)
    values = curve.as_dict()
    keys = [f"erc_accuracy@reject={fraction:.2f}" for fraction in ERC_REPORTED_FRACTIONS]
    return curve, {key: values[key] for key in keys}
