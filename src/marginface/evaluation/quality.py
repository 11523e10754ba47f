"""Feature magnitude as a quality score (MagFace): the error-versus-reject curve.

MagFace (Meng et al., CVPR 2021) trains the feature norm ``‖x‖`` to grow with the face's quality.
Its Sec. 4.3 judges a quality score by rejecting the lowest-quality fraction of the data and
measuring the recognition error of what is left, at a threshold fixed beforehand: a good score
makes the error fall as more is rejected.

Here, for verification pairs: a pair's quality is the smaller of its two magnitudes, the
threshold is the one of highest accuracy on *all* pairs (fixed), and the curve is the accuracy
on the pairs kept after rejecting the ``⌊r·P⌋`` pairs of lowest quality, for each fraction ``r``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .arrays import ArrayLike, as_bool_vector, as_float_vector, as_int_vector, to_numpy
from .verification import best_threshold

__all__ = [
    "DEFAULT_REJECT_FRACTIONS",
    "ErrorVersusReject",
    "error_versus_reject",
    "pair_quality",
]

DEFAULT_REJECT_FRACTIONS = tuple(round(0.05 * i, 2) for i in range(19))
"""0, 0.05, ..., 0.9: the fractions of pairs rejected."""


@dataclass
class ErrorVersusReject:
    """The error-versus-reject curve of :func:`error_versus_reject`.

    Attributes:
        fractions: ``float64[R]``, the fractions of pairs rejected, increasing.
        accuracy: ``float64[R]``, verification accuracy on the pairs kept (NaN if none are).
        kept: ``int64[R]``, how many pairs were kept.
        threshold: the fixed decision threshold (a pair is "same" when its score is ``>=`` it).
    """

    fractions: np.ndarray
    accuracy: np.ndarray
    kept: np.ndarray
    threshold: float

    @property
    def error(self) -> np.ndarray:
        """``1 - accuracy``, ``float64[R]``."""
        return 1.0 - self.accuracy

    def as_dict(self) -> dict[str, float]:
        """``{"erc_accuracy@reject=0.10": ..., ...}`` for the metrics table."""
        return {
            f"erc_accuracy@reject={fraction:.2f}": float(value)
            for fraction, value in zip(self.fractions, self.accuracy, strict=True)
        }


def pair_quality(magnitudes: ArrayLike, index: ArrayLike) -> np.ndarray:
    """A pair's quality: the smaller of its two images' feature magnitudes.

    Args:
        magnitudes: ``float[N]``, ``‖x_i‖`` of every image (unnormalized embeddings).
        index: ``int[P, 2]``, the pairs' rows ``(a, b)``.

    Returns:
        ``float64[P]``, ``min(‖x_a‖, ‖x_b‖)``.
    """
    norms = as_float_vector("magnitudes", magnitudes)
    pairs = to_numpy("index", index)
    if pairs.dtype == np.bool_ or not np.issubdtype(pairs.dtype, np.integer):
        raise TypeError(f"index must have an integer dtype, got {pairs.dtype}")
    if pairs.ndim != 2 or pairs.shape[1] != 2:
        raise ValueError(f"index must have shape (P, 2), got {pairs.shape}")
    if pairs.size and (pairs.min() < 0 or pairs.max() >= norms.shape[0]):
        raise ValueError(f"index must lie in [0, {norms.shape[0] - 1}] (rows of magnitudes)")
    return np.minimum(norms[pairs[:, 0]], norms[pairs[:, 1]])


def error_versus_reject(
    scores: ArrayLike,
    same: ArrayLike,
    quality: ArrayLike,
    *,
    fractions: ArrayLike = DEFAULT_REJECT_FRACTIONS,
    threshold: float | None = None,
) -> ErrorVersusReject:
    """Verification accuracy as the lowest-quality pairs are rejected.

    For each fraction ``r``, the ``⌊r·P⌋`` pairs of lowest ``quality`` are removed (ties: the
    pair listed first goes first) and the accuracy of the others is measured at one fixed
    threshold: ``threshold``, or (None, default) the threshold of highest accuracy on all ``P``
    pairs (:func:`~marginface.evaluation.verification.best_threshold`).

    Args:
        scores: ``float[P]`` similarities.
        same: ``bool[P]``, True for genuine pairs (both kinds must occur).
        quality: ``float[P]``, e.g. :func:`pair_quality`.
        fractions: in ``[0, 1)``, increasing. Default: 0, 0.05, ..., 0.9.
        threshold: a fixed decision threshold, or None.

    Returns:
        :class:`ErrorVersusReject`.
    """
    s = as_float_vector("scores", scores)
    y = as_bool_vector("same", same, length=s.shape[0])
    q = as_float_vector("quality", quality, length=s.shape[0])
    r = as_float_vector("fractions", fractions)
    if r.size == 0 or r.min() < 0 or r.max() >= 1 or np.any(np.diff(r) <= 0):
        raise ValueError(f"fractions must be increasing values in [0, 1), got {r.tolist()}")
    genuine = int(y.sum())
    if genuine == 0 or genuine == y.shape[0]:
        raise ValueError(
            f"same must contain both genuine (True) and impostor (False) pairs, got {genuine} "
            f"genuine out of {y.shape[0]}"
        )
    if threshold is None:
        threshold, _ = best_threshold(s, y)
    correct = (s >= threshold) == y  # (P,)
    order = np.argsort(q, kind="stable")  # lowest quality first
    correct_in_order = correct[order]
    # accuracy of the pairs order[n:], for every n: suffix sums of correct decisions
    suffix = np.r_[np.cumsum(correct_in_order[::-1])[::-1], 0]  # (P + 1,)
    # ⌊r·P⌋, robust to r·P landing a rounding error below an integer (0.35·100 = 34.999...)
    rejected = as_int_vector("rejected", np.floor(r * s.shape[0] + 1e-9).astype(np.int64))
    kept = s.shape[0] - rejected
    with np.errstate(invalid="ignore", divide="ignore"):
        accuracy = np.where(kept > 0, suffix[rejected] / np.maximum(kept, 1), np.nan)
    return ErrorVersusReject(
        r, accuracy.astype(np.float64), kept.astype(np.int64), float(threshold)
    )
