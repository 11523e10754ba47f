"""Pair scores against scikit-learn; sampled pairs are balanced, distinct, correct and seeded."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics.pairwise import paired_cosine_distances

from marginface.data import PairSet
from marginface.evaluation import pair_scores, sample_pairs


def test_pair_scores_match_sklearn() -> None:
    rng = np.random.default_rng(0)
    embeddings = rng.normal(size=(30, 5))
    index = rng.integers(0, 30, size=(100, 2))
    expected = 1.0 - paired_cosine_distances(embeddings[index[:, 0]], embeddings[index[:, 1]])
    np.testing.assert_allclose(pair_scores(embeddings, index), expected, atol=1e-12)
    from_torch = pair_scores(torch.from_numpy(embeddings).float(), torch.from_numpy(index))
    np.testing.assert_allclose(from_torch, expected, atol=1e-6)


@pytest.mark.parametrize(
    ("index", "error", "match"),
    [
        (np.array([[0, 5]]), ValueError, r"index must lie in \[0, 2\]"),
        (np.array([[0, -1]]), ValueError, "got -1"),
        (np.array([0, 1]), ValueError, r"shape \(P, 2\)"),
        (np.array([[0.0, 1.0]]), TypeError, "integer dtype"),
    ],
)
def test_pair_scores_bad_index(index: np.ndarray, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        pair_scores(np.ones((3, 2)), index)


@pytest.mark.parametrize("num_pairs", [2, 101, 600])
def test_sampled_pairs_are_balanced_distinct_and_labelled(num_pairs: int) -> None:
    labels = np.random.default_rng(1).integers(0, 40, size=500)
    pairs = sample_pairs(torch.from_numpy(labels), num_pairs, seed=3)
    assert isinstance(pairs, PairSet) and len(pairs) == 2 * (num_pairs // 2)  # balanced
    assert pairs.same.sum() == num_pairs // 2
    a, b = pairs.index[:, 0], pairs.index[:, 1]
    np.testing.assert_array_equal(labels[a] == labels[b], pairs.same)
    assert (a != b).all()
    keys = {(min(x, y), max(x, y)) for x, y in pairs.index.tolist()}
    assert len(keys) == len(pairs)
    assert set(pairs.fold.tolist()) <= set(range(10))
    for kind in (True, False):
        counts = np.bincount(pairs.fold[pairs.same == kind], minlength=10)
        assert counts.max() - counts.min() <= 1


def test_sampling_is_seeded() -> None:
    labels = np.repeat(np.arange(20), 10)
    first, again = sample_pairs(labels, 200, seed=0), sample_pairs(labels, 200, seed=0)
    other = sample_pairs(labels, 200, seed=1)
    np.testing.assert_array_equal(first.index, again.index)
    np.testing.assert_array_equal(first.fold, again.fold)
    assert not np.array_equal(first.index, other.index)


def test_every_genuine_pair_when_asked_for_all() -> None:
    labels = np.array([0, 0, 0, 1, 1, 2])  # 3 + 1 genuine pairs
    pairs = sample_pairs(labels, 8)
    genuine = {tuple(sorted(p)) for p in pairs.index[pairs.same].tolist()}
    assert genuine == {(0, 1), (0, 2), (1, 2), (3, 4)}


@pytest.mark.parametrize(
    ("labels", "num_pairs", "error", "match"),
    [
        (np.arange(10), 4, ValueError, "one identity with two images"),
        (np.zeros(10, dtype=int), 4, ValueError, "at least two identities"),
        (np.array([0, 0, 1]), 1, ValueError, "num_pairs must be >= 2"),
        (np.array([0, 0, 1]), 2.0, TypeError, "num_pairs must be an integer"),
        (np.array([0.0, 1.0]), 2, TypeError, "labels must have an integer dtype"),
    ],
)
def test_sample_pairs_bad_input(labels, num_pairs, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        sample_pairs(labels, num_pairs)
