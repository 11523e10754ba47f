"""What a photo command lacks is said before it does any work, in one line naming the extra
(``marginface[faces]``) and how to get MTCNN's weights; absence simulated by patching
``importlib.util.find_spec`` and the weights' lookup."""

from __future__ import annotations

import importlib.util

import pytest

from marginface.cli import main
from marginface.detect import WeightsError, needs, weights_cache
from marginface.detect.needs import (
    FACES_EXTRA,
    MissingPhotoToolsError,
    check_photo_needs,
    missing_photo_needs,
)

_real_find_spec = importlib.util.find_spec


def _without(monkeypatch, *modules: str) -> None:
    """``find_spec`` answers None for ``modules`` (as when they are not installed)."""

    def find_spec(name, *args, **kwargs):
        if name.split(".")[0] in modules:
            return None
        return _real_find_spec(name, *args, **kwargs)

    monkeypatch.setattr(needs.importlib.util, "find_spec", find_spec)


@pytest.fixture
def no_weights(monkeypatch, tmp_path):
    def absent():
        raise WeightsError("MTCNN weights not found (facenet-pytorch is not installed)")

    monkeypatch.setattr(weights_cache, "find_mtcnn_weights", absent)
    monkeypatch.setenv("MARGINFACE_CACHE", str(tmp_path / "empty-cache"))


def test_nothing_missing_here(mtcnn_weights):
    assert missing_photo_needs("mtcnn") == []
    check_photo_needs("align", "mtcnn")  # no error


def test_opencv_missing(monkeypatch):
    _without(monkeypatch, "cv2")
    assert missing_photo_needs(None) == ["OpenCV (cv2)"]
    assert missing_photo_needs(None, opencv=False) == []
    with pytest.raises(MissingPhotoToolsError) as info:
        check_photo_needs("align", None)
    message = str(info.value)
    assert message.startswith("align needs OpenCV (cv2), not found here: ")
    assert FACES_EXTRA in message and "\n" not in message
    assert isinstance(info.value, ImportError)


def test_onnx_runtime_only_for_onnx(monkeypatch, tmp_path):
    _without(monkeypatch, "onnxruntime")
    assert missing_photo_needs(tmp_path / "det_10g.onnx") == ["ONNX Runtime"]
    assert missing_photo_needs(None, model=tmp_path / "model.onnx") == ["ONNX Runtime"]
    assert missing_photo_needs(None, model=tmp_path / "model.pt") == []
    assert missing_photo_needs(tmp_path / "weights-folder") == []  # MTCNN's files, given


def test_weights_missing_says_how_to_get_them(no_weights):
    assert missing_photo_needs("mtcnn") == ["MTCNN's weights"]
    assert missing_photo_needs("MTCNN", opencv=False) == ["MTCNN's weights"]
    with pytest.raises(MissingPhotoToolsError) as info:
        check_photo_needs("detect", "mtcnn", opencv=False)
    message = str(info.value)
    assert "marginface detect --download-weights" in message and FACES_EXTRA not in message


def test_all_missing_in_one_line(monkeypatch, no_weights):
    _without(monkeypatch, "cv2", "PIL")
    with pytest.raises(MissingPhotoToolsError) as info:
        check_photo_needs("embed --detector", "mtcnn")
    message = str(info.value)
    assert "OpenCV (cv2) and Pillow and MTCNN's weights" in message
    assert message.index(FACES_EXTRA) < message.index("--download-weights")
    assert "\n" not in message


def _photo_commands(tmp_path, photos):
    out = tmp_path / "out"
    return {
        "align": ["align", str(photos), "--out", str(out), "--detector", "mtcnn"],
        "detect": ["detect", str(photos), "--out", str(out / "f.jsonl")],
        "embed": [
            "embed",
            "dlib-resnet-v1",
            str(photos),
            "--out",
            str(out / "e.npz"),
            "--detector",
            "mtcnn",
        ],
        "verify": [
            "verify",
            "dlib-resnet-v1",
            str(photos / "a.jpg"),
            str(photos / "a.jpg"),
            "--detector",
            "mtcnn",
        ],
        "gallery": [
            "gallery",
            "build",
            "dlib-resnet-v1",
            str(photos),
            "--out",
            str(out / "g"),
            "--detector",
            "mtcnn",
        ],
    }


@pytest.mark.parametrize("command", ["align", "detect", "embed", "verify", "gallery"])
@pytest.mark.parametrize("missing", ["opencv", "weights"])
def test_each_photo_command_says_it_before_any_work(
    command, missing, monkeypatch, tmp_path, capsys, no_weights, mtcnn_weights
):
    """The command stops before loading a model or reading a photo: the detector and the face
    model are never built, nothing is written."""
    if missing == "opencv":
        monkeypatch.undo()  # the weights are there again; OpenCV is not
        _without(monkeypatch, "cv2")
        if command == "detect":
            pytest.skip("detect with MTCNN cuts no crop: it does not need OpenCV")
    photos = tmp_path / "photos"
    photos.mkdir()
    (photos / "a.jpg").write_bytes(b"never read")

    def never(*args, **kwargs):
        raise AssertionError("work started before the check")

    import marginface.detect as detect_package
    import marginface.inference as inference_package

    monkeypatch.setattr(detect_package, "load_detector", never)
    monkeypatch.setattr(inference_package, "FaceModel", never)
    argv = _photo_commands(tmp_path, photos)[command]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    expected = FACES_EXTRA if missing == "opencv" else "marginface detect --download-weights"
    assert expected in err, err
    assert not (tmp_path / "out").exists()
