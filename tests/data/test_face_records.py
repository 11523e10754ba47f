"""read_face_records: ``marginface detect``'s JSON lines back into Faces per photo, names
resolved against the photo folder, one-line errors naming the line."""

from __future__ import annotations

import json

import numpy as np
import pytest

from marginface.data.face_records import is_face_records, read_face_records


def _record(file: str, x: float, score: float = 0.9) -> dict:
    return {
        "file": file,
        "box": [x, 10.0, x + 40, 60.0],
        "score": score,
        "landmarks": [[x + 10 + i, 30.0] for i in range(5)],
    }


@pytest.fixture
def folder(tmp_path):
    src = tmp_path / "photos"
    (src / "ann").mkdir(parents=True)
    for name in ("ann/1.jpg", "ann/2.jpg"):
        (src / name).write_bytes(b"x")
    (tmp_path / "elsewhere.jpg").write_bytes(b"x")
    return src


def _write(path, records) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + "\n")


def test_grouped_by_photo_best_score_first(folder, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "faces.jsonl"
    _write(
        path,
        [
            _record("photos/ann/1.jpg", 0, 0.8),  # as detect writes it: relative to the cwd
            _record("photos/ann/1.jpg", 100, 0.95),
            _record(str(folder / "ann" / "2.jpg"), 5),  # absolute
            _record("elsewhere.jpg", 0),  # not inside the folder: left out
        ],
    )
    faces, elsewhere = read_face_records(path, folder)
    assert sorted(faces) == ["ann/1.jpg", "ann/2.jpg"]
    one = faces["ann/1.jpg"]
    assert one.count == 2 and one.scores.tolist() == pytest.approx([0.95, 0.8])
    np.testing.assert_array_equal(one.boxes[0], [100, 10, 140, 60])
    assert one.landmarks.shape == (2, 5, 2) and one.boxes.dtype == np.float32
    assert elsewhere == ["elsewhere.jpg"]
    # names relative to the folder itself work too
    _write(path, [_record("ann/2.jpg", 0)])
    assert list(read_face_records(path, folder)[0]) == ["ann/2.jpg"]


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ("not json", "faces.jsonl:1: not a JSON line"),
        ('{"box": [1, 2, 3, 4]}', 'expected marginface detect\'s {"file"'),
        ('{"file": "ann/1.jpg", "box": [1, 2, 3], "landmarks": []}', "box must be (4,)"),
        (
            '{"file": "ann/1.jpg", "box": [1, 2, 3, 4], "landmarks": [[1, 2]]}',
            "landmarks must be (5, 2)",
        ),
        (
            '{"file": "ann/1.jpg", "box": [1, 2, 3, NaN], "landmarks": [[1, 2]]}',
            "box must be (4,) finite",
        ),
    ],
)
def test_bad_lines_are_named(folder, tmp_path, line, needle):
    path = tmp_path / "faces.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(ValueError) as info:
        read_face_records(path, folder)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_an_empty_file_and_the_sniffing(folder, tmp_path):
    empty = tmp_path / "faces.jsonl"
    empty.write_text("\n")
    with pytest.raises(ValueError, match="holds no face records"):
        read_face_records(empty, folder)
    assert is_face_records(empty)
    other = tmp_path / "marks.txt"
    other.write_text("ann/1.jpg 1 2 3 4 5 6 7 8 9 10 0.9\n")
    assert not is_face_records(other)
    other.write_text(json.dumps(_record("ann/1.jpg", 0)) + "\n")
    assert is_face_records(other)
    assert not is_face_records(tmp_path / "absent.txt")
