"""cut_face: each crop kind a model description names, and facenet-pytorch's box crop
restated (extract_face's margin in output pixels, truncation, clipping, area resize)."""

from __future__ import annotations

import numpy as np
import pytest

from marginface.data.align import norm_crop
from marginface.data.face_chip import dlib_chip
from marginface.data.face_crops import box_crop, cut_face

pytest.importorskip("cv2")

LANDMARKS = np.array([[38.3, 51.7], [73.5, 51.5], [56.0, 71.7], [41.5, 92.4], [70.7, 92.2]])


def _photo() -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, (120, 140, 3), dtype=np.uint8)


def test_each_kind_is_its_function():
    image = _photo()
    box = (20.0, 30.0, 90.0, 110.0)
    np.testing.assert_array_equal(cut_face(image, LANDMARKS), norm_crop(image, LANDMARKS, 112))
    np.testing.assert_array_equal(
        cut_face(image, LANDMARKS, crop="dlib-chip", size=150), dlib_chip(image, LANDMARKS, 150)
    )
    np.testing.assert_array_equal(
        cut_face(image, LANDMARKS, box, crop="mtcnn-box", size=160), box_crop(image, box, 160)
    )


def test_the_box_crop_is_facenet_pytorchs_extract_face():
    """margin m output pixels: the box grows by m·w/(S − m) image pixels in x (m·h/(S − m) in
    y), half each side; corners truncated and clipped; cv2.INTER_AREA to S×S."""
    import cv2

    image = _photo()
    box, size, margin = (10.7, -5.2, 100.9, 90.4), 32, 8.0
    w, h = box[2] - box[0], box[3] - box[1]
    gx, gy = margin * w / (size - margin), margin * h / (size - margin)
    x1, y1 = int(max(box[0] - gx / 2, 0)), int(max(box[1] - gy / 2, 0))
    x2, y2 = int(min(box[2] + gx / 2, 140)), int(min(box[3] + gy / 2, 120))
    expected = cv2.resize(image[y1:y2, x1:x2], (size, size), interpolation=cv2.INTER_AREA)
    np.testing.assert_array_equal(box_crop(image, box, size, margin), expected)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: cut_face(_photo(), LANDMARKS, crop="square"), "crop"),
        (lambda: cut_face(_photo(), LANDMARKS, crop="mtcnn-box"), "needs the face's box"),
        (lambda: box_crop(_photo(), (1, 2, 3)), "box must be four finite numbers"),
        (lambda: box_crop(_photo(), (500, 500, 600, 600)), "has no pixel inside the 140x120"),
        (lambda: box_crop(_photo(), (0, 0, 9, 9), size=10, margin=10), "margin must be < size"),
        (lambda: box_crop(_photo(), (0, 0, 9, 9), size=0), "size"),
    ],
)
def test_bad_arguments_are_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()
