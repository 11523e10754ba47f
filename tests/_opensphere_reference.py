"""The one-vs-all heads of OpenSphere (SphereFace2 and its variants) and UniFace written out for
the tests from what their code computes, in plain PyTorch. Independent of marginface's code;
nothing copied.

* SphereFace2: ``ydwen/opensphere`` ``model/head/sphereface2c.py`` (variant C),
  ``sphereface2a.py`` (A) and ``sphereface2m.py`` (M). The centers are normalized in place
  before each forward (``w.data = normalize(w.data)``), so the loss is computed on unit centers
  and its gradient with respect to them carries no normalization Jacobian: the functions here
  take unit centers ``w_unit`` as the leaf.
* UniFace: ``CVI-SZU/UniFace`` ``head.py`` ``Unified_Cross_Entropy_Loss`` (every class kept,
  ``partial_index = arange(C)``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def sphereface2_loss(
    x: Tensor,
    w_unit: Tensor,
    labels: Tensor,
    bias: Tensor,
    *,
    variant: str,
    alpha: float = 0.7,
    r: float = 40.0,
    m: float = 0.4,
    t: float = 3.0,
    lw: float = 50.0,
) -> Tensor:
    """The authors' SphereFace2 forward on unit centers ``w_unit`` (``Tensor[C, D]``).

    ``cos θ = x̂·wᵀ``; with ``G(c) = 2((c + 1)/2)^t - 1``:

    * C: ``G(cos θ) - m`` at the label, ``G(cos θ) + m`` elsewhere, with its gradient;
    * A / M (computed under ``no_grad`` as a shift ``d = G(cos θ') - cos θ``): ``θ =
      arccos(clamp(cos θ, -1 + 1e-8, 1 - 1e-8))``, at the label ``θ + m`` (A) or ``θ·m`` (M),
      then ``θ`` clamped to ``[1e-8, 3.14159]``, ``cos θ' = cos θ``;

    logits ``r·(…) + b``; ``binary_cross_entropy_with_logits`` with the one-hot targets and the
    weights ``lw·C/r·(α`` at the label, ``1 - α`` elsewhere), mean over ``N×C``.
    """
    num_classes = w_unit.shape[0]
    cos_theta = F.normalize(x, dim=1) @ w_unit.t()  # (N, C)
    one_hot = torch.zeros_like(cos_theta)
    one_hot.scatter_(1, labels.view(-1, 1), 1.0)
    if variant == "C":
        g = 2.0 * ((cos_theta + 1.0) / 2.0).pow(t) - 1.0
        logits = r * (g - m * (2.0 * one_hot - 1.0)) + bias
    else:
        with torch.no_grad():
            eps = 1e-8
            theta = torch.acos(cos_theta.clamp(-1.0 + eps, 1.0 - eps))
            if variant == "A":
                theta = theta + m * one_hot
            else:
                theta = torch.where(one_hot > 0, theta * m, theta)
            g = torch.cos(theta.clamp(eps, 3.14159))
            g = 2.0 * ((g + 1.0) / 2.0).pow(t) - 1.0
            shift = g - cos_theta
        logits = r * (cos_theta + shift) + bias
    weight = alpha * one_hot + (1.0 - alpha) * (1.0 - one_hot)
    weight = lw * num_classes / r * weight
    return F.binary_cross_entropy_with_logits(logits, one_hot, weight=weight)


def uniface_loss(
    x: Tensor,
    weight: Tensor,
    labels: Tensor,
    bias: Tensor,
    *,
    m: float = 0.4,
    s: float = 64.0,
    l: float = 1.0,  # noqa: E741 (the authors' name)
) -> Tensor:
    """The authors' UCE forward: ``cos θ = normalize(x, eps=1e-5)·normalize(W, eps=1e-5)ᵀ``,
    ``p = s(cos θ - m) - b``, ``n = s·cos θ - b``, ``log(1 + exp(-clamp(p, -s, s)))`` at the
    label and ``l·log(1 + exp(clamp(n, -s, s)))`` elsewhere, summed over classes, mean over
    rows."""
    cos_theta = F.normalize(x, eps=1e-5) @ F.normalize(weight, eps=1e-5).t()  # (N, C)
    positive = s * (cos_theta - m) - bias
    negative = s * cos_theta - bias
    p_loss = torch.log(1 + torch.exp(-positive.clamp(min=-s, max=s)))
    n_loss = torch.log(1 + torch.exp(negative.clamp(min=-s, max=s))) * l
    one_hot = F.one_hot(labels, weight.shape[0]).bool()
    loss = one_hot * p_loss + (~one_hot) * n_loss
    return loss.sum(dim=1).mean()


def sphereface2_initial_bias(
    num_classes: int, variant: str, alpha: float, r: float, m: float, t: float
) -> float:
    """The authors' ``__init__`` bias (``sphereface2.py``), restated."""
    import math

    z = alpha / ((1.0 - alpha) * (num_classes - 1.0))
    if variant == "C":
        ay = r * (2.0 * 0.5**t - 1.0 - m)
        ai = r * (2.0 * 0.5**t - 1.0 + m)
    else:
        theta_y = (
            min(math.pi, math.pi / 2.0 + m) if variant == "A" else min(math.pi, m * math.pi / 2.0)
        )
        ay = r * (2.0 * ((math.cos(theta_y) + 1.0) / 2.0) ** t - 1.0)
        ai = r * (2.0 * 0.5**t - 1.0)
    temp = (1.0 - z) ** 2 + 4.0 * z * math.exp(ay - ai)
    return math.log(2.0 * z) - ai - math.log(1.0 - z + math.sqrt(temp))
