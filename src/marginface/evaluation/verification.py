"""Verification on pairs: ROC, AUC, EER, TAR at FAR and the LFW 10-fold accuracy.

Convention everywhere: a pair is predicted "same identity" when its score is **>= threshold**
(scores are similarities: higher means more alike). FAR = FPR = accepted impostors / impostors,
TAR = TPR = accepted genuine pairs / genuine pairs, FRR = FNR = 1 - TAR.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from .._validation import check_real
from .arrays import ArrayLike, as_bool_vector, as_float_vector, as_int_vector

__all__ = [
    "DEFAULT_FAR_TARGETS",
    "VerificationMetrics",
    "best_threshold",
    "equal_error_rate",
    "kfold_accuracy",
    "roc_auc",
    "roc_curve",
    "tar_at_far",
    "verification_metrics",
]

DEFAULT_FAR_TARGETS = (1e-1, 1e-2, 1e-3, 1e-4)


def _check_scores_and_same(scores: ArrayLike, same: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    s = as_float_vector("scores", scores)
    y = as_bool_vector("same", same, length=s.shape[0])
    num_genuine = int(y.sum())
    if num_genuine == 0 or num_genuine == y.shape[0]:
        raise ValueError(
            "same must contain both genuine (True) and impostor (False) pairs, got "
            f"{num_genuine} genuine out of {y.shape[0]}"
        )
    return s, y


def roc_curve(scores: ArrayLike, same: ArrayLike) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ROC at every distinct score, as ``sklearn.metrics.roc_curve(same, scores,
    drop_intermediate=False)``.

    Args:
        scores: ``float[P]`` similarities.
        same: ``bool[P]``, True for genuine pairs (both kinds must occur).

    Returns:
        ``(fpr, tpr, thresholds)``, each ``float64[T + 1]`` for ``T`` distinct scores: point ``t``
        accepts the pairs with ``score >= thresholds[t]``; ``thresholds`` is decreasing and starts
        at ``+inf`` (nothing accepted, the point (0, 0)); the last point is (1, 1).
    """
    s, y = _check_scores_and_same(scores, same)
    order = np.argsort(-s, kind="stable")  # descending scores
    s_sorted, y_sorted = s[order], y[order]
    last_of_value = np.r_[np.flatnonzero(np.diff(s_sorted)), s_sorted.shape[0] - 1]
    tps = np.cumsum(y_sorted)[last_of_value]  # accepted genuine pairs, (T,)
    fps = (last_of_value + 1) - tps  # accepted impostor pairs, (T,)
    fpr = np.r_[0.0, fps / fps[-1]]
    tpr = np.r_[0.0, tps / tps[-1]]
    thresholds = np.r_[np.inf, s_sorted[last_of_value]]
    return fpr, tpr, thresholds


def roc_auc(fpr: np.ndarray, tpr: np.ndarray) -> float:
    r"""Area under the ROC by the trapezoidal rule, :math:`\sum_t (f_{t+1}-f_t)(r_{t+1}+r_t)/2`.

    Equals the probability that a random genuine pair outscores a random impostor pair, ties
    counting one half (``sklearn.metrics.roc_auc_score``).
    """
    return float(np.sum(np.diff(fpr) * (tpr[1:] + tpr[:-1]) / 2.0))


def equal_error_rate(fpr: np.ndarray, tpr: np.ndarray) -> float:
    """The error rate where FAR = FRR (``fpr = 1 - tpr``), linearly interpolated on the ROC.

    ``fpr + tpr - 1`` increases along the ROC from -1 to +1; the EER is the ``fpr`` where the
    piecewise-linear ROC crosses zero (at the first point where it reaches zero, if one does).
    """
    gap = fpr + tpr - 1.0  # non-decreasing, (T + 1,)
    k = int(np.argmax(gap >= 0.0))  # first index with gap >= 0 (exists: gap[-1] = 1)
    if gap[k] == 0.0 or k == 0:
        return float(fpr[k])
    alpha = -gap[k - 1] / (gap[k] - gap[k - 1])
    return float(fpr[k - 1] + alpha * (fpr[k] - fpr[k - 1]))


