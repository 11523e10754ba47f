"""embed_folder: identities from the layout, a run killed midway keeps what it flushed and the
next run finishes it, bad arguments named; read_embeddings refuses other files."""

from __future__ import annotations

import numpy as np
import pytest

from marginface.inference import FaceModel
from marginface.inference.folder import embed_folder, list_images, read_embeddings

from ._digits import write_identities


def test_identities_come_from_the_first_folder_level(tmp_path):
    write_identities(tmp_path / "f", [1, 2], 2)
    (tmp_path / "f" / "1" / "notes.txt").write_text("not an image")
    write_identities(tmp_path / "f" / "2" / "deeper", [3], 1)
    listed = list_images(tmp_path / "f")
    assert ("2/deeper/3/0.png", "2") in listed and ("1/0.png", "1") in listed
    assert all(not path.endswith(".txt") for path, _ in listed)
    with pytest.raises(ValueError, match=r"is not a folder of images"):
        list_images(tmp_path / "missing")


def test_a_killed_run_keeps_what_it_flushed_and_the_next_finishes(digits_run, tmp_path):
    folder = write_identities(tmp_path / "f", range(4), 3)  # 12 images
    model = FaceModel(digits_run, batch_size=4)
    out = tmp_path / "e.npz"
    real = model.embed_pixels
    calls = []

    def dies_on_the_third_batch(pixels):
        calls.append(len(pixels))
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(pixels)

    model.embed_pixels = dies_on_the_third_batch
    with pytest.raises(KeyboardInterrupt):
        embed_folder(model, folder, out, flush_every=4, workers=1)
    assert len(read_embeddings(out)["paths"]) == 8  # two batches flushed, nothing torn
    model.embed_pixels = real
    result = embed_folder(model, folder, out, workers=1)
    assert (result.already, result.embedded, result.total) == (8, 4, 12)
    saved = read_embeddings(out)
    expected = model.embed([str(folder / p) for p in saved["paths"]])
    np.testing.assert_allclose(saved["embeddings"], expected, atol=1e-6)


def test_bad_arguments_and_files_are_named(digits_run, tmp_path):
    model = FaceModel(digits_run)
    folder = write_identities(tmp_path / "f", [0], 1)
    with pytest.raises(ValueError, match=r"--out must end in \.npz or \.parquet, got 'e\.csv'"):
        embed_folder(model, folder, tmp_path / "e.csv")
    with pytest.raises(ValueError, match=r"workers must be an int >= 0, got -1"):
        embed_folder(model, folder, tmp_path / "e.npz", workers=-1)
    (tmp_path / "junk.npz").write_bytes(b"junk")
    with pytest.raises(ValueError, match=r"junk\.npz is not an embeddings file written by"):
        read_embeddings(tmp_path / "junk.npz")


def test_parquet_output_when_pyarrow_is_present(digits_run, tmp_path):
    pytest.importorskip("pyarrow")
    folder = write_identities(tmp_path / "f", [0, 1], 2)
    model = FaceModel(digits_run)
    result = embed_folder(model, folder, tmp_path / "e.parquet")
    saved = read_embeddings(tmp_path / "e.parquet")
    assert result.total == 4 and list(saved["identities"]) == ["0", "0", "1", "1"]
    np.testing.assert_allclose(
        saved["embeddings"], model.embed([str(folder / p) for p in saved["paths"]]), atol=1e-6
    )
