"""insightface datasets without MXNet: train.rec/train.idx/property written by an independent
writer in this test (face2rec2's layout and im2rec's) over real ORL faces, the Dataset's items,
flips and DataLoader workers, bad records, and the .bin verification sets of a folder."""

from __future__ import annotations

import io
import pickle
import struct
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

from marginface.data.insightface import (
    InsightFaceDataset,
    decode_rgb,
    default_decoder,
    load_verification_sets,
    read_property,
)
from marginface.data.recordio import RecordFormatError
from marginface.data.safe_pickle import UnsafePickleError

MAGIC = 0xCED7230A
IDENTITIES, PER_IDENTITY = 3, 3
HEIGHT, WIDTH = 112, 92  # ORL's size: a non-square property

try:
    import simplejpeg  # noqa: F401

    DECODERS = ["pillow", "simplejpeg"]
except ImportError:
    DECODERS = ["pillow"]


# ------------------------------------------------------------------ the independent writer
def frame(payload: bytes) -> bytes:
    assert struct.pack("<I", MAGIC) not in payload[: len(payload) // 4 * 4 : 4]
    return struct.pack("<II", MAGIC, len(payload)) + payload + b"\0" * (-len(payload) % 4)


def header(flag: int, label: float, key: int, labels: tuple[float, ...] = ()) -> bytes:
    return struct.pack("<IfQQ", flag, label, key, 0) + struct.pack(f"<{len(labels)}f", *labels)


def write_dataset(folder: Path, records: dict[int, bytes], num_classes: int) -> Path:
    """records: key -> payload, written in dict order; plus train.idx and property."""
    folder.mkdir(parents=True, exist_ok=True)
    rec, lines = bytearray(), []
    for key, payload in records.items():
        lines.append(f"{key}\t{len(rec)}\n")
        rec += frame(payload)
    (folder / "train.rec").write_bytes(bytes(rec))
    (folder / "train.idx").write_text("".join(lines))
    (folder / "property").write_text(f"{num_classes},{HEIGHT},{WIDTH}")
    return folder


def jpeg(image: np.ndarray, quality: int = 90) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="JPEG", quality=quality)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def faces(shared_file) -> list[tuple[int, bytes]]:
    """(class, RGB JPEG bytes) of IDENTITIES × PER_IDENTITY real ORL faces (112×92)."""
    archive = shared_file("orl", "att_faces.tar")
    out = []
    with tarfile.open(archive) as tar:
        for label in range(IDENTITIES):
            for number in range(1, PER_IDENTITY + 1):
                data = tar.extractfile(f"att_faces/s{label + 1}/{number}.pgm").read()
                grey = np.asarray(Image.open(io.BytesIO(data)).convert("L"))
                rgb = np.stack([grey, np.roll(grey, 3, axis=1), grey[::-1]], axis=-1)
                out.append((label, jpeg(np.ascontiguousarray(rgb))))
    return out


def face2rec_records(faces: list[tuple[int, bytes]]) -> dict[int, bytes]:
    """insightface face2rec2's layout and order: images 1..N (flag 2: [class, aligned]), then the
    header record 0 ([N+1, N+1+K]), then one record per identity ([first, last + 1])."""
    count = len(faces)
    records = {
        key: header(2, 0.0, key, (float(label), 1.0)) + data
        for key, (label, data) in enumerate(faces, start=1)
    }
    records[0] = header(2, 0.0, 0, (count + 1.0, count + 1.0 + IDENTITIES))
    for label in range(IDENTITIES):
        first = 1 + label * PER_IDENTITY
        key = count + 1 + label
        records[key] = header(2, 0.0, key, (float(first), float(first + PER_IDENTITY)))
    return records


@pytest.fixture
def face2rec(tmp_path, faces) -> Path:
    return write_dataset(tmp_path / "face2rec", face2rec_records(faces), IDENTITIES)


def expected_image(data: bytes) -> torch.Tensor:
    decoded = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"), dtype=np.float32)
    return torch.from_numpy(decoded.transpose(2, 0, 1) / 127.5 - 1.0)


# ------------------------------------------------------------------ reading
@pytest.mark.parametrize("decoder", DECODERS)
def test_face2rec_layout(face2rec, faces, decoder):
    dataset = InsightFaceDataset(face2rec, decoder=decoder)
    assert dataset.decoder == decoder
    assert len(dataset) == len(faces) and dataset.num_classes == IDENTITIES
    assert dataset.image_size == (HEIGHT, WIDTH)
    assert dataset.keys.tolist() == list(range(1, len(faces) + 1))  # identity records excluded
    assert dataset.labels().tolist() == [label for label, _ in faces]
    for index, (label, data) in enumerate(faces):
        image, target = dataset[index]
        assert image.dtype == torch.float32 and image.shape == (3, HEIGHT, WIDTH)
        assert target.dtype == torch.int64 and target.ndim == 0 and int(target) == label
        assert float(image.min()) >= -1.0 and float(image.max()) <= 1.0
        tolerance = 0.0 if decoder == "pillow" else 2.0 / 127.5
        torch.testing.assert_close(image, expected_image(data), rtol=0, atol=tolerance + 1e-6)
    assert torch.equal(dataset[-1][0], dataset[len(faces) - 1][0])
    with pytest.raises(IndexError):
        dataset[len(faces)]
    assert "images=9" in repr(dataset)


