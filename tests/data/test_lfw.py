"""LFW: pairs parsing on the real pairs.txt, the View 2 protocol on a tiny archive built from real
images, the decoded-image cache, and bad input."""

from __future__ import annotations

import os
import tarfile
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from marginface.data import load_dataset
from marginface.data.download import DataFilesMissingError
from marginface.data.lfw import read_lfw_pairs

MULTI = 6  # identities with >= 2 images taken from the real archive
SINGLE = 4  # identities with exactly 1 image


@pytest.fixture(scope="module")
def real_members(shared_file) -> dict[str, list[bytes]]:
    """The first few identities of the real archive: MULTI with 2 images, SINGLE with 1."""
    archive = shared_file("lfw", "lfw-deepfunneled.tar.gz")
    found: dict[str, list[bytes]] = defaultdict(list)
    with tarfile.open(archive) as tar:
        for member in tar:
            if member.isfile() and member.name.endswith(".jpg"):
                name = member.name.split("/")[-2]
                found[name].append(tar.extractfile(member).read())
            multi = [n for n, v in found.items() if len(v) >= 2]
            single = [n for n, v in found.items() if len(v) == 1]
            if len(multi) >= MULTI and len(single) >= SINGLE + 1:
                break
    multi = sorted(n for n, v in found.items() if len(v) >= 2)[:MULTI]
    single = sorted(n for n, v in found.items() if len(v) == 1)[:SINGLE]
    return {n: found[n][:2] for n in multi} | {n: found[n] for n in single}


@pytest.fixture(scope="module")
def tiny_lfw(tmp_path_factory, real_members) -> tuple[Path, list[str], list[str]]:
    """``<root>/lfw/lfw-deepfunneled.tgz`` + a 2-fold pairs.txt (2 same + 2 different per fold).

    Fold 0 uses identities M0, M1, S0, S1; fold 1 uses M2, M3, S2, S3; M4 and M5 are in no pair.
    """
    root = tmp_path_factory.mktemp("lfwdata")
    (root / "lfw").mkdir()
    with tarfile.open(root / "lfw" / "lfw-deepfunneled.tgz", "w:gz") as tar:
        for name, blobs in real_members.items():
            for number, blob in enumerate(blobs, start=1):
                path = root / "tmpimg.jpg"
                path.write_bytes(blob)
                tar.add(path, arcname=f"lfw-deepfunneled/{name}/{name}_{number:04d}.jpg")
    multi = sorted(n for n, v in real_members.items() if len(v) == 2)
    single = sorted(n for n, v in real_members.items() if len(v) == 1)
    lines = ["2\t2"]
    for fold in range(2):
        m_a, m_b = multi[2 * fold], multi[2 * fold + 1]
        s_a, s_b = single[2 * fold], single[2 * fold + 1]
        lines += [f"{m_a}\t1\t2", f"{m_b}\t1\t2", f"{m_a}\t1\t{s_a}\t1", f"{m_b}\t2\t{s_b}\t1"]
    (root / "lfw" / "pairs.txt").write_text("\n".join(lines) + "\n")
    return root, multi, single


def _load(root: Path, cache: Path, **options):
    options = {"download": False, "image_size": 32, "cache_dir": cache, **options}
    return load_dataset("lfw", data_dir=root, **options)


def test_real_pairs_file(shared_file):
    pairs = read_lfw_pairs(shared_file("lfw", "pairs.txt"))
    assert len(pairs) == 6000
    assert [sum(p.fold == k for p in pairs) for k in range(10)] == [600] * 10
    assert [sum(p.same for p in pairs if p.fold == k) for k in range(10)] == [300] * 10
    assert all(p.first[0] == p.second[0] for p in pairs if p.same)
    assert all(p.first[0] != p.second[0] for p in pairs if not p.same)
    identities = [
        {n for p in pairs if p.fold == k for n in (p.first[0], p.second[0])} for k in range(10)
    ]
    assert sum(len(s) for s in identities) == len(set().union(*identities))  # identity-disjoint
    assert pairs[0].first == ("Abel_Pacheco", 1) and pairs[0].second == ("Abel_Pacheco", 4)


