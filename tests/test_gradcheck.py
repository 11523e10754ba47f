"""float64 gradcheck of every registered loss, with respect to embeddings and class centers."""

from __future__ import annotations

import pytest
import torch

import marginface

from .conftest import make_loss

DETACHED_BY_DESIGN = {
    "circle": "circle loss's self-paced weights α_p, α_n carry no gradient (paper and authors' "
    "code): its gradient is checked against the frozen-weight derivative in "
    "tests/margins/test_circle.py",
    "arcnegface": "ArcNegFace's Gaussian weights t carry no gradient (authors' code): its gradient "
    "is checked against the frozen-weight derivative in tests/margins/test_arcnegface.py",
    "npcface": "NPCFace's target margin m' (the mean of the row's hard-negative cosines) carries "
    "no gradient (authors' code): its gradient is checked against the frozen-mask derivative in "
    "tests/margins/test_npcface.py",
    "sphereface-r": "SphereFace-R's Δ = η(θ) - cos θ is detached by design (the method, and the "
    "authors' code: gradient='straight_through' by default); the default gradient is checked in "
    "tests/margins/test_sphereface_r.py, and gradient='exact' is gradchecked there",
    "sphereface-plus": "SphereFace+'s target Δ is detached as SphereFace-R's (authors' code); "
    "gradient='exact' with its MHE regularizer is gradchecked in "
    "tests/margins/test_sphereface_r.py",
}

STRAIGHT_THROUGH_BY_DEFAULT = {"sphereface2-a", "sphereface2-m"}
"""Losses whose default gradient is the authors' straight-through one (not the derivative of the
formula; compared with the authors' code in tests/margins/test_binary_parity.py): gradchecked
with ``gradient="exact"``, the formula's own derivative."""


@pytest.mark.parametrize("name", marginface.list_losses())
def test_gradcheck(name: str) -> None:
    if name in DETACHED_BY_DESIGN:
        pytest.skip(DETACHED_BY_DESIGN[name])
    torch.manual_seed(5)
    options = {"gradient": "exact"} if name in STRAIGHT_THROUGH_BY_DEFAULT else {}
    loss_fn = make_loss(name, 4, 3, dtype=torch.float64, reduction="sum", **options)
    loss_fn.eval()  # frozen state: the function under test must not change between evaluations
    # AdaFace deliberately detaches the norm (paper); above its clip of 100 the norm has no
    # effect at all, so the numerical derivative sees the same function as the analytical one.
    radius = 150.0 if name == "adaface" else 15.0
    x = (torch.randn(5, 3, dtype=torch.float64) * radius).requires_grad_(True)
    y = torch.tensor([0, 1, 2, 3, 1])
    w = loss_fn.weight.detach().clone().requires_grad_(True)

    def fn(x_, w_):
        return torch.func.functional_call(loss_fn, {"weight": w_}, (x_, y))

    assert torch.autograd.gradcheck(fn, (x, w), atol=1e-6)


@pytest.mark.parametrize("name", ["sphereface", "magface"])
def test_gradcheck_norm_dependence(name: str) -> None:
    """The norm-dependent margins, with norms inside their active ranges."""
    loss_fn = make_loss(name, 4, 3, dtype=torch.float64, reduction="sum").eval()
    x = torch.randn(5, 3, dtype=torch.float64)
    x = x / x.norm(dim=1, keepdim=True) * torch.tensor([[12.0], [30.0], [55.0], [80.0], [100.0]])
    x = x.to(torch.float64).requires_grad_(True)
    y = torch.tensor([0, 1, 2, 3, 1])
    assert torch.autograd.gradcheck(lambda x_: loss_fn(x_, y), (x,), atol=1e-6)


def test_adaface_gradient_ignores_the_norm() -> None:
    """AdaFace's margin depends on the norm, but by design no gradient flows through it."""
    loss_fn = make_loss("adaface", 4, 3, dtype=torch.float64, reduction="sum").eval()
    x = torch.randn(5, 3, dtype=torch.float64) * 20
    y = torch.tensor([0, 1, 2, 3, 1])
    scale = torch.ones(5, 1, dtype=torch.float64, requires_grad=True)
    loss = loss_fn(x * scale, y)  # the loss changes with the norm ...
    (grad,) = torch.autograd.grad(loss, scale)
    assert torch.allclose(grad, torch.zeros_like(grad), atol=1e-9)  # ... but not its gradient
    with torch.no_grad():
        assert not torch.allclose(loss_fn(x * 1.5, y), loss_fn(x, y))
