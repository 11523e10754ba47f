"""The detector in ``convert``'s framing record (marginface.data.framing): written only when
set, compared with the crop, and named in the mismatch sentence."""

from __future__ import annotations

import json

from marginface.data.framing import framing_mismatches, read_framing, write_framing

MTCNN = "mtcnn, largest face, float64 alignment"
SCRFD = "det_10g.onnx, largest face, float64 alignment"


def test_detector_recorded_and_compared(tmp_path):
    write_framing(tmp_path / "train.rec", crop=None, image_size=112, source="a", detector=MTCNN)
    assert read_framing(tmp_path / "train.rec")["detector"].startswith("mtcnn")
    write_framing(tmp_path / "lfw.bin", crop=150, image_size=112, source="b")
    assert "detector" not in json.loads((tmp_path / "lfw.convert.json").read_text())
    write_framing(tmp_path / "same.bin", crop=None, image_size=112, source="c", detector=MTCNN)
    write_framing(tmp_path / "other.bin", crop=None, image_size=112, source="d", detector=SCRFD)
    write_framing(tmp_path / "plain.bin", crop=None, image_size=112, source="e")
    found = framing_mismatches(tmp_path, ["lfw", "same", "other", "plain"])
    assert found == [
        "lfw.bin was converted with --crop 150, train.rec with --detector (mtcnn, largest face, "
        "float64 alignment)",
        "other.bin was converted with --detector (det_10g.onnx, largest face, float64 "
        "alignment), train.rec with --detector (mtcnn, largest face, float64 alignment)",
        "plain.bin was converted with no crop (the whole image), train.rec with --detector "
        "(mtcnn, largest face, float64 alignment)",
    ]