def test_im2rec_layout_every_key_is_an_image(tmp_path, faces):
    records = {key: header(0, float(label), key) + data for key, (label, data) in enumerate(faces)}
    dataset = InsightFaceDataset(write_dataset(tmp_path / "im2rec", records, IDENTITIES))
    assert dataset.keys.tolist() == list(range(len(faces)))
    assert dataset.labels().tolist() == [label for label, _ in faces]
    torch.testing.assert_close(dataset[4][0], expected_image(faces[4][1]), rtol=0, atol=1e-6)


def test_decoders_agree(faces):
    data = faces[0][1]
    reference = decode_rgb(data, "pillow")
    assert reference.shape == (HEIGHT, WIDTH, 3) and reference.dtype == np.uint8
    for decoder in DECODERS:
        assert np.abs(decode_rgb(data, decoder).astype(int) - reference).max() <= 2
    png = io.BytesIO()
    Image.fromarray(reference).save(png, format="PNG")
    for decoder in DECODERS:  # PNG goes to Pillow whatever the decoder
        assert np.array_equal(decode_rgb(png.getvalue(), decoder), reference)
    assert default_decoder() == DECODERS[-1]


def test_flips_are_seeded_and_worker_independent(face2rec, faces):
    plain = InsightFaceDataset(face2rec, decoder="pillow")
    flipping = InsightFaceDataset(face2rec, flip=True, seed=3, decoder="pillow")
    again = InsightFaceDataset(face2rec, flip=True, seed=3, decoder="pillow")

    def pattern(dataset: InsightFaceDataset) -> list[bool]:
        flags = []
        for index in range(len(dataset)):
            image, reference = dataset[index][0], plain[index][0]
            mirrored = torch.equal(image, reference.flip(-1))
            assert mirrored or torch.equal(image, reference)
            flags.append(mirrored)
        return flags

    first = pattern(flipping)
    assert first == pattern(again)
    patterns = {tuple(first)}
    for epoch in range(1, 6):
        flipping.set_epoch(epoch)
        patterns.add(tuple(pattern(flipping)))
    assert len(patterns) > 1  # the epoch changes the flips
    counts = [sum(p) for p in patterns]
    assert 0 < sum(counts) < len(faces) * len(patterns)

    flipping.set_epoch(2)
    single = torch.cat([batch[0] for batch in DataLoader(flipping, batch_size=4, num_workers=0)])
    loader = DataLoader(flipping, batch_size=4, num_workers=2, multiprocessing_context="fork")
    batches = list(loader)
    assert torch.equal(torch.cat([b[0] for b in batches]), single)
    assert torch.cat([b[1] for b in batches]).tolist() == [label for label, _ in faces]

    unseeded = InsightFaceDataset(face2rec, flip=1.0, seed=None, decoder="pillow")
    assert torch.equal(unseeded[0][0], plain[0][0].flip(-1))  # p = 1: always mirrored
    with pytest.raises(ValueError, match="flip must be"):
        InsightFaceDataset(face2rec, flip=1.5)
    with pytest.raises(TypeError, match="seed must be"):
        InsightFaceDataset(face2rec, seed="0")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="decoder must be one of"):
        InsightFaceDataset(face2rec, decoder="opencv")


# ------------------------------------------------------------------ bad input
def test_label_outside_property(tmp_path, faces):
    records = face2rec_records(faces)
    folder = write_dataset(tmp_path / "labels", records, IDENTITIES - 1)  # one class too few
    dataset = InsightFaceDataset(folder, decoder="pillow")
    dataset[0]  # class 0 is fine
    bad = 2 * PER_IDENTITY  # first image of class 2
    with pytest.raises(ValueError) as error:
        dataset[bad]
    message = str(error.value)
    assert f"train.rec: record {bad + 1}: label 2 is outside [0, 2)" in message
    assert str(folder / "property") in message and "\n" not in message
    with pytest.raises(ValueError, match=rf"record {bad + 1}: label 2 is outside"):
        dataset.labels()
    records[2] = header(0, 0.5, 2) + faces[1][1]  # not an integer
    dataset = InsightFaceDataset(write_dataset(tmp_path / "frac", records, IDENTITIES))
    with pytest.raises(ValueError, match=r"record 2: label 0.5 is outside"):
        dataset[1]


