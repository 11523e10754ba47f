"""cli/convert_command.py: convert's arguments become library calls; ``--detector`` and its
options (the same ones detect and align take) arrive as one DetectorSpec."""

from __future__ import annotations

import argparse

import pytest

from marginface.cli.convert_command import _detection, run_convert
from marginface.cli.convert_options import add_convert_arguments
from marginface.detect import DetectorSpec


def _parse(argv):
    parser = argparse.ArgumentParser()
    add_convert_arguments(parser)
    return parser.parse_args(argv)


def test_detector_options_become_one_spec():
    args = _parse(
        ["src", "out", "--detector", "det.onnx", "--det-size", "320", "--score-threshold", "0.6"]
    )
    assert _detection(args) == {
        "detector": DetectorSpec(
            "det.onnx", input_size=(320, 320), score_threshold=0.6, device="cpu"
        ),
        "faces": "subject",
        "alignment": "float64",
    }
    args = _parse(["src", "out", "--detector", "mtcnn", "--min-face-size", "40"])
    assert _detection(args)["detector"] == DetectorSpec("mtcnn", min_face_size=40.0, device="cpu")
    assert _detection(_parse(["src", "out"])) == {}


def test_command_errors(tmp_path):
    with pytest.raises(ValueError, match="--crop and --detector exclude each other"):
        _detection(_parse(["src", "out", "--detector", "mtcnn", "--crop", "100"]))
    with pytest.raises(ValueError, match="convert needs SRC and OUT"):
        run_convert(_parse([]))
    with pytest.raises(ValueError, match="leave SRC, OUT and --pairs out"):
        run_convert(_parse(["src", "--reindex", str(tmp_path)]))
    with pytest.raises(ValueError, match="no .rec file there"):
        run_convert(_parse(["--reindex", str(tmp_path)]))
