r"""The non-target rules, each declared once: the one table every executor reads.

A margin's non-target logits are ``s·g(cos θ_j)``; ``g`` is the margin's *non-target rule*
(:meth:`~marginface.margins.base.Margin.nontarget_cosine`). When ``g`` is one of the rules
declared here, the margin names it (:meth:`~marginface.margins.base.Margin.nontarget_kernel`)
with its per-row parameters (:meth:`~marginface.margins.base.Margin.nontarget_kernel_parameters`)
and the chunked executor runs it without autograd: inside its custom operators (no graph break
under ``torch.compile``) and in its Triton kernels. Each :class:`RuleDeclaration` holds, side by
side,

* the parameters the rule reads: a per-row ``threshold`` (``τ_i``, ``Tensor[N]`` or
  ``[N, 1]``), a per-row ``t`` (CurricularFace's, 0-dim or ``Tensor[N]``), or up to two scalars
  in ``t`` (``Tensor[k]``, the kernels' ``constants = [p₀, p₁]``), none of them with gradient;
* its PyTorch value and slope ``parameters -> (g, g')``, elementwise on ``Tensor[N, c]``
  (the derivative written out: no autograd runs inside a custom operator);
* the name of its Triton device function, ``(c, τ, t, p₀, p₁) -> (g(c), g'(c))`` on a tile, in
  :mod:`marginface.executors.triton_rules` (the one kernel-rule module).

The margins' own non-target formulas are written here (:func:`curricular_negative`,
:func:`mv_negative`, :func:`linear_angle`), so that a margin's :meth:`nontarget_cosine` and the
executors' compiled rule are the same function; each margin module re-exports its own. An
unknown rule name is an error (:func:`declared_rule`), never a fallback. The per-row statistics
the executors compile in (NPCFace's hard negatives) are declared the same way
(:data:`ROW_STATISTICS`).

Adding a rule: one entry in :data:`NONTARGET_RULES` (its formula and slope beside it), one
device function and one dispatch line in ``executors/triton_rules.py``, and the margin that
names it (docs/architecture.md, "Adding a non-target rule").

This module imports nothing from the package but :mod:`~marginface.margins._angles`, so that
:mod:`~marginface.margins.base` and every executor can read it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from ._angles import SIN2_FLOOR, arccos

__all__ = [
    "ANGLE_CLAMP",
    "NONTARGET_RULES",
    "ROW_STATISTICS",
    "SIN2_FLOOR",
    "RowStatistics",
    "RuleDeclaration",
    "Slopes",
    "above_threshold_terms",
    "curricular_negative",
    "declared_row_statistics",
    "declared_rule",
    "linear_angle",
    "mv_negative",
]

ANGLE_CLAMP = 1e-5
"""θ is ``arccos`` of ``cos θ`` clamped to ``[-1 + 1e-5, 1 - 1e-5]`` (SphereFace-R, the authors'
code; the ``"divided_angle"`` rule)."""

Elementwise = Callable[[Tensor], Tensor]
Slopes = tuple[Elementwise, Elementwise]
"""A rule given its parameters: ``(c -> g(c), c -> g'(c))``, elementwise on ``Tensor[N, c]``."""

Parameters = Mapping[str, Tensor]


# --------------------------------------------------------------------------- the formulas
def curricular_negative(cosine: Tensor, threshold: Tensor, t: Tensor | float) -> Tensor:
    r"""CurricularFace's non-target modulation, elementwise.

    .. math:: N(t, \cos\theta_j) = \begin{cases}
        \cos\theta_j\,(t + \cos\theta_j) & \cos\theta_j > \cos(\theta_y + m) \text{ (hard)}\\
        \cos\theta_j & \text{otherwise}\end{cases}

    Args:
        cosine: ``Tensor[N, c]`` of ``cos θ_j``.
        threshold: ``Tensor[N, 1]``, ``cos(θ_y + m)`` per row (no gradient).
        t: the adaptive parameter (no gradient).

    Returns:
        ``Tensor[N, c]``; derivative ``t + 2cos θ_j`` on hard negatives, 1 elsewhere.
    """
    hard = cosine > threshold  # (N, c)
    return torch.where(hard, cosine * (t + cosine), cosine)


def mv_negative(cosine: Tensor, threshold: Tensor, slope: float, shift: float) -> Tensor:
    r"""MV-Softmax's non-target rule, elementwise.

    .. math:: g(\cos\theta_j) = \begin{cases}
        a\cos\theta_j + b & \cos\theta_j > f(m, \theta_y) \text{ (mis-classified)}\\
        \cos\theta_j & \text{otherwise}\end{cases}

    Args:
        cosine: ``Tensor[N, c]`` of ``cos θ_j``.
        threshold: ``Tensor[N, 1]``, ``f(m, θ_y)`` per row (no gradient).
        slope: ``a`` (:func:`~marginface.margins.mv_softmax.mv_weight`).
        shift: ``b`` (:func:`~marginface.margins.mv_softmax.mv_weight`).

    Returns:
        ``Tensor[N, c]``; derivative ``a`` on mis-classified classes, 1 elsewhere.
    """
    hard = cosine > threshold  # (N, c)
    return torch.where(hard, cosine * slope + shift, cosine)


def linear_angle(cosine: Tensor, margin: float | Tensor = 0.0) -> Tensor:
    r"""``(π - 2(θ + m))/π`` from ``cos θ``, elementwise: ``1 - 2(θ + m)/π``.

    Args:
        cosine: ``Tensor[...]`` of ``cos θ`` (values outside [-1, 1] count as ±1).
        margin: ``m`` in radians (0 for the non-target classes).

    Returns:
        ``Tensor[...]``; derivative ``2/(π sin θ)`` with respect to ``cos θ``, with ``sin θ``
        floored near ``cos θ = ±1`` (:func:`~marginface.margins._angles.arccos`).
    """
    return (math.pi - 2.0 * (arccos(cosine) + margin)) / math.pi


def above_threshold_terms(cosine: Tensor, threshold: Tensor) -> tuple[Tensor, Tensor]:
    r"""The summands of the ``"above_threshold"`` row statistics (:data:`ROW_STATISTICS`):

    .. math:: ([c_{ij} > \tau_i]\,c_{ij},\ [c_{ij} > \tau_i])

    Args:
        cosine: ``Tensor[N, c]``, cosines of all classes or one chunk of them.
        threshold: ``Tensor[N, 1]``, the per-row ``τ_i`` (NPCFace's ``cos(θ_y + m)``).

    Returns:
        Two ``Tensor[N, c]`` in ``cosine``'s dtype; no gradient is taken through them.
    """
    hard = cosine > threshold.to(cosine.dtype)  # (N, c)
    return torch.where(hard, cosine, 0.0), hard.to(cosine.dtype)


# --------------------------------------------------------------------------- the declaration
@dataclass(frozen=True)
class RuleDeclaration:
    """One non-target rule ``g``: what it reads, its PyTorch value and slope, its Triton code.

    Attributes:
        name: the rule's name (what :meth:`~marginface.margins.base.Margin.nontarget_kernel`
            returns).
        formula: ``g`` and ``g'`` in words (the documentation's table).
        threshold: whether it reads the per-row ``parameters["threshold"]`` (``τ_i``).
        row_t: whether it reads ``parameters["t"]`` as a per-row value (0-dim or ``Tensor[N]``;
            CurricularFace's ``t``).
        constants: how many scalars it reads from ``parameters["t"]`` (``Tensor[k]``, ``k <= 2``;
            the kernels' ``constants``, zero-padded to 2).
        slopes: ``parameters -> (g, g')`` in PyTorch, or None for the identity (``g(c) = c``,
            which the loop runs on its fast paths, the scale inside the GEMM).
        device_function: the name of its Triton device function in
            :mod:`marginface.executors.triton_rules`.
    """

    name: str
    formula: str
    threshold: bool = False
    row_t: bool = False
    constants: int = 0
    slopes: Callable[[Parameters], Slopes] | None = None
    device_function: str = "_identity"

    @property
    def identity(self) -> bool:
        """Whether the rule is the identity ``g(c) = c``."""
        return self.slopes is None


def _per_row(parameters: Parameters, name: str) -> Tensor:
    return parameters[name].reshape(-1, 1)  # (N, 1), or (1, 1) for a scalar


def _scalars(parameters: Parameters) -> tuple[Tensor, Tensor]:
    t = parameters["t"].reshape(-1)
    return t[0], t[1]


def _curricular(parameters: Parameters) -> Slopes:
    threshold, t = _per_row(parameters, "threshold"), parameters["t"]

    def function(cos: Tensor) -> Tensor:
        return curricular_negative(cos, threshold.to(cos.dtype), t)

    def derivative(cos: Tensor) -> Tensor:  # t + 2cos on hard negatives, 1 elsewhere
        hard = cos > threshold.to(cos.dtype)  # (N, c)
        return torch.where(hard, cos * 2.0 + t.to(cos.dtype), torch.ones_like(cos))

    return function, derivative


def _mv(parameters: Parameters) -> Slopes:
    threshold = _per_row(parameters, "threshold")
    a, b = _scalars(parameters)

    def function(cos: Tensor) -> Tensor:
        return mv_negative(cos, threshold.to(cos.dtype), a.to(cos.dtype), b.to(cos.dtype))

    def derivative(cos: Tensor) -> Tensor:
        return torch.where(cos > threshold.to(cos.dtype), a.to(cos.dtype), 1.0)

    return function, derivative


def _gaussian(parameters: Parameters) -> Slopes:
    target = _per_row(parameters, "threshold")
    alpha, sigma = _scalars(parameters)

    def weight(cos: Tensor) -> Tensor:
        return alpha.to(cos.dtype) * torch.exp(-((cos - target.to(cos.dtype)) ** 2) / sigma)

    def function(cos: Tensor) -> Tensor:
        w = weight(cos)
        return w * cos + w - 1.0

    return function, weight


def _circle(parameters: Parameters) -> Slopes:
    m = parameters["t"].reshape(-1)[0]

    def weight(cos: Tensor) -> Tensor:
        return torch.clamp_min(cos + m.to(cos.dtype), 0.0)

    def function(cos: Tensor) -> Tensor:
        return weight(cos) * (cos - m.to(cos.dtype))

    return function, weight


def _linear_angle(parameters: Parameters) -> Slopes:
    def derivative(cos: Tensor) -> Tensor:
        sin2 = (1.0 - cos * cos).clamp_min(SIN2_FLOOR)
        return (2.0 / math.pi) / torch.sqrt(sin2)

    return linear_angle, derivative


def _divided_angle(parameters: Parameters) -> Slopes:
    m, straight = _scalars(parameters)
    low, high = -1.0 + ANGLE_CLAMP, 1.0 - ANGLE_CLAMP

    def function(cos: Tensor) -> Tensor:
        return torch.cos(torch.acos(cos.clamp(low, high)) / m.to(cos.dtype))

    def derivative(cos: Tensor) -> Tensor:
        clamped = cos.clamp(low, high)  # (N, c)
        divisor = m.to(cos.dtype)
        slope = torch.sin(torch.acos(clamped) / divisor) / (
            divisor * torch.sqrt(1.0 - clamped * clamped)
        )
        inside = (cos >= low) & (cos <= high)  # the clamp's gradient: 1 inside, 0 outside
        exact = torch.where(inside, slope, 0.0)
        return torch.where(straight > 0, torch.ones_like(cos), exact)

    return function, derivative


NONTARGET_RULES: dict[str, RuleDeclaration] = {
    rule.name: rule
    for rule in (
        RuleDeclaration("identity", "g = c (g' = 1)"),
        RuleDeclaration(
            "curricular",
            "g = c(t_i + c) where c > τ_i, else c (g' = t_i + 2c / 1); CurricularFace "
            "(Huang et al. 2020, Eq. 9)",
            threshold=True,
            row_t=True,
            slopes=_curricular,
            device_function="_curricular",
        ),
        RuleDeclaration(
            "mv",
            "g = a·c + b where c > τ_i, else c (g' = a / 1), t = [a, b]; MV-Softmax's "
            "re-weighting, NPCFace's hard negatives",
            threshold=True,
            constants=2,
            slopes=_mv,
            device_function="_mv",
        ),
        RuleDeclaration(
            "gaussian",
            "g = w·c + w - 1, w = α·exp(-(c - f_i)²/σ) held constant (g' = w), t = [α, σ], "
            "threshold f_i; ArcNegFace",
            threshold=True,
            constants=2,
            slopes=_gaussian,
            device_function="_gaussian",
        ),
        RuleDeclaration(
            "circle",
            "g = [c + m]_+ (c - m), the bracket held constant (g' = [c + m]_+), t = [m]; "
            "circle loss's self-paced α_n",
            constants=1,
            slopes=_circle,
            device_function="_circle",
        ),
        RuleDeclaration(
            "linear_angle",
            "g = (π - 2θ)/π (g' = 2/(π sin θ), sin²θ floored at SIN2_FLOOR); Li-ArcFace",
            slopes=_linear_angle,
            device_function="_linear_angle",
        ),
        RuleDeclaration(
            "divided_angle",
            "g = cos(θ/m), θ = arccos of c clamped to ±(1 - ANGLE_CLAMP) (g' = 1 when "
            "straight = 1, else sin(θ/m)/(m sin θ) inside the clamp, 0 outside), "
            "t = [m, straight]; SphereFace-R v2",
            constants=2,
            slopes=_divided_angle,
            device_function="_divided_angle",
        ),
    )
}
"""Every non-target rule the executors run compiled, by name (:class:`RuleDeclaration`)."""


def declared_rule(name: str) -> RuleDeclaration:
    """The declaration of the rule ``name``; ``ValueError`` naming it and the known rules."""
    try:
        return NONTARGET_RULES[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown non-target rule {name!r}; the known rules: {', '.join(NONTARGET_RULES)}"
        ) from None


# --------------------------------------------------------------------------- row statistics
@dataclass(frozen=True)
class RowStatistics:
    """Per-row sums over the non-target classes that a margin's ``prepare`` needs, compiled in.

    Attributes:
        name: what :meth:`~marginface.margins.base.Margin.row_statistics_kernel` returns.
        size: how many sums ``k``.
        terms: ``parameters -> (cos -> k summands)``, each ``Tensor[N, c]`` (PyTorch; run inside
            the custom operator), given the per-row ``parameters["threshold"]``.
    """

    name: str
    size: int
    terms: Callable[[Parameters], Callable[[Tensor], tuple[Tensor, ...]]]


def _above_threshold(parameters: Parameters) -> Callable[[Tensor], tuple[Tensor, ...]]:
    threshold = _per_row(parameters, "threshold")
    return lambda cos: above_threshold_terms(cos, threshold)


ROW_STATISTICS: dict[str, RowStatistics] = {
    "above_threshold": RowStatistics("above_threshold", 2, _above_threshold),
}
"""The compiled per-row statistics, by name: ``"above_threshold"``, ``Σ_j [c_ij > τ_i]·c_ij``
and ``Σ_j [c_ij > τ_i]`` (NPCFace's hard negatives' cosine sum and count)."""


def declared_row_statistics(name: str) -> RowStatistics:
    """The declaration of the row statistics ``name``; ``ValueError`` naming the known ones."""
    try:
        return ROW_STATISTICS[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown row statistics {name!r}; the known ones: {', '.join(ROW_STATISTICS)}"
        ) from None
