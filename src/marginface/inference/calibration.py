"""A verification threshold for a target false accept rate, measured on labelled pairs, with
the rate those pairs can support and its uncertainty.

A pair is accepted ("same identity") when ``score >= threshold``; its false accept rate (FAR)
is the fraction of impostor pairs (two identities) accepted. A FAR of ``f`` measured on ``n``
impostor pairs rests on about ``f · n`` accepted impostors: with 300 impostors a "FAR 1e-3"
threshold is the one above the highest impostor score, and says nothing about 1e-3. So
:func:`calibrate_threshold` also reports

* the smallest FAR the pairs support, ``min_errors / n`` (default ``10 / n``: at least ten
  impostors accepted are expected at that rate;
  :func:`~marginface.evaluation.binomial.supported_rate`), and refuses (``ValueError``) or
  warns when asked for less;
* the FAR measured at the threshold chosen, ``k / n``, with its exact binomial (Clopper–Pearson)
  interval (:func:`~marginface.evaluation.binomial.clopper_pearson`; 95 % by default). The
  interval treats pairs as independent; pairs of one image set share images, so the real
  uncertainty is larger.

To have enough impostor pairs, :func:`labelled_pair_scores` takes every pair of a labelled
image set (``N (N - 1) / 2`` pairs, nearly all of them cross-identity), not only a protocol's
listed pairs (LFW's 300 impostor pairs per fold).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from ..evaluation.binomial import (
    DEFAULT_MIN_ERRORS,
    clopper_pearson,
    rate_is_supported,
    supported_rate,
)
from ..evaluation.verification import roc_curve

__all__ = [
    "UNSUPPORTED_ACTIONS",
    "Calibration",
    "calibrate_threshold",
    "labelled_pair_scores",
    "pair_sample_note",
    "supports_far",
    "threshold_at_far",
    "unsupported_message",
]

UNSUPPORTED_ACTIONS = ("raise", "warn")
"""What :func:`calibrate_threshold` does when asked for a FAR the pairs cannot support."""


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
        next float above the highest impostor score. Whether the pairs can measure ``far`` at
        all is :func:`calibrate_threshold`'s question.

    Raises:
        ValueError: ``far`` outside ``(0, 1]``; pairs of one kind only; bad shapes.
    """
    _check_far(far)
    fpr, _, thresholds = roc_curve(scores, same)  # fpr non-decreasing, thresholds decreasing
    allowed = np.flatnonzero(fpr <= far)
    threshold = float(thresholds[allowed[-1]])
    if math.isinf(threshold):  # no score accepted at all: just above the highest impostor
        impostors = np.asarray(scores, dtype=np.float64)[~np.asarray(same, dtype=bool)]
        threshold = float(np.nextafter(impostors.max(), np.inf))
    return threshold


def _check_far(far: object) -> float:
    if isinstance(far, bool) or not isinstance(far, int | float) or not 0.0 < far <= 1.0:
        raise ValueError(f"far must be in (0, 1], got {far!r}")
    return float(far)


