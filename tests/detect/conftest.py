"""Fixtures of the detector tests: real LFW photos and MTCNN's weights."""

from __future__ import annotations

import tarfile

import cv2
import numpy as np
import pytest

from ._weights import require_mtcnn_weights


@pytest.fixture(scope="session")
def mtcnn_weights():
    """facenet-pytorch's ``data`` folder (skip locally, fail under CI, when absent)."""
    return require_mtcnn_weights()


@pytest.fixture(scope="session")
def lfw_jpegs(shared_file) -> dict[str, bytes]:
    """The first 24 JPEGs of the real LFW deep-funneled archive, ``{relative name: bytes}``."""
    found = {}
    with tarfile.open(shared_file("lfw", "lfw-deepfunneled.tar.gz")) as tar:
        for member in tar:
            if member.isfile() and member.name.endswith(".jpg"):
                found[member.name.split("/", 1)[1]] = tar.extractfile(member).read()
                if len(found) == 24:
                    break
    return found


@pytest.fixture(scope="session")
def lfw_rgb(lfw_jpegs) -> list[np.ndarray]:
    """Those photos decoded, ``uint8[250, 250, 3]`` RGB."""
    return [
        cv2.cvtColor(cv2.imdecode(np.frombuffer(b, np.uint8), cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
        for b in lfw_jpegs.values()
    ]
