"""Verification metrics against scikit-learn and brute force on random inputs."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from scipy.interpolate import interp1d
from scipy.optimize import brentq
from sklearn import metrics

from marginface.evaluation import (
    best_threshold,
    equal_error_rate,
    roc_auc,
    roc_curve,
    tar_at_far,
    verification_metrics,
)

SEEDS = range(6)


def random_pairs(seed: int, n: int = 400, ties: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Scores of ``n`` pairs, genuine ones shifted up; with ``ties``, rounded to few values."""
    rng = np.random.default_rng(seed)
    same = rng.random(n) < rng.uniform(0.2, 0.8)
    scores = rng.normal(size=n) + rng.uniform(0.0, 2.0) * same
    if ties:
        scores = np.round(scores, 1)
    return scores, same


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("seed", SEEDS)
def test_roc_curve_and_auc_match_sklearn(seed: int, ties: bool) -> None:
    scores, same = random_pairs(seed, ties=ties)
    fpr, tpr, thresholds = roc_curve(scores, same)
    ref_fpr, ref_tpr, ref_thr = metrics.roc_curve(same, scores, drop_intermediate=False)
    np.testing.assert_allclose(fpr, ref_fpr)
    np.testing.assert_allclose(tpr, ref_tpr)
    np.testing.assert_allclose(thresholds[1:], ref_thr[1:])
    assert thresholds[0] == np.inf
    assert roc_auc(fpr, tpr) == pytest.approx(metrics.auc(ref_fpr, ref_tpr), abs=1e-12)
    assert roc_auc(fpr, tpr) == pytest.approx(metrics.roc_auc_score(same, scores), abs=1e-12)


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("seed", SEEDS)
def test_eer_matches_brentq_on_sklearn_roc(seed: int, ties: bool) -> None:
    scores, same = random_pairs(seed, ties=ties)
    fpr, tpr = metrics.roc_curve(same, scores)[:2]
    reference = brentq(lambda x: 1.0 - x - interp1d(fpr, tpr)(x), 0.0, 1.0)
    ours = equal_error_rate(*roc_curve(scores, same)[:2])
    assert ours == pytest.approx(reference, abs=1e-9)


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("seed", SEEDS)
def test_tar_at_far_is_best_real_threshold(seed: int, ties: bool) -> None:
    scores, same = random_pairs(seed, n=3000, ties=ties)
    fpr, tpr, _ = roc_curve(scores, same)
    num_impostors = int((~same).sum())
    ref_fpr, ref_tpr, _ = metrics.roc_curve(same, scores)
    for far in (0.3, 0.1, 0.01, 1e-3):
        # brute force: every threshold, measured directly
        best = 0.0
        for threshold in np.r_[np.unique(scores), np.inf]:
            accepted = scores >= threshold
            if accepted[~same].mean() <= far:
                best = max(best, accepted[same].mean())
        ours = tar_at_far(fpr, tpr, far, num_impostors)
        if num_impostors < 1 / far:
            assert ours is None
            continue
        assert ours == pytest.approx(best, abs=1e-12)
        assert ours == pytest.approx(ref_tpr[ref_fpr <= far].max(), abs=1e-12)


def test_tar_at_far_is_none_without_enough_impostors() -> None:
    scores, same = random_pairs(0, n=400)
    result = verification_metrics(scores, same, far_targets=(0.1, 1e-2, 1e-3))
    num_impostor = int((~same).sum())
    assert 100 <= num_impostor < 1000
    assert result.tar_at_far[0.1] is not None
    assert result.tar_at_far[1e-2] is not None
    assert result.tar_at_far[1e-3] is None
    assert result.as_dict()["tar@far=1e-03"] is None


def brute_force_kfold(scores: np.ndarray, same: np.ndarray, folds: np.ndarray) -> list[float]:
    """Fold accuracies: the best of every midpoint threshold on the other folds, in loops."""
    accuracies = []
    for fold in sorted(set(folds.tolist())):
        train = folds != fold
        values = sorted(set(scores[train].tolist()))
        candidates = [np.nextafter(values[0], -np.inf)]
        candidates += [(a + b) / 2 for a, b in itertools.pairwise(values)]
        candidates += [np.nextafter(values[-1], np.inf)]
        best_acc, best_t = -1.0, None
        for t in candidates:  # ascending: the first maximum is the lowest threshold
            acc = np.mean((scores[train] >= t) == same[train])
            if acc > best_acc:
                best_acc, best_t = acc, t
        test = ~train
        accuracies.append(float(np.mean((scores[test] >= best_t) == same[test])))
    return accuracies


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("seed", SEEDS)
def test_kfold_accuracy_matches_brute_force(seed: int, ties: bool) -> None:
    scores, same = random_pairs(seed, n=300, ties=ties)
    folds = np.random.default_rng(seed + 100).integers(0, 10, size=scores.shape[0])
    result = verification_metrics(scores, same, folds)
    expected = brute_force_kfold(scores, same, folds)
    np.testing.assert_allclose(result.fold_accuracies, expected)
    assert result.accuracy == pytest.approx(np.mean(expected))
    assert result.accuracy_std == pytest.approx(np.std(expected))


@pytest.mark.parametrize("seed", SEEDS)
def test_best_threshold_accuracy_matches_sklearn(seed: int) -> None:
    scores, same = random_pairs(seed)
    threshold, accuracy = best_threshold(scores, same)
    fpr, tpr, _ = metrics.roc_curve(same, scores, drop_intermediate=False)
    positives, negatives = same.sum(), (~same).sum()
    reference = np.max((tpr * positives + (1 - fpr) * negatives) / same.shape[0])
    assert accuracy == pytest.approx(reference)
    assert metrics.accuracy_score(same, scores >= threshold) == pytest.approx(reference)


