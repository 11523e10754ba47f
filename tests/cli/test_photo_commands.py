"""The photo commands on real LFW photos (issue 47): ``align`` cuts ``detect``'s faces without
detecting again, refuses an OUT holding files unless ``--overwrite`` and leaves no stale
report; a command that produces nothing exits non-zero and writes nothing; bad photos (no
face, several faces, unreadable, grey) are one line each in every command that takes photos."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from marginface.cli import main
from marginface.data.face_photos import read_photo
from marginface.inference import FaceModel
from tests._face_fixtures import lfw_jpegs, mtcnn_weights, photos

__all__ = ["lfw_jpegs", "mtcnn_weights", "photos"]  # fixtures


def _one_line(capsys, code: int, *needles: str) -> str:
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    for needle in needles:
        assert needle in err, err
    return err


@pytest.fixture
def hard(lfw_jpegs, mtcnn_weights, tmp_path):
    """One photo of each hard kind, ``<identity>/<image>``: a good one, the same in grey, two
    people side by side, a flat photo with no face, an unreadable file."""
    src = tmp_path / "hard"
    first, second = (
        np.asarray(Image.open(__import__("io").BytesIO(b)).convert("RGB"))
        for b in list(lfw_jpegs.values())[:2]
    )
    for folder in ("ann", "bob", "cat"):
        (src / folder).mkdir(parents=True)
    Image.fromarray(first).save(src / "ann" / "good.jpg", quality=95)
    Image.fromarray(first).convert("L").save(src / "ann" / "grey.jpg", quality=95)
    Image.fromarray(np.concatenate([second, first], axis=1)).save(src / "bob" / "two.jpg")
    Image.new("RGB", (200, 160), (128, 128, 128)).save(src / "cat" / "none.png")
    (src / "cat" / "broken.jpg").write_bytes(b"\xff\xd8\xff not really")
    return src


# ------------------------------------------------------------------ align reads detect's output
def test_align_cuts_detects_faces_without_detecting_again(photos, tmp_path, monkeypatch, capsys):
    faces = tmp_path / "faces.jsonl"
    assert main(["detect", str(photos), "--out", str(faces), "-q"]) == 0
    direct = tmp_path / "direct"
    assert main(["align", str(photos), "--out", str(direct), "--detector", "mtcnn", "-q"]) == 0
    capsys.readouterr()

    import marginface.data.face_photos as face_photos

    def no_detector(*args, **kwargs):
        raise AssertionError("align detected again")

    monkeypatch.setattr(face_photos, "load_detector", no_detector)
    monkeypatch.chdir(tmp_path.parent)  # detect's names are resolved under SRC too
    from_file = tmp_path / "from-file"
    assert main(["align", str(photos), str(faces), str(from_file)]) == 0
    out = capsys.readouterr().out
    assert "3 aligned 112x112 arcface crop(s) from 4 photo(s)" in out, out
    assert "1 not in" in out  # the unreadable photo: detect listed no face for it
    flagged = tmp_path / "flagged"
    assert main(["align", str(photos), "--faces-from", str(faces), "--out", str(flagged)]) == 0
    written = sorted(p.relative_to(direct) for p in direct.rglob("*.jpg"))
    assert written == sorted(p.relative_to(from_file) for p in from_file.rglob("*.jpg"))
    for name in written:
        a, b = read_photo(direct / name), read_photo(from_file / name)
        assert np.abs(a.astype(int) - b.astype(int)).mean() < 1.0  # landmarks kept to 1e-3 px
        assert (read_photo(flagged / name) == b).all()
    report = (tmp_path / "from-file.report.tsv").read_text()
    assert "junk/broken.jpg\tnot_in_faces_file" in report
    # the faces of another folder: one line
    other = tmp_path / "other"
    (other / "x").mkdir(parents=True)
    (other / "x" / "y.jpg").write_bytes(b"x")
    code = main(["align", str(other), str(faces), str(tmp_path / "o")])
    _one_line(capsys, code, "names none of the 1 photo(s)")
    code = main(["align", str(photos), "--faces-from", str(faces), "--out", "o", "--detector", "x"])
    _one_line(capsys, code, "--faces-from gives the faces already found")


# ------------------------------------------------------------------ OUT holding files
def test_align_refuses_an_out_holding_files_and_overwrite_replaces_them(photos, tmp_path, capsys):
    out = tmp_path / "aligned"
    report = tmp_path / "aligned.report.tsv"
    argv = ["align", str(photos), "--out", str(out), "--detector", "mtcnn", "-q"]
    assert main(argv) == 0
    assert "junk/broken.jpg\tunreadable" in report.read_text()
    crops = sorted(out.rglob("*.jpg"))
    before = {p: p.read_bytes() for p in crops}
    (out / "stale.jpg").write_bytes(b"from an earlier run")
    _one_line(capsys, main(argv), "holds files already", "--overwrite")
    assert {p: p.read_bytes() for p in crops} == before and (out / "stale.jpg").exists()
    # --overwrite on the photos without the unreadable one: no report may remain
    (photos / "junk" / "broken.jpg").unlink()
    assert main([*argv, "--overwrite"]) == 0
    assert not (out / "stale.jpg").exists() and sorted(out.rglob("*.jpg")) == crops
    assert not report.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".aligned")]  # no staging


def test_align_with_a_landmarks_file_refuses_and_replaces_alike(photos, tmp_path, capsys):
    from marginface.detect import MTCNN

    lines = ["name,x1,y1,x2,y2,x3,y3,x4,y4,x5,y5"]
    for path in sorted(photos.rglob("*.jpg")):
        if path.parent.name == "junk":
            continue
        points = MTCNN().detect(read_photo(path))[0].landmarks[0].reshape(-1)
        name = path.relative_to(photos).as_posix()
        lines.append(name + "," + ",".join(f"{v:.3f}" for v in points))
    marks = tmp_path / "marks.csv"
    marks.write_text("\n".join(lines) + "\n")
    out = tmp_path / "aligned"
    out.mkdir()
    (out / "old.jpg").write_bytes(b"old")
    argv = ["align", str(photos), str(marks), str(out), "-q"]
    _one_line(capsys, main(argv), "holds files already")
    assert main([*argv, "--overwrite"]) == 0
    assert not (out / "old.jpg").exists() and len(list(out.rglob("*.jpg"))) == 3
    marks.write_text(lines[0] + "\n")
    empty = tmp_path / "empty"
    _one_line(capsys, main(["align", str(photos), str(marks), str(empty)]), "no landmarks")
    assert not empty.exists()


# ------------------------------------------------------------------ nothing produced
@pytest.fixture
def faceless(tmp_path):
    src = tmp_path / "faceless"
    (src / "cat").mkdir(parents=True)
    Image.new("RGB", (200, 160), (128, 128, 128)).save(src / "cat" / "none.png")
    (src / "cat" / "broken.jpg").write_bytes(b"\xff\xd8\xff not really")
    return src


def test_align_and_detect_that_find_nothing_write_nothing(
    faceless, mtcnn_weights, tmp_path, capsys
):
    out = tmp_path / "aligned"
    code = main(["align", str(faceless), "--out", str(out), "--detector", "mtcnn"])
    _one_line(capsys, code, "no crop written from 2 photo(s): 1 with no face, 1 unreadable")
    assert not out.exists()
    assert "cat/none.png\tno_face" in (tmp_path / "aligned.report.tsv").read_text()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".aligned")]
    jsonl = tmp_path / "faces.jsonl"
    code = main(["detect", str(faceless), "--out", str(jsonl)])
    _one_line(capsys, code, "no face found in 2 photo(s)", "nothing written")
    assert not jsonl.exists() and (tmp_path / "faces.jsonl.report.tsv").exists()


def test_embed_with_every_image_refused_writes_nothing(digits_run, faceless, tmp_path, capsys):
    """The issue's case: a model of another input size refuses every image; no .npz is left
    and the exit status says so (an empty folder too)."""
    out = tmp_path / "e.npz"
    code = main(["embed", str(digits_run), str(faceless), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "none of the 2 image(s)" in err and "nothing written" in err, err
    assert not out.exists()
    (tmp_path / "empty").mkdir()
    code = main(["embed", str(digits_run), str(tmp_path / "empty"), "--out", str(out)])
    _one_line(capsys, code, "holds no images")
    assert not out.exists()


# ------------------------------------------------------------------ bad photos, every command
DLIB = "dlib-resnet-v1"


def _subject_faces(folder, names):
    """What MTCNN finds in each photo, the subject's face chosen (as the commands do)."""
    from marginface.data.face_photos import select_faces
    from marginface.data.imaging import decode_image
    from marginface.detect import MTCNN
    from marginface.inference.face_rows import DetectedFace

    detector, faces = MTCNN(), []
    for name in names:
        image = decode_image(folder / name, rgb=True)
        found = detector.detect([image])[0]
        k = select_faces(found, image.shape, "subject")[0]
        faces.append(DetectedFace(found.boxes[k], found.landmarks[k], found.scores[k]))
    return faces


