"""The gradient check of a loss whose weights are detached by design (circle loss's α, ArcNegFace's
Gaussian t): the head's ∂L/∂x and ∂L/∂W against central differences of the loss with those
weights frozen at the evaluation point, in float64."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

import marginface

C, D = 4, 3
X_SCALE = 4.0


def cosine_of(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x̂·ŵᵀ``, ``Tensor[N, C]``."""
    return F.normalize(x, dim=1) @ F.normalize(w).t()


def check_frozen_weight_gradient(
    name: str,
    options: dict,
    frozen_logits: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], Callable],
    impl: str,
    h: float = 1e-6,
) -> None:
    """``frozen_logits(cosine0, labels, x)`` returns ``cosine -> logits[N, C]`` with the weights
    computed from ``cosine0`` (the evaluation point's cosines) held fixed."""
    torch.manual_seed(3)
    loss_fn = marginface.create_loss(
        name, C, D, dtype=torch.float64, reduction="sum", impl=impl, chunk_size=3, **options
    )
    x = torch.randn(5, D, dtype=torch.float64) * X_SCALE
    y = torch.tensor([0, 1, 2, 3, 1])
    w = loss_fn.weight.detach().clone()
    xr = x.clone().requires_grad_(True)
    gx, gw = torch.autograd.grad(loss_fn(xr, y), [xr, loss_fn.weight])
    logits_of = frozen_logits(cosine_of(x, w), y, x)

    def loss(x_: torch.Tensor, w_: torch.Tensor) -> float:
        return float(F.cross_entropy(logits_of(cosine_of(x_, w_)), y, reduction="sum"))

    for which, grad in (("x", gx), ("w", gw)):
        base = x if which == "x" else w
        numeric = torch.zeros_like(base)
        for index in range(base.numel()):
            plus, minus = base.clone(), base.clone()
            plus.view(-1)[index] += h
            minus.view(-1)[index] -= h
            if which == "x":
                numeric.view(-1)[index] = (loss(plus, w) - loss(minus, w)) / (2 * h)
            else:
                numeric.view(-1)[index] = (loss(x, plus) - loss(x, minus)) / (2 * h)
        torch.testing.assert_close(grad, numeric, rtol=1e-6, atol=1e-6)
