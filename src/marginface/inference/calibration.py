"""A verification threshold for a target false accept rate, measured on labelled pairs."""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike

from ..evaluation.verification import roc_curve

__all__ = ["labelled_pair_scores", "threshold_at_far"]


def threshold_at_far(scores: ArrayLike, same: ArrayLike, far: float) -> float:
    """The lowest cosine threshold whose false accept rate on these pairs is ``<= far``.

    A pair is accepted ("same identity") when ``score >= threshold``; the false accept rate is
    the fraction of impostor pairs (``same == False``) accepted. Of the thresholds with
    ``FAR <= far`` the lowest is taken: it accepts the most genuine pairs.

    Args:
        scores: ``float[P]`` cosine of each pair.
        same: ``bool[P]`` whether each pair is of one identity; both kinds must occur.
        far: the target false accept rate, in ``(0, 1]`` (``1e-3``: one impostor in a thousand).

    Returns:
        The threshold, a float. When even the highest impostor score would exceed ``far``
        (fewer than ``1 / far`` impostors), the threshold rejects every impostor pair: the
        next float above the highest impostor score.

    Raises:
        ValueError: ``far`` outside ``(0, 1]``; pairs of one kind only; bad shapes.
    """
    if isinstance(far, bool) or not isinstance(far, int | float) or not 0.0 < far <= 1.0:
        raise ValueError(f"far must be in (0, 1], got {far!r}")
    fpr, _, thresholds = roc_curve(scores, same)  # fpr non-decreasing, thresholds decreasing
    allowed = np.flatnonzero(fpr <= far)
    threshold = float(thresholds[allowed[-1]])
    if math.isinf(threshold):  # no score accepted at all: just above the highest impostor
        impostors = np.asarray(scores, dtype=np.float64)[~np.asarray(same, dtype=bool)]
        threshold = float(np.nextafter(impostors.max(), np.inf))
    return threshold


def labelled_pair_scores(
    embeddings: np.ndarray, labels: np.ndarray, *, max_pairs: int = 1_000_000, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Cosines and same-identity flags of the pairs of a labelled embedding set: every pair
    ``i < j`` when there are at most ``max_pairs``, else ``max_pairs`` of them drawn with
    ``seed`` (without the ``i == j`` pairs).

    Args:
        embeddings: ``float[N, D]`` (normalised here).
        labels: ``int[N]`` identities.

    Returns:
        ``(scores float64[P], same bool[P])``.
    """
    x = np.asarray(embeddings, dtype=np.float64)
    x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    y = np.asarray(labels)
    n = x.shape[0]
    if n * (n - 1) // 2 <= max_pairs:
        first, second = np.triu_indices(n, k=1)
    else:
        rng = np.random.default_rng(seed)
        first, second = rng.integers(0, n, max_pairs), rng.integers(0, n, max_pairs)
        keep = first != second
        first, second = first[keep], second[keep]
    scores = np.einsum("pd,pd->p", x[first], x[second])
    return scores, y[first] == y[second]
