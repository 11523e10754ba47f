"""Li-ArcFace / AirFace (Li et al., 2019): the paper's formula, its identities, bad inputs."""

from __future__ import annotations

import math

import pytest
import torch

from marginface.margins import LiArcFaceMargin

N, C = 8, 6


def _cosine(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    cosine = torch.rand(N, C, generator=generator, dtype=torch.float64) * 1.96 - 0.98
    return cosine, torch.randint(0, C, (N,), generator=generator)


def test_the_papers_logits() -> None:
    """logit = s(π - 2(θ + m·[j = y]))/π for every entry, θ up to π (no policy needed)."""
    cosine, labels = _cosine()
    cosine[0, labels[0]] = -0.97  # θ_y + m > π
    logits = LiArcFaceMargin(0.45, 64.0)(cosine, labels)
    for i in range(N):
        for j in range(C):
            theta = math.acos(float(cosine[i, j])) + (0.45 if j == int(labels[i]) else 0.0)
            assert float(logits[i, j]) == pytest.approx(64.0 * (math.pi - 2 * theta) / math.pi)


def test_the_target_logit_decreases_with_the_angle_everywhere() -> None:
    cos = torch.linspace(0.999, -0.999, 201, dtype=torch.float64).unsqueeze(1)
    logits = LiArcFaceMargin(1.0, 1.0)(cos, torch.zeros(201, dtype=torch.int64)).squeeze(1)
    assert bool((logits[1:] < logits[:-1]).all())


def test_the_gradient_is_the_angles() -> None:
    """∂logit/∂cos θ = 2s/(π sin θ) on every entry (margin or not)."""
    cosine, labels = _cosine(1)
    cosine.requires_grad_(True)
    (grad,) = torch.autograd.grad(LiArcFaceMargin(0.3, 10.0)(cosine, labels).sum(), cosine)
    sin = torch.sqrt(1 - cosine.detach() ** 2)
    torch.testing.assert_close(grad, 20.0 / (math.pi * sin), rtol=1e-12, atol=0)


@pytest.mark.parametrize(
    ("kwargs", "error", "pattern"),
    [
        ({"margin": -0.1}, ValueError, r"margin must be >= 0, got -0\.1"),
        ({"margin": 3.2}, ValueError, "margin must be < "),
        ({"scale": 0}, ValueError, "scale must be > 0, got 0"),
        ({"scale": "64"}, TypeError, "scale must be a real number"),
        ({"gradient": "none"}, ValueError, "gradient must be one of"),
    ],
)
def test_bad_options_are_named(kwargs: dict, error: type, pattern: str) -> None:
    with pytest.raises(error, match=pattern):
        LiArcFaceMargin(**kwargs)
