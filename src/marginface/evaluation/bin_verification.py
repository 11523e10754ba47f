"""insightface's ``.bin`` verification protocol (LFW, CFP-FP, AgeDB-30...): papers' numbers.

insightface's ``recognition/arcface_torch/eval/verification.py`` judges a verification set as
follows, and :func:`bin_verification_metrics` computes the same numbers:

1. each image ``i`` is embedded twice, as is (``e_i``) and flipped left-right (``f_i``);
   **XNorm** is the mean of ``‖e_i‖`` and ``‖f_i‖`` over all ``2·N`` embeddings;
2. the pair features are ``x_i = (e_i + f_i) / ‖e_i + f_i‖`` and the pair distance is the
   **squared** Euclidean distance ``d_p = ‖x_a - x_b‖²`` (``= 2 - 2 cos``, in [0, 4]);
3. the pairs are split into ``K = 10`` folds of consecutive pairs (scikit-learn's
   ``KFold(10, shuffle=False)``: the first ``P mod K`` folds hold one pair more);
4. for each fold, the threshold of highest accuracy on the other folds' pairs is searched on the
   grid ``t ∈ {0, 0.01, …, 3.99}`` (``numpy.arange(0, 4, 0.01)``), a pair being accepted as
   "same" when ``d_p < t`` (strictly), the **first** (smallest) best threshold winning a tie;
   the fold's accuracy is that threshold's accuracy on the fold's own pairs. **Accuracy-Flip**
   is the mean ± the population standard deviation of the ``K`` fold accuracies;
5. **VAL@FAR=1e-3**: for each fold, the FAR of every threshold of the finer grid
   ``numpy.arange(0, 4, 0.001)`` is measured on the other folds' pairs; the threshold where that
   FAR curve reaches the target is linearly interpolated (:func:`threshold_at_far`, below), and the
   fold's VAL (TAR) and FAR are measured at it on the fold's pairs; the mean VAL, its standard
   deviation and the mean FAR are reported.

insightface interpolates with ``scipy.interpolate.interp1d(far, thresholds, kind="slinear")``,
which recent SciPy refuses whenever the FAR curve repeats a value (``Expect x to not have
duplicates``; it always does: the FAR is 0 on a run of small thresholds).
:func:`threshold_at_far` evaluates the piecewise-linear function SciPy <= 1.8 built from the same
points (a degree-1 B-spline with the FARs as knots), which is defined with repeated values.

marginface's own search (:func:`~marginface.evaluation.verification.verification_metrics`,
thresholds at the midpoints between consecutive cosine scores, accepted when ``score >= t``) is
finer than the 0.01 grid and can print a slightly higher accuracy; it stays available and is
labelled ``midpoint`` in reports.

**When the grid is too coarse.** Embeddings whose pairs all lie within one grid step of each
other (every squared distance below 0.01: an untrained or collapsed model, a tiny embedding)
leave the grid no threshold between them: every ``t`` accepts all pairs or none, and the rule
prints 0.5000 ± 0.0000 at threshold 0 however well the pairs are ordered.
:attr:`BinVerificationMetrics.coarse_folds` counts the folds where the best grid threshold does
no better than one answer for every training pair although a threshold between two of their
distances does better; :func:`grid_note` turns it into the sentence ``marginface evaluate`` and
the report print beside the midpoint search's accuracy.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

from .._validation import check_real
from .arrays import ArrayLike, as_bool_vector, as_embeddings
from .pairs import pair_scores
from .verification import (
    DEFAULT_FAR_TARGETS,
    VerificationMetrics,
    best_threshold,
    verification_metrics,
)

__all__ = [
    "ACCURACY_THRESHOLDS",
    "VAL_THRESHOLDS",
    "BinVerificationMetrics",
    "bin_set_metrics",
    "bin_verification_metrics",
    "grid_accuracy",
    "grid_note",
    "grid_notes",
    "kfold_folds",
    "threshold_at_far",
    "validation_rate",
]

ACCURACY_THRESHOLDS = np.arange(0, 4, 0.01)
"""insightface's accuracy grid of squared-L2 thresholds, ``float64[400]``: 0, 0.01, ... 3.99."""

VAL_THRESHOLDS = np.arange(0, 4, 0.001)
"""insightface's VAL@FAR grid, ``float64[4000]``: 0, 0.001, ... 3.999."""


