"""Sub-center clean-up of a training set streamed from disk (insightface's train.rec): scikit-
learn's digits with label noise written as lossless PNG records, a tiny K = 3 run trained on
them (with limit and an exclude list), then `marginface outliers` and `train
--drop-non-dominant --drop-outliers` checked against the angles computed here by hand from the
checkpoint, `exclude` checked to keep the records out of training, and the streamed and
in-memory paths checked to agree on the same images."""

from __future__ import annotations

import csv
import dataclasses
import io
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from tests._subcenters_by_hand import dominant_and_angles

from marginface.cli import main
from marginface.data import load_dataset
from marginface.data.base import DatasetBundle, ImageSet
from marginface.data.insightface import InsightFaceDataset
from marginface.data.recordio import RecordWriter, pack_image_record
from marginface.train import extract_dataset_embeddings, load_bundle, load_run
from marginface.train.cleaning import run_outliers

K, COUNT, LIMIT, NOISE_EVERY = 3, 400, 300, 10
EXCLUDED_BEFORE = [0, 5, 7]  # the sub-center run's own exclude list (positions after limit)


def digits_pixels(count: int) -> tuple[np.ndarray, np.ndarray]:
    """The first ``count`` digits training images as ``uint8[N, 8, 8, 3]`` (grey in three
    channels) and their labels ``int64[N]``."""
    train = load_dataset("digits", seed=0).train
    grey = np.rint(train.images[:count, 0] * 255.0).astype(np.uint8)  # (N, 8, 8)
    return np.repeat(grey[..., None], 3, axis=3), np.asarray(train.labels[:count], np.int64)


def model_input(pixels: np.ndarray) -> np.ndarray:
    """``float32[N, 3, H, W]``: insightface's ``(x / 255 - 0.5) / 0.5`` of ``uint8[N, H, W, 3]``."""
    x = pixels.transpose(0, 3, 1, 2).astype(np.float32)
    return x / np.float32(127.5) - np.float32(1.0)


