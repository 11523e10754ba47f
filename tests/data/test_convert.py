"""convert: a folder of real ORL faces to train.rec/train.idx/property read back by the dataset,
LFW pairs to a .bin equal to what load_lfw evaluates, the command-line glue, and failures that
leave nothing half-written."""

from __future__ import annotations

import argparse
import io
import pickle
import tarfile
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from marginface.cli.convert_command import run_convert
from marginface.cli.convert_options import add_convert_arguments
from marginface.data import load_dataset
from marginface.data.convert import convert_folder, convert_pairs
from marginface.data.imaging import decode_image
from marginface.data.insightface import InsightFaceDataset, load_verification_sets
from marginface.data.insightface_bin import load_verification_bin
from marginface.data.recordio import RecordReader

IDENTITIES, PER_IDENTITY = 4, 3
SIZE = 64


@pytest.fixture(scope="module")
def orl_folder(tmp_path_factory, shared_file) -> Path:
    """tmp/<identity>/<n>.{png,jpg,pgm}: IDENTITIES × PER_IDENTITY real ORL faces (112×92)."""
    root = tmp_path_factory.mktemp("orl") / "faces"
    with tarfile.open(shared_file("orl", "att_faces.tar")) as tar:
        for subject in range(IDENTITIES):
            folder = root / f"person_{subject:02d}"
            folder.mkdir(parents=True)
            for number in range(1, PER_IDENTITY + 1):
                data = tar.extractfile(f"att_faces/s{subject + 1}/{number}.pgm").read()
                image = Image.open(io.BytesIO(data))
                extension = ("png", "jpg", "pgm")[number % 3]
                image.save(folder / f"{number}.{extension}")
    return root


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="marginface convert")
    add_convert_arguments(parser)
    return parser


# ------------------------------------------------------------------ folders
def test_convert_folder_reads_back(orl_folder, tmp_path):
    out = tmp_path / "dataset"
    summary = convert_folder(orl_folder, out, image_size=SIZE, quality=95, workers=2)
    count = IDENTITIES * PER_IDENTITY
    assert (summary.num_images, summary.num_classes, summary.image_size) == (count, 4, SIZE)
    assert summary.class_names == tuple(f"person_{k:02d}" for k in range(IDENTITIES))
    assert sorted(p.name for p in out.iterdir()) == [
        "property",
        "train.convert.json",
        "train.idx",
        "train.rec",
    ]
    assert (out / "property").read_text() == f"{IDENTITIES},{SIZE},{SIZE}"

    records = RecordReader(out / "train.rec")
    assert sorted(records.keys.tolist()) == list(range(count + IDENTITIES + 1))
    assert records.read_header(0).label.tolist() == [count + 1, count + 1 + IDENTITIES]
    for label in range(IDENTITIES):
        identity = records.read_header(count + 1 + label)
        first = 1 + label * PER_IDENTITY
        assert identity.label.tolist() == [first, first + PER_IDENTITY]
        assert identity.id == count + 1 + label

    dataset = InsightFaceDataset(out, decoder="pillow")
    assert len(dataset) == count and dataset.num_classes == IDENTITIES
    assert dataset.image_size == (SIZE, SIZE)
    expected_labels = np.repeat(np.arange(IDENTITIES), PER_IDENTITY)
    assert dataset.labels().tolist() == expected_labels.tolist()
    sources = sorted(orl_folder.glob("*/*"))
    for index, source in enumerate(sources):
        stored, label = dataset.read_item(index)
        assert label == expected_labels[index]
        assert records.read_header(index + 1).id == index + 1
        original = decode_image(source, rgb=True, size=SIZE).astype(np.float64)
        difference = np.abs(stored.astype(np.float64) - original)
        assert difference.mean() < 2.0 and difference.max() < 48  # JPEG q95
        image, target = dataset[index]
        assert image.shape == (3, SIZE, SIZE) and int(target) == label


