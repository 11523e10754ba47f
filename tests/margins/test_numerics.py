"""Finite values and gradients at the edges: cos θ = ±1, θ + m > π, zero-norm embeddings."""

from __future__ import annotations

import math

import pytest
import torch

import marginface
from marginface.functional import additive_angular_margin, margin_cross_entropy
from marginface.margins import ArcFaceMargin, CosFaceMargin

from ..conftest import make_loss

ALL = marginface.list_losses()


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_exactly_aligned_and_opposite_embeddings(name: str, dtype: torch.dtype) -> None:
    """Embeddings equal to (or opposite) their class center: cos θ = ±1 exactly."""
    loss_fn = make_loss(name, 4, 3, dtype=dtype)
    with torch.no_grad():
        loss_fn.weight.copy_(torch.eye(4, 3, dtype=dtype).repeat_interleave(loss_fn.sub_centers, 0))
    x = torch.tensor([[20.0, 0, 0], [0, -20.0, 0], [0, 0, 20.0], [-20.0, 0, 0]], dtype=dtype)
    x.requires_grad_(True)
    y = torch.tensor([0, 1, 2, 0])
    cos = loss_fn.cosine(x.detach()).detach()
    assert float(cos[0, 0]) == 1.0 and float(cos[1, 1]) == -1.0 and float(cos[3, 0]) == -1.0
    loss = loss_fn(x, y)
    loss.backward()
    assert torch.isfinite(loss)
    assert torch.isfinite(x.grad).all() and torch.isfinite(loss_fn.weight.grad).all()


@pytest.mark.parametrize("name", ALL)
def test_zero_norm_embedding(name: str) -> None:
    loss_fn = make_loss(name, 4, 3)
    x = torch.tensor([[0.0, 0.0, 0.0], [1.0, 2.0, 3.0]], requires_grad=True)
    loss = loss_fn(x, torch.tensor([1, 2]))
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(x.grad).all()
    assert torch.isfinite(loss_fn.weight.grad).all()


@pytest.mark.parametrize("policy", ["linear", "easy", "clip", "none"])
def test_theta_plus_m_beyond_pi_is_finite(policy: str) -> None:
    cos = torch.linspace(-1, 1, 2001, dtype=torch.float64, requires_grad=True)
    out = additive_angular_margin(cos, 1.0, policy)
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(cos.grad).all()


def test_policies_beyond_pi() -> None:
    m = 0.5
    theta = torch.tensor([math.pi - 0.2, math.pi - 0.05], dtype=torch.float64)  # θ + m > π
    cos = theta.cos()
    torch.testing.assert_close(additive_angular_margin(cos, m, "linear"), cos - m * math.sin(m))
    torch.testing.assert_close(additive_angular_margin(cos, m, "clip"), -torch.ones(2).double())
    torch.testing.assert_close(additive_angular_margin(cos, m, "none"), (theta + m).cos())
    torch.testing.assert_close(additive_angular_margin(cos, m, "easy"), cos)  # cos θ < 0
    inside = torch.tensor([0.3, 1.0], dtype=torch.float64)  # θ + m < π, cos θ > 0
    for policy in ("linear", "clip", "none", "easy"):
        torch.testing.assert_close(
            additive_angular_margin(inside.cos(), m, policy), (inside + m).cos()
        )


def test_arcface_exact_gradient_matches_formula() -> None:
    """d cos(θ+m)/d cos θ = cos m + sin m · cos θ / sin θ (the true derivative)."""
    cos = torch.tensor([-0.5, 0.1, 0.7, 0.99], dtype=torch.float64, requires_grad=True)
    additive_angular_margin(cos, 0.5, "none").sum().backward()
    c = cos.detach()
    expected = math.cos(0.5) + math.sin(0.5) * c / torch.sqrt(1 - c * c)
    torch.testing.assert_close(cos.grad, expected)


def test_straight_through_gradient_is_normface_like() -> None:
    g = torch.Generator().manual_seed(0)
    cosine = (torch.rand(6, 5, generator=g, dtype=torch.float64) * 1.8 - 0.9).requires_grad_(True)
    labels = torch.tensor([0, 1, 2, 3, 4, 0])
    exact = ArcFaceMargin(0.5, 64.0)
    st = ArcFaceMargin(0.5, 64.0, gradient="straight_through")
    torch.testing.assert_close(exact(cosine, labels), st(cosine, labels))  # same values
    # straight-through: d logit_y / d cos θ_y = s
    st(cosine, labels)[torch.arange(6), labels].sum().backward()
    torch.testing.assert_close(
        cosine.grad[torch.arange(6), labels], torch.full((6,), 64.0).double()
    )
    cosine.grad = None
    exact(cosine, labels)[torch.arange(6), labels].sum().backward()
    assert not torch.allclose(cosine.grad[torch.arange(6), labels], torch.full((6,), 64.0).double())


def test_large_scale_loss_is_accurate() -> None:
    """s = 64 with very confident rows: the loss must not lose precision or overflow."""
    cosine = torch.tensor([[0.99, -0.99, -0.99], [-0.99, 0.99, -0.99]])
    labels = torch.tensor([0, 1])
    loss = margin_cross_entropy(cosine, labels, CosFaceMargin(0.35, 64.0), reduction="none")
    ref = margin_cross_entropy(cosine.double(), labels, CosFaceMargin(0.35, 64.0), reduction="none")
    torch.testing.assert_close(loss.double(), ref, rtol=1e-5, atol=1e-12)
    assert (loss >= 0).all()


def test_arccos_clamps_cosines_just_outside_the_unit_interval() -> None:
    """Rounding can put a normalized cosine a few ulps beyond ±1; θ must still be 0 or π."""
    from marginface.margins._angles import arccos

    cosine = torch.tensor([1.0000001, -1.0000001, 1.5, -2.0])
    theta = arccos(cosine)
    assert theta.tolist() == pytest.approx([0.0, math.pi, 0.0, math.pi])
