"""convert records how it framed the images (crop, side) beside train.rec and each .bin; loading
the insightface dataset (train, evaluate) warns when the two were cropped differently."""

from __future__ import annotations

import json
import logging

import pytest
from tests._converted_faces import write_lfw_like

from marginface.cli import main
from marginface.data.convert import convert_folder, convert_pairs
from marginface.data.framing import (
    framing_mismatches,
    framing_path,
    read_framing,
    warn_framing,
    write_framing,
)
from marginface.data.insightface import load_insightface


@pytest.fixture(autouse=True)
def restore_logging():
    package = logging.getLogger("marginface")
    handlers, level = list(package.handlers), package.level
    yield
    package.handlers[:] = handlers
    package.setLevel(level)


@pytest.fixture(scope="module")
def lfw_like(tmp_path_factory):
    return write_lfw_like(tmp_path_factory.mktemp("lfw-like"))


def _convert(lfw_like, out, *, train_crop, bin_crop):
    images, pairs = lfw_like
    folder = convert_folder(images, out, image_size=16, crop=train_crop, workers=1)
    found = convert_pairs(pairs, images, out / "lfw.bin", image_size=16, crop=bin_crop, workers=1)
    return folder, found


def test_framing_path():
    assert framing_path("out/train.rec").as_posix() == "out/train.convert.json"
    assert framing_path("data/lfw.bin").name == "lfw.convert.json"


def test_convert_records_the_crop(lfw_like, tmp_path):
    folder, pairs = _convert(lfw_like, tmp_path / "ds", train_crop=None, bin_crop=30)
    assert (folder.crop, pairs.crop) == (None, 30)
    train = json.loads((tmp_path / "ds" / "train.convert.json").read_text())
    assert train == {"crop": None, "image_size": 16, "source": str(lfw_like[0])}
    assert read_framing(tmp_path / "ds" / "lfw.bin") == {
        "crop": 30,
        "image_size": 16,
        "source": str(lfw_like[0]),
    }


def test_different_crops_warn_at_load(lfw_like, tmp_path, caplog):
    out = tmp_path / "ds"
    _convert(lfw_like, out, train_crop=None, bin_crop=30)
    with caplog.at_level(logging.WARNING, logger="marginface"):
        load_insightface(out)
    (record,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    message = record.getMessage()
    assert message.startswith(
        "lfw.bin was converted with --crop 30, train.rec with no crop (the whole image) in "
    )
    assert "framed differently" in message and f"marginface convert SRC {out} --crop N" in message


def test_same_crop_or_no_record_says_nothing(lfw_like, tmp_path, caplog):
    out = tmp_path / "ds"
    _convert(lfw_like, out, train_crop=30, bin_crop=30)
    with caplog.at_level(logging.WARNING, logger="marginface"):
        load_insightface(out)
    assert framing_mismatches(out, ["lfw"]) == []
    write_framing(out / "lfw.bin", crop=None, image_size=16, source="elsewhere")
    assert framing_mismatches(out, ["lfw"]) == [
        "lfw.bin was converted with no crop (the whole image), train.rec with --crop 30"
    ]
    framing_path(out / "lfw.bin").unlink()  # insightface's own .bin: nothing to compare
    assert framing_mismatches(out, ["lfw"]) == []
    framing_path(out / "lfw.bin").write_text("{not json")
    assert read_framing(out / "lfw.bin") is None and warn_framing(out, ["lfw"]) == []
    framing_path(out / "lfw.bin").write_text('{"image_size": 16}')
    assert read_framing(out / "lfw.bin") is None
    framing_path(out / "train.rec").unlink()
    write_framing(out / "lfw.bin", crop=None, image_size=16, source="elsewhere")
    assert framing_mismatches(out, ["lfw"]) == []
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_train_warns_even_when_quiet(lfw_like, tmp_path, capsys):
    out = tmp_path / "ds"
    _convert(lfw_like, out, train_crop=None, bin_crop=30)
    argv = ["--quiet", "train", "--dataset", "insightface", "--data-dir", str(out), "--epochs"]
    argv += ["1", "--recipe", "sphere", "--batch-size", "4", "--threads", "1", "--device", "cpu"]
    assert main([*argv, "--out", str(tmp_path / "run")]) == 0
    err = capsys.readouterr().err
    assert "WARNING marginface.data.framing: lfw.bin was converted with --crop 30" in err