def test_embed_gallery_search_with_a_detector_on_hard_photos(hard, tmp_path, capsys):
    """Grey and two-person photos are embedded (the subject's face); the faceless and the
    unreadable ones are skipped, each named on one line; nothing half-written."""
    from marginface.inference.folder import read_embeddings

    detector = ["--detector", "mtcnn"]
    out = tmp_path / "e.npz"
    assert main(["embed", DLIB, str(hard), "--out", str(out), *detector]) == 0
    captured = capsys.readouterr()
    assert "3 image(s) embedded" in captured.out and "2 skipped" in captured.out
    assert "cat/none.png: no face found in a 200x160 photo" in captured.err
    assert "cat/broken.jpg:" in captured.err and "Traceback" not in captured.err
    saved = read_embeddings(out)
    assert sorted(saved["paths"]) == ["ann/good.jpg", "ann/grey.jpg", "bob/two.jpg"]
    good, grey = (
        saved["embeddings"][list(saved["paths"]).index(n)] for n in ("ann/good.jpg", "ann/grey.jpg")
    )
    assert float(good @ grey) > 0.9  # the grey copy is the same face
    expected = _subject_faces(hard, saved["paths"])  # the detector's own answer per photo
    np.testing.assert_allclose(saved["boxes"], [f.box for f in expected], atol=1e-4)
    np.testing.assert_allclose(saved["landmarks"], [f.landmarks for f in expected], atol=1e-4)
    np.testing.assert_allclose(saved["scores"], [f.score for f in expected], atol=1e-6)

    gallery = tmp_path / "gallery"
    assert main(["gallery", "build", DLIB, str(hard), "--out", str(gallery), *detector]) == 0
    assert "gallery of 2 identities (3 images)" in capsys.readouterr().out
    results, page = tmp_path / "r.json", tmp_path / "r.html"
    argv = ["search", str(gallery), str(hard), "--out", str(results), "--html", str(page)]
    assert main([*argv, *detector]) == 0
    rows = json.loads(results.read_text())
    shown = page.read_text(encoding="utf-8")
    for row in rows:  # the page shows each probe's box, as the results hold it
        box = ",".join(f"{v:.1f}" for v in row["face"]["box"])
        assert f'class="box">box {box} (score {row["face"]["score"]:.3f})' in shown
    assert sorted(r["probe"] for r in rows) == ["ann/good.jpg", "ann/grey.jpg", "bob/two.jpg"]
    probes = [r["probe"] for r in rows]
    for row, face in zip(rows, _subject_faces(hard, probes), strict=True):
        np.testing.assert_allclose(row["face"]["box"], face.box, atol=1e-4)
        np.testing.assert_allclose(row["face"]["landmarks"], face.landmarks, atol=1e-4)
    from marginface.inference.gallery import Gallery

    kept = {path: face for _, path, face in Gallery.load(gallery).faces}
    assert len(kept) == 3
    for name, face in zip(probes, _subject_faces(hard, probes), strict=True):
        np.testing.assert_allclose(kept[str((hard / name).resolve())].box, face.box, atol=1e-4)
    assert "skipped 2 image(s)" in capsys.readouterr().err

    faceless = tmp_path / "only-bad"
    (faceless / "cat").mkdir(parents=True)
    for name in ("none.png", "broken.jpg"):
        (faceless / "cat" / name).write_bytes((hard / "cat" / name).read_bytes())
    targets = {"embed": tmp_path / "n.npz", "gallery": tmp_path / "g2"}
    targets["search"] = tmp_path / "n.json"
    for argv in (
        ["embed", DLIB, str(faceless), "--out", str(targets["embed"])],
        ["gallery", "build", DLIB, str(faceless), "--out", str(targets["gallery"])],
        ["search", str(gallery), str(faceless), "--out", str(targets["search"])],
    ):
        target = targets[argv[0]]
        assert main([*argv, *detector]) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("marginface")
        assert not target.exists(), argv
    manifest = (gallery / "manifest.json").read_bytes()
    assert main(["gallery", "add", str(gallery), str(faceless), *detector]) == 2
    assert "none of the 2 image(s)" in capsys.readouterr().err
    assert (gallery / "manifest.json").read_bytes() == manifest