@pytest.mark.parametrize("decoder", DECODERS)
@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_corrupt_jpeg_in_a_record(tmp_path, faces, decoder, damage):
    records = face2rec_records(faces)
    data = faces[4][1]
    broken = {
        "truncated": data[: len(data) // 2],
        "garbage": b"\xff\xd8" + bytes(300),
        "empty": b"",
    }
    records[5] = header(2, 0.0, 5, (1.0, 1.0)) + broken[damage]
    dataset = InsightFaceDataset(
        write_dataset(tmp_path / "c", records, IDENTITIES), decoder=decoder
    )
    dataset[3]
    with pytest.raises(ValueError) as error:
        dataset[4]
    message = str(error.value)
    assert str(tmp_path / "c" / "train.rec") in message and "record 5" in message
    assert "\n" not in message


def test_image_of_the_wrong_size(tmp_path, faces):
    folder = write_dataset(tmp_path / "size", face2rec_records(faces), IDENTITIES)
    (folder / "property").write_text(f"{IDENTITIES},112,112")
    with pytest.raises(ValueError, match=r"record 1: image is 112x92, .*property says 112x112"):
        InsightFaceDataset(folder)[0]


def test_truncated_record_file(face2rec):
    rec, index = face2rec / "train.rec", face2rec / "train.idx"
    lines = index.read_text().splitlines()
    last_image = int(lines[8].split("\t")[1])  # record 9; records 0 and 10.. follow it
    rec.write_bytes(rec.read_bytes()[: last_image + 100])
    index.write_text("\n".join(lines[:9]) + "\n")  # an index of the images only
    dataset = InsightFaceDataset(face2rec)
    dataset[7]
    with pytest.raises(RecordFormatError) as error:
        dataset[8]
    message = str(error.value)
    assert f"{rec}: record 9: truncated" in message and "end of the file" in message
    index.write_text("\n".join(lines) + "\n")  # the full index now points past the end
    with pytest.raises(RecordFormatError, match=r"train\.idx: line 10: record 0: offset") as error:
        InsightFaceDataset(face2rec)
    assert str(error.value).startswith(f"{rec} looks truncated, or does not belong to train.idx")


@pytest.mark.parametrize(
    ("text", "match"),
    [("3,112", "three positive integers"), ("x,1,1", "got 'x,1,1'"), ("0,112,112", "positive")],
)
def test_bad_property(tmp_path, text, match):
    (tmp_path / "property").write_text(text)
    with pytest.raises(ValueError, match=match) as error:
        read_property(tmp_path / "property")
    assert str(tmp_path / "property") in str(error.value)
    assert read_property(_write(tmp_path / "ok", "85742,112,112\n")) == (85742, 112, 112)


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.mark.parametrize("first_identity", [50.0, 1e12])
def test_header_range_beyond_the_index(tmp_path, faces, first_identity):
    records = face2rec_records(faces)
    records[0] = header(2, 0.0, 0, (first_identity, first_identity + 3))
    folder = write_dataset(tmp_path / "range", records, IDENTITIES)
    end = int(np.float32(first_identity))
    with pytest.raises(
        RecordFormatError,
        match=rf"train\.idx: record 0 says images are records 1\.\.{end - 1}, but "
        rf"{end - 13} of them are not indexed \(first: record 13\)",
    ):
        InsightFaceDataset(folder)  # 1e12: refused before an array of that size is made


def test_missing_files_are_named(tmp_path, face2rec):
    (face2rec / "train.idx").unlink()
    with pytest.raises(FileNotFoundError, match="train.idx"):
        InsightFaceDataset(face2rec)
    with pytest.raises(FileNotFoundError, match="property"):
        InsightFaceDataset(tmp_path)


# ------------------------------------------------------------------ verification sets
def test_verification_sets_of_a_folder(tmp_path, faces):
    images = [data for _, data in faces[:4]]
    with open(tmp_path / "lfw.bin", "wb") as stream:
        pickle.dump((images, [True, False]), stream, protocol=2)
    with open(tmp_path / "cfp_fp.bin", "wb") as stream:
        pickle.dump((images[:2], [False]), stream, protocol=4)
    (tmp_path / "notes.txt").write_text("not a set")
    sets = load_verification_sets(tmp_path)
    assert list(sets) == ["cfp_fp", "lfw"]
    assert sets["lfw"].images.shape == (4, 3, HEIGHT, WIDTH)
    assert sets["lfw"].same.tolist() == [True, False]
    assert len(sets["lfw"].pairs()) == 2
    only = load_verification_sets(tmp_path, names=["lfw"], image_size=56)
    assert list(only) == ["lfw"] and only["lfw"].images.shape == (4, 3, 56, 56)
    with pytest.raises(ValueError, match=r"no verification set 'agedb_30'.*available: cfp_fp, lfw"):
        load_verification_sets(tmp_path, names=["agedb_30"])
    with pytest.raises(ValueError, match="is not a folder"):
        load_verification_sets(tmp_path / "lfw.bin")


def test_verification_set_with_wrong_issame_length(tmp_path, faces):
    images = [data for _, data in faces[:4]]
    with open(tmp_path / "agedb_30.bin", "wb") as stream:
        pickle.dump((images, [True, False, True]), stream, protocol=2)
    with pytest.raises(UnsafePickleError) as error:
        load_verification_sets(tmp_path)
    message = str(error.value)
    assert isinstance(error.value, ValueError)
    assert str(tmp_path / "agedb_30.bin") in message and "4 images for 3 pairs" in message
