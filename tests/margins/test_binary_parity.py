"""SphereFace2 (C, A, M) and UniFace against the authors' code restated
(tests/_opensphere_reference.py): loss, ∂x, ∂W and ∂b within 1e-10 in float64 over three
training steps (the bias and the centers move by SGD on both sides), dense and chunked."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import marginface

from .._opensphere_reference import sphereface2_initial_bias, sphereface2_loss, uniface_loss

N, C, D = 10, 12, 8
TOLERANCE = 1e-10
LR = 0.5


def _batch(step: int, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Norms 2..140; a third of the rows point away from their class (cos θ_y ≈ -0.97: θ + m
    and m·θ beyond π, UniFace's clamp), one row almost on its center (cos θ_y ≈ 0.9999)."""
    generator = torch.Generator().manual_seed(10 + step)
    labels = torch.randint(0, C, (N,), generator=generator)
    x = torch.randn(N, D, generator=generator, dtype=torch.float64)
    centers = F.normalize(weight[labels], dim=1)
    away = torch.arange(N) % 3 == 0
    x[away] = -centers[away] + 0.15 * x[away] / x[away].norm(dim=1, keepdim=True)
    x[1] = centers[1] + 0.01 * F.normalize(x[1], dim=0)
    x = F.normalize(x, dim=1) * torch.linspace(2.0, 140.0, N, dtype=torch.float64).unsqueeze(1)
    return x, labels