@pytest.mark.parametrize(
    ("second", "code", "needle"),
    [
        ("ann/grey.jpg", 0, "same at threshold 0.9000"),
        ("bob/two.jpg", 0, "cosine"),
        ("cat/none.png", 2, "no face found in a 200x160 photo"),
        ("cat/broken.jpg", 2, "broken.jpg"),
    ],
)
def test_verify_with_a_detector_on_hard_photos(hard, capsys, second, code, needle):
    argv = ["verify", DLIB, str(hard / "ann" / "good.jpg"), str(hard / second)]
    assert main([*argv, "--detector", "mtcnn", "--threshold", "0.9"]) == code
    captured = capsys.readouterr()
    text = captured.out if code == 0 else captured.err
    assert needle in text, captured
    if code:
        assert len(captured.err.strip().splitlines()) == 1 and "Traceback" not in captured.err
    else:  # one line, with the box each photo's face was cut from, as the library gives it
        assert len(captured.out.strip().splitlines()) == 1
        model = FaceModel(DLIB, detector="mtcnn")
        answer = model.verify(str(hard / "ann" / "good.jpg"), str(hard / second))
        for path, face in zip((argv[2], argv[3]), answer.faces, strict=True):
            box = ",".join(f"{v:.1f}" for v in face.box)
            assert f"; face in {path}: box {box} (score {face.score:.3f})" in captured.out


