"""insightface records at another size than --image-size: refused with a message naming
--resize-records, or resized on the fly (records and .bin sets) when asked."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from PIL import Image
from tests._converted_faces import NAMES, PER_NAME, write_lfw_like

from marginface.cli import main
from marginface.data import load_dataset
from marginface.data.convert import convert_folder, convert_pairs
from marginface.data.insightface import InsightFaceDataset, load_insightface


@pytest.fixture(autouse=True)
def restore_logging():
    package = logging.getLogger("marginface")
    handlers, level = list(package.handlers), package.level
    yield
    package.handlers[:] = handlers
    package.setLevel(level)


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    """A dataset folder: train.rec at 32×32 and lfw.bin at 32×32, both cropped alike."""
    root = tmp_path_factory.mktemp("records")
    images, pairs = write_lfw_like(root)
    out = root / "dataset"
    convert_folder(images, out, image_size=32, workers=1)
    convert_pairs(pairs, images, out / "lfw.bin", image_size=32, crop=None, workers=1)
    return out


def test_another_size_is_refused_naming_the_option(records):
    message = r"image_size = 16 differs from .*property \(32x32\)"
    with pytest.raises(ValueError, match=message) as error:
        load_insightface(records, image_size=16)
    assert "--resize-records (dataset option resize = true)" in str(error.value)
    assert load_insightface(records, image_size=32).train.image_shape == (3, 32, 32)


@pytest.mark.parametrize("side", [16, 48])
def test_resize_on_the_fly(records, side):
    bundle = load_insightface(records, image_size=side, resize=True)
    assert bundle.train.image_shape == (3, side, side)
    assert bundle.verification["lfw"].images.shape[-2:] == (side, side)
    own = InsightFaceDataset(records, decoder="pillow")
    resized = InsightFaceDataset(records, decoder="pillow", output_size=side)
    assert resized.output_size == (side, side) and resized.image_size == (32, 32)
    assert len(resized) == len(NAMES) * PER_NAME
    image, label = resized.read_item(3)
    original, same_label = own.read_item(3)
    shrink = side < 32
    filter_ = Image.Resampling.BOX if shrink else Image.Resampling.BILINEAR
    expected = np.asarray(Image.fromarray(original).resize((side, side), filter_))
    assert image.shape == (side, side, 3) and label == same_label
    np.testing.assert_array_equal(image, expected)  # uint8 from the same Pillow call
    pixels, _ = resized[3]
    assert pixels.shape == (3, side, side)
    assert f"size=({side}, {side})" in repr(resized)


def test_resize_at_the_records_size_changes_nothing(records):
    plain = InsightFaceDataset(records, decoder="pillow")
    same = InsightFaceDataset(records, decoder="pillow", output_size=32)
    np.testing.assert_array_equal(plain.read_item(0)[0], same.read_item(0)[0])


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"resize": True}, ValueError, r"resize = true needs image_size \(--image-size N\)"),
        ({"resize": 1, "image_size": 16}, TypeError, "resize must be a bool, got 1"),
    ],
)
def test_bad_resize_options(records, options, error, match):
    with pytest.raises(error, match=match):
        load_dataset("insightface", data_dir=records, **options)


@pytest.mark.parametrize("bad", [0, -3, 2.5, True])
def test_bad_output_size(records, bad):
    with pytest.raises(ValueError, match=f"output_size must be an int >= 1 or None, got {bad!r}"):
        InsightFaceDataset(records, output_size=bad)


def test_train_with_resize_records(records, tmp_path, capsys):
    run = tmp_path / "run"
    argv = ["--quiet", "train", "--dataset", "insightface", "--data-dir", str(records)]
    argv += ["--recipe", "sphere", "--image-size", "16", "--epochs", "1", "--batch-size", "4"]
    argv += ["--embedding-dim", "4", "--threads", "1", "--device", "cpu", "--out", str(run)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--resize-records" in err and "Traceback" not in err
    assert main([*argv, "--resize-records"]) == 0
    assert "resize = true" in (run / "config.toml").read_text()
    argv = ["train", "--dataset", "digits", "--resize-records", "--epochs", "1"]
    assert main(argv) == 2
    assert "--resize-records resizes insightface records" in capsys.readouterr().err
