"""NMS and square boxes (marginface.detect.boxes) on boxes worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from marginface.detect import Faces, nms, square_boxes

from ._facenet_pytorch import torchvision_batched_nms


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


def _random_boxes(rng, count):
    """Boxes of sizes 5..60 px on a 120 px field, many overlapping; scores from a few values,
    so that many are equal (float32)."""
    corner = rng.uniform(0, 120, (count, 2))
    side = rng.uniform(5, 60, (count, 2))
    boxes = np.concatenate([corner, corner + side], axis=1).astype(np.float32)
    scores = rng.choice(np.array([1.0, 0.999, 0.99], np.float32), count)
    return boxes, scores


def test_numpy_order_equals_facenet_pytorchs_nms_numpy(facenet_mtcnn):
    # facenet-pytorch 2.6.0's own nms_numpy (detect_face.py): np.argsort(s), the last first
    reference = facenet_mtcnn
    rng = np.random.default_rng(0)
    differs_from_stable = 0
    for trial in range(300):
        boxes, scores = _random_boxes(rng, 2 + trial % 40)
        expected = reference.module.nms_numpy(boxes, scores, 0.7, "Min").astype(np.int64)
        got = nms(
            torch.from_numpy(boxes),
            torch.from_numpy(scores),
            0.7,
            overlap="min",
            inclusive=True,
            order="numpy",
        )
        assert got.tolist() == expected.tolist(), f"trial {trial}"
        stable = nms(
            torch.from_numpy(boxes), torch.from_numpy(scores), 0.7, overlap="min", inclusive=True
        )
        differs_from_stable += stable.tolist() != got.tolist()
    assert differs_from_stable > 0  # the tie rule matters on these boxes


@pytest.mark.parametrize("count", [40, 900, 1500])
def test_torchvision_order_equals_batched_nms_for_one_image(count):
    # against torchvision 0.17's batched_nms restated in _facenet_pytorch.py: with more than
    # 1,000 boxes its per-class branch re-sorts the kept indices by a sort that is not stable
    rng = np.random.default_rng(count)
    boxes, scores = _random_boxes(rng, count)
    boxes, scores = torch.from_numpy(boxes * 8), torch.from_numpy(scores)
    for threshold in (0.5, 0.7, 0.6):
        expected = torchvision_batched_nms(
            boxes, scores, torch.zeros(count, dtype=torch.int64), threshold
        )
        got = nms(boxes, scores, threshold, order="torchvision")
        assert got.tolist() == expected.tolist()


def test_float64_comparison_of_the_threshold():
    # IoU 0.6 as float32 is 0.6000000238 > 0.6: torchvision compares in float64 and drops,
    # nms_numpy compares in float32 and keeps
    boxes = _t([[0, 0, 10, 10], [0, 0, 10, 6]])
    scores = _t([0.9, 0.8])
    assert nms(boxes, scores, 0.6).tolist() == [0]
    assert nms(boxes, scores, 0.6, order="numpy").tolist() == [0, 1]


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        ((torch.zeros(2, 4), torch.zeros(2), 0.5), {"order": "fast"}, ValueError, "order"),
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
