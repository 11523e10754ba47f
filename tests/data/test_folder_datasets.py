"""Folder, Omniglot, ORL and Extended Yale B loaders: real archives and bad input."""

from __future__ import annotations

import zipfile

import numpy as np
import pytest
from PIL import Image

from marginface.data import load_dataset
from marginface.data.download import DataFilesMissingError


def _write_folder(root, identities=4, per_identity=3, size=(20, 16), mode="L"):
    rng = np.random.default_rng(0)
    for k in range(identities):
        folder = root / f"person{k}"
        folder.mkdir(parents=True)
        for i in range(per_identity):
            shape = (size[1], size[0]) if mode == "L" else (size[1], size[0], 3)
            pixels = rng.integers(0, 256, shape, dtype=np.uint8)
            Image.fromarray(pixels, mode=mode).save(folder / f"{i}.png")
    (root / "person0" / "notes.txt").write_text("not an image")
    (root / "person0" / ".hidden.png").write_bytes(b"")
    return root


def test_folder_closed_split(tmp_path):
    root = _write_folder(tmp_path / "faces")
    bundle = load_dataset("folder", root=root, test_fraction=0.34)
    assert bundle.train.class_names == ("person0", "person1", "person2", "person3")
    assert len(bundle.train) == 8 and len(bundle.test) == 4 and not bundle.open_set
    assert bundle.train.images.shape[1:] == (1, 16, 20)  # native size, grey
    assert bundle.pairs is None


def test_folder_values_match_pillow(tmp_path):
    root = _write_folder(tmp_path / "faces", identities=2, per_identity=2)
    bundle = load_dataset("folder", data_dir=root, test_fraction=0.5, seed=0)
    expected = {
        tuple(np.asarray(Image.open(p), np.float32).ravel()[:8] / 255)
        for p in sorted(root.rglob("*.png"))
        if not p.name.startswith(".")
    }
    got = {
        tuple(img.ravel()[:8]) for img in np.concatenate([bundle.train.images, bundle.test.images])
    }
    assert got == expected


def test_folder_open_rgb_resized(tmp_path):
    root = _write_folder(tmp_path / "faces", identities=6, mode="RGB")
    bundle = load_dataset(
        "folder", root=root, rgb=True, image_size=8, split="open", test_fraction=0.5, num_pairs=10
    )
    assert bundle.open_set and bundle.train.images.shape[1:] == (3, 8, 8)
    assert not set(bundle.train.class_names) & set(bundle.test.class_names)
    assert len(bundle.pairs) == 10 and bundle.pairs.same.sum() == 5


def test_folder_min_images_per_identity(tmp_path):
    root = _write_folder(tmp_path / "faces", identities=3, per_identity=2)
    (root / "person0" / "0.png").unlink()
    bundle = load_dataset("folder", root=root, min_images_per_identity=2)
    assert bundle.train.class_names == ("person1", "person2")


def test_folder_empty_and_missing(tmp_path):
    (tmp_path / "empty" / "someone").mkdir(parents=True)
    with pytest.raises(ValueError, match="no images found"):
        load_dataset("folder", root=tmp_path / "empty")
    with pytest.raises(ValueError, match="does not exist"):
        load_dataset("folder", root=tmp_path / "absent")
    with pytest.raises(ValueError, match="root="):
        load_dataset("folder")


def test_folder_corrupt_image(tmp_path):
    root = _write_folder(tmp_path / "faces", identities=2)
    (root / "person1" / "1.png").write_bytes(b"\x89PNG broken")
    with pytest.raises(ValueError, match=r"cannot decode image .*1\.png"):
        load_dataset("folder", root=root)


def test_omniglot_real(shared_file, shared_data):
    shared_file("omniglot", "images_background_small2.zip")
    bundle = load_dataset("omniglot", data_dir=shared_data, num_pairs=200)
    assert bundle.open_set
    assert bundle.train.images.shape == (2720, 1, 28, 28) and bundle.train.num_classes == 136
    # evaluation: small2's characters minus Greek and Latin (also in small1) = 47 + 42 + 17
    assert bundle.test.images.shape == (2120, 1, 28, 28) and bundle.test.num_classes == 106
    alphabets = {name.split("/")[0] for name in bundle.test.class_names}
    assert alphabets == {"Japanese_(katakana)", "Sanskrit", "Tagalog"}
    # inverted: background dark, strokes bright
    assert bundle.train.images.mean() < 0.2 and bundle.train.images.max() == 1.0
    assert len(bundle.pairs) == 200


