"""The non-target rules of the chunked executor's Triton kernels, as Triton device functions:
``(g(c), g'(c))`` elementwise on a tile of cosines (:func:`_nontarget`), the rule a
compile-time name (``RULE``, one of :data:`~marginface.margins.base.NONTARGET_KERNELS`; what
each computes is tabled in :class:`~marginface.executors.kernel_options.NonTargetRule` and
docs/fused.md). :mod:`~marginface.executors.triton_kernels` calls them inside its three kernels.

Importing this module imports :mod:`triton` (as :mod:`~marginface.executors.triton_kernels`
does); the same ``TRITON_INTERPRET`` rule applies.
"""

# Compile-time (tl.constexpr) arguments are UPPER_CASE, Triton's convention.
# ruff: noqa: N803

from __future__ import annotations

import math

import triton
import triton.language as tl

from ..margins._angles import SIN2_FLOOR as _SIN2_FLOOR

__all__: list[str] = []  # device functions, called by triton_kernels only

PI = tl.constexpr(math.pi)
SIN2_FLOOR = tl.constexpr(_SIN2_FLOOR)
"""Li-ArcFace's derivative floors ``sin²θ`` as :func:`~marginface.margins._angles.arccos` does."""


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
def _nontarget(cos, threshold, t, p0, p1, RULE: tl.constexpr):
    """``(g(c), g'(c))`` elementwise for the rule ``RULE``
    (:class:`~marginface.executors.kernel_options.NonTargetRule`): ``threshold``, ``t`` per
    row (``[BLOCK_N]``), ``p0``, ``p1`` the rule's two scalars."""
    if RULE == "curricular":
        hard = cos > threshold[:, None]
        value = tl.where(hard, cos * (t[:, None] + cos), cos)
        slope = tl.where(hard, t[:, None] + 2.0 * cos, 1.0)
    elif RULE == "mv":  # a·c + b on the mis-classified (p0 = a, p1 = b)
        hard = cos > threshold[:, None]
        value = tl.where(hard, cos * p0 + p1, cos)
        slope = tl.where(hard, p0, 1.0)
    elif RULE == "gaussian":  # w = α·exp(-(c - f)²/σ), held constant (p0 = α, p1 = σ)
        distance = cos - threshold[:, None]
        slope = p0 * tl.exp(-(distance * distance) / p1)
        value = slope * cos + slope - 1.0
    elif RULE == "circle":  # [c + m]_+ (c - m), the bracket held constant (p0 = m)
        slope = tl.maximum(cos + p0, 0.0)
        value = slope * (cos - p0)
    elif RULE == "linear_angle":  # (π - 2θ)/π; g' = 2/(π sin θ), sin²θ floored
        angle = _arccos(tl.minimum(tl.maximum(cos, -1.0), 1.0))
        value = (PI - 2.0 * angle) / PI
        slope = (2.0 / PI) / tl.sqrt(tl.maximum(1.0 - cos * cos, SIN2_FLOOR))
    else:  # "identity"
        value = cos
        slope = tl.full(cos.shape, 1.0, tl.float32)
    return value, slope