def test_fold_protocol(tiny_lfw, tmp_path):
    root, multi, single = tiny_lfw
    bundle = _load(root, tmp_path, fold=0)
    assert bundle.open_set and bundle.name == "lfw"
    assert set(bundle.test.class_names) == {multi[0], multi[1], single[0], single[1]}
    assert len(bundle.test) == 6
    assert bundle.test.images.shape == (6, 3, 32, 32) and bundle.test.images.dtype == np.float32
    assert set(bundle.train.class_names) == {*multi[2:], single[2], single[3]}
    assert len(bundle.train) == 2 * 4 + 2
    assert not set(bundle.train.class_names) & set(bundle.test.class_names)
    assert bundle.train.labels.max() + 1 == bundle.train.num_classes == 6
    pairs = bundle.pairs
    assert len(pairs) == 4 and pairs.same.tolist() == [True, True, False, False]
    assert pairs.fold.tolist() == [0, 0, 0, 0]
    labels = bundle.test.labels
    same_by_label = labels[pairs.index[:, 0]] == labels[pairs.index[:, 1]]
    np.testing.assert_array_equal(same_by_label, pairs.same)
    # the first pair is M0 image 1 vs M0 image 2: distinct rows, same identity
    assert pairs.index[0, 0] != pairs.index[0, 1]


def test_exclude_all_pair_identities_and_all_folds(tiny_lfw, tmp_path):
    root, multi, _ = tiny_lfw
    strict = _load(root, tmp_path, fold=1, exclude_all_pair_identities=True)
    assert set(strict.train.class_names) == set(multi[4:])
    everything = _load(root, tmp_path, fold=None)
    assert len(everything.pairs) == 8 and len(everything.test) == 12
    assert everything.pairs.fold.tolist() == [0] * 4 + [1] * 4
    assert set(everything.train.class_names) == set(multi[4:])


def test_grey_crop_and_limit(tiny_lfw, tmp_path):
    root, _, _ = tiny_lfw
    bundle = _load(root, tmp_path, rgb=False, crop=None, image_size=16, limit=3, seed=1)
    assert bundle.train.images.shape == (3, 1, 16, 16)
    assert bundle.train.labels.max() + 1 == len(bundle.train.class_names)


def test_decoded_images_are_cached_and_invalidated(tiny_lfw, tmp_path):
    root, _, _ = tiny_lfw
    first = _load(root, tmp_path)
    cached = tmp_path / "lfw" / "lfw-deepfunneled_32px_crop150_rgb.npz"
    assert cached.exists()
    stamp = cached.stat().st_mtime_ns
    second = _load(root, tmp_path)
    np.testing.assert_array_equal(first.test.images, second.test.images)
    assert cached.stat().st_mtime_ns == stamp  # reused, not rewritten
    archive = root / "lfw" / "lfw-deepfunneled.tgz"
    info = archive.stat()
    os.utime(archive, ns=(info.st_atime_ns, info.st_mtime_ns + 10**9))
    try:
        _load(root, tmp_path)
        assert cached.stat().st_mtime_ns != stamp  # source changed: rebuilt
    finally:
        os.utime(archive, ns=(info.st_atime_ns, info.st_mtime_ns))
    assert [p.name for p in cached.parent.iterdir()] == [cached.name]  # no temporary left


def test_extracted_folder(tiny_lfw, tmp_path):
    root, _, _ = tiny_lfw
    data = tmp_path / "data"
    (data / "lfw").mkdir(parents=True)
    with tarfile.open(root / "lfw" / "lfw-deepfunneled.tgz") as tar:
        tar.extractall(data / "lfw", filter="data")
    (data / "lfw" / "pairs.txt").write_bytes((root / "lfw" / "pairs.txt").read_bytes())
    from_folder = _load(data, tmp_path / "cache", fold=0)
    from_tar = _load(root, tmp_path / "cache2", fold=0)
    np.testing.assert_array_equal(from_folder.test.images, from_tar.test.images)


