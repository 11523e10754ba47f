"""The non-target rules the chunk loop runs compiled beyond the identity and CurricularFace's:
each ``parameters -> (g, g')``, elementwise given the per-row ``threshold`` (``Tensor[N]`` or
``[N, 1]``) and the constants ``t``, with the derivative written out so that no autograd runs
inside a custom operator (:data:`~marginface.margins.base.NONTARGET_KERNELS`; PyTorch ops; the
Triton kernels have the same rules in :mod:`~marginface.executors.triton_kernels`)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from ..margins._angles import SIN2_FLOOR
from ..margins.li_arcface import linear_angle
from ..margins.mv_softmax import mv_negative

__all__ = ["ELEMENTWISE_RULES", "Rule"]

Rule = tuple[Callable[[Tensor], Tensor], Callable[[Tensor], Tensor]]


def _mv_rule(parameters: dict[str, Tensor]) -> Rule:
    """``"mv"``: ``a·c + b`` above the per-row threshold, ``c`` elsewhere; derivative ``a``/1."""
    threshold = parameters["threshold"].reshape(-1, 1)  # (N, 1)
    a, b = parameters["t"].reshape(-1)[0], parameters["t"].reshape(-1)[1]

    def function(cos: Tensor) -> Tensor:
        return mv_negative(cos, threshold.to(cos.dtype), a.to(cos.dtype), b.to(cos.dtype))

    def derivative(cos: Tensor) -> Tensor:
        return torch.where(cos > threshold.to(cos.dtype), a.to(cos.dtype), 1.0)

    return function, derivative


def _gaussian_rule(parameters: dict[str, Tensor]) -> Rule:
    """``"gaussian"``: ``w·c + w - 1``, ``w = α·exp(-(c - f)²/σ)`` constant; derivative ``w``."""
    target = parameters["threshold"].reshape(-1, 1)  # (N, 1)
    alpha, sigma = parameters["t"].reshape(-1)[0], parameters["t"].reshape(-1)[1]

    def weight(cos: Tensor) -> Tensor:
        return alpha.to(cos.dtype) * torch.exp(-((cos - target.to(cos.dtype)) ** 2) / sigma)

    def function(cos: Tensor) -> Tensor:
        w = weight(cos)
        return w * cos + w - 1.0

    return function, weight


def _circle_rule(parameters: dict[str, Tensor]) -> Rule:
    """``"circle"``: ``[c + m]_+ (c - m)``, the bracket constant; derivative ``[c + m]_+``."""
    m = parameters["t"].reshape(-1)[0]

    def weight(cos: Tensor) -> Tensor:
        return torch.clamp_min(cos + m.to(cos.dtype), 0.0)

    def function(cos: Tensor) -> Tensor:
        return weight(cos) * (cos - m.to(cos.dtype))

    return function, weight


def _linear_angle_rule(parameters: dict[str, Tensor]) -> Rule:
    """``"linear_angle"``: ``(π - 2θ)/π``; derivative ``2/(π sin θ)``, ``sin θ`` floored as
    :func:`~marginface.margins._angles.arccos`'s."""

    def function(cos: Tensor) -> Tensor:
        return linear_angle(cos)

    def derivative(cos: Tensor) -> Tensor:
        sin2 = (1.0 - cos * cos).clamp_min(SIN2_FLOOR)
        return (2.0 / math.pi) / torch.sqrt(sin2)

    return function, derivative


ELEMENTWISE_RULES: dict[str, Callable[[dict[str, Tensor]], Rule]] = {
    "mv": _mv_rule,
    "gaussian": _gaussian_rule,
    "circle": _circle_rule,
    "linear_angle": _linear_angle_rule,
}
"""The compiled rules beyond CurricularFace's, each ``parameters -> (g, g')`` (PyTorch):
:data:`~marginface.margins.base.NONTARGET_KERNELS`."""