@dataclass(frozen=True)
class Calibration:
    """A threshold chosen for a false accept rate, and what the pairs say about it.

    Attributes:
        threshold: the cosine threshold (accept when ``score >= threshold``).
        far: the target FAR it was chosen for.
        impostors, genuine: impostor and genuine pairs counted.
        false_accepts: impostor pairs with ``score >= threshold``.
        true_accepts: genuine pairs with ``score >= threshold``.
        far_interval: ``(lower, upper)``, the exact binomial interval of the measured FAR
            ``false_accepts / impostors`` at ``confidence``.
        confidence: of ``far_interval``. Default: 0.95.
        min_errors: expected false accepts a supported FAR needs (``supported_far``).
        pairs: how the pairs were drawn, in words (``""`` when not known).
    """

    threshold: float
    far: float
    impostors: int
    genuine: int
    false_accepts: int
    true_accepts: int
    far_interval: tuple[float, float]
    confidence: float = 0.95
    min_errors: int = DEFAULT_MIN_ERRORS
    pairs: str = ""

    @property
    def measured_far(self) -> float:
        """``false_accepts / impostors``: the FAR these pairs show at :attr:`threshold`."""
        return self.false_accepts / self.impostors

    @property
    def tar(self) -> float:
        """``true_accepts / genuine``: the true accept rate at :attr:`threshold`."""
        return self.true_accepts / self.genuine

    @property
    def supported_far(self) -> float:
        """``min_errors / impostors``: the smallest FAR these pairs can measure."""
        return supported_rate(self.impostors, self.min_errors)

    @property
    def supported(self) -> bool:
        """Whether :attr:`far` is at least :attr:`supported_far`."""
        return supports_far(self.far, self.impostors, self.min_errors)

    def summary(self) -> str:
        """One line: the threshold, the target and measured FAR with its interval, the
        counts, the TAR and the smallest FAR the pairs support."""
        lower, upper = self.far_interval
        text = (
            f"threshold {self.threshold:.4f} for FAR {self.far:g}: {self.false_accepts:,} of "
            f"{self.impostors:,} impostor pairs accepted (FAR {self.measured_far:.3g}, "
            f"{self.confidence:.0%} exact interval {lower:.3g}-{upper:.3g}), TAR "
            f"{self.tar:.4f} ({self.true_accepts:,} of {self.genuine:,} genuine pairs); "
            f"these pairs support FAR >= {self.supported_far:.3g}"
        )
        return text + (f" ({self.pairs})" if self.pairs else "")


def supports_far(far: float, impostors: int, min_errors: int = DEFAULT_MIN_ERRORS) -> bool:
    """Whether ``impostors`` pairs can measure ``far``: ``far · impostors >= min_errors``
    (with a little room for floats: ``0.001 · 10000`` is supported)."""
    return rate_is_supported(far, impostors, min_errors)


def unsupported_message(far: float, impostors: int, min_errors: int = DEFAULT_MIN_ERRORS) -> str:
    """The one line naming why ``far`` cannot be measured on ``impostors`` pairs."""
    needed = math.ceil(min_errors / far - 1e-9)
    return (
        f"far {far:g} needs at least {needed:,} impostor pairs ({min_errors} false accepts "
        f"expected at that rate), these pairs hold {impostors:,}: they support FAR >= "
        f"{supported_rate(impostors, min_errors):.3g}; calibrate on more pairs (every "
        "cross-identity pair of more images) or ask for a larger far"
    )


def calibrate_threshold(
    scores: ArrayLike,
    same: ArrayLike,
    far: float,
    *,
    min_errors: int = DEFAULT_MIN_ERRORS,
    confidence: float = 0.95,
    unsupported: str = "raise",
    pairs: str = "",
) -> Calibration:
    """The threshold for ``far`` (:func:`threshold_at_far`), the FAR measured there with its
    exact interval, and whether the pairs support ``far`` (module docstring).

    Args:
        scores: ``float[P]`` cosine of each pair.
        same: ``bool[P]``, True for genuine pairs; both kinds must occur.
        far: the target FAR in ``(0, 1]``.
        min_errors: ``far`` is supported when ``far · impostors >= min_errors``. Default: 10.
        confidence: of the measured FAR's interval, in ``(0, 1)``. Default: 0.95.
        unsupported: ``"raise"`` (default): a ``ValueError`` naming ``far``, the impostor pairs
            it needs and holds and the FAR they support; ``"warn"``: a ``UserWarning`` with
            that text, and the calibration.
        pairs: how the pairs were drawn, kept in :attr:`Calibration.pairs`.

    Returns:
        The :class:`Calibration`.

    Raises:
        ValueError: ``far``, ``confidence``, ``min_errors`` or ``unsupported`` out of range;
            pairs of one kind only (naming the counts); an unsupported ``far`` with
            ``unsupported="raise"``.
    """
    far = _check_far(far)
    if unsupported not in UNSUPPORTED_ACTIONS:
        raise ValueError(
            f"unsupported must be one of {', '.join(UNSUPPORTED_ACTIONS)}, got {unsupported!r}"
        )
    if isinstance(min_errors, bool) or not isinstance(min_errors, int) or min_errors < 1:
        raise ValueError(f"min_errors must be an int >= 1, got {min_errors!r}")
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(same, dtype=bool)
    if s.ndim == 1 and y.shape == s.shape:
        genuine = int(y.sum())
        if genuine == 0 or genuine == y.shape[0]:
            raise ValueError(
                f"calibration needs genuine and impostor pairs, got {genuine:,} genuine and "
                f"{y.shape[0] - genuine:,} impostor pairs (of one identity each, or two)"
            )
    impostors = int((~y).sum()) if y.ndim == 1 else 0
    if impostors and not supports_far(far, impostors, min_errors):
        message = unsupported_message(far, impostors, min_errors)
        if unsupported == "raise":
            raise ValueError(message)
        warnings.warn(message, UserWarning, stacklevel=2)
    threshold = threshold_at_far(s, y, far)  # checks shapes and both kinds
    accepted = s >= threshold
    false_accepts = int((accepted & ~y).sum())
    return Calibration(
        threshold=threshold,
        far=far,
        impostors=impostors,
        genuine=int(y.sum()),
        false_accepts=false_accepts,
        true_accepts=int((accepted & y).sum()),
        far_interval=clopper_pearson(false_accepts, impostors, confidence),
        confidence=float(confidence),
        min_errors=min_errors,
        pairs=pairs,
    )