def tar_at_far(fpr: np.ndarray, tpr: np.ndarray, far: float, num_impostors: int) -> float | None:
    """The TAR at a false-accept rate: the largest TPR among ROC points with FPR <= ``far``.

    No interpolation: this is the TAR of a real threshold whose measured FAR does not exceed the
    target (the conservative reading, as in the IJB protocols). ``None`` when there are fewer
    than ``1/far`` impostor pairs, since then a FAR of ``far`` cannot be measured (any single
    false accept already exceeds it).
    """
    if num_impostors * far < 1.0 - 1e-9:
        return None
    return float(tpr[fpr <= far + 1e-12].max())


def best_threshold(scores: np.ndarray, same: np.ndarray) -> tuple[float, float]:
    """The threshold of highest accuracy on these pairs, and that accuracy.

    Candidates are the midpoints between consecutive distinct scores, plus one just below the
    smallest (accept all) and one just above the largest (reject all): every distinct decision
    is reached. Ties go to the lowest threshold.

    Args:
        scores: ``float64[P]``; same: ``bool[P]`` (no checks: callers checked).

    Returns:
        ``(threshold, accuracy)``.
    """
    values, inverse = np.unique(scores, return_inverse=True)  # ascending distinct, (V,)
    genuine = np.bincount(inverse, weights=same, minlength=values.shape[0])  # (V,)
    impostor = np.bincount(inverse, weights=~same, minlength=values.shape[0])  # (V,)
    # candidate m accepts values[m:], for m = 0..V (m = V accepts nothing)
    accepted_genuine = np.r_[np.cumsum(genuine[::-1])[::-1], 0.0]  # (V + 1,)
    rejected_impostor = np.r_[0.0, np.cumsum(impostor)]  # (V + 1,)
    accuracy = (accepted_genuine + rejected_impostor) / scores.shape[0]
    m = int(np.argmax(accuracy))
    if m == 0:
        threshold = float(np.nextafter(values[0], -np.inf))
    elif m == values.shape[0]:
        threshold = float(np.nextafter(values[-1], np.inf))
    else:
        threshold = float((values[m - 1] + values[m]) / 2.0)
        if threshold <= values[m - 1]:  # adjacent floats: the midpoint rounds down
            threshold = float(values[m])
    return threshold, float(accuracy[m])


def _default_folds(same: np.ndarray, num_folds: int = 10) -> np.ndarray:
    """Contiguous, stratified folds: the k-th genuine (impostor) pair of ``n`` goes to fold
    ``floor(10·k/n)``."""
    folds = np.empty(same.shape[0], dtype=np.int64)
    for kind in (True, False):
        where = np.flatnonzero(same == kind)
        folds[where] = np.arange(where.shape[0]) * num_folds // where.shape[0]
    return folds


