"""Degenerate identities between margins, value and gradient."""

from __future__ import annotations

import pytest
import torch

from marginface import functional as MF
from marginface.margins import (
    ArcFaceMargin,
    CombinedMargin,
    CosFaceMargin,
    CurricularFaceMargin,
    Margin,
    NormFaceMargin,
)

from ..conftest import make_loss


def _value_and_grad(margin: Margin, cosine: torch.Tensor, labels: torch.Tensor):
    cos = cosine.clone().requires_grad_(True)
    loss = MF.margin_cross_entropy(cos, labels, margin)
    (grad,) = torch.autograd.grad(loss, cos)
    return loss.detach(), grad


@pytest.fixture()
def batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    cosine = torch.rand(16, 9, generator=g, dtype=torch.float64) * 1.9 - 0.95
    labels = torch.randint(0, 9, (16,), generator=g)
    return cosine, labels


def assert_same(a: Margin, b: Margin, cosine: torch.Tensor, labels: torch.Tensor) -> None:
    la, ga = _value_and_grad(a, cosine, labels)
    lb, gb = _value_and_grad(b, cosine, labels)
    torch.testing.assert_close(la, lb, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ga, gb, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("policy", ["linear", "easy", "clip", "none"])
def test_zero_margins_equal_normface(batch, policy: str) -> None:
    cosine, labels = batch
    normface = NormFaceMargin(scale=30.0)
    assert_same(ArcFaceMargin(0.0, 30.0, policy=policy), normface, cosine, labels)
    assert_same(CosFaceMargin(0.0, 30.0), normface, cosine, labels)
    assert_same(CombinedMargin(1.0, 0.0, 0.0, 30.0, policy=policy), normface, cosine, labels)


@pytest.mark.parametrize("m", [0.1, 0.5, 1.2])
@pytest.mark.parametrize("policy", ["linear", "easy", "clip", "none"])
def test_combined_reduces_to_arcface(batch, m: float, policy: str) -> None:
    cosine, labels = batch
    assert_same(
        CombinedMargin(1.0, m, 0.0, 64.0, policy=policy),
        ArcFaceMargin(m, 64.0, policy=policy),
        cosine,
        labels,
    )


@pytest.mark.parametrize("m", [0.1, 0.35])
def test_combined_reduces_to_cosface(batch, m: float) -> None:
    cosine, labels = batch
    assert_same(CombinedMargin(1.0, 0.0, m, 64.0), CosFaceMargin(m, 64.0), cosine, labels)


def test_curricular_without_hard_negatives_and_t0_is_arcface() -> None:
    # every non-target cosine below cos(θ_y + m): no hard negatives
    cosine = torch.full((4, 5), -0.9, dtype=torch.float64)
    labels = torch.tensor([0, 1, 2, 4])
    cosine[torch.arange(4), labels] = torch.tensor([0.9, 0.8, 0.95, 0.7], dtype=torch.float64)
    curricular = CurricularFaceMargin(0.5, 64.0).eval()  # eval: t stays 0
    assert float(curricular.t) == 0.0
    assert_same(curricular, ArcFaceMargin(0.5, 64.0), cosine, labels)


def test_curricular_with_t0_hard_negatives_differ(batch) -> None:
    cosine, labels = batch
    curricular = CurricularFaceMargin(0.5, 64.0).eval()
    la, _ = _value_and_grad(curricular, cosine, labels)
    lb, _ = _value_and_grad(ArcFaceMargin(0.5, 64.0), cosine, labels)
    assert not torch.allclose(la, lb)  # the identity test above is not vacuous


def _loss_and_grads(loss_module, x, y):
    x = x.clone().requires_grad_(True)
    value = loss_module(x, y)
    gx, gw = torch.autograd.grad(value, (x, loss_module.weight))
    return value.detach(), gx, gw


def test_subcenter_k1_equals_arcface() -> None:
    x = torch.randn(12, 6, dtype=torch.float64)
    y = torch.randint(0, 8, (12,))
    sub = make_loss("subcenter-arcface", 8, 6, sub_centers=1, dtype=torch.float64)
    arc = make_loss("arcface", 8, 6, dtype=torch.float64)
    arc.weight.data.copy_(sub.weight.data)
    for a, b in zip(_loss_and_grads(sub, x, y), _loss_and_grads(arc, x, y), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_subcenter_pools_the_nearest_subcenter() -> None:
    sub = make_loss("subcenter-arcface", 3, 2, sub_centers=2, dtype=torch.float64)
    with torch.no_grad():
        # class 0: centers at 0° and 90°; class 1: 180°, 270°; class 2: 45°, 225°
        angles = torch.tensor([0, 90, 180, 270, 45, 225], dtype=torch.float64).deg2rad()
        sub.weight.copy_(torch.stack([angles.cos(), angles.sin()], dim=1))
    x = torch.tensor([[0.0, 1.0]], dtype=torch.float64)  # at 90°
    cos = sub.cosine(x)
    expected = torch.tensor([[1.0, 0.0, 2**-0.5]], dtype=torch.float64)
    torch.testing.assert_close(cos, expected)
