"""inference/embedder.py: the one batch loop, held to the loops it replaced (restated here as
they were written: FaceModel's sum-then-normalise, the training loop's flip average, IJB's
as-is and mirrored features kept apart), to the bit."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from marginface.inference.embedder import embed_batch, embed_batches
from marginface.models.description import normalise_pixels


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.LazyLinear(8)).eval()


def _pixels(n: int = 7) -> torch.Tensor:
    return torch.randint(0, 256, (n, 3, 8, 8), generator=torch.Generator().manual_seed(1)).to(
        torch.uint8
    )


def _normalise(x: torch.Tensor) -> torch.Tensor:
    return normalise_pixels(x, (0.4, 0.5, 0.6), 0.25)


@pytest.mark.parametrize("flip", [False, True])
def test_embed_batches_is_the_sum_then_the_normalisation(flip: bool) -> None:
    model, pixels = _model(), _pixels()
    with torch.no_grad():
        model(_normalise(pixels[:1]))  # the lazy layer
        expected = []
        for start in range(0, 7, 3):  # FaceModel.embed_pixels as it was written
            x = _normalise(pixels[start : start + 3])
            features = model(x).float()
            if flip:
                features = features + model(torch.flip(x, dims=(3,))).float()
            expected.append(torch.nn.functional.normalize(features, dim=1))
    got = embed_batches(model, pixels, normalise=_normalise, flip=flip, batch_size=3)
    assert torch.equal(got, torch.cat(expected))
    assert torch.allclose(got.norm(dim=1), torch.ones(7))


def test_embed_batches_takes_an_iterable_of_batches() -> None:
    model, pixels = _model(), _pixels()
    whole = embed_batches(model, pixels, normalise=_normalise, flip=True, batch_size=4)
    parts = embed_batches(model, [pixels[:4], pixels[4:]], normalise=_normalise, flip=True)
    assert torch.equal(whole, parts)


def test_embed_batch_keeps_the_raw_features_apart() -> None:
    model, pixels = _model(), _pixels(3)
    x = (pixels.float() / 255.0 - 0.5) / 0.5  # IJB's loop as it was written
    with torch.no_grad():
        model(x)
        as_is, mirrored = embed_batch(
            model, pixels, normalise=lambda p: normalise_pixels(p, 0.5, 0.5), flip=True
        )
        assert torch.equal(as_is, model(x).float())
        assert mirrored is not None
        assert torch.equal(mirrored, model(torch.flip(x, dims=(3,))).float())
        assert embed_batch(model, x, flip=False)[1] is None


def test_no_images_is_an_empty_answer_of_width_d() -> None:
    got = embed_batches(_model(), torch.empty(0, 3, 8, 8, dtype=torch.uint8), embedding_dim=8)
    assert got.shape == (0, 8)


@pytest.mark.parametrize(
    ("batch_size", "error"),
    [(0, ValueError), (-1, ValueError), (2.0, TypeError), (True, TypeError)],
)
def test_a_bad_batch_size_is_named(batch_size: object, error: type) -> None:
    with pytest.raises(error, match="batch_size"):
        embed_batches(_model(), _pixels(), batch_size=batch_size)  # type: ignore[arg-type]


def test_autocast_is_off_without_amp_dtype_and_on_with_it() -> None:
    model, pixels = _model(), _pixels()
    plain = embed_batches(model, pixels, normalise=_normalise)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = embed_batches(model, pixels, normalise=_normalise)
    assert torch.equal(inside, plain)
    amp = embed_batches(model, pixels, normalise=_normalise, amp_dtype=torch.bfloat16)
    assert not torch.equal(amp, plain)
    assert torch.allclose(amp, plain, atol=0.05)
