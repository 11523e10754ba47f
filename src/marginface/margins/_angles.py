"""Angle arithmetic on cosines with gradients that stay finite at ``cos θ = ±1``.

The derivative of ``θ = arccos(c)`` is ``-1/sqrt(1 - c²)``, infinite at ``c = ±1``. Every
margin in this package that needs θ or ``sin θ`` goes through these helpers, which compute the
true value and the true derivative everywhere except in the band ``1 - c² < SIN2_FLOOR``, where
``sin θ`` in the derivative is held at ``sqrt(SIN2_FLOOR)``. For fp32 inputs that band is
narrower than the spacing of representable cosines next to 1, so in practice it only affects
``c`` exactly ``±1``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["SIN2_FLOOR", "arccos", "cos_add", "sin_from_cos"]

SIN2_FLOOR = 1e-8
"""Smallest value of ``sin²θ`` used in a derivative (gradient cap ``1/sqrt(SIN2_FLOOR) = 1e4``)."""


def sin_from_cos(cosine: Tensor) -> Tensor:
    """``sin θ = sqrt(1 - cos²θ)`` for θ in [0, π], with a finite derivative at ``cos θ = ±1``.

    Args:
        cosine: ``Tensor[...]`` of cosines in [-1, 1].

    Returns:
        ``Tensor[...]`` of sines in [0, 1]; the value is exact, the derivative
        ``-c / sqrt(max(1 - c², SIN2_FLOOR))``.
    """
    sin2 = 1.0 - cosine * cosine  # >= 0 for |c| <= 1
    denominator = torch.sqrt(sin2.detach().clamp_min(SIN2_FLOOR))
    surrogate = sin2 / (2.0 * denominator)  # d/dc = -c / denominator
    return torch.sqrt(sin2.detach().clamp_min(0.0)) + (surrogate - surrogate.detach())


class _SafeArccos(torch.autograd.Function):
    """arccos whose backward uses ``-1 / sqrt(max(1 - c², SIN2_FLOOR))``."""

    @staticmethod
    def forward(ctx, cosine: Tensor) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(cosine)
        return torch.arccos(cosine.clamp(-1.0, 1.0))

    @staticmethod
    def backward(ctx, grad_output: Tensor) -> Tensor:  # type: ignore[override]
        (cosine,) = ctx.saved_tensors
        sin2 = (1.0 - cosine * cosine).clamp_min(SIN2_FLOOR)
        return -grad_output / torch.sqrt(sin2)


def arccos(cosine: Tensor) -> Tensor:
    """θ = arccos(c) in radians, in [0, π], with a derivative capped at ``1/sqrt(SIN2_FLOOR)``.

    Args:
        cosine: ``Tensor[...]``; values outside [-1, 1] are clamped for the value.
    """
    return _SafeArccos.apply(cosine)


def cos_add(cosine: Tensor, angle: Tensor | float) -> Tensor:
    """``cos(θ + angle)`` from ``cos θ``, as ``c·cos(angle) - sin θ·sin(angle)``.

    Exact where θ + angle lies anywhere (the identity holds for all angles); no arccos is taken,
    so the value keeps full precision near θ = 0.

    Args:
        cosine: ``Tensor[...]`` of ``cos θ`` in [-1, 1].
        angle: radians, a float or a ``Tensor`` broadcastable to ``cosine``.
    """
    if isinstance(angle, Tensor):
        return cosine * torch.cos(angle) - sin_from_cos(cosine) * torch.sin(angle)
    return cosine * math.cos(angle) - sin_from_cos(cosine) * math.sin(angle)
