"""data/ijb.py embeds with the model's own pixel normalisation: insightface's
``(x / 255 - 0.5) / 0.5`` by default, the description's ``(x / 255 - mean[c]) / std[c]``
when given, and a cache made under one is not read back under another."""

from __future__ import annotations

import numpy as np
import torch

from marginface.data.ijb import read_ijb_layout
from marginface.train.evaluation.ijb_embedding import embed_ijb_images


def _recording(crops: list[torch.Tensor]):
    def embed(x: torch.Tensor) -> torch.Tensor:
        crops.append(x.clone())
        return torch.nn.functional.avg_pool2d(x, 16).reshape(x.shape[0], -1)

    return embed


def test_the_default_is_insightface_and_a_description_gets_its_own(ijb_folder, tmp_path):
    layout = read_ijb_layout(ijb_folder[0], "IJBC")
    default: list[torch.Tensor] = []
    embed_ijb_images(layout, _recording(default), batch_size=32)
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    own: list[torch.Tensor] = []
    embed_ijb_images(layout, _recording(own), batch_size=32, mean=mean, std=std)
    pixels = ((default[0] * 0.5 + 0.5) * 255).round()  # insightface's undone: the uint8 crop
    assert float(pixels.min()) >= 0 and float(pixels.max()) <= 255
    m = torch.tensor(mean).view(1, 3, 1, 1)
    s = torch.tensor(std).view(1, 3, 1, 1)
    torch.testing.assert_close(own[0], (pixels / 255.0 - m) / s)  # as is, then mirrored
    torch.testing.assert_close(own[1], torch.flip(own[0], dims=(3,)))
    assert not torch.allclose(own[0], default[0])


def test_a_cache_of_another_normalisation_is_not_read_back(ijb_folder, tmp_path):
    layout = read_ijb_layout(ijb_folder[0], "IJBC")
    cache = tmp_path / "f.npz"
    first, _ = embed_ijb_images(layout, _recording([]), cache=cache)
    calls: list[torch.Tensor] = []
    other, _ = embed_ijb_images(layout, _recording(calls), cache=cache, mean=0.4, std=0.3)
    assert calls  # embedded again
    assert not np.allclose(first, other)
    again: list[torch.Tensor] = []
    back, _ = embed_ijb_images(layout, _recording(again), cache=cache, mean=0.4, std=0.3)
    assert not again  # its own cache is read back
    np.testing.assert_array_equal(back, other)
