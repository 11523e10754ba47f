"""MTCNN's opt-in ``batch_networks`` (marginface.detect.mtcnn): P-Net runs once per pyramid
level over a batch's photos; the numbers then differ from one photo at a time only in the last
bits.

Tolerances as in test_mtcnn.py: corners and landmarks to 2e-3 px, probabilities to 1e-5 (the
same faces found on these photos; a face near a threshold could in principle flip)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from marginface.detect import MTCNN

PX, PROB = 2e-3, 1e-5


@pytest.fixture(scope="module")
def detectors(mtcnn_weights) -> tuple[MTCNN, MTCNN]:
    torch.set_num_threads(1)
    return MTCNN(), MTCNN(batch_networks=True)


def test_batch_networks_is_off_by_default(detectors):
    exact, batched = detectors
    assert exact.batch_networks is False and batched.batch_networks is True


def test_batch_networks_agrees_with_the_exact_path(detectors, lfw_rgb):
    exact, batched = detectors
    images = lfw_rgb[:8]
    expected, got = exact.detect(images), batched.detect(images)
    for want, faces in zip(expected, got, strict=True):
        assert faces.count == want.count >= 1
        np.testing.assert_allclose(faces.boxes, want.boxes, rtol=0, atol=PX)
        np.testing.assert_allclose(faces.scores, want.scores, rtol=0, atol=PROB)
        np.testing.assert_allclose(faces.landmarks, want.landmarks, rtol=0, atol=PX)
    # one photo per call has batch size 1 everywhere: then the kernels are the exact path's
    for image, want in zip(images[:2], expected[:2], strict=True):
        alone = batched.detect(image)[0]
        assert np.array_equal(alone.boxes, want.boxes)
        assert np.array_equal(alone.landmarks, want.landmarks)


@pytest.mark.parametrize("value", [1, "yes", None])
def test_batch_networks_must_be_a_bool(mtcnn_weights, value):
    with pytest.raises(TypeError, match="batch_networks must be True or False"):
        MTCNN(batch_networks=value)
