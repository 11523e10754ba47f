"""FaceModel: a run folder or an exported file in, unit embeddings of aligned crops out, the
same for every image type; verification at a threshold calibrated for a false accept rate."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from marginface.cli import main
from marginface.inference import (
    FaceModel,
    describe_model,
    save_description,
    threshold_at_far,
)
from marginface.train import load_run


def _pixels(count: int = 6, seed: int = 0) -> np.ndarray:
    """``uint8[N, 8, 8, 1]`` random grey crops of the digits run's input size."""
    return np.random.default_rng(seed).integers(0, 256, (count, 8, 8, 1), dtype=np.uint8)


def _reference(run_dir, pixels: np.ndarray, flip: bool = False) -> np.ndarray:
    """The run's model on ``x / 255`` (the digits' normalisation), summed with the mirror's
    when ``flip``, L2-normalised: the embedding restated by hand."""
    model = load_run(run_dir).model
    x = torch.from_numpy(pixels).permute(0, 3, 1, 2).float() / 255.0
    with torch.no_grad():
        features = model(x)
        if flip:
            features = features + model(x.flip(3))
    return F.normalize(features, dim=1).numpy()


def test_a_run_checkpoint_carries_its_description(digits_run):
    state = torch.load(digits_run / "checkpoint.pt", weights_only=True)
    assert state["description"]["architecture"] == "seed-cnn"
    description = describe_model(digits_run)
    assert (description.colour, description.image_size, description.embedding_dim) == (
        "grey",
        (8, 8),
        3,
    )
    assert (description.mean, description.std, description.loss) == (0.0, 1.0, "curricularface")


@pytest.mark.parametrize("flip", [False, True])
def test_embed_is_the_model_on_normalised_pixels(digits_run, flip):
    pixels = _pixels()
    model = FaceModel(digits_run, flip=flip, batch_size=4)  # two batches
    embeddings = model.embed(pixels)
    assert embeddings.dtype == np.float32 and embeddings.shape == (6, 3)
    np.testing.assert_allclose(np.linalg.norm(embeddings, axis=1), 1.0, atol=1e-6)
    np.testing.assert_allclose(embeddings, _reference(digits_run, pixels, flip), atol=1e-6)
    as_tensor = model.embed(pixels, as_tensor=True)
    assert isinstance(as_tensor, torch.Tensor) and as_tensor.dtype == torch.float32


def test_paths_pil_arrays_and_tensors_give_the_same_embeddings(digits_run, tmp_path):
    from PIL import Image

    pixels = _pixels(3)
    paths = []
    for i, image in enumerate(pixels):
        paths.append(tmp_path / f"{i}.png")
        Image.fromarray(image[:, :, 0]).save(paths[-1])
    model = FaceModel(digits_run)
    expected = model.embed(pixels)
    uint8 = torch.from_numpy(pixels).permute(0, 3, 1, 2)
    inputs = {
        "paths": [str(p) for p in paths],
        "pil": [Image.open(p) for p in paths],
        "arrays": [image[:, :, 0] for image in pixels],
        "rgb arrays": [np.repeat(image, 3, axis=2) for image in pixels],  # grey model: luma
        "uint8 tensor": uint8,
        "float tensor": uint8.float() / 255.0,
    }
    for name, images in inputs.items():
        np.testing.assert_allclose(model.embed(images), expected, atol=1e-6, err_msg=name)
    assert model.embed(str(paths[0])).shape == (1, 3)


def test_a_crop_of_another_size_is_refused_unless_an_aligner_is_given(digits_run):
    model = FaceModel(digits_run)
    photo = np.zeros((20, 16), dtype=np.uint8)
    with pytest.raises(ValueError) as error:
        model.embed(photo)
    assert str(error.value).startswith("images[0] is 20x16, the model takes aligned 8x8 crops")
    assert "detector='mtcnn'" in str(error.value)
    assert "align --detector mtcnn --for-model" in str(error.value)
    seen = []

    def aligner(image: np.ndarray) -> np.ndarray:
        seen.append(image.shape)
        return image[:8, :8]

    aligned = FaceModel(digits_run, aligner=aligner)
    np.testing.assert_allclose(aligned.embed(photo), model.embed(photo[:8, :8]), atol=1e-6)
    assert seen == [(20, 16, 3)]  # the aligner receives RGB photos
    bad = FaceModel(digits_run, aligner=lambda image: image)
    with pytest.raises(ValueError, match=r"the aligner's crop of images\[0\] is 20x16"):
        bad.embed(photo)


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"batch_size": 0}, ValueError, r"batch_size must be >= 1, got 0"),
        ({"dtype": torch.int32}, TypeError, r"dtype must be a floating-point torch.dtype"),
        ({"flip": "yes"}, TypeError, r"flip must be a bool or None, got 'yes'"),
        ({"aligner": 3}, TypeError, r"aligner must be callable or None, got int"),
    ],
)
def test_bad_options_are_named(digits_run, options, error, match):
    with pytest.raises(error, match=match):
        FaceModel(digits_run, **options)