def test_align_on_hard_photos_lists_each(hard, tmp_path, capsys):
    out = tmp_path / "aligned"
    assert main(["align", str(hard), "--out", str(out), "--detector", "mtcnn"]) == 0
    text = capsys.readouterr().out
    assert (
        "3 aligned" in text
        and "1 with no face, 1 with several (kept: subject), 1 unreadable" in text
    )
    report = (tmp_path / "aligned.report.tsv").read_text()
    for line in (
        "cat/none.png\tno_face",
        "bob/two.jpg\tseveral_faces",
        "cat/broken.jpg\tunreadable",
    ):
        assert line in report
    assert read_photo(out / "ann" / "grey.jpg").shape == (112, 112, 3)


@pytest.mark.slow
def test_a_huge_photo_stays_bounded(lfw_jpegs, mtcnn_weights, tmp_path):
    """An 8000x6000 photo: detected on a copy shrunk to 1600 px (MTCNN's max_side), cut from
    the full photo; the process stays under 2 GB and the command under a minute."""
    import resource
    import subprocess
    import sys
    import time

    src = tmp_path / "huge" / "ann"
    src.mkdir(parents=True)
    face = Image.open(__import__("io").BytesIO(next(iter(lfw_jpegs.values())))).convert("RGB")
    face.resize((6000, 6000)).crop((-1000, 0, 7000, 6000)).save(src / "big.jpg", quality=80)
    start = time.perf_counter()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "marginface",
            "-q",
            "align",
            str(src.parent),
            "--out",
            str(tmp_path / "out"),
            "--detector",
            "mtcnn",
        ],
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - start
    assert done.returncode == 0, done.stderr
    assert read_photo(tmp_path / "out" / "ann" / "big.jpg").shape == (112, 112, 3)
    peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    assert peak_mb < 2048 and seconds < 60, (peak_mb, seconds)