def test_convert_folder_failure_writes_nothing(orl_folder, tmp_path):
    source = tmp_path / "src"
    for path in sorted(orl_folder.glob("*/*"))[:6]:
        (source / path.parent.name).mkdir(parents=True, exist_ok=True)
        (source / path.parent.name / path.name).write_bytes(path.read_bytes())
    (source / "person_01" / "9_broken.jpg").write_bytes(b"\xff\xd8 not a jpeg")
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=r"9_broken\.jpg"):
        convert_folder(source, out, image_size=SIZE)
    assert not out.exists() or not any(out.iterdir())
    out.mkdir(exist_ok=True)
    (out / "train.rec").write_bytes(b"previous")
    (out / "lfw.bin").write_bytes(b"kept")
    with pytest.raises(ValueError, match=r"9_broken\.jpg"):
        convert_folder(source, out, image_size=SIZE)
    assert sorted(p.name for p in out.iterdir()) == ["lfw.bin", "train.rec"]
    assert (out / "train.rec").read_bytes() == b"previous"
    (source / "person_01" / "9_broken.jpg").unlink()
    convert_folder(source, out, image_size=SIZE)
    assert (out / "lfw.bin").read_bytes() == b"kept"  # other files are left alone
    assert len(InsightFaceDataset(out)) == 6


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"image_size": 0}, ValueError, "image_size"),
        ({"quality": 101}, ValueError, "quality must be in 1..100, got 101"),
        ({"quality": 9.5}, TypeError, "quality"),
        ({"crop": 0}, ValueError, "crop"),
        ({"workers": 0}, ValueError, "workers"),
    ],
)
def test_convert_folder_bad_options(orl_folder, tmp_path, options, error, match):
    with pytest.raises(error, match=match):
        convert_folder(orl_folder, tmp_path / "o", **options)
    with pytest.raises(ValueError, match="no images found"):
        convert_folder(tmp_path, tmp_path / "o")


# ------------------------------------------------------------------ LFW pairs
@pytest.fixture(scope="module")
def tiny_lfw(tmp_path_factory, shared_file) -> tuple[Path, Path]:
    """``root/lfw/lfw-deepfunneled/<Name>/<Name>_NNNN.jpg`` from the real archive (6 people with
    two images, 3 with one) and a 2-fold pairs file over them (one person in no pair)."""
    found: dict[str, list[bytes]] = defaultdict(list)
    with tarfile.open(shared_file("lfw", "lfw-deepfunneled.tar.gz")) as tar:
        for member in tar:
            if member.isfile() and member.name.endswith(".jpg"):
                found[member.name.split("/")[-2]].append(tar.extractfile(member).read())
            multi = [n for n, v in found.items() if len(v) >= 2]
            single = [n for n, v in found.items() if len(v) == 1]
            if len(multi) >= 6 and len(single) >= 4:
                break
    multi = sorted(n for n, v in found.items() if len(v) >= 2)[:6]
    single = sorted(n for n, v in found.items() if len(v) == 1)[:3]
    root = tmp_path_factory.mktemp("lfw")
    images = root / "lfw" / "lfw-deepfunneled"
    for name in multi + single:
        (images / name).mkdir(parents=True)
        for number, blob in enumerate(found[name][:2], start=1):
            (images / name / f"{name}_{number:04d}.jpg").write_bytes(blob)
    lines = ["2\t2"]
    for fold in range(2):
        a, b = multi[2 * fold], multi[2 * fold + 1]
        lines += [f"{a}\t1\t2", f"{b}\t2\t1", f"{a}\t2\t{single[fold]}\t1", f"{b}\t1\t{a}\t1"]
    pairs = root / "pairs.txt"
    pairs.write_text("\n".join(lines) + "\n")
    return root, pairs


def test_convert_pairs_equals_load_lfw(tiny_lfw, tmp_path):
    root, pairs = tiny_lfw
    images = root / "lfw" / "lfw-deepfunneled"
    summary = convert_pairs(pairs, images, tmp_path / "lfw.bin", image_size=112)
    assert (summary.num_pairs, summary.num_same, summary.image_size) == (8, 4, 112)
    raw = (tmp_path / "lfw.bin").read_bytes()
    assert raw[:2] == b"\x80\x02"  # pickle protocol 2, as insightface's sets
    bins, issame = pickle.loads(raw, encoding="bytes")
    assert len(bins) == 16 and all(isinstance(b, bytes) and b[:2] == b"\xff\xd8" for b in bins)
    assert issame == [True, True, False, False] * 2

    verification = load_verification_bin(tmp_path / "lfw.bin")
    bundle = load_dataset(
        "lfw",
        data_dir=root,
        download=False,
        pairs_file=pairs,
        fold=None,
        image_size=112,
        cache_dir=tmp_path / "cache",
    )
    assert bundle.pairs is not None
    assert verification.same.tolist() == bundle.pairs.same.tolist()
    reference = bundle.test.images * 255.0  # float32[N, 3, 112, 112] in [0, 255]
    stored = verification.images.astype(np.float32)
    for pair, (first, second) in enumerate(bundle.pairs.index):
        for image, row in ((stored[2 * pair], first), (stored[2 * pair + 1], second)):
            difference = np.abs(image - reference[row])
            assert difference.mean() < 2.0 and difference.max() < 48

    # the same pairs from the .tgz of the folder
    archive = tmp_path / "lfw-deepfunneled.tgz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(images, arcname="lfw-deepfunneled")
    convert_pairs(pairs, archive, tmp_path / "from_tar.bin", image_size=112)
    assert (tmp_path / "from_tar.bin").read_bytes() == raw
    convert_pairs(pairs, root / "lfw", tmp_path / "deeper.bin", image_size=112)  # one level up
    assert (tmp_path / "deeper.bin").read_bytes() == raw