def test_bad_images_and_sources_are_named(digits_run, tmp_path):
    model = FaceModel(digits_run)
    with pytest.raises(TypeError, match=r"images\[1\] must be a path, a PIL image, .* got int"):
        model.embed([_pixels(1)[0], 3])
    with pytest.raises(TypeError, match=r"a NumPy image must be uint8 pixels .* got float64"):
        model.embed(np.zeros((8, 8)))
    with pytest.raises(ValueError, match=r"images is empty"):
        model.embed([])
    with pytest.raises(ValueError, match=r"no model at .*missing: give a run folder"):
        FaceModel(tmp_path / "missing")


def test_dtype_option_runs_the_model_in_that_type(digits_run):
    pixels = _pixels()
    wide = FaceModel(digits_run, dtype=torch.float64).embed(pixels)
    assert wide.dtype == np.float32
    np.testing.assert_allclose(wide, FaceModel(digits_run).embed(pixels), atol=1e-5)


def test_calibrate_then_verify_at_the_stored_threshold(digits_run, tmp_path):
    model = FaceModel(digits_run)
    pixels = _pixels(2)
    unset = model.verify(pixels[0], pixels[1])
    assert unset.same is None and unset.threshold is None
    assert "no calibrated threshold" in str(unset)
    rng = np.random.default_rng(1)
    scores = np.r_[rng.uniform(0.5, 1.0, 50), rng.uniform(-1.0, 0.6, 1000)]
    same = np.r_[np.ones(50, bool), np.zeros(1000, bool)]
    calibration = model.calibrate(scores=scores, same=same, far=0.01, name="synthetic")
    threshold = calibration.threshold
    assert threshold == threshold_at_far(scores, same, 0.01)
    assert calibration.impostors == 1000 and calibration.false_accepts <= 10
    assert model.description.threshold == threshold and model.description.threshold_far == 0.01
    itself = model.verify(pixels[0], pixels[0])
    assert itself.same is True and itself.cosine == pytest.approx(1.0, abs=1e-6)
    assert "same at threshold" in str(itself)
    assert model.verify(pixels[0], pixels[1], threshold=1.01).same is False
    save_description(digits_run, model.description)
    try:
        assert FaceModel(digits_run).description.threshold == threshold
    finally:
        (digits_run / "description.json").unlink()


def test_calibrate_refuses_a_far_its_pairs_cannot_support(digits_run):
    model = FaceModel(digits_run)
    rng = np.random.default_rng(2)
    scores = np.r_[rng.uniform(0.5, 1.0, 300), rng.uniform(-1.0, 0.6, 300)]
    same = np.r_[np.ones(300, bool), np.zeros(300, bool)]
    with pytest.raises(ValueError, match=r"far 0.001 needs at least 10,000 impostor pairs"):
        model.calibrate(scores=scores, same=same, far=1e-3)
    assert model.description.threshold is None  # nothing stored
    with pytest.warns(UserWarning, match="these pairs hold 300"):
        model.calibrate(scores=scores, same=same, far=1e-3, unsupported="warn")
    assert model.description.threshold_far == 1e-3


def test_threshold_at_far_is_the_lowest_threshold_within_the_rate():
    rng = np.random.default_rng(0)
    scores = rng.normal(size=400)
    same = rng.random(400) < 0.3
    impostors = scores[~same]
    for far in (0.001, 0.01, 0.1, 0.5, 1.0):
        t = threshold_at_far(scores, same, far)
        assert np.mean(impostors >= t) <= far  # the definition, restated
        lower = scores[scores < t]
        if lower.size:  # the next lower score would break it
            assert np.mean(impostors >= lower.max()) > far
    with pytest.raises(ValueError, match=r"far must be in \(0, 1\], got 0"):
        threshold_at_far(scores, same, 0)


needs_onnx = pytest.mark.skipif(
    importlib.util.find_spec("onnxruntime") is None, reason="the marginface[onnx] extra"
)


@pytest.mark.parametrize(
    ("fmt", "name"),
    [
        ("pt", "backbone.pt"),
        ("safetensors", "backbone.safetensors"),
        ("torchscript", "model.ts"),
        pytest.param("onnx", "model.onnx", marks=needs_onnx),
    ],
)
def test_every_exported_file_is_a_face_model_with_no_option(digits_run, tmp_path, fmt, name):
    out = tmp_path / fmt
    assert main(["--quiet", "export", str(digits_run), "--format", fmt, "--out", str(out)]) == 0
    pixels = _pixels()
    from_file = FaceModel(out / name).embed(pixels)
    np.testing.assert_allclose(from_file, FaceModel(digits_run).embed(pixels), atol=1e-5)
    assert describe_model(out / name) == describe_model(digits_run)