def test_default_folds_are_ten_stratified_blocks() -> None:
    scores, same = random_pairs(3, n=600)
    result = verification_metrics(scores, same)
    assert result.fold_accuracies.shape == (10,)
    folds = np.empty(600, dtype=np.int64)
    for kind in (True, False):  # the k-th of n pairs of a kind goes to fold floor(10 k / n)
        where = np.flatnonzero(same == kind)
        folds[where] = [10 * k // len(where) for k in range(len(where))]
    explicit = verification_metrics(scores, same, folds)
    np.testing.assert_array_equal(result.fold_accuracies, explicit.fold_accuracies)
    assert result.threshold == explicit.threshold


def test_separable_pairs_are_perfect() -> None:
    same = np.array([True] * 100 + [False] * 100)
    scores = np.where(same, 0.9, 0.1) + np.linspace(0, 0.05, 200)
    result = verification_metrics(scores, same, far_targets=(0.1, 0.01))
    assert result.accuracy == 1.0 and result.accuracy_std == 0.0
    assert result.auc == 1.0 and result.eer == 0.0
    assert result.tar_at_far == {0.1: 1.0, 0.01: 1.0}
    assert 0.15 < result.threshold < 0.9
    reversed_result = verification_metrics(-scores, same)
    assert reversed_result.auc == 0.0 and reversed_result.eer == 1.0


def test_accepts_tensors_and_matches_numpy() -> None:
    scores, same = random_pairs(1)
    folds = np.arange(scores.shape[0]) % 10
    from_numpy = verification_metrics(scores, same, folds).as_dict()
    from_torch = verification_metrics(
        torch.from_numpy(scores), torch.from_numpy(same), torch.from_numpy(folds)
    ).as_dict()
    for key, value in from_numpy.items():
        assert from_torch[key] == pytest.approx(value, abs=1e-6), key
    assert set(from_numpy) >= {"accuracy", "accuracy_std", "threshold", "auc", "eer"}
    half = verification_metrics(torch.from_numpy(scores).half(), torch.from_numpy(same))
    assert 0.0 <= half.auc <= 1.0


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"scores": np.zeros(4), "same": np.array([1, 0, 1])}, ValueError, "same must have"),
        ({"scores": np.array([0.1, np.nan]), "same": [True, False]}, ValueError, "non-finite"),
        ({"scores": np.zeros(4), "same": np.ones(4, bool)}, ValueError, "both genuine"),
        ({"scores": np.zeros((2, 2)), "same": [True, False]}, ValueError, "scores must have"),
        ({"scores": [0.1, 0.2], "same": [2, 0]}, ValueError, "only 0 and 1"),
        ({"scores": [0.1, 0.2], "same": [0.5, 1.0]}, TypeError, "same must be boolean"),
        ({"scores": "abc", "same": [True, False]}, TypeError, "scores must be"),
        (
            {"scores": [0.1, 0.2], "same": [True, False], "folds": [0, 0]},
            ValueError,
            "at least 2 distinct folds",
        ),
        (
            {"scores": [0.1, 0.2], "same": [True, False], "folds": [0.0, 1.0]},
            TypeError,
            "folds must have an integer dtype",
        ),
        (
            {"scores": [0.1, 0.2], "same": [True, False], "folds": [0, 1], "far_targets": [0.0]},
            ValueError,
            "far_targets must be > 0",
        ),
        (
            {"scores": [0.1, 0.2], "same": [True, False], "folds": [0, 1], "far_targets": [2]},
            ValueError,
            "far_targets must be <= 1",
        ),
    ],
)
def test_bad_input_names_the_argument(kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        verification_metrics(**kwargs)


def test_tar_at_far_includes_a_point_exactly_at_the_far() -> None:
    """A threshold whose measured FAR equals the target counts (``FPR <= far``): 1 false accept
    in 1000 impostors is a FAR of exactly 1e-3."""
    impostor = np.r_[np.linspace(0.0, 0.9, 999), 3.0]
    genuine = np.r_[np.full(3, 4.0), np.full(7, 3.0)]  # 7 tie with the top impostor
    scores = np.r_[impostor, genuine]
    same = np.r_[np.zeros(1000, bool), np.ones(10, bool)]
    fpr, tpr, _ = roc_curve(scores, same)
    assert fpr[np.searchsorted(fpr, 1e-3)] == 1e-3  # the ROC has that point exactly
    assert tar_at_far(fpr, tpr, 1e-3, 1000) == 1.0  # threshold 3.0: FAR 1/1000, TAR 10/10


@pytest.mark.parametrize(
    ("same", "threshold", "accuracy"),
    [
        ([True, True, True, True, False], np.nextafter(1.0, -np.inf), 0.8),  # accept all
        ([False, True, True, True, False], 1.5, 0.8),  # reject the lowest only
        ([False, False, False, False, True], 4.5, 1.0),
        ([False, False, False, True, False], 3.5, 0.8),
    ],
)
def test_best_threshold_at_the_ends(same, threshold, accuracy) -> None:
    scores = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    found, measured = best_threshold(scores, np.array(same))
    assert found == threshold and measured == pytest.approx(accuracy)
    assert ((scores >= found) == np.array(same)).mean() == pytest.approx(accuracy)


def test_as_dict_reports_the_pair_counts() -> None:
    scores, same = random_pairs(1, n=200)
    result = verification_metrics(scores, same).as_dict()
    assert result["num_genuine"] == int(same.sum())
    assert result["num_impostor"] == int((~same).sum())
    assert {"accuracy", "accuracy_std", "threshold", "auc", "eer", "tar@far=1e-01"} <= set(result)
