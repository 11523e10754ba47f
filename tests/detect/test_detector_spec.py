"""detect/choice.py's DetectorSpec: one detector and its options, built by load_detector."""

from __future__ import annotations

import pickle

import pytest

from marginface.detect import SCRFD, DetectorSpec, load_detector

from .test_scrfd import _graph


def test_spec_carries_the_onnx_options(tmp_path):
    path = _graph(tmp_path / "open.onnx")
    spec = DetectorSpec(path, input_size=(320, 320), score_threshold=0.7)
    assert pickle.loads(pickle.dumps(spec)) == spec  # worker processes rebuild it
    detector = load_detector(spec)
    assert isinstance(detector, SCRFD)
    assert detector.input_size == (320, 320) and detector.score_threshold == 0.7
    default = load_detector(DetectorSpec(path))
    assert default.input_size == (640, 640) and default.score_threshold == 0.5


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"name": 3}, TypeError, "name must be 'mtcnn' or a path, got 3"),
        ({"min_face_size": 0}, ValueError, "min_face_size must be > 0, got 0"),
        ({"input_size": (640,)}, ValueError, r"input_size must be two sides >= 1, got \(640,\)"),
        ({"input_size": (0, 640)}, ValueError, "input_size must be two sides >= 1"),
        ({"input_size": (2.5, 640)}, ValueError, "input_size must be two sides >= 1"),
    ],
)
def test_bad_spec(kwargs, error, message):
    with pytest.raises(error, match=message):
        DetectorSpec(**kwargs)
