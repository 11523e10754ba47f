"""Photos in, aligned faces out (marginface.data.face_photos): reading every kind of photo,
detecting, choosing a face, aligning a folder, the report, and the folders refused."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image
from tests._face_fixtures import lfw_jpegs, lfw_rgb, mtcnn_weights

from marginface.data.align import norm_crop
from marginface.data.face_photos import (
    PhotoError,
    align_photos,
    detect_photos,
    list_photos,
    read_photo,
    select_faces,
)
from marginface.detect import MTCNN, Faces

__all__ = ["lfw_jpegs", "lfw_rgb", "mtcnn_weights"]  # fixtures


@pytest.fixture(scope="module")
def detector(mtcnn_weights) -> MTCNN:
    return MTCNN()


def _save(image: np.ndarray, path, **options) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(image).save(path, **options)


# ------------------------------------------------------------------ reading photos
def test_jpeg_reads_as_opencv_decodes_it(lfw_jpegs, lfw_rgb, tmp_path):
    path = tmp_path / "a.jpg"
    path.write_bytes(next(iter(lfw_jpegs.values())))
    image = read_photo(path)
    assert image.dtype == np.uint8 and image.shape == (250, 250, 3)
    # two JPEG decoders (libjpeg builds) may round the IDCT differently by a grey level
    assert np.abs(image.astype(int) - lfw_rgb[0]).max() <= 2


def test_grey_16bit_cmyk_rgba_palette(lfw_rgb, tmp_path):
    grey = lfw_rgb[0].mean(axis=2).astype(np.uint8)
    _save(grey, tmp_path / "grey.png")
    assert np.array_equal(read_photo(tmp_path / "grey.png"), np.repeat(grey[:, :, None], 3, 2))
    wide = grey.astype(np.uint16) * 257  # 8-bit values on the 16-bit scale
    Image.fromarray(wide).save(tmp_path / "wide.png")
    assert Image.open(tmp_path / "wide.png").mode.startswith("I")
    assert np.array_equal(read_photo(tmp_path / "wide.png"), np.repeat(grey[:, :, None], 3, 2))
    Image.fromarray(lfw_rgb[0]).convert("CMYK").save(tmp_path / "cmyk.jpg", quality=98)
    cmyk = read_photo(tmp_path / "cmyk.jpg")
    assert cmyk.shape == (250, 250, 3)
    assert np.abs(cmyk.astype(int) - lfw_rgb[0]).mean() < 3
    rgba = np.concatenate([lfw_rgb[0], np.full((250, 250, 1), 9, np.uint8)], axis=2)
    _save(rgba, tmp_path / "rgba.png")
    assert np.array_equal(read_photo(tmp_path / "rgba.png"), lfw_rgb[0])
    Image.fromarray(lfw_rgb[0]).convert("P").save(tmp_path / "palette.png")
    assert read_photo(tmp_path / "palette.png").shape == (250, 250, 3)


def test_exif_orientation_is_applied(lfw_rgb, detector, tmp_path):
    # stored turned a quarter counter-clockwise, tagged 6 ("rotate 90° clockwise to view")
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray(np.rot90(lfw_rgb[0]).copy()).save(
        tmp_path / "turned.jpg", quality=98, exif=exif
    )
    upright = read_photo(tmp_path / "turned.jpg")
    assert upright.shape == (250, 250, 3)
    assert np.abs(upright.astype(int) - lfw_rgb[0]).mean() < 3
    found, expected = detector.detect(upright)[0], detector.detect(lfw_rgb[0])[0]
    assert np.abs(found.landmarks[0] - expected.landmarks[0]).max() < 2


def test_unreadable_photos_name_the_file(lfw_jpegs, tmp_path):
    blob = next(iter(lfw_jpegs.values()))
    (tmp_path / "half.jpg").write_bytes(blob[: len(blob) // 2])
    (tmp_path / "text.jpg").write_text("not a photo")
    for name in ("half.jpg", "text.jpg", "absent.jpg"):
        with pytest.raises(PhotoError, match=rf"{name}: not a readable image") as info:
            read_photo(tmp_path / name)
        assert "\n" not in str(info.value)


# ------------------------------------------------------------------ choosing a face
def test_select_faces_by_hand():
    boxes = np.array([[0, 0, 50, 50], [90, 90, 110, 110], [0, 150, 60, 220]], np.float32)
    faces = Faces(boxes, np.array([0.99, 0.95, 0.9], np.float32), np.zeros((3, 5, 2), np.float32))
    assert select_faces(faces, (200, 200, 3), "largest") == [2]  # 60 x 70
    assert select_faces(faces, (200, 200, 3), "central") == [1]  # centre (100, 100)
    assert select_faces(faces, (200, 200, 3), "all") == [0, 1, 2]
    assert select_faces(Faces.empty(), (200, 200, 3), "largest") == []
    with pytest.raises(ValueError, match="faces must be one of"):
        select_faces(faces, (200, 200, 3), "best")


# ------------------------------------------------------------------ a folder
@pytest.fixture
def photo_folder(lfw_jpegs, lfw_rgb, tmp_path):
    """Two identities of real photos, a blank photo, a truncated one, and two faces side by
    side (the smaller one on the right)."""
    src = tmp_path / "photos"
    names = list(lfw_jpegs)[:3]
    for name in names:
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(lfw_jpegs[name])
    _save(np.full((200, 200, 3), 120, np.uint8), src / "nobody" / "blank.png")
    (src / "nobody" / "broken.jpg").write_bytes(lfw_jpegs[names[0]][:3000])
    small = np.asarray(Image.fromarray(lfw_rgb[4]).resize((170, 170), Image.BILINEAR))
    pair = np.zeros((250, 540, 3), np.uint8)  # centre x = 270
    pair[:, :250] = lfw_rgb[3]  # face near x = 125
    pair[40:210, 270:440] = small  # face near x = 355: smaller, nearer the centre
    _save(pair, src / "pair" / "two.png")
    return src, names


def test_align_photos_writes_each_main_face_and_lists_the_rest(photo_folder, detector, tmp_path):
    src, names = photo_folder
    out = tmp_path / "aligned"
    seen = []
    result = align_photos(src, out, detector=detector, progress=lambda d, t: seen.append((d, t)))
    assert result.photos == 6 and seen[-1] == (6, 6)
    assert result.no_face == ["nobody/blank.png"] and result.unreadable == ["nobody/broken.jpg"]
    assert "pair/two.png" in result.several_faces and result.written == 4
    for name in [*names, "pair/two.png"]:
        image = read_photo(src / name)
        faces = detector.detect(image)[0]
        k = select_faces(faces, image.shape, "largest")[0]
        expected = norm_crop(image, faces.landmarks[k])
        written = read_photo(out / name)
        if name.endswith(".png"):
            assert np.array_equal(written, expected)
        else:  # JPEG re-encoded
            assert np.abs(written.astype(int) - expected).mean() < 3
    assert not (out / "nobody").exists()
    report = result.report.read_text().splitlines()
    assert result.report == tmp_path / "aligned.report.tsv"
    assert report[0] == "name\tproblem\tdetail"
    assert any(line.startswith("nobody/blank.png\tno_face") for line in report)
    assert any(line.startswith("nobody/broken.jpg\tunreadable\t") for line in report)
    assert any(line.startswith("pair/two.png\tseveral_faces\t2 faces") for line in report)


def test_all_faces_and_the_central_one(photo_folder, detector, tmp_path):
    src, _ = photo_folder
    every = align_photos(src / "pair", tmp_path / "all", detector=detector, faces="all")
    assert sorted(p.name for p in (tmp_path / "all").iterdir()) == ["two_0.png", "two_1.png"]
    assert every.written == 2
    align_photos(src / "pair", tmp_path / "central", detector=detector, faces="central")
    align_photos(src / "pair", tmp_path / "largest", detector=detector, faces="largest")
    central = read_photo(tmp_path / "central" / "two.png")
    largest = read_photo(tmp_path / "largest" / "two.png")
    assert not np.array_equal(central, largest)  # the left face is larger, the right central
    matches = [
        np.array_equal(central, read_photo(tmp_path / "all" / n))
        for n in ("two_0.png", "two_1.png")
    ]
    assert sum(matches) == 1


@pytest.mark.parametrize("where", ["same", "inside", "around"])
def test_output_inside_the_photos_is_refused(photo_folder, tmp_path, where):
    src, _ = photo_folder
    out = {"same": src, "inside": src / "aligned", "around": tmp_path}[where]
    with pytest.raises(ValueError, match="must not be, or contain, each other"):
        align_photos(src, out, detector="mtcnn")
    assert not (src / "aligned").exists()


def test_bad_options_before_any_work(photo_folder, tmp_path):
    src, _ = photo_folder
    with pytest.raises(ValueError, match="faces must be one of"):
        align_photos(src, tmp_path / "o", faces="best")
    with pytest.raises(ValueError, match="image_size must be a multiple of 112 or 128"):
        align_photos(src, tmp_path / "o", image_size=100)
    with pytest.raises(FileNotFoundError, match="no photo or folder"):
        align_photos(tmp_path / "absent", tmp_path / "o")
    with pytest.raises(FileNotFoundError, match=r"no ONNX detector at .*det_10g\.onnx"):
        align_photos(src, tmp_path / "o", detector=tmp_path / "det_10g.onnx")
    assert not (tmp_path / "o").exists()
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no images"):
        list_photos(tmp_path / "empty")


def test_detect_photos_yields_every_photo_in_order(photo_folder, detector):
    src, _ = photo_folder
    photos = list_photos(src)
    results = list(detect_photos(photos, detector, workers=2))
    assert [name for name, _, _ in results] == [name for _, name in photos]
    kinds = {name: found for name, _, found in results}
    assert isinstance(kinds["nobody/broken.jpg"], PhotoError)
    assert kinds["nobody/blank.png"].count == 0 and kinds["pair/two.png"].count == 2
