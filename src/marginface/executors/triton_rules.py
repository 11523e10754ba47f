"""The non-target rules' Triton device code: one device function per rule, each
``(c, threshold, t, p0, p1) -> (g(c), g'(c))`` elementwise on a tile of cosines, and
:func:`_nontarget`, which calls the one a compile-time name picks (``RULE``). The rule's
declaration (parameters, PyTorch value and slope, and the name of its device function here)
is in :data:`~marginface.margins.rules.NONTARGET_RULES`; what each computes is tabled there and
in docs/fused.md. :mod:`~marginface.executors.triton_kernels` calls :func:`_nontarget` inside its
three kernels. ``threshold``, ``t``: per row (``[BLOCK_N]``); ``p0``, ``p1``: the rule's two
scalars (the kernels' ``constants``).

Importing this module imports :mod:`triton` (as :mod:`~marginface.executors.triton_kernels`
does); the same ``TRITON_INTERPRET`` rule applies.
"""

# Compile-time (tl.constexpr) arguments are UPPER_CASE, Triton's convention.
# ruff: noqa: N803

from __future__ import annotations

import math

import triton
import triton.language as tl

from ..margins.rules import ANGLE_CLAMP as _ANGLE_CLAMP
from ..margins.rules import SIN2_FLOOR as _SIN2_FLOOR

__all__: list[str] = []  # device functions, called by triton_kernels only

PI = tl.constexpr(math.pi)
SIN2_FLOOR = tl.constexpr(_SIN2_FLOOR)
"""Li-ArcFace's derivative floors ``sin²θ`` as :func:`~marginface.margins._angles.arccos` does."""
ANGLE_CLAMP = tl.constexpr(_ANGLE_CLAMP)
"""SphereFace-R v2 takes θ of ``cos θ`` clamped to ``[-1 + ε, 1 - ε]``
(:data:`~marginface.margins.rules.ANGLE_CLAMP`)."""


@triton.jit
def _arccos(c):
    """``arccos c`` in radians for ``c`` in ``[-1, 1]``, float32, without ``acos`` (not a Triton
    builtin; libdevice's does not run under the interpreter): Abramowitz & Stegun 4.4.46,
    ``arccos|c| = sqrt(1 - |c|)·Σ_k a_k |c|^k`` (``|error| <= 2e-8`` in exact arithmetic),
    and ``arccos c = π - arccos|c|`` for ``c < 0``."""
    x = tl.abs(c)
    poly = -0.0012624911
    poly = poly * x + 0.0066700901
    poly = poly * x - 0.0170881256
    poly = poly * x + 0.0308918810
    poly = poly * x - 0.0501743046
    poly = poly * x + 0.0889789874
    poly = poly * x - 0.2145988016
    poly = poly * x + 1.5707963050
    angle = tl.sqrt(1.0 - x) * poly
    return tl.where(c < 0.0, PI - angle, angle)


@triton.jit
def _identity(cos, threshold, t, p0, p1):
    """``"identity"``: ``g = c``, ``g' = 1``."""
    return cos, tl.full(cos.shape, 1.0, tl.float32)


@triton.jit
def _curricular(cos, threshold, t, p0, p1):
    """``"curricular"``: ``c(t_i + c)`` where ``c > τ_i``, else ``c``."""
    hard = cos > threshold[:, None]
    value = tl.where(hard, cos * (t[:, None] + cos), cos)
    slope = tl.where(hard, t[:, None] + 2.0 * cos, 1.0)
    return value, slope


@triton.jit
def _mv(cos, threshold, t, p0, p1):
    """``"mv"``: ``a·c + b`` on the mis-classified (``p0 = a``, ``p1 = b``)."""
    hard = cos > threshold[:, None]
    value = tl.where(hard, cos * p0 + p1, cos)
    slope = tl.where(hard, p0, 1.0)
    return value, slope


@triton.jit
def _gaussian(cos, threshold, t, p0, p1):
    """``"gaussian"``: ``w = α·exp(-(c - f)²/σ)``, held constant (``p0 = α``, ``p1 = σ``)."""
    distance = cos - threshold[:, None]
    slope = p0 * tl.exp(-(distance * distance) / p1)
    value = slope * cos + slope - 1.0
    return value, slope


@triton.jit
def _circle(cos, threshold, t, p0, p1):
    """``"circle"``: ``[c + m]_+ (c - m)``, the bracket held constant (``p0 = m``)."""
    slope = tl.maximum(cos + p0, 0.0)
    value = slope * (cos - p0)
    return value, slope


@triton.jit
def _linear_angle(cos, threshold, t, p0, p1):
    """``"linear_angle"``: ``(π - 2θ)/π``; ``g' = 2/(π sin θ)``, ``sin²θ`` floored."""
    angle = _arccos(tl.minimum(tl.maximum(cos, -1.0), 1.0))
    value = (PI - 2.0 * angle) / PI
    slope = (2.0 / PI) / tl.sqrt(tl.maximum(1.0 - cos * cos, SIN2_FLOOR))
    return value, slope


@triton.jit
def _divided_angle(cos, threshold, t, p0, p1):
    """``"divided_angle"``: ``cos(θ/m)`` (``p0 = m``; ``p1 = 1``: straight-through, ``g' = 1``)."""
    low = -1.0 + ANGLE_CLAMP
    high = 1.0 - ANGLE_CLAMP
    clamped = tl.minimum(tl.maximum(cos, low), high)
    angle = _arccos(clamped) / p0
    value = tl.cos(angle)
    inside = (cos >= low) & (cos <= high)  # the clamp passes no gradient outside
    exact = tl.where(inside, tl.sin(angle) / (p0 * tl.sqrt(1.0 - clamped * clamped)), 0.0)
    slope = tl.where(p1 > 0.0, tl.full(cos.shape, 1.0, tl.float32), exact)
    return value, slope


@triton.jit
def _nontarget(cos, threshold, t, p0, p1, RULE: tl.constexpr):
    """``(g(c), g'(c))`` elementwise for the rule ``RULE``: the device function its declaration
    names (:data:`~marginface.margins.rules.NONTARGET_RULES`), one line per rule; an unknown
    name fails to compile."""
    if RULE == "curricular":
        value, slope = _curricular(cos, threshold, t, p0, p1)
    elif RULE == "mv":
        value, slope = _mv(cos, threshold, t, p0, p1)
    elif RULE == "gaussian":
        value, slope = _gaussian(cos, threshold, t, p0, p1)
    elif RULE == "circle":
        value, slope = _circle(cos, threshold, t, p0, p1)
    elif RULE == "linear_angle":
        value, slope = _linear_angle(cos, threshold, t, p0, p1)
    elif RULE == "divided_angle":
        value, slope = _divided_angle(cos, threshold, t, p0, p1)
    else:
        tl.static_assert(RULE == "identity", "unknown non-target rule")
        value, slope = _identity(cos, threshold, t, p0, p1)
    return value, slope
