"""``align`` never writes among the user's photos and never crops nothing: an output folder that
is, is inside, or holds the image folder; a name outside the image folder; landmarks far outside
their image; an unreadable image or a landmarks file that is not UTF-8 are one line before
anything is written (data/align.py)."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from tests.data.test_align import _faces_folder, _landmark_line

from marginface.cli import main
from marginface.data.align import ARCFACE_TEMPLATE, align_folder, norm_crop, read_landmarks

cv2 = pytest.importorskip("cv2")


def _fingerprint(folder) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.mark.parametrize("where", ["same", "inside", "holding"])
def test_an_output_folder_nested_with_the_photos_is_refused(tmp_path, capsys, where):
    src, marks = _faces_folder(tmp_path)
    before = _fingerprint(tmp_path)
    out = {"same": src, "inside": src / "anna" / "crops", "holding": tmp_path}[where]
    assert main(["align", str(src), str(marks), str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "must not be, or contain, each other" in err and len(err.splitlines()) == 1
    assert _fingerprint(tmp_path) == before  # not one photo replaced, nothing added


def test_absolute_names_inside_the_folder_are_written_under_out(tmp_path):
    src, marks = _faces_folder(tmp_path)
    table = read_landmarks(marks)
    absolute = tmp_path / "absolute.txt"
    absolute.write_text("".join(_landmark_line(str(src / n), p) + "\n" for n, p in table.items()))
    before = _fingerprint(src)
    result = align_folder(src, absolute, tmp_path / "out")
    assert result.written == 4 and _fingerprint(src) == before
    for name, points in table.items():
        expected = norm_crop(cv2.imread(str(src / name), cv2.IMREAD_UNCHANGED), points)
        np.testing.assert_array_equal(cv2.imread(str(tmp_path / "out" / name)), expected)


@pytest.mark.parametrize("name", ["../elsewhere.png", "ABSOLUTE"])
def test_names_outside_the_folder_are_refused(tmp_path, name):
    src, marks = _faces_folder(tmp_path)
    other = tmp_path / "elsewhere.png"
    cv2.imwrite(str(other), np.zeros((120, 120, 3), np.uint8))
    name = str(other) if name == "ABSOLUTE" else name
    marks.write_text(marks.read_text() + _landmark_line(name, ARCFACE_TEMPLATE) + "\n")
    with pytest.raises(ValueError, match="outside the image folder|climbs out"):
        align_folder(src, marks, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_landmarks_far_outside_the_image_are_refused_before_writing(tmp_path, capsys):
    src, marks = _faces_folder(tmp_path)
    far = ARCFACE_TEMPLATE.astype(np.float64) + 5000.0
    marks.write_text(marks.read_text() + _landmark_line("anna/extra.png", far) + "\n")
    assert main(["align", str(src), str(marks), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert "anna/extra.png" in err and "lie outside the 50x50 image" in err
    assert not (tmp_path / "out").exists()
    # a face partly out of frame is still aligned
    edge = ARCFACE_TEMPLATE.astype(np.float64) * 0.5 - 12.0
    marks.write_text(_landmark_line("anna/extra.png", edge) + "\n")
    assert align_folder(src, marks, tmp_path / "out").written == 1


def test_an_unreadable_image_is_named_before_anything_is_written(tmp_path):
    src, marks = _faces_folder(tmp_path)
    (src / "bob" / "1.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    with pytest.raises(ValueError, match=r"bob/1\.png: not a readable image"):
        align_folder(src, marks, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_landmarks_file_that_is_not_utf8(tmp_path, capsys):
    src, marks = _faces_folder(tmp_path)
    marks.write_bytes(marks.read_bytes() + "# café\n".encode("latin-1"))
    assert main(["align", str(src), str(marks), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert f"{marks}: not UTF-8 text" in err and len(err.splitlines()) == 1
