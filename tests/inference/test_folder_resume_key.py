"""``embed``'s output records its key (issue 45): a resume with the same model's weights and
preprocessing goes on; another model, preprocessing, precision or flip test is refused with
one line naming the file and what differs (exit 2 at the command line), never mixed."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from marginface.cli import main
from marginface.inference import FaceModel
from marginface.inference.folder import embed_folder, read_embeddings

from ._digits import write_identities


def _first_half(digits_run, tmp_path):
    folder = write_identities(tmp_path / "f", range(4), 2)  # 8 images
    model = FaceModel(digits_run)
    out = tmp_path / "e.npz"
    (folder / "3").rename(tmp_path / "later")  # the last identity comes later
    embed_folder(model, folder, out, workers=1)
    (tmp_path / "later").rename(folder / "3")
    return model, folder, out


def test_the_same_weights_resume_and_equal_the_direct_embeddings(digits_run, tmp_path):
    model, folder, out = _first_half(digits_run, tmp_path)
    copied = FaceModel.from_module(copy.deepcopy(model.module), model.description)
    result = embed_folder(copied, folder, out, workers=1)
    assert (result.already, result.embedded) == (6, 2)
    saved = read_embeddings(out)
    direct = model.embed([str(folder / p) for p in saved["paths"]])
    np.testing.assert_array_equal(saved["embeddings"], direct)


def _other(model: FaceModel, part: str) -> FaceModel:
    if part == "weights":
        module = copy.deepcopy(model.module)
        with torch.no_grad():
            next(module.parameters()).add_(0.01)
        return FaceModel.from_module(module, model.description)
    if part == "preprocessing.mean":
        return FaceModel.from_module(model.module, model.description.replace(mean=0.4))
    if part == "precision":
        return FaceModel.from_module(
            copy.deepcopy(model.module), model.description, dtype=torch.float64
        )
    return FaceModel.from_module(model.module, model.description, flip=not model.flip)


@pytest.mark.parametrize("part", ["weights", "preprocessing.mean", "precision", "flip"])
def test_another_model_or_preprocessing_is_refused(digits_run, tmp_path, part):
    model, folder, out = _first_half(digits_run, tmp_path)
    before = out.read_bytes()
    with pytest.raises(
        ValueError, match=rf"{out} holds embeddings of another model .*\(.*{part}.*differ\)"
    ):
        embed_folder(_other(model, part), folder, out, workers=1)
    assert out.read_bytes() == before  # nothing mixed in


def test_a_file_without_key_is_resumed_when_its_preprocessing_fits(digits_run, tmp_path):
    model, folder, out = _first_half(digits_run, tmp_path)
    with np.load(out) as stored:
        arrays = {k: stored[k] for k in stored.files if k != "key"}  # as written before
    np.savez(out, **arrays)
    with pytest.raises(ValueError, match=r"\(preprocessing.mean differ\)"):
        embed_folder(_other(model, "preprocessing.mean"), folder, out, workers=1)
    with pytest.warns(UserWarning, match=rf"{out} was written before embed recorded"):
        result = embed_folder(model, folder, out, workers=1)
    assert (result.already, result.embedded) == (6, 2)
    assert "key" in read_embeddings(out)  # recorded from now on


def test_the_command_refuses_another_model_in_one_line(digits_run, tmp_path, capsys):
    from marginface.export import export_state_dict
    from marginface.inference import describe_model
    from marginface.models import create_model

    model, folder, out = _first_half(digits_run, tmp_path)
    torch.manual_seed(1)
    other = create_model("seed-cnn", embedding_dim=model.embedding_dim, in_channels=1, image_size=8)
    path = export_state_dict(other, tmp_path / "other.pt", description=describe_model(digits_run))
    capsys.readouterr()
    assert main(["embed", str(path), str(folder), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert str(out) in err and "(weights differ)" in err
