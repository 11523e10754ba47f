"""Circle loss, class-level (Sun et al., 2020): the paper's formula, the self-paced weights'
gradient, bad inputs."""

from __future__ import annotations

import math

import pytest
import torch

from marginface.margins import CircleMargin

from ._frozen_weights import check_frozen_weight_gradient

N, C = 8, 6


def _cosine(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    cosine = torch.rand(N, C, generator=generator, dtype=torch.float64) * 1.96 - 0.98
    return cosine, torch.randint(0, C, (N,), generator=generator)


def test_the_papers_loss() -> None:
    """L = log(1 + Σ_j e^{γ α_n (s_n - Δ_n)} · e^{-γ α_p (s_p - Δ_p)}) with one positive: the
    paper's Eq. 4 for a single positive similarity, per sample."""
    cosine, labels = _cosine()
    m, gamma = 0.25, 8.0
    logits = CircleMargin(m, gamma)(cosine, labels)
    losses = torch.nn.functional.cross_entropy(logits, labels, reduction="none")
    for i in range(N):
        y = int(labels[i])
        s_p = float(cosine[i, y])
        positive = gamma * max(1 + m - s_p, 0.0) * (s_p - (1 - m))
        negatives = sum(
            math.exp(gamma * max(float(cosine[i, j]) + m, 0.0) * (float(cosine[i, j]) - m))
            for j in range(C)
            if j != y
        )
        expected = math.log(1 + negatives * math.exp(-positive))
        assert float(losses[i]) == pytest.approx(expected, rel=1e-12)


def test_the_weights_carry_no_gradient() -> None:
    """∂logit_j/∂cos θ_j = γ α_n and ∂logit_y/∂cos θ_y = γ α_p (α's held constant)."""
    cosine, labels = _cosine(1)
    cosine.requires_grad_(True)
    m, gamma = 0.25, 4.0
    (grad,) = torch.autograd.grad(CircleMargin(m, gamma)(cosine, labels).sum(), cosine)
    c = cosine.detach()
    is_target = torch.nn.functional.one_hot(labels, C).bool()
    expected = torch.where(
        is_target, gamma * (1 + m - c).clamp_min(0), gamma * (c + m).clamp_min(0)
    )
    torch.testing.assert_close(grad, expected, rtol=1e-12, atol=0)
    assert bool((grad[~is_target] == 0).any())  # negatives below -m get no gradient


@pytest.mark.parametrize(
    ("kwargs", "error", "pattern"),
    [
        ({"margin": -0.1}, ValueError, r"margin must be >= 0, got -0\.1"),
        ({"margin": 1.5}, ValueError, r"margin must be <= 1"),
        ({"scale": -1.0}, ValueError, "scale must be > 0"),
        ({"scale": None}, TypeError, "scale must be a real number"),
    ],
)
def test_bad_options_are_named(kwargs: dict, error: type, pattern: str) -> None:
    with pytest.raises(error, match=pattern):
        CircleMargin(**kwargs)


@pytest.mark.parametrize("impl", ["dense", "chunked"])
def test_the_heads_gradient_is_the_frozen_weight_derivative(impl: str) -> None:
    """float64: ∂L/∂x and ∂L/∂W of the head equal central differences of the loss with α_p and
    α_n frozen at the evaluation point (the gradcheck of a loss whose weights are detached)."""
    m, gamma = 0.25, 16.0

    def frozen(c0: torch.Tensor, y: torch.Tensor, x: torch.Tensor):
        is_target = torch.nn.functional.one_hot(y, c0.shape[1]).bool()
        alpha = torch.where(is_target, (1 + m - c0).clamp_min(0), (c0 + m).clamp_min(0))
        delta = torch.where(is_target, torch.full_like(c0, 1 - m), torch.full_like(c0, m))
        return lambda cosine: gamma * alpha * (cosine - delta)

    check_frozen_weight_gradient("circle", {"margin": m, "scale": gamma}, frozen, impl)
