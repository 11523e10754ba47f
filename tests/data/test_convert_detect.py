"""``convert --detector``: training folders and verification pairs detected and aligned the same
way (marginface.data.convert with marginface.data.face_photos), the report of photos without a face,
and the options refused."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image
from tests._face_fixtures import lfw_jpegs, mtcnn_weights

from marginface.cli import main
from marginface.data.align import norm_crop
from marginface.data.convert import convert_folder, convert_pairs
from marginface.data.face_photos import read_photo, select_faces
from marginface.data.insightface import InsightFaceDataset
from marginface.data.insightface_bin import load_verification_bin
from marginface.detect import MTCNN

__all__ = ["lfw_jpegs", "mtcnn_weights"]  # fixtures


@pytest.fixture(scope="module")
def detector(mtcnn_weights) -> MTCNN:
    return MTCNN()


@pytest.fixture
def photos(lfw_jpegs, mtcnn_weights, tmp_path):
    """LFW's layout: ``<Name>/<Name>_NNNN.jpg``, the first 4 photos, plus a blank one."""
    src = tmp_path / "lfw"
    names = list(lfw_jpegs)[:4]
    for name in names:
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(lfw_jpegs[name])
    (src / "Nobody").mkdir()
    Image.new("RGB", (250, 250), (120, 120, 120)).save(src / "Nobody" / "Nobody_0001.jpg")
    return src, names


def _aligned(path, detector, alignment="float64"):
    image = read_photo(path)
    faces = detector.detect(image)[0]
    k = select_faces(faces, image.shape, "largest")[0]
    return norm_crop(image, faces.landmarks[k], alignment=alignment)


def test_a_training_folder_is_aligned_like_align(photos, detector, tmp_path):
    src, names = photos
    result = convert_folder(src, tmp_path / "rec", detector="mtcnn", alignment="insightface")
    assert result.num_images == 4 and result.num_classes == len({n.split("/")[0] for n in names})
    assert "Nobody" not in result.class_names  # no face: left out, and listed
    assert "Nobody/Nobody_0001.jpg\tno_face" in result.report.read_text()
    dataset = InsightFaceDataset(tmp_path / "rec", decoder="pillow")
    for index, name in enumerate(sorted(names)):
        stored, _ = dataset.read_item(index)
        expected = _aligned(src / name, detector, "insightface")
        assert stored.shape == (112, 112, 3)
        assert np.abs(stored.astype(int) - expected).mean() < 2.5  # one JPEG encoding
    assert not list(tmp_path.glob(".rec-aligning-*"))  # the temporary folder is gone


def test_pairs_are_aligned_the_same_way(photos, detector, tmp_path):
    src, names = photos
    first, second = (n.split("/")[0] for n in names[:2])
    pairs = tmp_path / "pairs.txt"  # one fold: a same pair, then a different pair
    pairs.write_text(f"1\t1\n{first}\t1\t1\n{second}\t1\tNobody\t1\n")
    result = convert_pairs(pairs, src, tmp_path / "p.bin", detector="mtcnn", workers=1)
    assert result.num_pairs == 2 and result.report.name == "p.bin.report.tsv"
    assert "Nobody_0001.jpg\tno_face" in result.report.read_text()
    stored = load_verification_bin(tmp_path / "p.bin").images.transpose(0, 2, 3, 1)
    for index, name in ((0, names[0]), (1, names[0]), (2, names[1])):
        expected = _aligned(src / name, detector)
        assert np.abs(stored[index].astype(int) - expected).mean() < 2.5
    assert stored[3].std() < 2  # the blank photo: its centre crop, kept so the pair stays


def test_pairs_are_cut_as_a_model_takes_them(photos, detector, tmp_path):
    """``face_crop="dlib-chip"`` (what ``evaluate --backbone dlib-resnet-v1 --pairs`` passes):
    dlib chips of 150 px, as cut_face cuts them."""
    from marginface.data.face_crops import cut_face

    src, names = photos
    first, second = (n.split("/")[0] for n in names[:2])
    pairs = tmp_path / "pairs.txt"
    pairs.write_text(f"1\t1\n{first}\t1\t1\n{second}\t1\tNobody\t1\n")
    out = tmp_path / "chips.bin"
    convert_pairs(
        pairs, src, out, image_size=150, detector="mtcnn", face_crop="dlib-chip", workers=1
    )
    stored = load_verification_bin(out).images.transpose(0, 2, 3, 1)
    assert stored.shape[1:] == (150, 150, 3)
    image = read_photo(src / names[0])
    faces = detector.detect(image)[0]
    k = select_faces(faces, image.shape, "subject")[0]
    chip = cut_face(image, faces.landmarks[k], faces.boxes[k], crop="dlib-chip", size=150)
    assert np.abs(stored[0].astype(int) - chip).mean() < 2.5  # one JPEG encoding
    with pytest.raises(ValueError, match="face_crop"):
        convert_pairs(pairs, src, out, detector="mtcnn", face_crop="square", workers=1)


def test_command_line(photos, tmp_path, capsys):
    src, _ = photos
    assert main(["convert", str(src), str(tmp_path / "rec"), "--detector", "mtcnn"]) == 0
    assert "photos left out or with several faces" in capsys.readouterr().out
    argv = ["convert", str(src), str(tmp_path / "p.bin"), "--pairs", str(tmp_path / "x.txt")]
    (tmp_path / "x.txt").write_text("1\t1\nA\t1\t2\nA\t1\tB\t1\n")
    assert main([*argv, "--detector", "mtcnn", "--faces", "all"]) == 2
    err = capsys.readouterr().err
    assert "faces must be one of 'subject', 'largest', 'central'" in err and "Traceback" not in err
    assert main(["convert", str(src), str(tmp_path / "r2"), "--detector", "mtcnn",
                 "--crop", "100"]) == 2  # fmt: skip
    assert "--crop and --detector" in capsys.readouterr().err
    assert not (tmp_path / "r2").exists() and not (tmp_path / "p.bin").exists()


def test_train_says_when_the_sets_are_framed_differently(photos, tmp_path, caplog):
    from marginface.data.framing import read_framing
    from marginface.data.insightface import load_insightface

    src, names = photos
    out = tmp_path / "set"
    convert_folder(src, out, detector="mtcnn")
    record = read_framing(out / "train.rec")
    assert record["detector"] == "mtcnn, subject face, float64 alignment"  # the default
    assert record["crop"] is None
    first = names[0].split("/")[0]
    pairs = tmp_path / "pairs.txt"
    pairs.write_text(f"1\t1\n{first}\t1\t1\n{first}\t1\tNobody\t1\n")
    convert_pairs(pairs, src, out / "lfw.bin", workers=1)  # centre crops
    assert "detector" not in read_framing(out / "lfw.bin")
    with caplog.at_level("WARNING", logger="marginface"):
        load_insightface(out)
    assert "lfw.bin was converted with --crop 150, train.rec with --detector (mtcnn" in caplog.text
    caplog.clear()
    convert_pairs(pairs, src, out / "lfw.bin", detector="mtcnn", workers=1)
    with caplog.at_level("WARNING", logger="marginface"):
        load_insightface(out)
    assert "converted with" not in caplog.text  # aligned the same way: nothing to say
