"""train/embeddings.py: its loops go through the one embedder and give, to the bit, what the
loops written there gave (restated: the flip average, the transform on the device, the
dataset streamed in order)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from marginface.train.embeddings import extract_dataset_embeddings, extract_embeddings


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
