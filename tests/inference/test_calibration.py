"""Calibration you can trust: the threshold for a FAR, the FAR measured there with its exact
interval, the smallest FAR the pairs support (``min_errors / impostors``), a refusal or a
warning below it, and every cross-identity pair of a labelled set as the pairs."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from marginface.evaluation.binomial import clopper_pearson
from marginface.inference.calibration import (
    calibrate_threshold,
    labelled_pair_scores,
    pair_sample_note,
    threshold_at_far,
)


def _pairs(genuine: int, impostors: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Distinct scores: impostors spread over [-1, 0.6), genuine over [0.3, 1)."""
    rng = np.random.default_rng(seed)
    scores = np.r_[rng.uniform(0.3, 1.0, genuine), rng.uniform(-1.0, 0.6, impostors)]
    return scores, np.r_[np.ones(genuine, bool), np.zeros(impostors, bool)]


def test_counts_measured_far_and_interval_at_the_threshold():
    scores, same = _pairs(200, 5000)
    calibration = calibrate_threshold(scores, same, 0.01)
    threshold = threshold_at_far(scores, same, 0.01)
    assert calibration.threshold == threshold
    impostor, genuine = scores[~same], scores[same]
    k = int(np.sum(impostor >= threshold))  # accepted impostors, restated
    assert calibration.false_accepts == k == 50  # FAR <= 0.01 of 5000 distinct scores: 50
    assert calibration.impostors == 5000 and calibration.genuine == 200
    assert calibration.measured_far == k / 5000
    assert calibration.true_accepts == int(np.sum(genuine >= threshold))
    assert calibration.tar == calibration.true_accepts / 200
    assert calibration.far_interval == clopper_pearson(50, 5000, 0.95)
    assert calibration.supported_far == pytest.approx(10 / 5000)  # min_errors / impostors
    assert calibration.supported
    line = calibration.summary()
    assert len(line.splitlines()) == 1
    assert f"threshold {threshold:.4f} for FAR 0.01: 50 of 5,000 impostor pairs" in line
    assert "95% exact interval" in line and "support FAR >= 0.002" in line


def test_a_far_the_pairs_cannot_support_is_refused_naming_the_numbers():
    scores, same = _pairs(300, 300)  # one LFW fold: 300 impostor pairs
    with pytest.raises(ValueError) as error:
        calibrate_threshold(scores, same, 1e-3)
    message = str(error.value)
    assert len(message.splitlines()) == 1
    assert "far 0.001 needs at least 10,000 impostor pairs" in message
    assert "these pairs hold 300" in message and "support FAR >= 0.0333" in message
    # the boundary: 10 / 300 is supported; 0.033 needs ceil(10 / 0.033) = 304 impostors
    assert calibrate_threshold(scores, same, 10 / 300).supported
    with pytest.raises(ValueError, match="far 0.033 needs at least 304 impostor pairs"):
        calibrate_threshold(scores, same, 0.033)
    # 0.001 * 10,000 is 10 (in floats a hair above or below): supported
    scores, same = _pairs(10, 10_000)
    assert calibrate_threshold(scores, same, 1e-3).supported


def test_unsupported_warn_returns_the_calibration_with_its_numbers():
    scores, same = _pairs(300, 300)
    with pytest.warns(UserWarning, match="far 0.001 needs at least 10,000 impostor pairs"):
        calibration = calibrate_threshold(scores, same, 1e-3, unsupported="warn")
    assert not calibration.supported and calibration.false_accepts == 0
    assert calibration.threshold > scores[~same].max()  # every impostor rejected
    assert calibration.far_interval[1] == pytest.approx(1 - 0.025 ** (1 / 300))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a supported far warns nothing
        calibrate_threshold(scores, same, 0.1, unsupported="warn")


def test_min_errors_sets_the_support():
    scores, same = _pairs(50, 1000)
    with pytest.raises(ValueError, match="100 false accepts expected"):
        calibrate_threshold(scores, same, 0.05, min_errors=100)
    assert calibrate_threshold(scores, same, 0.05, min_errors=50).supported


@pytest.mark.parametrize(
    ("same", "counts"),
    [(np.ones(20, bool), "20 genuine and 0 impostor"), (np.zeros(20, bool), "0 genuine and 20")],
)
def test_pairs_of_one_kind_are_one_line(same, counts):
    with pytest.raises(ValueError, match=f"needs genuine and impostor pairs, got {counts}"):
        calibrate_threshold(np.linspace(-1, 1, 20), same, 0.5)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"far": 0.0}, r"far must be in \(0, 1\], got 0.0"),
        ({"far": 0.5, "unsupported": "ignore"}, r"unsupported must be one of raise, warn"),
        ({"far": 0.5, "min_errors": 0}, r"min_errors must be an int >= 1, got 0"),
        ({"far": 0.5, "confidence": 1.5}, r"confidence must be in \(0, 1\), got 1.5"),
    ],
)
def test_bad_options_are_named(options, message):
    scores, same = _pairs(50, 1000)
    with pytest.raises(ValueError, match=message):
        calibrate_threshold(scores, same, **options)


def test_labelled_pair_scores_takes_every_pair_then_a_seeded_distinct_sample():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 6))
    labels = np.arange(40) % 8  # 8 identities of 5 images
    scores, same = labelled_pair_scores(x, labels)
    assert scores.shape == (40 * 39 // 2,)
    assert int(same.sum()) == 8 * (5 * 4 // 2)  # the genuine pairs: C(5, 2) per identity
    unit = x / np.linalg.norm(x, axis=1, keepdims=True)
    i, j = np.triu_indices(40, k=1)
    np.testing.assert_allclose(scores, np.sum(unit[i] * unit[j], axis=1), atol=1e-12)
    assert pair_sample_note(40) == "all 780 pairs of 40 images"
    # a sample: distinct pairs of the same set, the same with the same seed
    sampled, sampled_same = labelled_pair_scores(x, labels, max_pairs=300, seed=3, chunk=7)
    assert sampled.shape == (300,) and np.unique(sampled).shape == (300,)
    lookup = {round(float(s), 12): bool(g) for s, g in zip(scores, same, strict=True)}
    assert all(lookup[round(float(s), 12)] == g for s, g in zip(sampled, sampled_same, strict=True))
    again, _ = labelled_pair_scores(x, labels, max_pairs=300, seed=3)
    np.testing.assert_array_equal(sampled, again)
    assert not np.array_equal(sampled, labelled_pair_scores(x, labels, max_pairs=300, seed=4)[0])
    note = pair_sample_note(40, max_pairs=300, seed=3)
    assert note == "300 distinct pairs of 40 images drawn with seed 3"
