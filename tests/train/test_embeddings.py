"""train/embeddings.py: its loops go through the one embedder and give, to the bit, what the
loops written there gave (restated: the flip average, the transform on the device, the
dataset streamed in order)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from marginface.data.base import VerificationSet
from marginface.evaluation import PairSet
from marginface.train.embeddings import (
    extract_dataset_embeddings,
    extract_embeddings,
    extract_embeddings_and_flipped,
)
from marginface.train.evaluation.evaluate import as_is_and_flipped


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(4 * 6 * 6, 5))


def _images(n: int = 9) -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, (n, 3, 8, 8), dtype=np.uint8)


def _transform(x: torch.Tensor) -> torch.Tensor:
    return (x.float() / 255.0 - 0.5) / 0.5


@pytest.mark.parametrize("flip", [False, True])
def test_extract_embeddings_is_the_loop_it_replaced(flip: bool) -> None:
    model, images = _model().train(), _images()
    got = extract_embeddings(model, images, batch_size=4, flip=flip, transform=_transform)
    assert model.training  # its mode is given back
    model.eval()
    expected = []
    with torch.no_grad():
        for start in range(0, 9, 4):
            x = _transform(torch.as_tensor(images[start : start + 4]))
            out = model(x).float()
            if flip:
                out = (out + model(torch.flip(x, dims=(3,))).float()) / 2
            expected.append(out)
    assert torch.equal(got, torch.cat(expected))


def test_extract_dataset_embeddings_reads_in_order() -> None:
    model, images = _model(), _images()
    x = _transform(torch.as_tensor(images))
    dataset = [(x[i], i % 3) for i in range(9)]
    got = extract_dataset_embeddings(model, dataset, batch_size=4, labels=np.arange(9) % 3)
    with torch.no_grad():
        expected = torch.cat([model.eval()(x[s : s + 4]) for s in range(0, 9, 4)])
    assert torch.equal(got, expected)


def test_empty_images_are_named() -> None:
    with pytest.raises(ValueError, match="empty"):
        extract_embeddings(_model(), np.zeros((0, 3, 8, 8), np.uint8), transform=_transform)


def _two_passes(model: nn.Module, images: np.ndarray, transform, **options) -> tuple:
    """What ``as_is_and_flipped`` computed before it called the one embedder's flip test: a
    pass as is, then a pass of its own flip (``torch.flip(transform(x), dims=(3,))``)."""
    flipped = lambda batch: torch.flip(transform(batch), dims=(3,))  # noqa: E731
    return tuple(
        extract_embeddings(model, images, transform=how, **options) for how in (transform, flipped)
    )


@pytest.mark.parametrize("channels_last", [False, True])
def test_the_flip_kept_apart_is_the_two_passes_it_replaced(channels_last: bool) -> None:
    """One pass through the embedder's flip gives, to the bit, the former two passes; their
    mean is ``extract_embeddings(flip=True)``; the model's mode is given back."""
    model, images = _model().train(), _images()
    options = {"batch_size": 4, "channels_last": channels_last}
    as_is, flipped = extract_embeddings_and_flipped(model, images, transform=_transform, **options)
    assert model.training
    expected_as_is, expected_flipped = _two_passes(model, images, _transform, **options)
    assert torch.equal(as_is, expected_as_is) and torch.equal(flipped, expected_flipped)
    assert not torch.equal(as_is, flipped)  # the mirror is a different image
    averaged = extract_embeddings(model, images, flip=True, transform=_transform, **options)
    assert torch.equal((as_is + flipped) / 2, averaged)


def test_as_is_and_flipped_is_the_two_passes_it_replaced() -> None:
    """The verification sets' embeddings (``evaluate``, the epoch row, a backbone file) are
    bit for bit what they were, now through the one flip site."""
    model, images = _model(), _images(8)
    pairs = PairSet(np.arange(8).reshape(4, 2), np.array([True, False, True, False]))
    verification = VerificationSet(images, pairs, mean=0.5, std=0.5)
    as_is, flipped = as_is_and_flipped(model, verification, batch_size=3, device="cpu")
    expected = _two_passes(model, images, verification.model_input, batch_size=3)
    assert np.array_equal(as_is, expected[0].numpy())
    assert np.array_equal(flipped, expected[1].numpy())
    assert as_is.dtype == flipped.dtype == np.float32 and as_is.shape == (8, 5)


def test_the_flip_kept_apart_names_empty_images_and_a_bad_batch_size() -> None:
    with pytest.raises(ValueError, match="empty"):
        extract_embeddings_and_flipped(_model(), np.zeros((0, 3, 8, 8), np.uint8))
    with pytest.raises(ValueError, match="batch_size must be >= 1, got 0"):
        extract_embeddings_and_flipped(_model(), _images(), batch_size=0)