def write_digits_recordio(
    root: Path, count: int, *, noise_every: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Write ``count`` digits to ``root`` (created); returns their pixels and the labels
    written. ``noise_every``: every such image gets a wrong label (``(label + 1 + i % 9) % 10``),
    label noise for the clean-up to find; 0: none."""
    pixels, labels = digits_pixels(count)
    if noise_every:
        noisy = np.arange(0, count, noise_every)
        labels = labels.copy()
        labels[noisy] = (labels[noisy] + 1 + noisy % 9) % 10
    root.mkdir(parents=True, exist_ok=True)
    with RecordWriter(root / "train.rec") as writer:
        for key, (image, label) in enumerate(zip(pixels, labels, strict=True)):
            buffer = io.BytesIO()
            Image.fromarray(image).save(buffer, "PNG")
            writer.write(key, pack_image_record(float(label), buffer.getvalue(), id=key))
    (root / "property").write_text(f"10,{pixels.shape[1]},{pixels.shape[2]}\n")
    return pixels, labels


@pytest.fixture(scope="module")
def digits_rec(tmp_path_factory) -> tuple[Path, np.ndarray, np.ndarray]:
    """(folder, uint8 pixels[COUNT, 8, 8, 3], labels as written, with noise)."""
    root = tmp_path_factory.mktemp("digits-rec")
    pixels, labels = write_digits_recordio(root, COUNT, noise_every=NOISE_EVERY)
    return root, pixels, labels


def _train_args(data: Path, out: Path) -> list[str]:
    return [
        "--quiet", "train", "--dataset", "insightface", "--recipe", "sphere",
        "--data-dir", str(data),
        "--loss", "subcenter-arcface", "--loss-option", f"sub_centers={K}",
        "--embedding-dim", "8", "--limit", str(LIMIT), "--epochs", "1", "--batch-size", "50",
        "--lr", "1e-4", "--threads", "1", "--device", "cpu", "--set", "eval_batch_size=64",
        "--set", f"exclude={EXCLUDED_BEFORE}", "--out", str(out),
    ]  # fmt: skip


@pytest.fixture(scope="module")
def streamed_run(digits_rec, tmp_path_factory) -> Path:
    """A K = 3 sub-center run (1 epoch, lr 1e-4: the angles spread on both sides of 75°)."""
    run = tmp_path_factory.mktemp("streamed") / "run"
    assert main(_train_args(digits_rec[0], run)) == 0
    return run


def _limit_positions(seed: int) -> np.ndarray:
    """The records of the ``limit`` subset, in order (load_bundle's documented rule: a seeded
    random subset, sorted)."""
    order = torch.randperm(COUNT, generator=torch.Generator().manual_seed(seed))
    return order[:LIMIT].sort().values.numpy()


def _by_hand(run_dir: Path, digits_rec):
    """Per position of the limit subset (exclude not applied): the label, its class's
    dominant sub-center and the angle (degrees) to it, from the pixels decoded here."""
    _, pixels, written = digits_rec
    run = load_run(run_dir)
    records = _limit_positions(run.config.seed)
    with torch.no_grad():
        x = run.model(torch.from_numpy(model_input(pixels[records]))).double().numpy()
    labels = written[records]
    weight = run.loss.weight.detach().double().numpy()  # (C·K, D)
    dominant, angles = dominant_and_angles(x, labels, weight, K)
    return labels, dominant, angles, records


def test_outliers_of_a_streamed_run_are_the_angles_by_hand(streamed_run, digits_rec, tmp_path):
    labels, dominant, angles, _ = _by_hand(streamed_run, digits_rec)
    expected = [i for i, angle in enumerate(angles) if angle > 75.0]
    assert 0.05 * LIMIT < len(expected) < 0.95 * LIMIT  # the test can tell right from wrong
    assert set(EXCLUDED_BEFORE) & set(expected) != set(EXCLUDED_BEFORE)  # not all flagged
    out = tmp_path / "flagged.csv"
    args = ["--quiet", "outliers", str(streamed_run), "--out", str(out), "--workers", "1"]
    assert main(args) == 0
    with out.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [int(row["index"]) for row in rows] == expected
    for row in rows:
        i = int(row["index"])
        assert int(row["label"]) == labels[i]
        assert float(row["angle_degrees"]) == pytest.approx(angles[i], abs=2e-3)
        assert int(row["dominant_sub_center"]) == dominant[labels[i]]
        assert row["class_name"] == ""  # train.rec names no classes


def test_drop_outliers_of_a_streamed_run_leaves_them_out_of_training(
    streamed_run, digits_rec, tmp_path, monkeypatch
):
    """``--drop-outliers 75``: the new run's exclude is the old one plus the samples beyond
    75° (by hand), and its training reads none of those records (every read recorded)."""
    _, _, angles, records = _by_hand(streamed_run, digits_rec)
    flagged = [i for i, angle in enumerate(angles) if angle > 75.0]
    excluded = sorted({*EXCLUDED_BEFORE, *flagged})
    reads: list[tuple[float, int]] = []
    original = InsightFaceDataset.__getitem__

    def recorded(self, index):
        reads.append((self.flip, int(index)))
        return original(self, index)

    monkeypatch.setattr(InsightFaceDataset, "__getitem__", recorded)
    out = tmp_path / "clean"
    args = ["--quiet", "train", "--drop-non-dominant", str(streamed_run), "--out", str(out)]
    assert main([*args, "--epochs", "2", "--drop-outliers", "75", "--workers", "0"]) == 0
    config = load_run(out).config
    assert config.exclude == excluded and config.loss_options["sub_centers"] == 1
    # the clean-up pass read every position of the limit subset once, unflipped
    assert sorted(index for flip, index in reads if flip == 0.0) == records.tolist()
    trained = [index for flip, index in reads if flip > 0.0]  # the new run's 2 epochs
    kept = np.delete(records, excluded).tolist()
    assert sorted(trained) == sorted(kept * 2)  # every kept record once per epoch, no other


def test_exclude_leaves_the_records_out_of_a_streamed_training_set(digits_rec, streamed_run):
    """load_bundle(config): limit, then exclude, as one Subset of the records; reading it (in
    order and through a DataLoader worker) yields exactly the records kept."""
    _, pixels, written = digits_rec
    config = load_run(streamed_run).config
    records = _limit_positions(config.seed)
    kept = np.delete(records, EXCLUDED_BEFORE)
    train = load_bundle(config).train
    assert len(train) == LIMIT - len(EXCLUDED_BEFORE)
    np.testing.assert_array_equal(train.labels, written[kept])
    assert train.dataset.indices == kept.tolist()  # one Subset over the records
    assert hasattr(train.dataset.dataset, "set_epoch")  # the trainer reaches the flips' epoch
    plain = train.unaugmented().dataset
    loader = torch.utils.data.DataLoader(plain, batch_size=64, num_workers=1)
    images = torch.cat([batch for batch, _ in loader]).numpy()
    np.testing.assert_array_equal(images, model_input(pixels[kept]))
    full = load_bundle(config, exclude=False).train
    assert len(full) == LIMIT and full.dataset.indices == records.tolist()


def test_in_memory_and_streamed_sets_of_the_same_images_give_the_same_outliers(
    streamed_run, digits_rec
):
    _, pixels, written = digits_rec
    run_config = load_run(streamed_run).config
    streamed = load_bundle(run_config, exclude=False)
    records = _limit_positions(run_config.seed)
    in_memory = DatasetBundle(
        "same-images",
        ImageSet(model_input(pixels[records]), written[records]),
        streamed.test,
    )
    found = {}
    for name, bundle in (("streamed", streamed), ("in memory", in_memory)):
        found[name] = run_outliers(streamed_run, bundle=bundle, device="cpu")[0]
    assert torch.equal(found["streamed"].indices, found["in memory"].indices)
    assert torch.equal(found["streamed"].dominant, found["in memory"].dominant)
    torch.testing.assert_close(found["streamed"].angles, found["in memory"].angles)
    assert found["streamed"].indices.numel() > 0


def test_a_corrupt_record_in_the_clean_up_pass_is_one_line(digits_rec, streamed_run, tmp_path):
    """A record that does not decode, read by a DataLoader worker during the clean-up pass: a
    ValueError of one line naming the file and the record (no worker traceback)."""
    data = tmp_path / "data"
    shutil.copytree(digits_rec[0], data)
    config = load_run(streamed_run).config
    key = int(_limit_positions(config.seed)[10])
    offset = int((data / "train.idx").read_text().splitlines()[key].split("\t")[1])
    with (data / "train.rec").open("r+b") as handle:  # the PNG signature is lost
        handle.seek(offset + 8 + 24)
        handle.write(b"\0\0\0\0")
    bundle = load_bundle(dataclasses.replace(config, data_dir=str(data)), exclude=False)
    with pytest.raises(ValueError) as caught:
        run_outliers(streamed_run, bundle=bundle, device="cpu", workers=1)
    message = str(caught.value)
    assert len(message.splitlines()) == 1 and "Traceback" not in message, message
    assert f"train.rec: record {key}: cannot decode the image" in message


def test_streamed_embedding_errors(digits_rec, capsys, streamed_run):
    model = load_run(streamed_run).model
    dataset = InsightFaceDataset(digits_rec[0], flip=False)
    wrong = digits_rec[2].copy()
    wrong[37] = (wrong[37] + 1) % 10
    with pytest.raises(ValueError, match="item 37 of the dataset has label"):
        extract_dataset_embeddings(model, dataset, batch_size=16, labels=wrong)
    with pytest.raises(ValueError, match="workers must be an int >= 0, got -1"):
        extract_dataset_embeddings(model, dataset, workers=-1)
    with pytest.raises(ValueError, match="batch_size must be an int >= 1, got 0"):
        extract_dataset_embeddings(model, dataset, batch_size=0)
    assert main(["outliers", str(streamed_run), "--workers", "-1"]) == 2
    assert "--workers must be >= 0, got -1" in capsys.readouterr().err


def test_the_clean_up_reads_the_records_unflipped(digits_rec):
    """without_augmentation(): the same records, never flipped (the training copy still flips);
    a dataset without that method is embedded as it is."""
    _, pixels, written = digits_rec
    flipping = InsightFaceDataset(digits_rec[0], flip=1.0)
    plain = flipping.without_augmentation()
    image, label = plain[3]
    np.testing.assert_array_equal(image.numpy(), model_input(pixels[3:4])[0])
    assert int(label) == written[3] and plain.records is flipping.records
    np.testing.assert_array_equal(flipping[3][0].numpy(), image.flip(2).numpy())
    from marginface.data.base import StreamedImageSet

    other = StreamedImageSet([(image, label)], written[3:4], shape=(3, 8, 8))
    assert other.unaugmented() is other


def test_bad_options_fail_before_the_embedding_pass(streamed_run, tmp_path, capsys, monkeypatch):
    """On a web-scale train.rec the pass takes hours: a bad --drop-outliers or override fails
    first, without reading a record."""
    reads = []
    original = InsightFaceDataset.__getitem__
    monkeypatch.setattr(
        InsightFaceDataset, "__getitem__", lambda self, i: reads.append(i) or original(self, i)
    )
    args = ["train", "--drop-non-dominant", str(streamed_run), "--out", str(tmp_path / "x")]
    assert main([*args, "--drop-outliers", "200"]) == 2
    assert "drop_outliers" in capsys.readouterr().err
    assert main([*args, "--workers", "-1"]) == 2
    assert "workers" in capsys.readouterr().err
    assert main(["outliers", str(streamed_run), "--threshold", "-1"]) == 2
    assert "threshold_degrees must be >= 0" in capsys.readouterr().err
    assert reads == [] and not (tmp_path / "x").exists()
