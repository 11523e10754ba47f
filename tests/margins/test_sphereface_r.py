"""SphereFace-R and SphereFace+ (OpenSphere, ydwen/opensphere ``model/head/spherefacer.py``,
``spherefaceplus.py``): parity with the authors' computation restated in
tests/_facex_reference.py (float64, 3 steps), the detached Δ's gradient, the head's MHE weight
regularizer, bad inputs."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import marginface
from marginface.margins import SphereFaceRMargin
from marginface.weight_regularizers import MinimumHypersphericalEnergy

from .._facex_reference import sphereface_plus_loss, sphereface_r_factor, sphereface_r_loss

TOLERANCE = 1e-10
N, C, D, STEPS, LR = 16, 11, 6, 3, 0.5


def _batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(300 + step)
    x = torch.randn(N, D, generator=generator, dtype=torch.float64) * 5
    return x, torch.randint(0, C, (N,), generator=generator)


def _tangent(weight: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """``g - (ŵ·g)ŵ`` per row: the gradient through ``w/‖w‖`` at unit-norm ``w``."""
    unit = F.normalize(weight, dim=1)
    return grad - (unit * grad).sum(dim=1, keepdim=True) * unit


def _parity(name: str, options: dict, reference, factor: float, impl: str) -> dict[str, float]:
    """Loss, ∂x, ∂W over STEPS steps: ``factor·ours`` (the authors' constant loss weight)
    against theirs, the centers renormalized before each step on both sides (their head does it
    in place), their ∂W taken to the tangent space (ours goes through ``w/‖w‖``), both sides
    stepping with our update so that the centers stay equal."""
    torch.manual_seed(0)
    extra = {"chunk_size": 4} if impl == "chunked" else {}
    loss = marginface.create_loss(name, C, D, impl=impl, dtype=torch.float64, **extra, **options)
    errors = {"loss": 0.0, "∂x": 0.0, "∂W": 0.0}
    for step in range(STEPS):
        with torch.no_grad():
            loss.weight.copy_(F.normalize(loss.weight, dim=1))
        weight = loss.weight.detach().clone().requires_grad_(True)
        x, labels = _batch(step)
        xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
        ours = factor * loss(xa, labels)
        gxa, gwa = torch.autograd.grad(ours, [xa, loss.weight])
        theirs = reference(xb, weight, labels)
        gxb, gwb = torch.autograd.grad(theirs, [xb, weight])
        errors["loss"] = max(errors["loss"], float((ours - theirs).detach().abs()))
        errors["∂x"] = max(errors["∂x"], float((gxa - gxb).abs().max()))
        tangent = _tangent(weight.detach(), gwb)
        errors["∂W"] = max(errors["∂W"], float((gwa - tangent).abs().max()))
        with torch.no_grad():
            loss.weight -= LR * gwa
    return errors


H_CASES = [
    ({}, {"variant": "H"}),
    (
        {"kind": "v1", "margin": 1.7, "scale": 20.0},
        {"variant": "H", "kind": "v1", "m": 1.7, "s": 20.0},
    ),
    ({"kind": "v2", "margin": 1.4}, {"variant": "H", "kind": "v2", "m": 1.4}),
    ({"feature_norm": "none"}, {"variant": "N"}),
    ({"feature_norm": "soft", "soft_weight": 0.01 * 30.0 / 50.0}, {"variant": "S"}),
]


@pytest.mark.parametrize("impl", ["dense", "chunked"])
@pytest.mark.parametrize(("options", "theirs"), H_CASES)
def test_sphereface_r_reproduces_opensphere(options: dict, theirs: dict, impl: str) -> None:
    variant = theirs["variant"]
    s = theirs.get("s", 30.0)
    factor = sphereface_r_factor(variant, s)  # their default lw (/ s)
    reference = lambda x, w, y: sphereface_r_loss(x, w, y, **theirs)  # noqa: E731
    errors = _parity("sphereface-r", options, reference, factor, impl)
    assert max(errors.values()) <= TOLERANCE, errors


PLUS_CASES = [
    ({}, 1.0),
    ({"weight_regularizer": MinimumHypersphericalEnergy(0.3), "margin": 1.3}, 0.3),
]


@pytest.mark.parametrize("impl", ["dense", "chunked"])
@pytest.mark.parametrize(("options", "lam"), PLUS_CASES)
def test_sphereface_plus_reproduces_opensphere(options: dict, lam: float, impl: str) -> None:
    m = options.get("margin", 1.5)
    reference = lambda x, w, y: sphereface_plus_loss(x, w, y, m=m, lam=lam)  # noqa: E731
    errors = _parity("sphereface-plus", options, reference, 1.0, impl)
    assert max(errors.values()) <= TOLERANCE, errors


def test_the_target_value_is_psi_and_its_gradient_the_cosines() -> None:
    """v0: logit_y = s·ψ(θ_y) with real m; ∂logit_y/∂cos θ_y = s (Δ detached)."""
    cosine = torch.tensor([[0.9, 0.1], [-0.3, 0.2], [0.2, -0.95]], dtype=torch.float64)
    cosine.requires_grad_(True)
    labels = torch.tensor([0, 0, 1])
    margin = SphereFaceRMargin(1.5, 30.0)
    logits = margin(cosine, labels)
    for i, y in enumerate(labels.tolist()):
        theta = 1.5 * math.acos(float(cosine[i, y]))
        k = math.floor(theta / math.pi)
        expected = (-1) ** k * math.cos(theta) - 2 * k
        assert float(logits[i, y]) == pytest.approx(30.0 * expected, rel=1e-12)
    (grad,) = torch.autograd.grad(logits.sum(), cosine)
    torch.testing.assert_close(grad, torch.full_like(grad, 30.0))


def test_the_exact_gradient_mode_differentiates_psi() -> None:
    cosine = torch.tensor([[0.6, 0.1]], dtype=torch.float64, requires_grad=True)
    logits = SphereFaceRMargin(1.5, 1.0, gradient="exact")(cosine, torch.tensor([0]))
    (grad,) = torch.autograd.grad(logits[0, 0], cosine)
    theta = math.acos(0.6)  # d cos(1.5θ)/d cos θ = 1.5 sin(1.5θ)/sin θ
    assert float(grad[0, 0]) == pytest.approx(1.5 * math.sin(1.5 * theta) / math.sin(theta))


@pytest.mark.parametrize("impl", ["dense", "chunked"])
@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("sphereface-r", {"kind": "v0"}),
        ("sphereface-r", {"kind": "v1", "feature_norm": "soft"}),
        ("sphereface-r", {"kind": "v2", "feature_norm": "none"}),
        ("sphereface-plus", {}),
    ],
)
def test_float64_gradcheck_of_the_exact_gradient(name: str, options: dict, impl: str) -> None:
    """With gradient='exact' the head's gradient is the derivative of its value (MHE included)."""
    torch.manual_seed(5)
    extra = {"chunk_size": 2} if impl == "chunked" else {}
    loss = marginface.create_loss(
        name, 4, 3, gradient="exact", dtype=torch.float64, reduction="sum", **extra, **options
    )
    x = (torch.randn(5, 3, dtype=torch.float64) * 3).requires_grad_(True)
    y = torch.tensor([0, 1, 2, 3, 1])
    w = loss.weight.detach().clone().requires_grad_(True)

    def fn(x_, w_):
        return torch.func.functional_call(loss, {"weight": w_}, (x_, y))

    assert torch.autograd.gradcheck(fn, (x, w), atol=1e-6)


def test_mhe_counts_each_distinct_center_once_and_is_zero_for_one_class() -> None:
    generator = torch.Generator().manual_seed(0)
    centers = torch.randn(3, 4, generator=generator, dtype=torch.float64)
    mhe = MinimumHypersphericalEnergy(2.0)
    rows = torch.tensor([5, 1, 5, 7, 1])
    batch = centers[[0, 1, 0, 2, 1]]
    unit = F.normalize(centers, dim=1)
    angles = torch.acos((unit @ unit.t()).clamp(-1 + 1e-5, 1 - 1e-5))
    expected = 2.0 * (angles[0, 1] ** -2 + angles[0, 2] ** -2 + angles[1, 2] ** -2) / 3
    torch.testing.assert_close(mhe(batch, rows), expected, rtol=1e-13, atol=0)
    assert float(mhe(batch[:1].repeat(3, 1), torch.tensor([4, 4, 4]))) == 0.0


@pytest.mark.parametrize(
    ("kwargs", "error", "pattern"),
    [
        ({"margin": 0.9}, ValueError, r"margin must be >= 1 .*got 0\.9"),
        ({"kind": "v3"}, ValueError, "kind must be one of"),
        ({"feature_norm": "hyper"}, ValueError, "feature_norm must be one of"),
        ({"soft_weight": -1.0}, ValueError, r"soft_weight must be >= 0, got -1\.0"),
        ({"scale": 0}, ValueError, "scale must be > 0, got 0"),
    ],
)
def test_bad_options_are_named(kwargs: dict, error: type, pattern: str) -> None:
    with pytest.raises(error, match=pattern):
        SphereFaceRMargin(**kwargs)


def test_bad_weight_regularizers_are_named() -> None:
    with pytest.raises(TypeError, match="weight_regularizer must be a marginface"):
        marginface.create_loss("arcface", 4, 3, weight_regularizer="mhe")
    with pytest.raises(ValueError, match=r"weight must be >= 0, got -1"):
        MinimumHypersphericalEnergy(-1)
    with pytest.raises(ValueError, match=r"power must be > 0, got 0"):
        MinimumHypersphericalEnergy(power=0)


def measured_table() -> list[str]:
    """docs/parity.md's rows: ``name options: dense loss/∂x/∂W | chunked ...``."""
    lines = []
    for options, theirs in H_CASES:
        factor = sphereface_r_factor(theirs["variant"], theirs.get("s", 30.0))
        cells = []
        for impl in ("dense", "chunked"):
            reference = lambda x, w, y, t=theirs: sphereface_r_loss(x, w, y, **t)  # noqa: E731
            errors = _parity("sphereface-r", options, reference, factor, impl)
            cells.append(" / ".join(f"{errors[k]:.1e}" for k in ("loss", "∂x", "∂W")))
        lines.append(f"sphereface-r {options}: {' | '.join(cells)}")
    for options, lam in PLUS_CASES:
        m = options.get("margin", 1.5)
        cells = []
        for impl in ("dense", "chunked"):
            reference = lambda x, w, y, m=m, lam=lam: sphereface_plus_loss(x, w, y, m=m, lam=lam)  # noqa: E731
            errors = _parity("sphereface-plus", options, reference, 1.0, impl)
            cells.append(" / ".join(f"{errors[k]:.1e}" for k in ("loss", "∂x", "∂W")))
        lines.append(f"sphereface-plus {options}: {' | '.join(cells)}")
    return lines


if __name__ == "__main__":  # python -m tests.margins.test_sphereface_r
    print("\n".join(measured_table()))
