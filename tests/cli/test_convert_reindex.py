"""A missing ``train.idx`` says how to rebuild it, and ``marginface convert --reindex`` does:
the rebuilt index equals the one ``convert`` wrote."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from marginface.cli import main
from marginface.data.insightface import InsightFaceDataset
from marginface.data.recordio import (
    RecordFormatError,
    RecordWriter,
    pack_image_record,
    rebuild_index,
)


@pytest.fixture
def converted(tmp_path) -> Path:
    """``convert`` of a folder of 3 identities x 2 PNGs (16x16) into ``tmp/data``."""
    rng = np.random.default_rng(0)
    for person in ("ann", "bob", "cid"):
        folder = tmp_path / "faces" / person
        folder.mkdir(parents=True)
        for i in range(2):
            pixels = rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / f"{i}.png")
    out = tmp_path / "data"
    args = ["--quiet", "convert", str(tmp_path / "faces"), str(out), "--image-size", "16"]
    assert main(args) == 0
    return out


def test_a_missing_index_names_the_command_that_rebuilds_it(converted, capsys):
    written = (converted / "train.idx").read_bytes()
    (converted / "train.idx").unlink()
    with pytest.raises(FileNotFoundError) as caught:
        InsightFaceDataset(converted)
    assert f"marginface convert --reindex {converted / 'train.rec'}" in str(caught.value)
    assert main(["convert", "--reindex", str(converted)]) == 0
    assert "10 records indexed" in capsys.readouterr().out  # header, 6 images, 3 identities
    assert (converted / "train.idx").read_bytes() == written
    dataset = InsightFaceDataset(converted)
    assert len(dataset) == 6 and dataset.num_classes == 3


def test_train_without_the_index_is_a_one_line_error(converted, tmp_path, capsys):
    (converted / "train.idx").unlink()
    args = ["train", "--dataset", "insightface", "--data-dir", str(converted)]
    assert main([*args, "--out", str(tmp_path / "run"), "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "train.idx: missing" in err and "marginface convert --reindex" in err


def test_reindex_takes_the_rec_file_and_refuses_mixed_arguments(converted, capsys):
    rec = converted / "train.rec"
    assert main(["--quiet", "convert", "--reindex", str(rec)]) == 0
    assert main(["convert", "--reindex", str(rec), "src", "out"]) == 2
    assert "leave SRC, OUT and --pairs out" in capsys.readouterr().err
    assert main(["convert", "--reindex", str(converted / "property")]) == 2
    assert "no .rec file there" in capsys.readouterr().err
    assert main(["convert"]) == 2
    assert "convert needs SRC and OUT (or --reindex REC" in capsys.readouterr().err


def test_rebuild_index_keys_are_the_header_ids_and_duplicates_are_refused(tmp_path):
    rec = tmp_path / "x.rec"
    with RecordWriter(rec) as writer:  # keys 5, 3, 9 in file order, as a shuffled im2rec
        for key in (5, 3, 9):
            writer.write(key, pack_image_record(1.0, b"img" * key, id=key))
    written = rec.with_suffix(".idx").read_text()
    rec.with_suffix(".idx").unlink()
    assert rebuild_index(rec) == 3
    assert rec.with_suffix(".idx").read_text() == written
    assert [line.split("\t")[0] for line in written.splitlines()] == ["5", "3", "9"]
    with RecordWriter(rec) as writer:
        writer.write(0, pack_image_record(1.0, b"a", id=4))
        writer.write(1, pack_image_record(1.0, b"b", id=4))
    with pytest.raises(RecordFormatError, match="records #0 and #1 both have id 4"):
        rebuild_index(rec, tmp_path / "y.idx")
    assert not (tmp_path / "y.idx").exists()
