"""embed_paths: the images' unit rows, in order, each equal to FaceModel.embed of that image;
unusable images skipped with a reason; bad arguments named."""

from __future__ import annotations

import numpy as np
import pytest

from marginface.inference import FaceModel
from marginface.inference.embed_paths import embed_paths
from marginface.inference.folder import list_images

from ._digits import write_identities


def test_rows_match_the_model_and_bad_images_are_skipped(digits_run, tmp_path):
    folder = write_identities(tmp_path / "f", range(3), 3)  # 9 images
    (folder / "0" / "broken.png").write_bytes(b"not a png")
    model = FaceModel(digits_run, batch_size=4)
    relative = [p for p, _ in list_images(folder)]
    seen: list[tuple[int, int]] = []
    got = embed_paths(model, folder, relative, workers=1, progress=lambda *a: seen.append(a))
    assert [p for p, _ in got.skipped] == ["0/broken.png"]
    assert got.names == [p for p in relative if p != "0/broken.png"]
    expected = model.embed([str(folder / p) for p in got.names])
    np.testing.assert_allclose(got.embeddings, expected, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(got.embeddings, axis=1), 1.0, atol=1e-5)
    assert seen[-1] == (len(relative), len(relative))
    none = embed_paths(model, folder, ["0/broken.png"])
    assert none.names == [] and none.embeddings.shape == (0, 0) and len(none.skipped) == 1


def test_bad_workers(digits_run, tmp_path):
    with pytest.raises(ValueError, match="workers must be an integer >= 0, got -1"):
        embed_paths(FaceModel(digits_run), tmp_path, [], workers=-1)
