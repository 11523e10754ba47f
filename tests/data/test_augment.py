"""Batch augmentation: geometry against an independent bilinear resampler, flips, determinism,
and the errors of its options."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from marginface.data.augment import BatchAugmentation, build_augmentation, check_augment_options
from marginface.train.config import TrainConfig


def reference_warp(image: np.ndarray, matrix: np.ndarray) -> np.ndarray:
    """Bilinear sampling of ``image`` (C, H, W) at ``matrix`` (2, 3) applied to each output pixel
    centre (pixel units, origin at the image centre), coordinates clamped to the image (border)."""
    _, height, width = image.shape
    out = np.zeros_like(image)
    for row in range(height):
        for col in range(width):
            centred = np.array([col + 0.5 - width / 2, row + 0.5 - height / 2])
            x, y = matrix[:, :2] @ centred + matrix[:, 2]
            x = min(max(x + width / 2 - 0.5, 0.0), width - 1.0)
            y = min(max(y + height / 2 - 0.5, 0.0), height - 1.0)
            x0, y0 = int(np.floor(x)), int(np.floor(y))
            x1, y1 = min(x0 + 1, width - 1), min(y0 + 1, height - 1)
            fx, fy = x - x0, y - y0
            out[:, row, col] = (
                image[:, y0, x0] * (1 - fx) * (1 - fy)
                + image[:, y0, x1] * fx * (1 - fy)
                + image[:, y1, x0] * (1 - fx) * fy
                + image[:, y1, x1] * fx * fy
            )
    return out


@pytest.mark.parametrize("shape", [(3, 2, 9, 9), (2, 1, 7, 12)])
def test_warp_matches_an_independent_bilinear_resampler(shape):
    images = torch.rand(shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    augment = BatchAugmentation(translate=2.5, rotate=30, scale=0.2, hflip=0.5)
    out = augment(images, torch.Generator().manual_seed(1))
    matrices = augment.sample_matrices(shape[0], torch.Generator().manual_seed(1))
    for i in range(shape[0]):
        expected = reference_warp(images[i].numpy(), matrices[i].numpy())
        np.testing.assert_allclose(out[i].numpy(), expected, atol=1e-9)


def test_full_flip_probability_mirrors_every_image():
    images = torch.rand(4, 1, 6, 6)
    out = BatchAugmentation(hflip=1.0)(images, torch.Generator().manual_seed(0))
    torch.testing.assert_close(out, images.flip(-1), atol=1e-6, rtol=0)


def test_integer_translation_moves_content_by_whole_pixels():
    augment = BatchAugmentation(translate=3.0)
    matrices = augment.sample_matrices(64, torch.Generator().manual_seed(0))
    assert matrices[:, :, 2].abs().max() <= 3.0
    assert matrices[:, :, 2].abs().max() > 2.0  # the range is used
    identity = torch.eye(2, dtype=torch.float64).expand(64, 2, 2)
    torch.testing.assert_close(matrices[:, :, :2], identity)
    image = torch.zeros(1, 1, 9, 9)
    image[0, 0, 4, 4] = 1.0
    # Content shifted by +t: the bright pixel lands at centre + t (t = -M's offset here).
    shifted = BatchAugmentation(translate=2.0)
    generator = torch.Generator().manual_seed(5)
    shift = -shifted.sample_matrices(1, torch.Generator().manual_seed(5))[0, :, 2]
    out = shifted(image, generator)
    centre_of_mass = (
        (out[0, 0].sum(0) * torch.arange(9)).sum() / out.sum(),
        (out[0, 0].sum(1) * torch.arange(9)).sum() / out.sum(),
    )
    assert float(centre_of_mass[0]) == pytest.approx(4 + float(shift[0]), abs=1e-5)
    assert float(centre_of_mass[1]) == pytest.approx(4 + float(shift[1]), abs=1e-5)


def test_same_generator_same_batch_and_input_untouched():
    images = torch.rand(8, 1, 10, 10)
    before = images.clone()
    augment = BatchAugmentation(translate=2, rotate=10, scale=0.1, hflip=0.5)
    a = augment(images, torch.Generator().manual_seed(3))
    b = augment(images, torch.Generator().manual_seed(3))
    c = augment(images, torch.Generator().manual_seed(4))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert torch.equal(images, before)
    assert a.shape == images.shape and a.dtype == images.dtype


def test_inactive_augmentation_is_none_and_identity():
    assert build_augmentation({}) is None
    assert build_augmentation({"rotate": 0}) is None
    images = torch.rand(2, 1, 4, 4)
    assert BatchAugmentation()(images, torch.Generator()) is images


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"shift": 2}, ValueError, r"'shift'.*valid: translate, rotate, scale, hflip"),
        ({"rotate": "10"}, TypeError, r"'rotate'.*'10'"),
        ({"rotate": True}, TypeError, r"'rotate'.*True"),
        ({"translate": -1}, ValueError, r"'translate'.*-1"),
        ({"translate": float("nan")}, ValueError, r"'translate'.*nan"),
        ({"hflip": 1.5}, ValueError, r"'hflip'.*1.5"),
        ({"scale": 1.0}, ValueError, r"'scale'.*1.0"),
        ({"rotate": 181}, ValueError, r"'rotate'.*181"),
        ([("rotate", 1)], TypeError, r"augment.*\[\(.rotate., 1\)\]"),
    ],
)
def test_bad_options_name_the_option_and_value(options, error, match):
    with pytest.raises(error, match=match):
        check_augment_options(options)
    with pytest.raises(error, match=match):
        TrainConfig(augment=options)


def test_bad_images_are_refused():
    augment = BatchAugmentation(rotate=5)
    with pytest.raises(ValueError, match=r"\(B, C, H, W\).*\(3, 4\)"):
        augment(torch.rand(3, 4), torch.Generator())
    with pytest.raises(ValueError, match="torch.int64"):
        augment(torch.zeros(1, 1, 4, 4, dtype=torch.int64), torch.Generator())