def test_omniglot_other_direction_and_size(shared_file, shared_data):
    shared_file("omniglot", "images_background_small1.zip")
    bundle = load_dataset(
        "omniglot", data_dir=shared_data, train_set="small2", image_size=14, limit=100
    )
    assert bundle.train.images.shape == (100, 1, 14, 14)
    alphabets = {name.split("/")[0] for name in bundle.test.class_names}
    assert alphabets == {"Balinese", "Early_Aramaic", "Korean"}


def test_omniglot_bad_input(tmp_path):
    with pytest.raises(ValueError, match="train_set"):
        load_dataset("omniglot", data_dir=tmp_path, train_set="small3")
    with pytest.raises(DataFilesMissingError, match="images_background_small1"):
        load_dataset("omniglot", data_dir=tmp_path, download=False)
    (tmp_path / "omniglot").mkdir()
    for n in (1, 2):
        (tmp_path / "omniglot" / f"images_background_small{n}.zip").write_bytes(b"PK garbage")
    with pytest.raises(ValueError, match="not a readable Omniglot zip"):
        load_dataset("omniglot", data_dir=tmp_path, download=False)
    for n in (1, 2):
        with zipfile.ZipFile(tmp_path / "omniglot" / f"images_background_small{n}.zip", "w") as z:
            z.writestr("readme.txt", "x")
    with pytest.raises(ValueError, match="no <set>/<alphabet>"):
        load_dataset("omniglot", data_dir=tmp_path, download=False)


def test_orl_real(shared_file, shared_data):
    shared_file("orl", "att_faces.tar")
    bundle = load_dataset("orl", data_dir=shared_data)
    assert bundle.train.images.shape == (280, 1, 112, 92)
    assert bundle.test.images.shape == (120, 1, 112, 92)
    assert np.bincount(bundle.test.labels).tolist() == [3] * 40
    assert set(bundle.train.class_names) == {f"s{k}" for k in range(1, 41)}
    square = load_dataset("orl", data_dir=shared_data, image_size=24, split="open", num_pairs=100)
    assert square.open_set and square.train.images.shape[1:] == (1, 24, 24)


def test_yaleb_real(shared_file, shared_data):
    shared_file("yaleb", "CroppedYale.tar.gz")
    bundle = load_dataset("yaleb", data_dir=shared_data, image_size=16)
    assert len(bundle.train) + len(bundle.test) == 2414  # 2432 minus 18 marked .bad
    assert bundle.train.num_classes == 38 and bundle.train.images.shape[1:] == (1, 16, 16)
    assert "yaleB14" not in bundle.train.class_names


@pytest.mark.parametrize("name", ["orl", "yaleb"])
def test_face_archives_missing_or_corrupt(tmp_path, name):
    with pytest.raises(DataFilesMissingError, match=rf"(?s)no public mirror.*{name}"):
        load_dataset(name, data_dir=tmp_path)
    archive = {"orl": "att_faces.tar", "yaleb": "CroppedYale.tar.gz"}[name]
    (tmp_path / name).mkdir()
    (tmp_path / name / archive).write_bytes(b"garbage" * 100)
    with pytest.raises(ValueError, match="not a readable tar"):
        load_dataset(name, data_dir=tmp_path)
    with pytest.raises(ValueError, match="split"):
        load_dataset(name, data_dir=tmp_path, split="random")


def test_orl_extracted_folder_matches_tar(shared_file, shared_data, tmp_path):
    import tarfile

    with tarfile.open(shared_file("orl", "att_faces.tar")) as tar:
        tar.extractall(tmp_path / "orl", filter="data")
    from_folder = load_dataset("orl", data_dir=tmp_path, image_size=16)
    from_tar = load_dataset("orl", data_dir=shared_data, image_size=16)
    np.testing.assert_array_equal(from_folder.train.images, from_tar.train.images)
    np.testing.assert_array_equal(from_folder.test.labels, from_tar.test.labels)
