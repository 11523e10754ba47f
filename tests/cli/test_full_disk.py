"""A full disk while ``align``, ``convert``, ``export``, ``embed`` and ``gallery build`` write
(issue 39): exit 2, one line "disk full: could not write <file>" naming a file of the output,
no half-written file or temporary left, and the previous output byte for byte as it was."""

from __future__ import annotations

import numpy as np
import pytest

from marginface.cli import main
from tests.cli._full_disk import fill, fingerprint, mounted_tmpfs, one_line
from tests.inference._digits import write_identities


@pytest.fixture
def disk(tmp_path):
    with mounted_tmpfs(tmp_path / "disk") as point:
        yield point


@pytest.fixture
def faces(tmp_path):
    return write_identities(tmp_path / "faces", range(3), 2)


def _refused_on_a_full_disk(capsys, disk, args: list[str], named) -> None:
    """Fill ``disk``, run ``args``: disk full naming ``named``, nothing on ``disk`` changed."""
    before = fingerprint(disk)
    fill(disk)
    one_line(capsys, main(args), "disk full: could not write", str(named))
    assert fingerprint(disk) == before


def test_align(tmp_path, disk, capsys):
    pytest.importorskip("cv2")
    from tests.data.test_align import _faces_folder

    src, marks = _faces_folder(tmp_path)
    args = ["--quiet", "align", str(src), str(marks), str(disk / "crops")]
    assert main(args) == 0
    assert main([*args[:-1], str(disk / "more")]) == 0  # a second output: written afresh
    capsys.readouterr()
    (disk / "more" / "anna" / "0.png").unlink()
    again = [*args[:-1], str(disk / "more"), "--overwrite"]  # OUT holds crops: replace them
    _refused_on_a_full_disk(capsys, disk, again, disk / "more")


def test_convert(faces, disk, capsys):
    args = ["--quiet", "convert", str(faces), str(disk / "ds"), "--image-size", "16"]
    assert main([*args, "--workers", "1"]) == 0
    capsys.readouterr()
    other = [*args[:3], str(disk / "ds2"), *args[4:], "--workers", "1"]
    _refused_on_a_full_disk(capsys, disk, other, disk / "ds2")
    assert not (disk / "ds2" / "train.rec").exists()


@pytest.mark.parametrize("form", ["torchscript", "onnx", "safetensors", "pt"])
def test_export(digits_run, disk, capsys, form):
    if form == "onnx":
        pytest.importorskip("onnx")
        pytest.importorskip("onnxruntime")
    args = ["--quiet", "export", str(digits_run), "--format", form, "--out", str(disk / "x")]
    assert main(args) == 0
    capsys.readouterr()
    _refused_on_a_full_disk(capsys, disk, args, disk / "x")


def test_embed_keeps_the_previous_embeddings(digits_run, faces, disk, capsys):
    out = disk / "e.npz"
    args = ["--quiet", "embed", str(digits_run), str(faces), "--out", str(out)]
    assert main(args) == 0
    capsys.readouterr()
    write_identities(faces, [7], 2)  # new images: the file is rewritten
    _refused_on_a_full_disk(capsys, disk, args, out)


def test_gallery_build_keeps_the_previous_gallery(digits_run, faces, disk, capsys):
    args = ["--quiet", "gallery", "build", str(digits_run), str(faces), "--out", str(disk / "g")]
    assert main(args) == 0
    capsys.readouterr()
    write_identities(faces, [7], 2)
    _refused_on_a_full_disk(capsys, disk, [*args, "--overwrite"], disk / "g")


def test_convert_pairs(tmp_path, disk, capsys):
    from PIL import Image

    for name in ("Ann_A", "Bob_B"):
        (tmp_path / "lfw" / name).mkdir(parents=True)
        for k in (1, 2):
            pixels = np.full((32, 32, 3), 40 * k, np.uint8)
            Image.fromarray(pixels).save(tmp_path / "lfw" / name / f"{name}_{k:04d}.jpg")
    pairs = tmp_path / "pairs.txt"
    pairs.write_text("1\t1\nAnn_A\t1\t2\nAnn_A\t1\tBob_B\t2\n")
    args = ["--quiet", "convert", str(tmp_path / "lfw"), str(disk / "lfw.bin")]
    args += ["--pairs", str(pairs), "--image-size", "16", "--crop", "0"]
    assert main(args) == 0
    capsys.readouterr()
    _refused_on_a_full_disk(capsys, disk, args, disk / "lfw.bin")
