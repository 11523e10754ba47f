"""Fixtures of the detector tests: real LFW photos and MTCNN's weights (tests/_face_fixtures.py)."""

from tests._face_fixtures import lfw_jpegs, lfw_rgb, mtcnn_weights

__all__ = ["lfw_jpegs", "lfw_rgb", "mtcnn_weights"]
