"""MTCNN (marginface.detect.mtcnn) against facenet-pytorch's own ``detect_face`` (bit for bit)
and against the cascade restated in ``_mtcnn_reference.py`` on real LFW photos, batching, input
kinds, huge images and the constructor's checks.

Tolerances: coordinates are float32 values below 512 px, whose spacing is 3e-5 to 6e-5; a box
goes through a few regressions whose dot products may be summed in another order (batch size,
kernels), so corners and landmarks agree to 2e-3 px (about 40 ulps), probabilities (softmax
outputs in [0, 1], spacing 6e-8) to 1e-5.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from marginface.detect import MTCNN, Faces, read_mtcnn_weights
from marginface.detect.mtcnn import pyramid_scales

from ._mtcnn_reference import mtcnn_reference

PX, PROB = 2e-3, 1e-5


@pytest.fixture(scope="module")
def detector(mtcnn_weights) -> MTCNN:
    torch.set_num_threads(1)
    return MTCNN()


def _assert_same(a: Faces, b, what: str = "") -> None:
    boxes, scores, landmarks = b
    assert a.boxes.shape == (len(scores), 4), what
    np.testing.assert_allclose(a.boxes, boxes, rtol=0, atol=PX, err_msg=what)
    np.testing.assert_allclose(a.scores, scores, rtol=0, atol=PROB, err_msg=what)
    np.testing.assert_allclose(a.landmarks, landmarks, rtol=0, atol=PX, err_msg=what)


def test_equals_the_restated_cascade_on_lfw(detector, lfw_rgb, mtcnn_weights):
    states = read_mtcnn_weights(mtcnn_weights)
    found = 0
    for index, image in enumerate(lfw_rgb[:12]):
        faces = detector.detect(image)[0]
        _assert_same(faces, mtcnn_reference(image, states), f"photo {index}")
        assert faces.boxes.dtype == np.float32 and faces.landmarks.dtype == np.float32
        assert np.all(np.diff(faces.scores) <= 0)  # best first
        found += faces.count >= 1
    assert found >= 11  # LFW photos: one main face each, near the centre


def test_equals_facenet_pytorch_bit_for_bit_on_lfw(detector, lfw_rgb, facenet_mtcnn):
    # facenet-pytorch 2.6.0's own detect_face, one photo per call as MTCNN.detect runs it;
    # marginface with the 24 photos as one batch: boxes, scores and landmarks identical
    torch.set_num_threads(1)
    batched = detector.detect(lfw_rgb)
    faces = 0
    for index, (image, ours) in enumerate(zip(lfw_rgb, batched, strict=True)):
        boxes, scores, landmarks = facenet_mtcnn.detect(image)
        what = f"photo {index}"
        assert ours.boxes.shape == boxes.shape, what
        assert np.array_equal(ours.boxes, boxes.astype(np.float32)), what
        assert np.array_equal(ours.scores, scores.astype(np.float32)), what
        assert np.array_equal(ours.landmarks, landmarks.astype(np.float32)), what
        faces += ours.count
    assert faces >= 24


def test_the_main_face_is_where_lfw_puts_it(detector, lfw_rgb):
    # deep-funneled LFW centres the face: the best face's eyes lie above its mouth, inside
    # its box, and the box contains the image centre
    for image in lfw_rgb[:8]:
        faces = detector.detect(image)[0]
        box, points = faces.boxes[0], faces.landmarks[0]
        assert box[0] < 125 < box[2] and box[1] < 125 < box[3]
        assert points[0, 0] < points[1, 0] and points[3, 0] < points[4, 0]
        assert max(points[0, 1], points[1, 1]) < points[2, 1] < min(points[3, 1], points[4, 1])
        assert np.all((points >= box[:2]) & (points <= box[2:]))


def test_batch_equals_one_image_at_a_time(detector, lfw_rgb):
    images = lfw_rgb[:6]
    one_by_one = [detector.detect(image)[0] for image in images]
    as_batch = detector.detect(np.stack(images))
    as_list = detector.detect(images)
    assert len(as_batch) == len(as_list) == 6
    for single, batched, listed in zip(one_by_one, as_batch, as_list, strict=True):
        _assert_same(batched, single)
        _assert_same(listed, single)


def test_mixed_sizes_group_by_size(detector, lfw_rgb):
    images = [lfw_rgb[0], lfw_rgb[1][20:220, 10:240], lfw_rgb[2], lfw_rgb[3][20:220, 10:240]]
    results = detector.detect(images)
    for image, faces in zip(images, results, strict=True):
        _assert_same(faces, detector.detect(image)[0])


def test_grey_rgba_and_tensor_inputs(detector, lfw_rgb):
    grey = lfw_rgb[0].mean(axis=2).astype(np.uint8)
    as_rgb = detector.detect(np.repeat(grey[:, :, None], 3, axis=2))[0]
    _assert_same(detector.detect(grey)[0], as_rgb)
    _assert_same(detector.detect(grey[:, :, None])[0], as_rgb)
    rgba = np.concatenate([lfw_rgb[1], np.full((250, 250, 1), 7, np.uint8)], axis=2)
    _assert_same(detector.detect(rgba)[0], detector.detect(lfw_rgb[1])[0])
    _assert_same(detector.detect(torch.from_numpy(lfw_rgb[1]))[0], detector.detect(lfw_rgb[1])[0])


def test_huge_image_is_shrunk_and_mapped_back(mtcnn_weights, lfw_rgb):
    # a 2x nearest upscale shrunk back by area averaging is the photo itself, exactly, so the
    # faces found are the photo's, times 2
    small = MTCNN(max_side=250)
    big = np.repeat(np.repeat(lfw_rgb[0], 2, axis=0), 2, axis=1)  # (500, 500, 3)
    expected = small.detect(lfw_rgb[0])[0]
    found = small.detect(big)[0]
    np.testing.assert_allclose(found.boxes, 2 * expected.boxes, rtol=0, atol=2 * PX)
    np.testing.assert_allclose(found.landmarks, 2 * expected.landmarks, rtol=0, atol=2 * PX)
    np.testing.assert_allclose(found.scores, expected.scores, rtol=0, atol=PROB)
    unlimited = MTCNN(max_side=None).detect(big)[0]  # the full-size pyramid: the same face
    assert unlimited.count >= 1
    assert np.abs(unlimited.landmarks[0] - found.landmarks[0]).max() < 10


def test_no_face_and_tiny_images(detector):
    for image in (np.full((200, 300, 3), 128, np.uint8), np.zeros((5, 7, 3), np.uint8)):
        (faces,) = detector.detect(image)
        assert faces.boxes.shape == (0, 4) and faces.scores.shape == (0,)
        assert faces.landmarks.shape == (0, 5, 2) and faces.count == 0
    assert detector.detect([]) == []


def test_pyramid_scales():
    # restated: 12/20 = 0.6, times 0.709 while 250 * s >= 12
    scales = pyramid_scales(250, 300, 20, 0.709)
    expected, s = [], 0.6
    while 250 * s >= 12:
        expected.append(s)
        s *= 0.709
    assert scales == pytest.approx(expected, rel=1e-12) and len(scales) == 8
    assert pyramid_scales(11, 400, 12, 0.709) == []


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"min_face_size": 0}, ValueError, "min_face_size must be > 0"),
        ({"thresholds": (0.6, 0.7)}, ValueError, "thresholds must be three"),
        ({"thresholds": (0.6, 0.7, 1.5)}, ValueError, r"thresholds\[2\] must be <= 1"),
        ({"factor": 1.0}, ValueError, "factor must be < 1"),
        ({"factor": "0.7"}, TypeError, "factor must be a real number"),
        ({"max_side": 5}, ValueError, "max_side must be >= 12"),
        ({"device": "gpu0"}, ValueError, "device must name a device"),
    ],
)
def test_bad_options(mtcnn_weights, options, error, match):
    with pytest.raises(error, match=match):
        MTCNN(**options)


@pytest.mark.parametrize(
    ("images", "error", "match"),
    [
        (np.zeros((20, 20, 3), np.float32), TypeError, r"images\[0\] must be uint8"),
        (np.zeros((20, 20, 2), np.uint8), ValueError, r"images\[0\] must be \[H, W, 3\]"),
        (np.zeros((0, 20, 3), np.uint8), ValueError, r"images\[0\] must be \[H, W, 3\]"),
        ([np.zeros((20, 20, 3), np.uint8), "x.jpg"], TypeError, r"images\[1\] must be"),
        ("photo.jpg", TypeError, "images must be an image or a sequence"),
    ],
)
def test_bad_images(detector, images, error, match):
    with pytest.raises(error, match=match):
        detector.detect(images)
