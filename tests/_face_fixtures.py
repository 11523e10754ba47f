"""Fixtures shared by the face front end's tests (tests/detect, tests/data, tests/cli): real LFW
photos and MTCNN's weights, skipped locally when facenet-pytorch's files are absent and a
failure under CI (``make venv`` installs them: ``pip install --no-deps facenet-pytorch==2.6.0``),
as ``tests/_shared_data.py`` does for the datasets. Import the fixtures into a test module or
conftest.
"""

from __future__ import annotations

import tarfile

import cv2
import numpy as np
import pytest

from marginface.detect import WeightsError, find_mtcnn_weights
from tests._shared_data import require_shared_file, running_under_ci


def require_mtcnn_weights():
    """The folder holding pnet.pt, rnet.pt, onet.pt; skip (fail under CI) when absent."""
    try:
        return find_mtcnn_weights()
    except WeightsError as error:
        if running_under_ci():
            pytest.fail(f"CI is set and {error}", pytrace=False)
        pytest.skip(str(error))


@pytest.fixture(scope="session")
def mtcnn_weights():
    """facenet-pytorch's ``data`` folder (skip locally, fail under CI, when absent)."""
    return require_mtcnn_weights()


@pytest.fixture(scope="session")
def lfw_jpegs() -> dict[str, bytes]:
    """The first 24 JPEGs of the real LFW deep-funneled archive, ``{relative name: bytes}``."""
    found = {}
    with tarfile.open(require_shared_file("lfw", "lfw-deepfunneled.tar.gz")) as tar:
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


@pytest.fixture
def photos(lfw_jpegs, mtcnn_weights, tmp_path):
    """A photo folder: three LFW photos (``<identity>/<image>``) and an unreadable one
    (``junk/broken.jpg``)."""
    src = tmp_path / "photos"
    for name in list(lfw_jpegs)[:3]:
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(lfw_jpegs[name])
    (src / "junk").mkdir()
    (src / "junk" / "broken.jpg").write_bytes(b"\xff\xd8\xff not really")
    return src
