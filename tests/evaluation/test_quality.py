"""The error-versus-reject curve (MagFace's feature magnitude as quality) against a computation
written out here with loops, and its argument errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

from marginface.evaluation import error_versus_reject, pair_quality
from marginface.evaluation.quality import DEFAULT_REJECT_FRACTIONS


def _problem(seed: int = 0, pairs: int = 200):
    rng = np.random.default_rng(seed)
    same = rng.random(pairs) < 0.5
    quality = rng.gamma(4.0, 5.0, pairs)
    # low-quality pairs are noisier: the curve should fall
    noise = rng.normal(0.0, 1.0, pairs) * (8.0 / quality)
    scores = np.clip(np.where(same, 0.5, 0.1) + 0.2 * noise, -1, 1)
    quality[::7] = quality[3]  # ties in quality
    return scores, same, quality


def _best_threshold_by_brute_force(scores, same):
    """The lowest threshold of highest accuracy among 'accept scores >= t' for every distinct
    score t (and t = +inf: accept nothing)."""
    best, best_accuracy = None, -1.0
    for t in [*sorted(set(scores.tolist())), math.inf]:
        accuracy = sum((s >= t) == y for s, y in zip(scores, same, strict=True)) / len(scores)
        if accuracy > best_accuracy:
            best, best_accuracy = t, accuracy
    return best


def _curve_by_hand(scores, same, quality, fractions, threshold):
    order = sorted(range(len(scores)), key=lambda i: (quality[i], i))  # lowest quality first
    values = []
    for r in fractions:
        kept = order[math.floor(r * len(scores) + 1e-9) :]
        correct = sum((scores[i] >= threshold) == same[i] for i in kept)
        values.append(correct / len(kept))
    return values


def test_curve_equals_the_computation_by_hand_at_a_given_threshold():
    scores, same, quality = _problem()
    curve = error_versus_reject(scores, same, quality, threshold=0.3)
    expected = _curve_by_hand(scores, same, quality, DEFAULT_REJECT_FRACTIONS, 0.3)
    np.testing.assert_allclose(curve.accuracy, expected, rtol=0, atol=1e-12)
    assert curve.kept.tolist() == [200 - math.floor(r * 200 + 1e-9) for r in curve.fractions]
    np.testing.assert_allclose(curve.error, 1 - np.asarray(expected))


def test_default_threshold_is_the_most_accurate_on_all_pairs():
    scores, same, quality = _problem(1)
    curve = error_versus_reject(scores, same, quality)
    threshold = _best_threshold_by_brute_force(scores, same)
    expected = _curve_by_hand(scores, same, quality, DEFAULT_REJECT_FRACTIONS, threshold)
    np.testing.assert_allclose(curve.accuracy, expected, rtol=0, atol=1e-12)
    # same decisions as the brute-force threshold on every pair
    assert np.array_equal(scores >= curve.threshold, scores >= threshold)
    assert curve.accuracy[-1] > curve.accuracy[0]  # rejecting noisy pairs helps here
    assert list(curve.as_dict())[:2] == ["erc_accuracy@reject=0.00", "erc_accuracy@reject=0.05"]


def test_pair_quality_is_the_smaller_magnitude():
    magnitudes = np.array([3.0, 10.0, 7.5, 0.5])
    index = np.array([[0, 1], [1, 2], [3, 2], [1, 1]])
    expected = [min(magnitudes[a], magnitudes[b]) for a, b in index]
    assert pair_quality(magnitudes, index).tolist() == expected


@pytest.mark.parametrize(
    ("kwargs", "error", "text"),
    [
        ({"fractions": [0.0, 1.0]}, ValueError, r"fractions must be increasing values in \[0, 1\)"),
        ({"fractions": [0.2, 0.1]}, ValueError, r"fractions must be increasing"),
        ({"fractions": []}, ValueError, r"fractions must be increasing"),
        ({"quality": np.ones(3)}, ValueError, r"quality must have length 10, got 3"),
        ({"same": np.ones(10, dtype=bool)}, ValueError, r"both genuine \(True\) and impostor"),
        ({"scores": np.full(10, np.nan)}, ValueError, r"scores contains non-finite"),
    ],
)
def test_bad_arguments_raise_naming_them(kwargs, error, text):
    arguments = {
        "scores": np.linspace(0, 1, 10),
        "same": np.arange(10) % 2 == 0,
        "quality": np.arange(10.0),
    }
    arguments.update(kwargs)
    with pytest.raises(error, match=text):
        error_versus_reject(**arguments)


def test_pair_quality_errors():
    with pytest.raises(ValueError, match=r"index must lie in \[0, 1\]"):
        pair_quality(np.ones(2), np.array([[0, 2]]))
    with pytest.raises(TypeError, match="index must have an integer dtype"):
        pair_quality(np.ones(2), np.array([[0.0, 1.0]]))


def test_pair_quality_index_shape_error():
    with pytest.raises(ValueError, match=r"index must have shape \(P, 2\), got \(3,\)"):
        pair_quality(np.ones(4), np.array([0, 1, 2]))