def pair_sample_note(
    num_images: int, *, max_pairs: int = 1_000_000, seed: int = 0, images: str = "images"
) -> str:
    """How :func:`labelled_pair_scores` draws the pairs of ``num_images`` images, in words:
    ``"all 499,500 pairs of 1,000 images"`` or ``"1,000,000 distinct pairs of 5,000 images
    drawn with seed 0"`` (``images``: the word for them, e.g. ``"test images"``)."""
    total = num_images * (num_images - 1) // 2
    if total <= max_pairs:
        return f"all {total:,} pairs of {num_images:,} {images}"
    return f"{max_pairs:,} distinct pairs of {num_images:,} {images} drawn with seed {seed}"


def labelled_pair_scores(
    embeddings: np.ndarray,
    labels: np.ndarray,
    *,
    max_pairs: int = 1_000_000,
    seed: int = 0,
    chunk: int = 65_536,
) -> tuple[np.ndarray, np.ndarray]:
    """Cosines and same-identity flags of the pairs of a labelled embedding set: every pair
    ``i < j`` when there are at most ``max_pairs``, else ``max_pairs`` distinct pairs drawn
    uniformly without replacement with ``seed`` (:func:`pair_sample_note` says which).

    Args:
        embeddings: ``float[N, D]`` (normalised here).
        labels: ``int[N]`` identities.
        max_pairs: Default: a million.
        seed: of the draw. Default: 0.
        chunk: pairs scored at a time (memory: ``chunk · D`` floats). Default: 65,536.

    Returns:
        ``(scores float64[P], same bool[P])``, the pairs in ``(i, j)`` order (row-major over
        the upper triangle).
    """
    x = np.asarray(embeddings, dtype=np.float64)
    x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    y = np.asarray(labels)
    n = x.shape[0]
    total = n * (n - 1) // 2
    if total <= max_pairs:
        first, second = np.triu_indices(n, k=1)
    else:
        rng = np.random.default_rng(seed)
        linear = np.sort(rng.choice(total, size=max_pairs, replace=False))
        # row i of the upper triangle starts at offset(i) = i (2n - i - 1) / 2
        rows = np.arange(n, dtype=np.int64)
        offsets = rows * (2 * n - rows - 1) // 2
        first = np.searchsorted(offsets, linear, side="right") - 1
        second = linear - offsets[first] + first + 1
    scores = np.empty(first.shape[0], dtype=np.float64)
    for start in range(0, first.shape[0], chunk):
        a, b = first[start : start + chunk], second[start : start + chunk]
        scores[start : start + chunk] = np.einsum("pd,pd->p", x[a], x[b])
    return scores, y[first] == y[second]