def kfold_folds(num_pairs: int, num_folds: int = 10) -> np.ndarray:
    """The fold of each pair under ``sklearn.model_selection.KFold(num_folds, shuffle=False)``.

    Folds are consecutive blocks; the first ``num_pairs % num_folds`` hold
    ``num_pairs // num_folds + 1`` pairs, the others ``num_pairs // num_folds``.

    Returns:
        ``int64[num_pairs]`` fold ids in ``0 .. num_folds - 1``, non-decreasing.
    """
    if isinstance(num_folds, bool) or not isinstance(num_folds, int) or num_folds < 2:
        raise ValueError(f"num_folds must be an int >= 2, got {num_folds!r}")
    if isinstance(num_pairs, bool) or not isinstance(num_pairs, int) or num_pairs < num_folds:
        raise ValueError(f"num_pairs must be an int >= num_folds ({num_folds}), got {num_pairs!r}")
    sizes = np.full(num_folds, num_pairs // num_folds, dtype=np.int64)
    sizes[: num_pairs % num_folds] += 1
    return np.repeat(np.arange(num_folds, dtype=np.int64), sizes)


def _accepted_counts(
    distances: np.ndarray, same: np.ndarray, thresholds: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Genuine and impostor pairs with ``distance < t`` for every threshold, ``int64[T]`` each."""
    genuine = np.sort(distances[same])
    impostor = np.sort(distances[~same])
    # searchsorted(side="left") counts the values strictly below t
    return (
        np.searchsorted(genuine, thresholds, side="left"),
        np.searchsorted(impostor, thresholds, side="left"),
    )


def grid_accuracy(
    distances: np.ndarray, same: np.ndarray, thresholds: np.ndarray = ACCURACY_THRESHOLDS
) -> np.ndarray:
    """Accuracy of the rule "same when ``distance < t``" at every threshold ``t``.

    ``accuracy(t) = (#{genuine: d < t} + #{impostor: d >= t}) / P``.

    Args:
        distances: ``float64[P]`` squared-L2 distances; same: ``bool[P]``.
        thresholds: ``float64[T]`` (default: :data:`ACCURACY_THRESHOLDS`).

    Returns:
        ``float64[T]``.
    """
    true_accepts, false_accepts = _accepted_counts(distances, same, thresholds)
    true_rejects = int((~same).sum()) - false_accepts
    return (true_accepts + true_rejects) / distances.shape[0]


def threshold_at_far(far: np.ndarray, thresholds: np.ndarray, target: float) -> float:
    """The threshold where a non-decreasing FAR curve reaches ``target``, linearly interpolated.

    The points ``(far[k], thresholds[k])`` (``far`` non-decreasing, ``thresholds`` increasing)
    are joined by straight segments between consecutive *distinct* FAR values, a run of equal
    FARs being represented by its last threshold (its first at the curve's maximum):

    * ``target > max(far)``: ``0.0`` (insightface's fallback: nothing is accepted);
    * ``target == max(far)``: the first threshold with that FAR (SciPy's spline is degenerate
      there when the maximum repeats);
    * otherwise, with ``j`` the last index where ``far[j] <= target`` and ``k = j + 1``:
      ``thresholds[j] + (target - far[j]) · (thresholds[k] - thresholds[j]) / (far[k] - far[j])``.

    This is ``scipy.interpolate.interp1d(far, thresholds, kind="slinear")(target)`` wherever
    SciPy accepts the input (no repeated FAR), and its degree-1 B-spline (SciPy <= 1.8) where it
    does not.

    Args:
        far: ``float64[T]`` non-decreasing FARs; thresholds: ``float64[T]`` increasing.
        target: the FAR to reach, >= ``far[0]``.

    Returns:
        The threshold (a float).
    """
    if target > far[-1]:
        return 0.0
    if target < far[0]:
        raise ValueError(f"target must be >= the smallest FAR {far[0]}, got {target}")
    if target == far[-1]:
        return float(thresholds[int(np.searchsorted(far, target, side="left"))])
    j = int(np.searchsorted(far, target, side="right")) - 1  # last far[j] <= target
    k = j + 1  # far[k] > target
    slope = (thresholds[k] - thresholds[j]) / (far[k] - far[j])
    return float(thresholds[j] + (target - far[j]) * slope)


def validation_rate(
    distances: np.ndarray, same: np.ndarray, threshold: float
) -> tuple[float, float]:
    """``(VAL, FAR)`` of the rule "same when ``distance < threshold``".

    ``VAL = #{genuine: d < t} / #genuine`` and ``FAR = #{impostor: d < t} / #impostor``; a rate
    whose denominator is zero is 0.
    """
    accepted = distances < threshold
    num_same, num_diff = int(same.sum()), int((~same).sum())
    val = float((accepted & same).sum()) / num_same if num_same else 0.0
    far = float((accepted & ~same).sum()) / num_diff if num_diff else 0.0
    return val, far


@dataclass(frozen=True)
class BinVerificationMetrics:
    """insightface's numbers for one ``.bin`` verification set.

    Attributes:
        accuracy: Accuracy-Flip, the mean of the fold accuracies (thresholds on the 0.01 grid).
        accuracy_std: their population standard deviation (``ddof=0``).
        threshold: mean of the folds' best squared-L2 thresholds (``cos = 1 - t / 2``).
        xnorm: mean L2 norm of the unnormalized embeddings (flipped ones included).
        val: mean over folds of the VAL (TAR) at the interpolated FAR-target threshold.
        val_std: its population standard deviation.
        far: mean over folds of the FAR measured at those thresholds.
        far_target: the FAR aimed at (insightface: 1e-3).
        fold_accuracies: ``float64[K]``.
        fold_thresholds: ``float64[K]``, each fold's best squared-L2 threshold.
        distances: ``float64[P]`` squared-L2 distances of the pairs.
        coarse_folds: the folds (0 .. ``K``) where the 0.01 grid is too coarse: its best
            threshold is no more accurate on the fold's training pairs than one answer for all
            of them (all "same" or all "different"), while a threshold between two of their
            distances is (e.g. every distance below 0.01). 0: the grid was fine.
    """

    accuracy: float
    accuracy_std: float
    threshold: float
    xnorm: float
    val: float
    val_std: float
    far: float
    far_target: float
    fold_accuracies: np.ndarray
    fold_thresholds: np.ndarray
    distances: np.ndarray
    coarse_folds: int = 0

    @property
    def grid_too_coarse(self) -> bool:
        """True when the grid was too coarse in at least one fold (:attr:`coarse_folds`)."""
        return self.coarse_folds > 0

    def as_dict(self) -> dict[str, float]:
        """The scalars: ``accuracy``, ``accuracy_std``, ``threshold``, ``xnorm``,
        ``val@far=1e-03`` (the target as formatted), ``val_std``, ``far``,
        ``grid_too_coarse_folds`` (:attr:`coarse_folds`, 0 when the grid was fine)."""
        return {
            "accuracy": self.accuracy,
            "accuracy_std": self.accuracy_std,
            "threshold": self.threshold,
            "xnorm": self.xnorm,
            f"val@far={self.far_target:.0e}": self.val,
            "val_std": self.val_std,
            "far": self.far,
            "grid_too_coarse_folds": float(self.coarse_folds),
        }


def _l2_normalize(x: np.ndarray) -> np.ndarray:
    """Rows divided by their L2 norm (a zero row stays zero), as
    ``sklearn.preprocessing.normalize``."""
    norms = np.sqrt(np.einsum("ij,ij->i", x, x))  # (N,)
    norms[norms == 0.0] = 1.0
    return x / norms[:, None]


def bin_verification_metrics(
    embeddings: ArrayLike,
    same: ArrayLike,
    *,
    flipped: ArrayLike | None = None,
    num_folds: int = 10,
    far_target: float = 1e-3,
) -> BinVerificationMetrics:
    """insightface's verification numbers of a ``.bin`` set (see the module docstring).

    Args:
        embeddings: ``[2P, D]`` embeddings of the images as they are (not normalized); pair
            ``p`` is rows ``2p`` and ``2p + 1``.
        same: ``bool[P]``, True for genuine pairs.
        flipped: ``[2P, D]`` embeddings of the left-right flipped images; None: no flip test
            (the pair features are then the normalized ``embeddings`` alone and XNorm their
            mean norm).
        num_folds: ``K`` consecutive folds (insightface: 10).
        far_target: the FAR of VAL@FAR, in (0, 1] (insightface: 1e-3).

    Returns:
        :class:`BinVerificationMetrics`.
    """
    e = as_embeddings("embeddings", embeddings, min_rows=2)  # (2P, D)
    if e.shape[0] % 2:
        raise ValueError(f"embeddings must have an even number of rows (2P), got {e.shape[0]}")
    y = as_bool_vector("same", same, length=e.shape[0] // 2)  # (P,)
    target = check_real("far_target", far_target, positive=True, at_most=1.0)
    folds = kfold_folds(y.shape[0], num_folds)
    norms = np.linalg.norm(e, axis=1)
    if flipped is not None:
        f = as_embeddings("flipped", flipped)
        if f.shape != e.shape:
            raise ValueError(f"flipped must have the shape of embeddings {e.shape}, got {f.shape}")
        norms = np.r_[norms, np.linalg.norm(f, axis=1)]
        e = e + f
    x = _l2_normalize(e)  # (2P, D)
    distances = np.sum(np.square(x[0::2] - x[1::2]), axis=1)  # (P,) squared L2
    return _protocol(distances, y, folds, norms, target)


def _protocol(
    distances: np.ndarray,
    same: np.ndarray,
    folds: np.ndarray,
    norms: np.ndarray,
    far_target: float,
) -> BinVerificationMetrics:
    fold_ids = np.unique(folds)
    accuracies = np.empty(fold_ids.shape[0])
    thresholds = np.empty(fold_ids.shape[0])
    vals = np.empty(fold_ids.shape[0])
    fars = np.empty(fold_ids.shape[0])
    coarse = 0
    for i, fold in enumerate(fold_ids):
        test = folds == fold
        train = ~test
        on_grid = grid_accuracy(distances[train], same[train])  # (400,)
        best = int(np.argmax(on_grid))  # first best
        coarse += _grid_too_coarse(distances[train], same[train], on_grid[best])
        thresholds[i] = ACCURACY_THRESHOLDS[best]
        accuracies[i] = grid_accuracy(
            distances[test], same[test], ACCURACY_THRESHOLDS[best : best + 1]
        )[0]
        _, false_accepts = _accepted_counts(distances[train], same[train], VAL_THRESHOLDS)
        num_diff = int((~same[train]).sum())
        far_curve = false_accepts / num_diff if num_diff else np.zeros(VAL_THRESHOLDS.shape[0])
        threshold = threshold_at_far(far_curve, VAL_THRESHOLDS, far_target)
        vals[i], fars[i] = validation_rate(distances[test], same[test], threshold)
    return BinVerificationMetrics(
        accuracy=float(accuracies.mean()),
        accuracy_std=float(accuracies.std()),
        threshold=float(thresholds.mean()),
        xnorm=float(norms.mean()),
        val=float(vals.mean()),
        val_std=float(vals.std()),
        far=float(fars.mean()),
        far_target=far_target,
        fold_accuracies=accuracies,
        fold_thresholds=thresholds,
        distances=distances,
        coarse_folds=coarse,
    )


def _grid_too_coarse(distances: np.ndarray, same: np.ndarray, grid_best: float) -> bool:
    """Whether the grid's best accuracy ``grid_best`` on these pairs is no better than one
    answer for all of them while a threshold between two of their distances is better
    (:func:`~marginface.evaluation.verification.best_threshold` on ``-distances``: every
    distinct decision)."""
    genuine = int(same.sum())
    constant = max(genuine, same.shape[0] - genuine) / same.shape[0]  # all "same" or all "not"
    _, finest = best_threshold(-distances, same)
    return bool(grid_best <= constant < finest)


def grid_note(name: str, values: Mapping[str, float], *, num_folds: int = 10) -> str | None:
    """The sentence ``marginface evaluate`` and the report print when insightface's 0.01 grid
    was too coarse for set ``name``, or None when it was not.

    Args:
        name: the set (``lfw``...), as it prefixes the keys of ``values``.
        values: the set's scalars without the prefix, as :func:`bin_set_metrics` returns them
            (``grid_too_coarse_folds``, ``accuracy``, ``accuracy_std``, ``accuracy_midpoint``,
            ``accuracy_midpoint_std``); a missing ``grid_too_coarse_folds`` means no note.
        num_folds: the folds of the protocol (insightface: 10).

    Returns:
        e.g. ``"lfw: insightface's threshold grid (steps of 0.01 in squared L2 distance) is too
        coarse for these embeddings: in 10 of 10 folds no grid threshold beats one answer for
        every pair, so its accuracy 50.00% ± 0.00 measures the grid, not the model. The finer
        midpoint search gives 97.50% ± 1.20 (lfw_accuracy_midpoint)."``
    """
    folds = values.get("grid_too_coarse_folds", 0.0)
    if not folds or not math.isfinite(folds):
        return None

    def percent(key: str) -> str:
        mean, std = values.get(key, math.nan), values.get(f"{key}_std", math.nan)
        return f"{100 * mean:.2f}% ± {100 * std:.2f}"

    return (
        f"{name}: insightface's threshold grid (steps of 0.01 in squared L2 distance) is too "
        f"coarse for these embeddings: in {int(folds)} of {num_folds} folds no grid threshold "
        f"beats one answer for every pair, so its accuracy {percent('accuracy')} measures the "
        f"grid, not the model. The finer midpoint search gives {percent('accuracy_midpoint')} "
        f"({name}_accuracy_midpoint)."
    )


class PairTable(Protocol):
    """What :func:`bin_set_metrics` reads of a pair list (a :class:`~marginface.data.PairSet`
    has it): ``index`` ``int[P, 2]`` rows of each pair, ``same`` ``bool[P]``, ``fold``
    ``int[P]``."""

    index: np.ndarray
    same: np.ndarray
    fold: np.ndarray


def bin_set_metrics(
    embeddings: ArrayLike,
    flipped: ArrayLike | None,
    pairs: PairTable,
    *,
    far_targets: Iterable[float] = DEFAULT_FAR_TARGETS,
) -> tuple[dict[str, float], VerificationMetrics]:
    """Everything a report shows for one verification set, by name.

    * insightface's rule (:func:`bin_verification_metrics`, the default numbers):
      ``accuracy``, ``accuracy_std``, ``threshold`` (squared L2), ``xnorm``, ``val@far=1e-03``,
      ``val_std``, ``far``;
    * marginface's finer threshold search on the same pairs and folds
      (:func:`~marginface.evaluation.verification_metrics` on the cosines of the flip-summed
      embeddings): ``accuracy_midpoint``, ``accuracy_midpoint_std``;
    * the ROC of all pairs: ``auc``, ``eer``, ``tar@far=1e-01`` ... (the conservative
      FAR <= target rule; NaN where fewer than ``1/far`` impostor pairs exist).

    Args:
        embeddings: ``[N, D]`` embeddings of the images as they are.
        flipped: ``[N, D]`` of the flipped images, or None (no flip test).
        pairs: a :class:`~marginface.data.PairSet` over the rows (``index`` ``int[P, 2]``,
            ``same`` ``bool[P]``, ``fold`` ``int[P]``); a ``.bin``'s pairs are rows
            ``(2p, 2p + 1)`` in 10 consecutive folds.
        far_targets: FARs of the ROC's TAR@FAR. Default: 1e-1, 1e-2, 1e-3, 1e-4.

    Returns:
        ``(values, roc)``: the scalars above, and the midpoint search's
        :class:`~marginface.evaluation.VerificationMetrics` (its ``fpr``/``tpr`` for a figure).
    """
    e = as_embeddings("embeddings", embeddings)
    f = None if flipped is None else as_embeddings("flipped", flipped)
    order = np.asarray(pairs.index).reshape(-1)  # (2P,) rows a_0, b_0, a_1, b_1 ...
    official = bin_verification_metrics(
        e[order], pairs.same, flipped=None if f is None else f[order]
    )
    if f is not None:
        # every image once in XNorm, as insightface computes it (a row may sit in two pairs)
        norms = np.r_[np.linalg.norm(e, axis=1), np.linalg.norm(f, axis=1)]
        official = replace(official, xnorm=float(norms.mean()))
    summed = e if f is None else e + f
    folds = pairs.fold if np.unique(pairs.fold).shape[0] >= 2 else None
    roc = verification_metrics(
        pair_scores(summed, pairs.index), pairs.same, folds=folds, far_targets=far_targets
    )
    values: dict[str, float] = {k: float(v) for k, v in official.as_dict().items()}
    values["accuracy_midpoint"] = roc.accuracy
    values["accuracy_midpoint_std"] = roc.accuracy_std
    values["auc"] = roc.auc
    values["eer"] = roc.eer
    for far, tar in roc.tar_at_far.items():
        values[f"tar@far={far:.0e}"] = math.nan if tar is None else float(tar)
    return values, roc


GRID_FLAG = "_grid_too_coarse_folds"
"""The suffix of a set's coarse-grid flag among prefixed metrics (``lfw_grid_too_coarse_folds``)."""


def grid_notes(metrics: Mapping[str, float]) -> list[str]:
    """:func:`grid_note` for every set of ``metrics`` (keys ``<set>_accuracy``... as
    ``marginface evaluate`` writes them; the sets are the prefixes of
    ``<set>_grid_too_coarse_folds``), in the order of the keys; ``[]`` when no set needs one."""
    notes = []
    for key in metrics:
        if key.endswith(GRID_FLAG):
            name = key[: -len(GRID_FLAG)]
            values = {k[len(name) + 1 :]: v for k, v in metrics.items() if k.startswith(f"{name}_")}
            note = grid_note(name, values)
            if note is not None:
                notes.append(note)
    return notes
