"""write_face_records: detect's lines read back by read_face_records to the same faces (to the
written rounding), the report listing the photos with no face or unreadable, nothing written
when no photo has a face."""

from __future__ import annotations

import numpy as np
import pytest

from marginface.data.face_photos import PhotoError
from marginface.data.face_records import read_face_records
from marginface.data.face_records_writer import write_face_records
from marginface.detect import Faces


def _faces(k: int, seed: int) -> Faces:
    rng = np.random.default_rng(seed)
    corner = rng.uniform(0, 50, (k, 2)).astype(np.float32)
    boxes = np.concatenate([corner, corner + 40], axis=1)
    landmarks = corner[:, None, :] + rng.uniform(5, 35, (k, 5, 2)).astype(np.float32)
    return Faces(boxes, np.sort(rng.uniform(0.5, 1, k))[::-1].astype(np.float32), landmarks)


def test_round_trip_and_report(tmp_path):
    src = tmp_path / "photos"
    src.mkdir()
    for name in ("a.jpg", "b.jpg", "c.jpg", "d.jpg"):
        (src / name).write_bytes(b"")  # read_face_records resolves names to files of src
    found = {"a.jpg": _faces(2, 0), "b.jpg": Faces.empty(), "d.jpg": _faces(1, 1)}
    results = [
        ("a.jpg", None, found["a.jpg"]),
        ("b.jpg", None, found["b.jpg"]),
        ("c.jpg", None, PhotoError("c.jpg: truncated")),
        ("d.jpg", None, found["d.jpg"]),
    ]
    out = tmp_path / "faces.jsonl"
    seen: list[tuple[int, int]] = []
    written = write_face_records(
        (r for r in results), out, total=4, progress=lambda *a: seen.append(a)
    )
    assert (written.photos, written.faces, written.problems) == (4, 3, 2)
    assert written.report == tmp_path / "faces.jsonl.report.tsv" and seen[-1] == (4, 4)
    rows = written.report.read_text().splitlines()
    assert rows == [
        "name\tproblem\tdetail",
        "b.jpg\tno_face\t",
        "c.jpg\tunreadable\tc.jpg: truncated",
    ]
    table, _ = read_face_records(out, src)
    for name in ("a.jpg", "d.jpg"):
        np.testing.assert_allclose(table[name].boxes, found[name].boxes, atol=1e-3)
        np.testing.assert_allclose(table[name].landmarks, found[name].landmarks, atol=1e-3)
        np.testing.assert_allclose(table[name].scores, found[name].scores, atol=1e-6)
    # a later run with nothing to list removes the report it would contradict
    write_face_records([("a.jpg", None, found["a.jpg"])], out, total=1)
    assert not written.report.exists()


def test_no_face_anywhere_writes_nothing(tmp_path):
    out = tmp_path / "faces.jsonl"
    with pytest.raises(ValueError, match=r"no face found in 1 photo\(s\) .* nothing written"):
        write_face_records([("b.jpg", None, Faces.empty())], out, total=1)
    assert not out.exists() and (tmp_path / "faces.jsonl.report.tsv").exists()
    with pytest.raises(ValueError, match="out .* is a folder"):
        write_face_records([], tmp_path, total=0)
