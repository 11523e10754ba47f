"""ArcNegFace (Liu et al., 2019): the paper's formula restated, the Gaussian weights' gradient,
bad inputs."""

from __future__ import annotations

import math

import pytest
import torch

from marginface.margins import ArcFaceMargin, ArcNegFaceMargin

from ._frozen_weights import check_frozen_weight_gradient

N, C = 8, 6


def _cosine(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    cosine = torch.rand(N, C, generator=generator, dtype=torch.float64) * 1.8 - 0.9
    return cosine, torch.randint(0, C, (N,), generator=generator)


def test_the_papers_logits() -> None:
    """logit_y = s cos(θ_y + m); logit_j = s(G cos θ_j + G - 1) with
    G = α e^{-(cos θ_j - cos(θ_y + m))²/σ}."""
    cosine, labels = _cosine()
    m, s, alpha, sigma = 0.5, 64.0, 1.2, 2.0
    logits = ArcNegFaceMargin(m, s, alpha=alpha, sigma=sigma, policy="none")(cosine, labels)
    for i in range(N):
        y = int(labels[i])
        f = math.cos(math.acos(float(cosine[i, y])) + m)
        for j in range(C):
            c = float(cosine[i, j])
            g = alpha * math.exp(-((c - f) ** 2) / sigma)
            expected = s * f if j == y else s * (g * c + g - 1)
            assert float(logits[i, j]) == pytest.approx(expected, rel=1e-12, abs=1e-12)


def test_the_target_is_arcfaces() -> None:
    cosine, labels = _cosine(1)
    ours = ArcNegFaceMargin(0.5, 64.0)(cosine, labels).gather(1, labels[:, None])
    arcface = ArcFaceMargin(0.5, 64.0)(cosine, labels).gather(1, labels[:, None])
    torch.testing.assert_close(ours, arcface, rtol=0, atol=1e-12)


@pytest.mark.parametrize("impl", ["dense", "chunked"])
def test_the_heads_gradient_is_the_frozen_weight_derivative(impl: str) -> None:
    """float64: the head's ∂L/∂x, ∂L/∂W equal central differences with t frozen."""
    m, s, alpha, sigma = 0.5, 16.0, 1.2, 2.0

    def frozen(c0: torch.Tensor, y: torch.Tensor, x: torch.Tensor):
        is_target = torch.nn.functional.one_hot(y, c0.shape[1]).bool()
        f0 = torch.cos(torch.acos(c0.gather(1, y[:, None])) + m)  # (N, 1)
        t = alpha * torch.exp(-((c0 - f0) ** 2) / sigma)

        def logits(cosine: torch.Tensor) -> torch.Tensor:
            f = torch.cos(torch.acos(cosine.gather(1, y[:, None])) + m)
            return s * torch.where(is_target, f, t * cosine + t - 1)

        return logits

    check_frozen_weight_gradient("arcnegface", {"margin": m, "scale": s}, frozen, impl)


@pytest.mark.parametrize(
    ("kwargs", "error", "pattern"),
    [
        ({"alpha": 0.0}, ValueError, "alpha must be > 0, got 0"),
        ({"sigma": -2.0}, ValueError, r"sigma must be > 0, got -2\.0"),
        ({"sigma": "2"}, TypeError, "sigma must be a real number"),
        ({"margin": 3.5}, ValueError, "margin must be < "),
        ({"policy": "hard"}, ValueError, "policy must be one of"),
        ({"scale": float("inf")}, ValueError, "scale must be finite"),
    ],
)
def test_bad_options_are_named(kwargs: dict, error: type, pattern: str) -> None:
    with pytest.raises(error, match=pattern):
        ArcNegFaceMargin(**kwargs)
