"""OpenSphere's SphereFace2-C head at ``9d53d28`` (the commit of the A and M files the parity
table reads) computes ``G(cos θ) ∓ m`` under ``no_grad`` as a shift of ``cos θ``: a
straight-through gradient (``∂z/∂cos θ = r``), unlike its later revisions, which differentiate
``G``. ``SphereFace2Loss(C, D, gradient="straight_through")`` reproduces the ``9d53d28`` form:
loss, ∂x, ∂W (tangential part), ∂b within 1e-10 in float64 over three SGD steps."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

import marginface

from .._opensphere_reference import sphereface2_initial_bias, sphereface2_loss
from .test_binary_parity import LR, _batch, _centers, _close, _ours

C, D = 12, 8


def sphereface2c_at_9d53d28(
    x: Tensor,
    w_unit: Tensor,
    labels: Tensor,
    bias: Tensor,
    *,
    alpha: float = 0.7,
    r: float = 40.0,
    m: float = 0.4,
    t: float = 3.0,
    lw: float = 50.0,
) -> Tensor:
    """The C head's forward at ``9d53d28``, restated: ``cos θ = x̂·wᵀ``; under ``no_grad`` the
    shift ``d = (2((cos θ + 1)/2)^t - 1 ∓ m) - cos θ`` (``-m`` at the label, ``+m`` elsewhere);
    logits ``r·(cos θ + d) + b``; weighted binary cross-entropy, mean over ``N×C``."""
    cos_theta = F.normalize(x, dim=1) @ w_unit.t()  # (N, C)
    one_hot = torch.zeros_like(cos_theta).scatter_(1, labels.view(-1, 1), 1.0)
    with torch.no_grad():
        g = 2.0 * ((cos_theta + 1.0) / 2.0).pow(t) - 1.0 - m * (2.0 * one_hot - 1.0)
        shift = g - cos_theta
    logits = r * (cos_theta + shift) + bias
    weight = lw * C / r * (alpha * one_hot + (1.0 - alpha) * (1.0 - one_hot))
    return F.binary_cross_entropy_with_logits(logits, one_hot, weight=weight)


def _steps(loss_fn, reference, *, gradient_of_reference_differs: bool = False) -> list[float]:
    """Three SGD steps of ``loss_fn`` and ``reference`` from the same unit centers and bias;
    the largest ∂x difference of each step."""
    b_ref = torch.tensor(float(loss_fn.margin.bias.detach()), dtype=torch.float64)
    w_ref = F.normalize(_centers(1), dim=1)
    differences = []
    for step in range(3):
        with torch.no_grad():
            loss_fn.weight.copy_(w_ref)
            loss_fn.margin.bias.copy_(b_ref)
        x, labels = _batch(step, w_ref)
        value, gx, gw, gb = _ours(loss_fn, x, labels)
        xr, wr, br = (v.clone().requires_grad_(True) for v in (x, w_ref, b_ref))
        expected = reference(xr, wr, labels, br)
        rx, rw, rb = torch.autograd.grad(expected, [xr, wr, br])
        rw_tangent = rw - w_ref * (rw * w_ref).sum(dim=1, keepdim=True)
        differences.append(float((gx - rx).abs().max()))
        if not gradient_of_reference_differs:
            what = f"step {step}"
            _close(value, expected.detach(), f"{what} loss")
            _close(gx, rx, f"{what} ∂x")
            _close(gw, rw_tangent, f"{what} ∂W")
            _close(gb, rb, f"{what} ∂b")
        with torch.no_grad():
            w_ref = F.normalize(w_ref - LR * rw, dim=1)
            b_ref = b_ref - LR * rb
    return differences


@pytest.mark.parametrize("impl", ["dense", "chunked"])
def test_straight_through_reproduces_the_9d53d28_head(impl: str) -> None:
    loss_fn = marginface.SphereFace2Loss(
        C, D, gradient="straight_through", dtype=torch.float64, impl=impl, chunk_size=5
    )
    assert float(loss_fn.margin.bias.detach()) == float(
        torch.tensor(sphereface2_initial_bias(C, "C", 0.7, 40.0, 0.4, 3.0))
    )
    _steps(loss_fn, sphereface2c_at_9d53d28)


def test_the_two_revisions_differ_in_the_gradient_only() -> None:
    """The exact gradient (the later revisions, ``SphereFace2Loss``'s default) is not the
    9d53d28 head's: same loss, different ∂x."""
    x, labels = _batch(0, F.normalize(_centers(1), dim=1))
    w = F.normalize(_centers(1), dim=1)
    b = torch.tensor(-5.0, dtype=torch.float64)
    xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    old = sphereface2c_at_9d53d28(xa, w, labels, b)
    new = sphereface2_loss(xb, w, labels, b, variant="C")
    assert abs(float(old.detach()) - float(new.detach())) <= 1e-12
    (ga,) = torch.autograd.grad(old, [xa])
    (gb,) = torch.autograd.grad(new, [xb])
    assert float((ga - gb).abs().max()) > 1e-3
    exact = marginface.SphereFace2Loss(C, D, dtype=torch.float64)
    differences = _steps(exact, sphereface2c_at_9d53d28, gradient_of_reference_differs=True)
    assert max(differences) > 1e-3
