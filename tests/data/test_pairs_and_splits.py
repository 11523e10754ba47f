"""Pair sampling and identity splits on synthetic labels."""

from __future__ import annotations

import numpy as np
import pytest

from marginface.data.pairs import sample_pairs
from marginface.data.splits import build_bundle, closed_set_split, open_set_split


def test_pairs_balanced_valid_and_seeded():
    labels = np.repeat(np.arange(30), 5)
    pairs = sample_pairs(labels, 600, seed=4)
    assert len(pairs) == 600 and pairs.same.sum() == 300
    same_by_label = labels[pairs.index[:, 0]] == labels[pairs.index[:, 1]]
    np.testing.assert_array_equal(same_by_label, pairs.same)
    assert (pairs.index[:, 0] != pairs.index[:, 1]).all()
    assert len({tuple(sorted(r)) for r in pairs.index.tolist()}) == 600  # distinct
    assert np.bincount(pairs.fold).tolist() == [60] * 10
    assert [pairs.same[pairs.fold == k].sum() for k in range(10)] == [30] * 10
    again = sample_pairs(labels, 600, seed=4)
    np.testing.assert_array_equal(pairs.index, again.index)
    assert not np.array_equal(pairs.index, sample_pairs(labels, 600, seed=5).index)


def test_pairs_capped_when_identities_are_small():
    labels = np.array([0, 0, 1, 1, 2])  # only 2 distinct genuine pairs exist
    pairs = sample_pairs(labels, 100, seed=0)
    assert pairs.same.sum() == 2 and (~pairs.same).sum() == 2


@pytest.mark.parametrize(
    ("labels", "num_pairs", "error", "match"),
    [
        (np.zeros(5, int), 10, ValueError, "two identities"),
        (np.arange(5), 10, ValueError, "two images"),
        (np.array([0, 0, 1]), 1, ValueError, "num_pairs"),
        (np.array([0, 0, 1]), 2.0, TypeError, "num_pairs"),
    ],
)
def test_pairs_bad_input(labels, num_pairs, error, match):
    with pytest.raises(error, match=match):
        sample_pairs(labels, num_pairs)


def test_closed_split_per_identity():
    labels = np.array([0] * 10 + [1] * 3 + [2])
    train, test = closed_set_split(labels, 0.3, seed=0)
    assert np.bincount(labels[test], minlength=3).tolist() == [3, 1, 0]
    assert sorted(np.concatenate([train, test]).tolist()) == list(range(14))


def test_open_split_is_identity_disjoint():
    labels = np.repeat(np.arange(10), 4)
    train, test = open_set_split(labels, 0.3, seed=1)
    assert len(set(labels[test])) == 3
    assert not set(labels[train]) & set(labels[test])
    with pytest.raises(ValueError, match="two identities"):
        open_set_split(np.zeros(4, int), 0.5, seed=0)


def test_build_bundle_open_relabels_and_limits():
    images = np.zeros((40, 1, 2, 2), np.float32)
    labels = np.repeat(np.arange(10), 4)
    names = [f"id{k}" for k in range(10)]
    bundle = build_bundle("x", images, labels, names, split="open", limit=5, num_pairs=20)
    assert bundle.open_set and len(bundle.train) == 5
    assert bundle.train.labels.max() + 1 == bundle.train.num_classes
    assert bundle.test.labels.max() + 1 == bundle.test.num_classes == 3
    assert len(bundle.pairs) == 20


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"split": "half"}, ValueError),
        ({"test_fraction": 1.0}, ValueError),
        ({"test_fraction": "0.3"}, TypeError),
        ({"limit": -1}, ValueError),
    ],
)
def test_build_bundle_bad_options(options, error):
    images = np.zeros((4, 1, 2, 2), np.float32)
    with pytest.raises(error, match=next(iter(options))):
        build_bundle("x", images, np.array([0, 0, 1, 1]), ["a", "b"], **options)