def kfold_accuracy(
    scores: np.ndarray, same: np.ndarray, folds: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The LFW protocol: for each fold, the threshold of :func:`best_threshold` on the other
    folds' pairs, and the accuracy it gets on this fold's pairs.

    Returns:
        ``(accuracies, thresholds)``, each ``float64[K]`` in the order of ``np.unique(folds)``.
    """
    accuracies, thresholds = [], []
    for fold in np.unique(folds):
        test = folds == fold
        threshold, _ = best_threshold(scores[~test], same[~test])
        accuracies.append(float(np.mean((scores[test] >= threshold) == same[test])))
        thresholds.append(threshold)
    return np.asarray(accuracies), np.asarray(thresholds)


@dataclass(frozen=True)
class VerificationMetrics:
    """Verification results on a set of scored pairs.

    Attributes:
        accuracy: mean over folds of the fold accuracy, each fold judged at the threshold that is
            best on the other folds (LFW's 10-fold protocol).
        accuracy_std: population standard deviation (``ddof=0``) of the fold accuracies.
        threshold: mean of the per-fold thresholds (a cosine).
        auc: area under the ROC.
        eer: equal error rate (FAR = FRR), interpolated on the ROC.
        tar_at_far: ``{far: TAR}``; the TAR of the best threshold with FAR <= far, or ``None``
            where there are fewer than ``1/far`` impostor pairs.
        fpr, tpr: the ROC, ``float64[T + 1]`` (see :func:`roc_curve`).
        fold_accuracies: ``float64[K]``, one per fold.
        num_genuine, num_impostor: pair counts.
    """

    accuracy: float
    accuracy_std: float
    threshold: float
    auc: float
    eer: float
    tar_at_far: dict[float, float | None]
    fpr: np.ndarray = field(repr=False)
    tpr: np.ndarray = field(repr=False)
    fold_accuracies: np.ndarray = field(repr=False)
    num_genuine: int = 0
    num_impostor: int = 0

    def as_dict(self) -> dict[str, float | int | None]:
        """The scalars, for a table or a CSV row: ``accuracy``, ``accuracy_std``, ``threshold``,
        ``auc``, ``eer``, ``tar@far=1e-01`` ... (None where not measurable), ``num_genuine``,
        ``num_impostor``."""
        result: dict[str, float | int | None] = {
            "accuracy": self.accuracy,
            "accuracy_std": self.accuracy_std,
            "threshold": self.threshold,
            "auc": self.auc,
            "eer": self.eer,
        }
        for far, tar in self.tar_at_far.items():
            result[f"tar@far={far:.0e}"] = tar
        result["num_genuine"] = self.num_genuine
        result["num_impostor"] = self.num_impostor
        return result


def verification_metrics(
    scores: ArrayLike,
    same: ArrayLike,
    folds: ArrayLike | None = None,
    far_targets: Iterable[float] = DEFAULT_FAR_TARGETS,
) -> VerificationMetrics:
    """All verification metrics of scored pairs.

    Args:
        scores: ``float[P]`` pair similarities (e.g. :func:`~marginface.evaluation.pair_scores`).
        same: ``bool[P]``, True for genuine pairs; both kinds must occur.
        folds: ``int[P]`` fold of each pair (``PairSet.fold``), at least two distinct values; None
            (default) deals each kind into 10 contiguous stratified folds in the given order.
        far_targets: the FARs for :attr:`VerificationMetrics.tar_at_far`, each in (0, 1].
            Default: 1e-1, 1e-2, 1e-3, 1e-4.

    Returns:
        :class:`VerificationMetrics`.
    """
    s, y = _check_scores_and_same(scores, same)
    if folds is None:
        fold_ids = _default_folds(y)
    else:
        fold_ids = as_int_vector("folds", folds, length=s.shape[0])
    if np.unique(fold_ids).shape[0] < 2:
        raise ValueError(
            f"folds must hold at least 2 distinct folds, got {np.unique(fold_ids).tolist()} "
            f"({s.shape[0]} pairs)"
        )
    targets = [check_real("far_targets", far, positive=True, at_most=1.0) for far in far_targets]
    fpr, tpr, _ = roc_curve(s, y)
    num_impostor = int((~y).sum())
    accuracies, thresholds = kfold_accuracy(s, y, fold_ids)
    return VerificationMetrics(
        accuracy=float(accuracies.mean()),
        accuracy_std=float(accuracies.std()),
        threshold=float(thresholds.mean()),
        auc=roc_auc(fpr, tpr),
        eer=equal_error_rate(fpr, tpr),
        tar_at_far={far: tar_at_far(fpr, tpr, far, num_impostor) for far in targets},
        fpr=fpr,
        tpr=tpr,
        fold_accuracies=accuracies,
        num_genuine=int(y.sum()),
        num_impostor=num_impostor,
    )
