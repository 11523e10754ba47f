"""NMS and square boxes (marginface.detect.boxes) on boxes worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from marginface.detect import Faces, nms, square_boxes


def _t(rows):
    return torch.tensor(rows, dtype=torch.float32)


def test_nms_union_by_hand():
    # a: 10x10 at 0; b: shifted by 5 in x (IoU 50/150 = 1/3); c: far away
    boxes = _t([[0, 0, 10, 10], [5, 0, 15, 10], [100, 100, 110, 110]])
    scores = _t([0.9, 0.8, 0.7])
    assert nms(boxes, scores, 0.3).tolist() == [0, 2]
    # the float32 IoU 0.33333334 is above the float64 1/3, as torchvision compares them
    assert nms(boxes, scores, 1 / 3).tolist() == [0, 2]
    half = _t([[0, 0, 10, 10], [0, 0, 10, 5]])  # IoU 50/100 exactly
    assert nms(half, scores[:2], 0.5).tolist() == [0, 1]  # only strictly above is dropped
    assert nms(half, scores[:2], 0.49).tolist() == [0]
    assert nms(boxes, _t([0.1, 0.8, 0.7]), 0.3).tolist() == [1, 2]


def test_nms_min_and_inclusive_by_hand():
    # small inside big: IoU 16/100 but intersection over the smaller area 1
    boxes = _t([[0, 0, 10, 10], [2, 2, 6, 6]])
    scores = _t([0.9, 0.8])
    assert nms(boxes, scores, 0.7).tolist() == [0, 1]
    assert nms(boxes, scores, 0.7, overlap="min").tolist() == [0]
    # touching boxes: no overlap in pixels-between-corners, one column with inclusive sizes
    touching = _t([[0, 0, 9, 9], [9, 0, 18, 9]])
    assert nms(touching, scores, 0.0).tolist() == [0, 1]
    assert nms(touching, scores, 0.0, inclusive=True).tolist() == [0]


def test_nms_ties_keep_order_and_empty():
    boxes = _t([[0, 0, 10, 10], [0, 0, 10, 10], [0, 0, 10, 10]])
    assert nms(boxes, _t([0.5, 0.5, 0.5]), 0.5).tolist() == [0]
    assert nms(boxes[[2, 1, 0]], _t([0.5, 0.5, 0.5]), 0.5).tolist() == [0]
    assert nms(torch.zeros(0, 4), torch.zeros(0), 0.5).tolist() == []


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        ((torch.zeros(2, 4), torch.zeros(2), 1.5), {}, ValueError, "threshold must be <= 1"),
        ((torch.zeros(2, 4), torch.zeros(2), 0.5), {"overlap": "max"}, ValueError, "overlap"),
        ((torch.zeros(2, 3), torch.zeros(2), 0.5), {}, ValueError, r"boxes must be \[K, 4\]"),
        ((torch.zeros(2, 4), torch.zeros(3), 0.5), {}, ValueError, r"scores \[K\]"),
    ],
)
def test_nms_bad_arguments(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        nms(*args, **kwargs)


def test_square_boxes_by_hand():
    boxes = _t([[10, 20, 30, 60, 0.9], [0, 0, 8, 2, 0.5]])
    out = square_boxes(boxes)
    # 20 x 40 -> 40 x 40 about the centre (20, 40); 8 x 2 -> 8 x 8 about (4, 1)
    expected = [0, 20, 40, 60, 0.9, 0, -3, 8, 5, 0.5]
    assert out.flatten().tolist() == pytest.approx(expected)
    assert boxes[0, 0] == 10  # the input is not changed


def test_faces_empty_and_unpacking():
    boxes, scores, landmarks = Faces.empty()
    assert boxes.shape == (0, 4) and scores.shape == (0,) and landmarks.shape == (0, 5, 2)
    faces = Faces(np.ones((2, 4), np.float32), np.ones(2, np.float32), np.ones((2, 5, 2)))
    assert faces.count == 2


def test_the_detector_never_imports_the_training_pipeline():
    # docs/architecture.md: detect/ sits beside data/ and is called by it, never the reverse
    from ..test_layers import PACKAGE, _imports

    banned = ("train", "cli", "data", "plots", "report", "convert", "export", "config", "models")
    for path in (PACKAGE / "detect").glob("*.py"):
        for line, module in _imports(path):
            parts = module.split(".")
            assert not (parts[0] == "marginface" and len(parts) > 1 and parts[1] in banned), (
                f"{path.name}:{line} imports {module}"
            )
