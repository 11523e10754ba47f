"""``embed``, ``gallery`` and ``search`` with damaged files, unusual images and outputs among
the photos (issue 39): a damaged manifest, arrays or embeddings file is one line naming it and
what to do; CMYK, 16-bit, grayscale and EXIF-rotated images are converted as a viewer shows
them; a gallery inside the image folder and an ``--html`` page over a photo are refused."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from marginface.cli import main
from marginface.data.imaging import decode_image
from marginface.inference.gallery import MANIFEST_NAME, Gallery
from tests.cli._full_disk import fingerprint, one_line
from tests.inference._digits import write_identities


@pytest.fixture
def faces(tmp_path):
    return write_identities(tmp_path / "faces", range(3), 2)


@pytest.fixture
def gallery(digits_run, faces, tmp_path):
    out = tmp_path / "gallery"
    args = ["--quiet", "gallery", "build", str(digits_run), str(faces), "--out", str(out)]
    assert main(args) == 0
    return out


def _edit_manifest(gallery, change) -> None:
    manifest = json.loads((gallery / MANIFEST_NAME).read_text())
    change(manifest)
    (gallery / MANIFEST_NAME).write_text(json.dumps(manifest))


def _search(capsys, gallery, faces) -> str:
    code = main(["--quiet", "search", str(gallery), str(faces / "0" / "0.png")])
    return one_line(capsys, code, str(gallery))


@pytest.mark.parametrize(
    "damage",
    [
        lambda g: (g / MANIFEST_NAME).write_text('{"format": '),
        lambda g: (g / MANIFEST_NAME).write_bytes(b"\xff\xfe{}"),
        lambda g: _edit_manifest(g, lambda m: m.pop("model")),
        lambda g: _edit_manifest(g, lambda m: m.update(identities="abc")),
        lambda g: _edit_manifest(g, lambda m: m.update(counts=m["counts"][:-1])),
    ],
    ids=["truncated", "not-utf8", "no-model", "identities-not-a-list", "counts-short"],
)
def test_a_damaged_manifest(gallery, faces, capsys, damage):
    damage(gallery)
    err = _search(capsys, gallery, faces)
    assert "is damaged" in err and "gallery build --overwrite" in err


def test_a_manifest_naming_arrays_outside_the_gallery(gallery, faces, tmp_path, capsys):
    np.savez(tmp_path / "elsewhere.npz", sums=np.zeros((3, 3), np.float32))
    _edit_manifest(gallery, lambda m: m.update(arrays="../elsewhere.npz"))
    assert "not an arrays-<n>.npz beside it" in _search(capsys, gallery, faces)


@pytest.mark.parametrize("damage", ["truncated", "missing"])
def test_damaged_or_missing_arrays(gallery, faces, capsys, damage):
    (arrays,) = gallery.glob("arrays-*.npz")
    if damage == "missing":
        arrays.unlink()
    else:
        arrays.write_bytes(arrays.read_bytes()[:100])
    err = _search(capsys, gallery, faces)
    assert f"the gallery's arrays {arrays.name} are unreadable" in err


@pytest.mark.parametrize("content", [b"hello\n", b"PK\x03\x04" + bytes(200)])
def test_a_damaged_embeddings_output(digits_run, faces, tmp_path, capsys, content):
    out = tmp_path / "e.npz"
    out.write_bytes(content)
    code = main(["--quiet", "embed", str(digits_run), str(faces), "--out", str(out)])
    err = one_line(capsys, code, f"{out} is not an embeddings file written by marginface embed")
    assert "allow_pickle" not in err and "delete it" in err
    assert out.read_bytes() == content  # not replaced


@pytest.mark.parametrize("where", ["same", "inside"])
def test_a_gallery_among_the_photos_is_refused(digits_run, faces, capsys, where):
    out = faces if where == "same" else faces / "gallery"
    before = fingerprint(faces)
    code = main(["--quiet", "gallery", "build", str(digits_run), str(faces), "--out", str(out)])
    one_line(capsys, code, "is, or is inside, the image folder")
    assert fingerprint(faces) == before and not (faces / "gallery").exists()


def test_search_never_writes_its_page_over_a_photo(gallery, faces, capsys):
    photo = faces / "1" / "0.png"
    before = photo.read_bytes()
    code = main(["--quiet", "search", str(gallery), str(faces), "--html", str(photo)])
    one_line(capsys, code, "--html must end in .html")
    assert photo.read_bytes() == before


def test_a_gallery_built_over_another_keeps_it_whole_until_the_manifest_moves(
    digits_run, faces, gallery, monkeypatch, capsys
):
    """--overwrite writes new arrays under a fresh name: a failure before the new manifest is
    in place leaves the old gallery readable, and no stray arrays file."""
    import marginface._atomic

    before = fingerprint(gallery)
    real = marginface._atomic.atomic_write_text

    def failing(path, text):
        if path.name == MANIFEST_NAME:
            raise OSError(28, "No space left on device", str(path))
        return real(path, text)

    monkeypatch.setattr(marginface._atomic, "atomic_write_text", failing)
    write_identities(faces, [7], 2)
    args = ["--quiet", "gallery", "build", str(digits_run), str(faces), "--out", str(gallery)]
    one_line(capsys, main([*args, "--overwrite"]), "disk full: could not write")
    assert fingerprint(gallery) == before
    assert len(Gallery.load(gallery)) == 3
    monkeypatch.undo()
    assert main([*args, "--overwrite"]) == 0
    assert len(Gallery.load(gallery)) == 4 and len(list(gallery.glob("arrays-*.npz"))) == 1


# ------------------------------------------------------------------ unusual images
def _grey(tmp_path):
    ramp = np.tile(np.linspace(0, 255, 8).round().astype(np.uint8), (8, 1))
    return ramp


def test_16_bit_grey_is_scaled_not_clipped_to_white(tmp_path):
    from PIL import Image

    ramp = _grey(tmp_path)
    Image.fromarray(ramp.astype(np.uint16) * 257).save(tmp_path / "deep.png")
    assert Image.open(tmp_path / "deep.png").mode.startswith("I")
    np.testing.assert_array_equal(decode_image(tmp_path / "deep.png"), ramp)
    np.testing.assert_array_equal(decode_image(tmp_path / "deep.png", rgb=True)[..., 1], ramp)


def test_an_exif_rotated_photo_is_turned_upright(tmp_path):
    from PIL import Image

    upright = np.arange(8 * 4, dtype=np.uint8).reshape(8, 4) * 7
    stored = Image.fromarray(np.rot90(upright))  # stored sideways, EXIF says "rotate 90 CW"
    exif = stored.getexif()
    exif[0x0112] = 6
    stored.save(tmp_path / "phone.png", exif=exif)
    np.testing.assert_array_equal(decode_image(tmp_path / "phone.png"), upright)


def test_cmyk_grey_and_16_bit_crops_are_embedded(digits_run, tmp_path, capsys):
    """Each converted as a viewer shows it: the same embedding as the plain 8-bit grey crop."""
    from PIL import Image

    folder = write_identities(tmp_path / "plain", [3], 1)
    crop = np.asarray(Image.open(folder / "3" / "0.png"))
    odd = tmp_path / "odd" / "3"
    odd.mkdir(parents=True)
    Image.fromarray(crop.astype(np.uint16) * 257).save(odd / "deep.png")
    Image.fromarray(crop).convert("RGB").save(odd / "colour.png")
    Image.fromarray(crop).convert("CMYK").save(odd / "cmyk.tif")
    for name in ("plain", "odd"):
        args = ["--quiet", "embed", str(digits_run), str(tmp_path / name)]
        assert main([*args, "--out", str(tmp_path / f"{name}.npz")]) == 0
    assert "skipped" not in capsys.readouterr().err
    with np.load(tmp_path / "plain.npz") as plain, np.load(tmp_path / "odd.npz") as odd_rows:
        assert sorted(odd_rows["paths"]) == ["3/cmyk.tif", "3/colour.png", "3/deep.png"]
        for row in odd_rows["embeddings"]:
            np.testing.assert_allclose(row, plain["embeddings"][0], atol=0.02)
    shutil.rmtree(tmp_path / "odd")


@pytest.mark.parametrize("out", ["FOLDER", "PHOTO"])
def test_embed_never_writes_over_the_images(digits_run, faces, capsys, out):
    target = faces if out == "FOLDER" else faces / "0" / "0.png"
    before = fingerprint(faces)
    code = main(["--quiet", "embed", str(digits_run), str(faces), "--out", str(target)])
    one_line(capsys, code, "--out must end in .npz or .parquet")
    assert fingerprint(faces) == before