def test_convert_pairs_missing_image(tiny_lfw, tmp_path):
    root, pairs = tiny_lfw
    lines = pairs.read_text().splitlines()
    lines[2] = "Nobody_Here\t1\t2"
    bad = tmp_path / "pairs.txt"
    bad.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out.bin"
    with pytest.raises(ValueError, match=r"pairs\.txt:3: image Nobody_Here/Nobody_Here_0001"):
        convert_pairs(bad, root / "lfw" / "lfw-deepfunneled", out)
    assert list(tmp_path.iterdir()) == [bad]
    with pytest.raises(FileNotFoundError, match="no_pairs.txt"):
        convert_pairs(tmp_path / "no_pairs.txt", root, out)
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(ValueError, match=r"empty\.txt: the first line"):
        convert_pairs(tmp_path / "empty.txt", root, out)
    (tmp_path / "empty.txt").unlink()
    with pytest.raises(FileNotFoundError, match="nowhere"):
        convert_pairs(pairs, tmp_path / "nowhere", out)
    (tmp_path / "fake.tgz").write_bytes(b"not a tar")
    with pytest.raises(ValueError, match="neither a folder nor a readable tar"):
        convert_pairs(pairs, tmp_path / "fake.tgz", out)


# ------------------------------------------------------------------ command line
def test_run_convert_both_modes(orl_folder, tiny_lfw, tmp_path):
    said: list[str] = []
    args = _parser().parse_args(
        [str(orl_folder), str(tmp_path / "ds"), "--image-size", "32", "--workers", "1"]
    )
    assert run_convert(args, echo=said.append) == 0
    assert InsightFaceDataset(tmp_path / "ds").image_size == (32, 32)
    assert "12 images of 4 identities, 32x32" in said[-1]

    root, pairs = tiny_lfw
    images = str(root / "lfw" / "lfw-deepfunneled")
    out = tmp_path / "ds" / "lfw.bin"
    args = _parser().parse_args([images, str(out), "--pairs", str(pairs), "--image-size", "32"])
    assert run_convert(args, echo=said.append) == 0
    assert "8 pairs (4 same), 32x32" in said[-1]
    sets = load_verification_sets(tmp_path / "ds")  # the .bin lives beside train.rec
    assert list(sets) == ["lfw"] and sets["lfw"].images.shape == (16, 3, 32, 32)
    args = _parser().parse_args([images, str(tmp_path), "--pairs", str(pairs)])
    with pytest.raises(ValueError, match="is a folder"):
        run_convert(args)
    args = _parser().parse_args([images, str(tmp_path / "b.bin"), "--pairs", str(pairs)])
    args.crop, args.image_size = 0, 16  # --crop 0: the whole image
    run_convert(args)
    assert load_verification_bin(tmp_path / "b.bin").images.shape == (16, 3, 16, 16)


def _photos(tmp_path, orl_folder):
    source = tmp_path / "src"
    for path in sorted(orl_folder.glob("*/*"))[:4]:
        (source / path.parent.name).mkdir(parents=True, exist_ok=True)
        (source / path.parent.name / path.name).write_bytes(path.read_bytes())
    return source


@pytest.mark.parametrize("where", ["same", "inside"])
def test_convert_refuses_an_output_inside_the_photos(orl_folder, tmp_path, where):
    source = _photos(tmp_path, orl_folder)
    before = sorted(p.relative_to(source) for p in source.rglob("*"))
    out = source if where == "same" else source / "records"
    with pytest.raises(ValueError, match="is the image folder or inside it"):
        convert_folder(source, out, image_size=SIZE)
    assert sorted(p.relative_to(source) for p in source.rglob("*")) == before


def test_convert_into_a_folder_holding_the_photos(orl_folder, tmp_path):
    source = _photos(tmp_path, orl_folder)
    assert convert_folder(source, tmp_path, image_size=SIZE).num_images == 4
    assert (tmp_path / "train.rec").is_file()
