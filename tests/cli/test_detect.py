"""``marginface detect`` and ``marginface align --detector``: files written, the report, and
one-line errors (never a traceback) for a problem in the user's files or options."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from marginface.cli import main
from marginface.cli.detect import CONVOLUTION_CACHE_CAPACITY
from marginface.data.face_photos import read_photo
from marginface.detect import MTCNN
from tests._face_fixtures import lfw_jpegs, mtcnn_weights, photos

__all__ = ["lfw_jpegs", "mtcnn_weights", "photos"]  # fixtures


def _one_line_error(capsys, *needles):
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    for needle in needles:
        assert needle in err, err


def test_detect_writes_one_json_line_per_face(photos, tmp_path, capsys):
    out = tmp_path / "faces.jsonl"
    assert main(["detect", str(photos), "--out", str(out)]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    detector = MTCNN()
    expected = 0
    for path in sorted(photos.rglob("*.jpg")):
        if path.parent.name == "junk":
            continue
        faces = detector.detect(read_photo(path))[0]
        mine = [r for r in records if r["file"] == path.as_posix()]
        assert len(mine) == faces.count
        expected += faces.count
        np.testing.assert_allclose([r["box"] for r in mine], faces.boxes, atol=1e-3)
        np.testing.assert_allclose([r["landmarks"] for r in mine], faces.landmarks, atol=1e-3)
        np.testing.assert_allclose([r["score"] for r in mine], faces.scores, atol=1e-6)
    assert len(records) == expected >= 3
    assert f"{expected} face(s) in 4 photo(s)" in capsys.readouterr().out
    report = (tmp_path / "faces.jsonl.report.tsv").read_text()
    assert "junk/broken.jpg\tunreadable\t" in report


def test_align_with_the_detector(photos, tmp_path, capsys):
    out = tmp_path / "aligned"
    assert main(["align", str(photos), "--out", str(out), "--detector", "mtcnn"]) == 0
    text = capsys.readouterr().out
    assert "3 aligned 112x112 arcface crop(s) from 4 photo(s)" in text and "1 unreadable" in text
    assert len(list(out.rglob("*.jpg"))) == 3
    assert read_photo(next(out.rglob("*.jpg"))).shape == (112, 112, 3)
    # the positional OUT works too, and --faces all names each face
    assert main(["align", str(photos), str(tmp_path / "all"), "--detector", "mtcnn",
                 "--faces", "all", "-q"]) == 0  # fmt: skip
    assert len(list((tmp_path / "all").rglob("*_0.jpg"))) == 3


_ALIGN = ["align", "{src}", "--out", "{tmp}/o", "--detector"]


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (
            ["align", "{src}", "marks.txt", "{tmp}/o", "--detector", "mtcnn"],
            ["expected align SRC --out OUT --detector"],
        ),
        (["align", "{src}", "{tmp}/o"], ["expected align SRC LANDMARKS OUT"]),
        (
            ["align", "{src}", "--out", "{src}/o", "--detector", "mtcnn"],
            ["must not be, or contain, each other"],
        ),
        ([*_ALIGN, "{tmp}/nowhere"], ["detector must be 'mtcnn', MTCNN's weights"]),
        ([*_ALIGN, "{tmp}"], ["no pnet.pt here", "pip install --no-deps facenet-pytorch==2.6.0"]),
        ([*_ALIGN, "{tmp}/det_10g.onnx"], ["no ONNX detector at", "det_10g.onnx"]),
        (["detect", "{tmp}/absent", "--out", "{tmp}/f.jsonl"], ["no photo or folder at"]),
        (["detect", "{src}", "--out", "{tmp}"], ["is a folder"]),
    ],
)
def test_one_line_errors(photos, tmp_path, capsys, argv, needles):
    argv = [a.format(src=photos, tmp=tmp_path) for a in argv]
    assert main(argv) == 2
    _one_line_error(capsys, *needles)
    assert not (tmp_path / "o").exists() and not (photos / "o").exists()


def test_alignment_defaults_insightface_for_ijb_float64_for_align():
    from marginface.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["ijb", "run", "--data-dir", "x"]).alignment == "insightface"
    assert parser.parse_args(["align", "src", "marks", "out"]).alignment == "float64"
    args = parser.parse_args(["align", "src", "--out", "o", "--alignment", "insightface"])
    assert args.alignment == "insightface"


@pytest.mark.parametrize("command", ["detect", "align"])
def test_help(command, capsys):
    with pytest.raises(SystemExit) as info:
        main([command, "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert f"usage: marginface {command}" in out and "--detector" in out


@pytest.mark.parametrize("command", ["detect", "align"])
def test_progress_lines_as_asked(photos, tmp_path, capsys, command):
    out = ["--out", str(tmp_path / ("f.jsonl" if command == "detect" else "o"))]
    lines = ["--progress", "lines", "--progress-seconds", "0"]
    argv = [command, str(photos), *out, "--detector", "mtcnn", *lines]
    assert main(argv) == 0
    err = capsys.readouterr().err
    verb = "detecting" if command == "detect" else "aligning"
    assert f"{verb}: 4/4 photos" in err, err
    quiet = [command, str(photos), "--out", str(tmp_path / "second"), "--detector", "mtcnn"]
    assert main([*quiet, "--progress", "none"]) == 0
    assert f"{verb}:" not in capsys.readouterr().err


CACHE = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"


def _photo_command(command: str, photos, out) -> list[str]:
    if command == "detect":
        return ["detect", str(photos), "--out", str(out / "faces.jsonl")]
    if command == "align":
        return ["align", str(photos), "--out", str(out / "aligned"), "--detector", "mtcnn"]
    good = out / "good"  # convert reads a folder of identities: no unreadable file
    shutil.copytree(photos, good, ignore=shutil.ignore_patterns("junk"))
    return ["convert", str(good), str(out / "rec"), "--detector", "mtcnn"]


@pytest.mark.parametrize("command", ["detect", "align", "convert"])
def test_the_photo_commands_cap_the_convolution_cache(photos, tmp_path, monkeypatch, command):
    """oneDNN keeps one compiled convolution per input shape (1024 by default) and MTCNN's
    later stages change batch shape with every chunk of photos: the photo commands cap the
    cache at 64 for their process, and keep a value the user set."""
    monkeypatch.setenv(CACHE, "unset by the test")  # restored afterwards
    monkeypatch.delenv(CACHE)
    assert main(_photo_command(command, photos, tmp_path / "first")) == 0
    assert os.environ[CACHE] == str(CONVOLUTION_CACHE_CAPACITY) == "64"
    monkeypatch.setenv(CACHE, "7")
    assert main(_photo_command(command, photos, tmp_path / "second")) == 0
    assert os.environ[CACHE] == "7"


def test_align_for_a_model_cuts_its_own_crops(photos, tmp_path, capsys):
    """``--for-model dlib-resnet-v1``: dlib chips of 150 px, equal to cut_face's; a model that
    takes chips refuses a landmarks file; a model name that is not known is one line."""
    from marginface.data.face_crops import cut_face
    from marginface.data.face_photos import select_faces

    out = tmp_path / "chips"
    args = ["align", str(photos), "--out", str(out), "--detector", "mtcnn"]
    assert main([*args, "--for-model", "dlib-resnet-v1"]) == 0
    assert "3 aligned 150x150 dlib-chip crop(s)" in capsys.readouterr().out
    written = sorted(out.rglob("*.jpg"))
    assert len(written) == 3
    name = written[0].relative_to(out)
    image = read_photo(photos / name)
    faces = MTCNN().detect(image)[0]
    k = select_faces(faces, image.shape, "largest")[0]
    expected = cut_face(image, faces.landmarks[k], faces.boxes[k], crop="dlib-chip", size=150)
    got = read_photo(written[0])
    assert got.shape == (150, 150, 3)
    assert np.abs(got.astype(int) - expected.astype(int)).mean() < 3  # JPEG's loss only
    landmarks = tmp_path / "points.csv"
    landmarks.write_text("name,x1,y1,x2,y2,x3,y3,x4,y4,x5,y5\n")
    bad = ["align", str(photos), str(landmarks), str(tmp_path / "o2")]
    assert main([*bad, "--for-model", "dlib-resnet-v1"]) == 2
    _one_line_error(capsys, "takes dlib-chip crops", "--detector mtcnn")
    assert main([*args[:3], str(tmp_path / "o3"), *args[4:], "--for-model", "dlib-resnt"]) == 2
    _one_line_error(capsys, "did you mean 'dlib-resnet-v1'")


def test_embed_takes_raw_photos_with_a_detector(photos, tmp_path, capsys):
    """``embed dlib-resnet-v1 PHOTOS --detector mtcnn``: each photo's face cut as a dlib chip
    and embedded; the unreadable one skipped and named."""
    from marginface.inference.folder import read_embeddings

    out = tmp_path / "e.npz"
    args = ["embed", "dlib-resnet-v1", str(photos), "--out", str(out), "--detector", "mtcnn"]
    assert main(args) == 0
    captured = capsys.readouterr()
    assert "3 image(s) embedded" in captured.out and "junk/broken.jpg" in captured.err
    saved = read_embeddings(out)
    assert len(saved["paths"]) == 3 and saved["embeddings"].shape == (3, 128)


@pytest.mark.parametrize(
    "command",
    [
        ["detect", "x.jpg", "--out", "f.jsonl"],
        ["align", "src", "--out", "out"],
        ["convert", "src", "out"],
        ["embed", "model", "photos", "--out", "e.npz"],
        ["search", "gallery", "photos"],
    ],
)
def test_every_photo_command_takes_one_detector_spec(command):
    from marginface.cli.detect import detector_spec
    from marginface.cli.parser import build_parser
    from marginface.detect import DetectorSpec

    options = ["--detector", "det.onnx", "--det-size", "320", "--score-threshold", "0.6"]
    args = build_parser().parse_args([*command, *options, "--min-face-size", "30"])
    assert detector_spec(args, device="cpu") == DetectorSpec(
        "det.onnx", min_face_size=30.0, input_size=(320, 320), score_threshold=0.6, device="cpu"
    )
