"""grouped_nms (marginface.detect.boxes): per-group torchvision-order NMS in one pass."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from marginface.detect.boxes import grouped_nms, nms


def _boxes(rng, count):
    corner = rng.integers(0, 60, (count, 2)).astype(np.float32)
    size = rng.integers(3, 30, (count, 2)).astype(np.float32)
    boxes = np.concatenate([corner, corner + size], axis=1)
    scores = rng.choice(np.float32([0.6, 0.7, 0.8, 0.9, 0.95]), count)  # many ties
    return torch.from_numpy(boxes), torch.from_numpy(scores)


def _per_group(boxes, scores, groups, threshold):
    kept = [
        members[nms(boxes[members], scores[members], threshold, order="torchvision")]
        for members in (torch.nonzero(groups == g).flatten() for g in groups.unique())
    ]
    return torch.cat(kept).tolist() if kept else []


@pytest.mark.parametrize(("count", "group_count"), [(0, 1), (1, 1), (60, 1), (300, 16), (900, 3)])
def test_grouped_nms_equals_nms_group_by_group(count, group_count):
    rng = np.random.default_rng(count + group_count)
    boxes, scores = _boxes(rng, count)
    groups = torch.from_numpy(rng.integers(0, group_count, count) * 7 - 5)  # any integers
    for threshold in (0.5, 0.7, 0.3):
        got = grouped_nms(boxes, scores, groups, threshold)
        assert got.dtype == torch.int64
        assert got.tolist() == _per_group(boxes, scores, groups, threshold)


def test_grouped_nms_never_suppresses_across_groups():
    boxes = torch.tensor([[0.0, 0, 10, 10], [0, 0, 10, 10], [0, 0, 10, 10]])
    scores = torch.tensor([0.9, 0.8, 0.7])
    assert grouped_nms(boxes, scores, torch.tensor([1, 0, 1]), 0.5).tolist() == [1, 0]


def test_grouped_nms_falls_back_for_a_group_over_1000_boxes():
    rng = np.random.default_rng(5)
    boxes, scores = _boxes(rng, 1300)
    groups = torch.from_numpy((np.arange(1300) >= 1200).astype(np.int64))
    got = grouped_nms(boxes, scores, groups, 0.5)
    assert got.tolist() == _per_group(boxes, scores, groups, 0.5)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((torch.zeros(2, 3), torch.zeros(2), torch.zeros(2, dtype=torch.int64), 0.5), "boxes"),
        ((torch.zeros(2, 4), torch.zeros(3), torch.zeros(2, dtype=torch.int64), 0.5), "scores"),
        ((torch.zeros(2, 4), torch.zeros(2), torch.zeros(3, dtype=torch.int64), 0.5), "groups"),
        ((torch.zeros(2, 4), torch.zeros(2), torch.zeros(2, dtype=torch.int64), 1.5), "threshold"),
    ],
)
def test_grouped_nms_bad_arguments(args, match):
    with pytest.raises(ValueError, match=match):
        grouped_nms(*args)
