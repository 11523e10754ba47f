"""Sub-center ArcFace's clean-up: dominance by counting, outlier angles computed by hand, and
the step to one center per class (library API, subcenters.py; a head's clean-up methods are
tested in head/test_subcenter_cleanup.py, the CLI in test_cli_subcenters.py)."""

from __future__ import annotations

import math

import pytest
import torch

from marginface.subcenters import (
    dominant_sub_centers,
    find_outliers,
    keep_dominant_centers,
    sub_center_counts,
)

C, K, D = 4, 3, 5


def _problem(seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(C * K, D, generator=generator, dtype=torch.float64)
    labels = torch.randint(0, C, (40,), generator=generator)
    embeddings = torch.randn(40, D, generator=generator, dtype=torch.float64) * 3
    return embeddings, labels, weight


def _cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def _counts_by_hand(embeddings, labels, weight):
    counts = [[0] * K for _ in range(C)]
    for x, y in zip(embeddings.tolist(), labels.tolist(), strict=True):
        own = [_cosine(x, weight[y * K + k].tolist()) for k in range(K)]
        counts[y][own.index(max(own))] += 1
    return counts


def test_counts_and_dominance_by_counting():
    embeddings, labels, weight = _problem()
    counts = _counts_by_hand(embeddings, labels, weight)
    assert sub_center_counts(embeddings, labels, weight, K).tolist() == counts
    expected = [row.index(max(row)) for row in counts]  # first maximum on ties
    assert dominant_sub_centers(embeddings, labels, weight, K).tolist() == expected
    assert len(set(expected)) > 1  # the problem is not trivially "sub-center 0 everywhere"


def test_ties_go_to_the_lowest_index_and_empty_classes_to_zero():
    weight = torch.eye(K * 2, D + 1, dtype=torch.float64)[:, :D]  # 2 classes of K unit centers
    weight[K * 2 - 1] = torch.tensor([0.0, 0.0, 0.0, 0.0, 1.0], dtype=torch.float64)
    # class 0: one sample at sub-center 2, one at sub-center 1: a tie between 1 and 2
    embeddings = torch.stack([weight[2], weight[1]]).clone()
    labels = torch.tensor([0, 0])
    dominant = dominant_sub_centers(embeddings, labels, weight, K)
    assert dominant.tolist() == [1, 0]  # class 1 has no sample: sub-center 0


def test_outlier_angles_computed_by_hand():
    # class 0's sub-centers: e1, e2, e3 (dominant e1: three samples nearest to it)
    weight = torch.zeros(C * K, D, dtype=torch.float64)
    for c in range(C):
        for k in range(K):
            weight[c * K + k, (c + k) % D] = 1.0
    degrees = [0.0, 60.0, 74.9, 75.1, 89.0]
    rows = []
    for angle in degrees:  # in the plane (e1, e4): angle to e1 as given, nearest to e1
        radians = math.radians(angle)
        rows.append([math.cos(radians), 0.0, 0.0, math.sin(radians), 0.0])
    rows.append([0.0, 1.0, 0.0, 0.0, 0.0])  # at class 0's sub-center 1: 90° from e1
    embeddings = torch.tensor(rows, dtype=torch.float64) * 7.0
    labels = torch.zeros(len(rows), dtype=torch.int64)
    found = find_outliers(embeddings, labels, weight, K)
    assert found.dominant[0] == 0 and found.counts[0].tolist() == [5, 1, 0]
    by_hand = [math.degrees(math.acos(_cosine(row, weight[0].tolist()))) for row in rows]
    torch.testing.assert_close(found.angles, torch.tensor(by_hand, dtype=torch.float64))
    assert found.indices.tolist() == [3, 4, 5]  # 75.1°, 89°, 90° > 75° (the paper's default)
    assert found.threshold_degrees == 75.0
    assert find_outliers(embeddings, labels, weight, K, threshold_degrees=80).indices.tolist() == [
        4,
        5,
    ]


def test_keep_dominant_centers_picks_one_row_per_class():
    _, _, weight = _problem(1)
    dominant = torch.tensor([2, 0, 1, 2])
    kept = keep_dominant_centers(weight, dominant, K)
    assert torch.equal(kept, torch.stack([weight[c * K + int(k)] for c, k in enumerate(dominant)]))


@pytest.mark.parametrize(
    ("call", "error", "text"),
    [
        (
            lambda w, x, y: keep_dominant_centers(w, torch.tensor([0, 1, 3, 0]), K),
            ValueError,
            r"dominant must lie in \[0, 2\] for sub_centers = 3, got values in \[0, 3\]",
        ),
        (
            lambda w, x, y: keep_dominant_centers(w, torch.tensor([0, 1]), K),
            ValueError,
            r"dominant must have shape \(4,\)",
        ),
        (
            lambda w, x, y: keep_dominant_centers(w, torch.tensor([0.0, 1, 2, 0]), K),
            TypeError,
            r"dominant must be an integer Tensor",
        ),
        (
            lambda w, x, y: find_outliers(x, y, w, K, threshold_degrees=-1),
            ValueError,
            r"threshold_degrees must be >= 0, got -1",
        ),
        (
            lambda w, x, y: find_outliers(x, y, w, K, threshold_degrees=200),
            ValueError,
            r"threshold_degrees must be <= 180, got 200",
        ),
        (
            lambda w, x, y: find_outliers(x, y, w, K, threshold_degrees="75"),
            TypeError,
            r"threshold_degrees must be a real number",
        ),
        (
            lambda w, x, y: sub_center_counts(x, y, w, 5),
            ValueError,
            r"weight must have C·K rows with K = sub_centers = 5",
        ),
        (
            lambda w, x, y: sub_center_counts(x, y + C, w, K),
            ValueError,
            r"labels must lie in \[0, 3\]",
        ),
    ],
)
def test_bad_arguments_raise_naming_them(call, error, text):
    embeddings, labels, weight = _problem()
    with pytest.raises(error, match=text):
        call(weight, embeddings, labels)


def test_more_bad_arguments():
    embeddings, labels, weight = _problem()
    with pytest.raises(TypeError, match=r"weight must be a floating Tensor of shape \(C·K, D\)"):
        sub_center_counts(embeddings, labels, weight.long(), K)
    with pytest.raises(ValueError, match=r"weight must have shape \(C·K, D\) with K = 3"):
        keep_dominant_centers(weight[:-1], torch.zeros(C, dtype=torch.long), K)


def test_a_training_set_neither_in_memory_nor_streamed_is_a_clear_error():
    """Streamed sets are embedded (tests/train/test_cleaning_streamed.py); any other kind of
    training set is refused by name."""
    from types import SimpleNamespace

    import numpy as np

    from marginface.data.base import DatasetBundle, ImageSet
    from marginface.train.cleaning import training_embeddings

    class Listed(list):
        labels = np.zeros(2, dtype=np.int64)

    test = ImageSet(np.zeros((1, 1, 2, 2), dtype=np.float32), np.zeros(1, dtype=np.int64))
    bundle = DatasetBundle("odd", Listed([1, 2]), test)

    run = SimpleNamespace(config=SimpleNamespace(eval_batch_size=8, workers=0))
    with pytest.raises(TypeError, match="'odd' is a Listed; sub-center clean-up embeds an"):
        training_embeddings(run, bundle)


def test_results_do_not_depend_on_the_block_size(monkeypatch):
    """The float64 work runs over blocks of ROWS_PER_BLOCK samples; blocks of 7 rows (the last
    one partial) give exactly what one block gives."""
    import marginface.subcenters as subcenters

    embeddings, labels, weight = _problem(seed=4)
    whole = find_outliers(embeddings.float(), labels, weight, K, threshold_degrees=60)
    monkeypatch.setattr(subcenters, "ROWS_PER_BLOCK", 7)
    blocked = find_outliers(embeddings.float(), labels, weight, K, threshold_degrees=60)
    assert torch.equal(blocked.counts, whole.counts) and torch.equal(blocked.indices, whole.indices)
    torch.testing.assert_close(blocked.angles, whole.angles, rtol=0, atol=1e-12)
    assert 0 < whole.indices.numel() < labels.numel()
