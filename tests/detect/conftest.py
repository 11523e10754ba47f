"""Fixtures of the detector tests: real LFW photos and MTCNN's weights (tests/_face_fixtures.py),
and facenet-pytorch's own MTCNN code (``_facenet_pytorch.py``; it ships the weights, so it is
there exactly when they are: skipped locally without it, a failure under CI)."""

import pytest

from tests._face_fixtures import lfw_jpegs, lfw_rgb, mtcnn_weights

from ._facenet_pytorch import FacenetMTCNN, load_facenet_mtcnn

__all__ = ["facenet_mtcnn", "lfw_jpegs", "lfw_rgb", "mtcnn_weights"]


@pytest.fixture(scope="session")
def facenet_mtcnn(mtcnn_weights) -> FacenetMTCNN:
    """facenet-pytorch 2.6.0's ``detect_face`` with its networks (a torchvision stand-in)."""
    return load_facenet_mtcnn()