@pytest.mark.parametrize(("fold", "error"), [(2, ValueError), (-1, ValueError), ("0", TypeError)])
def test_bad_fold(tiny_lfw, tmp_path, fold, error):
    root, _, _ = tiny_lfw
    with pytest.raises(error, match="fold must be"):
        _load(root, tmp_path, fold=fold)


def test_pair_naming_missing_image(tiny_lfw, tmp_path):
    root, multi, _ = tiny_lfw
    bad = tmp_path / "pairs.txt"
    bad.write_text(f"1\t1\n{multi[0]}\t1\t9\n{multi[0]}\t1\t{multi[1]}\t1\n")
    with pytest.raises(ValueError, match=r"_0009\.jpg is not in"):
        _load(root, tmp_path, pairs_file=bad)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("", "first line"),
        ("10 300\nA 1 2\n", "promises 10 folds"),
        ("1 1\nA 1\nA 1 B 2\n", r":2: expected 'name i j'"),
        ("1 1\nA 1 2\nA 1 B x\n", r":3: expected 'name1 i name2 j'"),
    ],
)
def test_malformed_pairs(tmp_path, text, match):
    path = tmp_path / "pairs.txt"
    path.write_text(text)
    with pytest.raises(ValueError, match=match):
        read_lfw_pairs(path)


def test_missing_archive(tmp_path):
    (tmp_path / "lfw").mkdir()
    (tmp_path / "lfw" / "pairs.txt").write_text("1 1\nA 1 2\nA 1 B 1\n")
    with pytest.raises(DataFilesMissingError, match=r"lfw-deepfunneled\.tgz"):
        load_dataset("lfw", data_dir=tmp_path, download=False, cache_dir=tmp_path / "c")


def test_corrupt_archive(tmp_path):
    (tmp_path / "lfw").mkdir()
    (tmp_path / "lfw" / "pairs.txt").write_text("1 1\nA 1 2\nA 1 B 1\n")
    (tmp_path / "lfw" / "lfw-deepfunneled.tgz").write_bytes(b"\x1f\x8b garbage")
    with pytest.raises(ValueError, match="not a readable LFW tar"):
        load_dataset("lfw", data_dir=tmp_path, download=False, cache_dir=tmp_path / "c")


@pytest.mark.slow
def test_full_lfw_fold_sizes(shared_file, shared_data, tmp_path):
    """Decodes all 13,233 images at 32 px (about a minute on 2 cores)."""
    shared_file("lfw", "lfw-deepfunneled.tar.gz")
    bundle = load_dataset(
        "lfw", data_dir=shared_data, download=False, image_size=32, cache_dir=tmp_path, fold=None
    )
    assert len(bundle.pairs) == 6000
    assert len(bundle.train) + len(bundle.test) <= 13233
    assert bundle.pairs.same.sum() == 3000


@pytest.mark.parametrize("damage", ["truncated", "not_npz", "foreign", "wrong_shape"])
def test_a_damaged_cache_is_decoded_again(tiny_lfw, tmp_path, caplog, damage):
    root, _, _ = tiny_lfw
    first = _load(root, tmp_path)
    cached = tmp_path / "lfw" / "lfw-deepfunneled_32px_crop150_rgb.npz"
    whole = cached.read_bytes()
    if damage == "truncated":
        cached.write_bytes(whole[: len(whole) // 2])
    elif damage == "not_npz":
        cached.write_text("not an archive")
    elif damage == "foreign":
        np.savez(cached, something=np.zeros(2))
    else:
        with np.load(cached) as stored:
            parts = dict(stored)
        parts["images"] = parts["images"][:, :, :16]
        np.savez(cached, **parts)
    caplog.set_level("WARNING", logger="marginface")
    again = _load(root, tmp_path)
    assert "damaged LFW cache" in caplog.text
    np.testing.assert_array_equal(again.test.images, first.test.images)
    assert cached.read_bytes() != b"not an archive" and cached.stat().st_size > 1000