def _centers(seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(C, D, generator=generator, dtype=torch.float64)
    weight[5] = weight[4] + 0.01 * weight[5]  # two nearly coincident centers
    return weight


def _ours(loss_fn, x, labels):
    x = x.clone().requires_grad_(True)
    value = loss_fn(x, labels)
    gx, gw, gb = torch.autograd.grad(value, [x, loss_fn.weight, loss_fn.margin.bias])
    return value.detach(), gx, gw, gb


def _close(actual, expected, what):
    error = float((actual - expected).abs().max())
    assert error <= TOLERANCE, f"{what}: {error:.3g}"


SPHEREFACE2 = [
    ("sphereface2", "C", {}),
    ("sphereface2", "C", {"margin": 0.3, "scale": 30.0, "balance": 0.8, "power": 2.0}),
    ("sphereface2-a", "A", {}),  # the default is the authors' straight-through gradient
    ("sphereface2-a", "A", {"gradient": "straight_through", "margin": 1.2}),
    ("sphereface2-m", "M", {}),
    ("sphereface2-m", "M", {"gradient": "straight_through", "margin": 3.0, "loss_weight": 10.0}),
]


@pytest.mark.parametrize("impl", ["dense", "chunked"])
@pytest.mark.parametrize(("name", "variant", "options"), SPHEREFACE2)
def test_sphereface2_equals_the_authors_code(name, variant, options, impl):
    defaults = {"A": 0.5, "M": 1.7, "C": 0.4}
    m = options.get("margin", defaults[variant])
    r = options.get("scale", 40.0)
    alpha, t = options.get("balance", 0.7), options.get("power", 3.0)
    lw = options.get("loss_weight", 50.0)
    loss_fn = marginface.create_loss(
        name, C, D, dtype=torch.float64, impl=impl, chunk_size=5, **options
    )
    # stored in a float32 parameter on both sides (the authors' torch.Tensor(1)), then float64
    expected_bias = float(torch.tensor(sphereface2_initial_bias(C, variant, alpha, r, m, t)))
    assert float(loss_fn.margin.bias) == expected_bias
    w_ref = F.normalize(_centers(1), dim=1)  # the authors' centers are unit (renormalized)
    b_ref = torch.tensor(expected_bias, dtype=torch.float64)
    for step in range(3):
        with torch.no_grad():
            loss_fn.weight.copy_(w_ref)
            loss_fn.margin.bias.copy_(b_ref)
        x, labels = _batch(step, w_ref)
        value, gx, gw, gb = _ours(loss_fn, x, labels)

        xr = x.clone().requires_grad_(True)
        wr = w_ref.clone().requires_grad_(True)
        br = b_ref.clone().requires_grad_(True)
        reference = sphereface2_loss(
            xr, wr, labels, br, variant=variant, alpha=alpha, r=r, m=m, t=t, lw=lw
        )
        rx, rw, rb = torch.autograd.grad(reference, [xr, wr, br])
        # marginface differentiates through w/‖w‖: the reference's gradient on unit centers
        # without its radial part (which the authors' renormalization discards next step)
        rw_tangent = rw - w_ref * (rw * w_ref).sum(dim=1, keepdim=True)
        what = f"{name} {options} {impl} step {step}"
        _close(value, reference.detach(), f"{what} loss")
        _close(gx, rx, f"{what} ∂x")
        _close(gw, rw_tangent, f"{what} ∂W")
        _close(gb, rb, f"{what} ∂b")
        with torch.no_grad():  # the authors' step: SGD, then the next forward renormalizes
            w_ref = F.normalize(w_ref - LR * rw, dim=1)
            b_ref = b_ref - LR * rb


def _three_steps_against(loss_fn, reference, w_ref, b_ref, what):
    """Three SGD steps (lr ``LR``) of ``loss_fn`` and of ``reference(x, w, labels, b)`` from the
    same centers and bias: loss, ∂x, ∂W and ∂b equal within ``TOLERANCE`` at each. Returns each
    step's ``(x, labels, centers, bias)`` as both sides saw them."""
    seen = []
    for step in range(3):
        with torch.no_grad():
            loss_fn.weight.copy_(w_ref)
            loss_fn.margin.bias.copy_(b_ref)
        x, labels = _batch(step, w_ref)
        value, gx, gw, gb = _ours(loss_fn, x, labels)
        xr = x.clone().requires_grad_(True)
        wr = w_ref.clone().requires_grad_(True)
        br = b_ref.clone().requires_grad_(True)
        expected = reference(xr, wr, labels, br)
        rx, rw, rb = torch.autograd.grad(expected, [xr, wr, br])
        _close(value, expected.detach(), f"{what} step {step} loss")
        _close(gx, rx, f"{what} step {step} ∂x")
        _close(gw, rw, f"{what} step {step} ∂W")
        _close(gb, rb, f"{what} step {step} ∂b")
        seen.append((x, labels, w_ref, b_ref))
        with torch.no_grad():
            w_ref = w_ref - LR * rw
            b_ref = b_ref - LR * rb
    return seen


UNIFACE = [
    {"clamp_logits": True},
    {"clamp_logits": True, "margin": 0.0, "negative_weight": 0.5, "scale": 32.0},
]


@pytest.mark.parametrize("impl", ["dense", "chunked"])
@pytest.mark.parametrize("options", UNIFACE)
def test_uniface_equals_the_authors_code(options, impl):
    m, s = options.get("margin", 0.4), options.get("scale", 64.0)
    lam = options.get("negative_weight", 1.0)
    loss_fn = marginface.create_loss(
        "uniface", C, D, dtype=torch.float64, impl=impl, chunk_size=5, **options
    )
    initial = float(torch.tensor(math.log(C * 1.0 * 10)))  # a float32 parameter on both sides
    assert float(loss_fn.margin.bias) == initial
    seen = _three_steps_against(
        loss_fn,
        lambda x, w, labels, b: uniface_loss(x, w, labels, b, m=m, s=s, l=lam),
        _centers(2),
        torch.tensor(initial, dtype=torch.float64),
        f"uniface {options} {impl}",
    )
    clamped = 0
    for x, labels, w_ref, b_ref in seen:
        cos = F.normalize(x) @ F.normalize(w_ref).t()
        clamped += int(((s * cos - b_ref).abs() > s).sum())
        clamped += int(((s * (cos.gather(1, labels[:, None]) - m) - b_ref).abs() > s).sum())
    assert clamped > 0  # the inputs reach the authors' clamp


def test_uniface_without_the_clamp_differs_only_where_the_clamp_acts():
    """The default (the paper's loss, no clamp) equals the authors' code on logits inside
    ``[-s, s]`` and differs where one is outside."""
    loss_fn = marginface.create_loss("uniface", C, D, dtype=torch.float64)
    w = _centers(3)
    with torch.no_grad():
        loss_fn.weight.copy_(w)
    b = loss_fn.margin.bias.detach().clone()
    x, labels = _batch(0, w)
    cos = F.normalize(x) @ F.normalize(w).t()
    logits = torch.where(F.one_hot(labels, C).bool(), 64.0 * (cos - 0.4) - b, 64.0 * cos - b)
    inside = (logits.abs() <= 64.0).all(dim=1)  # rows whose logits stay within [-s, s]
    assert 0 < int(inside.sum()) < N
    ours = loss_fn(x[inside], labels[inside])
    theirs = uniface_loss(x[inside], w, labels[inside], b)
    assert abs(float(ours - theirs)) <= TOLERANCE
    assert abs(float(loss_fn(x, labels) - uniface_loss(x, w, labels, b))) > 1e-6


def _uniface_a_formula(x, weight, labels, bias, *, m, s, policy):
    """UniFace with ArcFace's margin, restated: ``θ_y = arccos(cos θ_y)``, the target
    ``cos(θ_y + m)`` (ArcFace's ``policy`` where ``θ_y + m >= π``), ``softplus(b - s·f)`` at the
    label and ``softplus(s·cos θ_j - b)`` elsewhere, summed over classes, mean over rows."""
    cos = F.normalize(x) @ F.normalize(weight).t()
    one_hot = F.one_hot(labels, weight.shape[0]).bool()
    cos_y = cos[one_hot]
    theta = torch.arccos(cos_y)
    beyond = cos_y <= math.cos(math.pi - m)
    fallback = {"linear": cos_y - math.sin(math.pi - m) * m, "clip": -torch.ones_like(cos_y)}
    target = torch.where(beyond, fallback[policy], torch.cos(theta + m))
    positive = F.softplus(-(s * target - bias), threshold=1000)
    negative = torch.where(one_hot, 0.0, F.softplus(s * cos - bias, threshold=1000)).sum(dim=1)
    return (positive + negative).mean()


@pytest.mark.parametrize("impl", ["dense", "chunked"])
@pytest.mark.parametrize("policy", ["linear", "clip"])
def test_uniface_a_equals_its_formula_over_three_steps(policy, impl):
    """No authors' code has this variant (docs/parity.md): the loss, ∂x, ∂W and ∂b equal the
    formula restated through ``arccos`` within 1e-10 over three SGD steps, with rows beyond
    ``θ_y + m = π``."""
    m, s = 0.5, 64.0
    loss_fn = marginface.create_loss(
        "uniface-a", C, D, dtype=torch.float64, impl=impl, chunk_size=5, policy=policy
    )
    seen = _three_steps_against(
        loss_fn,
        lambda x, w, labels, b: _uniface_a_formula(x, w, labels, b, m=m, s=s, policy=policy),
        _centers(4),
        loss_fn.margin.bias.detach().double().clone(),
        f"uniface-a {policy} {impl}",
    )
    beyond = 0
    for x, labels, w_ref, _ in seen:
        cos_y = (F.normalize(x) * F.normalize(w_ref)[labels]).sum(dim=1)
        beyond += int((cos_y <= math.cos(math.pi - m)).sum())
    assert beyond > 0  # the fallback is exercised
