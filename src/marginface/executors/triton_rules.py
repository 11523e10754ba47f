"""What each loss computes on a tile of cosines, as Triton device code: the rules and the
reduction steps of the kernels of :mod:`~marginface.executors.triton_kernels`.

* The non-target rules: one device function per rule, each ``(c, threshold, t, p0, p1) ->
  (g(c), g'(c))`` elementwise, and :func:`_nontarget`, which calls the one a compile-time name
  picks (``RULE``). A rule's declaration (parameters, PyTorch value and slope, and the name of
  its device function here) is in :data:`~marginface.margins.rules.NONTARGET_RULES`; what each
  computes is tabled there and in docs/fused.md. ``threshold``, ``t``: per row
  (``[BLOCK_N]``); ``p0``, ``p1``: the rule's two scalars (the kernels' ``constants``).
* The one-vs-all rule's logit :func:`_binary_logit` (:class:`~.binary_rule.BinaryRule`).
* The reduction steps, picked by a compile-time ``REDUCTION``: :func:`_reduce_step` (the
  forward: the softmax's online ``(max, Σexp)``, the one-vs-all ``Σ softplus``, a row
  statistics pass's sums) and :func:`_gradient_step` (the backward's ``∂L/∂c``). They are all
  that differs between the losses' kernels.

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


@triton.jit
def _binary_logit(cos, SCALE, POWER, OFFSET, bias, LIMIT, CLAMP: tl.constexpr, ST: tl.constexpr):
    """The one-vs-all logit ``z = s(2u^t - 1 + μ) + βb``, ``u = max((c + 1)/2, 0)``, elementwise:
    ``(z, ∂z/∂c, inside)`` (``inside``: not clamped to ``[-L, L]``; ``ST``: ``∂z/∂c = s``)."""
    u = tl.maximum((cos + 1.0) * 0.5, 0.0)
    positive = u > 0.0
    log_u = tl.log(tl.where(positive, u, 1.0))
    power_u = tl.where(positive, tl.exp(POWER * log_u), 0.0)
    z = SCALE * (2.0 * power_u - 1.0 + OFFSET) + bias
    if ST:
        slope = tl.full(cos.shape, 1.0, tl.float32) * SCALE
    else:  # t·u^{t-1}: at u = 0 it is 1 for t = 1, else 0
        at_zero = tl.where(POWER == 1.0, 1.0, 0.0)
        slope = SCALE * tl.where(positive, POWER * tl.exp((POWER - 1.0) * log_u), at_zero)
    inside = tl.full(cos.shape, 1, tl.int1)
    if CLAMP:
        inside = (z >= -LIMIT) & (z <= LIMIT)
        z = tl.minimum(tl.maximum(z, -LIMIT), LIMIT)
    return z, slope, inside


@triton.jit
def _reduce_step(
    cos, keep, first, second, scale, threshold, t, p0, p1, SCALE, POWER, OFFSET, LIMIT,
    REDUCTION: tl.constexpr, RULE: tl.constexpr, CLAMP: tl.constexpr, ST: tl.constexpr,
):  # fmt: skip
    """The forward's reduction of a tile into its rows' ``(first, second)``: ``"softmax"``, the
    online ``(max, Σexp)`` of ``z = s_i g_i(c)``; ``"softplus"``, ``Σ softplus(z)`` of the
    one-vs-all logit (``second`` unused); ``"above_threshold"``, ``(S_i, H_i)``."""
    if REDUCTION == "softmax":
        value, _ = _nontarget(cos, threshold, t, p0, p1, RULE)
        logit = tl.where(keep, value * scale[:, None], float("-inf"))
        new_max = tl.maximum(first, tl.max(logit, axis=1))
        shift = tl.where(new_max == float("-inf"), 0.0, new_max)
        second = second * tl.exp(first - shift) + tl.sum(tl.exp(logit - shift[:, None]), 1)
        first = new_max
    elif REDUCTION == "softplus":
        z, _, _ = _binary_logit(cos, SCALE, POWER, OFFSET, p0, LIMIT, CLAMP, ST)
        softplus = tl.maximum(z, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(z)))
        first += tl.sum(tl.where(keep, softplus, 0.0), axis=1)
    else:
        tl.static_assert(REDUCTION == "above_threshold", "unknown reduction")
        hard = keep & (cos > threshold[:, None])
        first += tl.sum(tl.where(hard, cos, 0.0), axis=1)
        second += tl.sum(tl.where(hard, 1.0, 0.0), axis=1)
    return first, second


@triton.jit
def _gradient_step(
    cos, keep, scale, threshold, t, p0, p1, lse, grad, SCALE, POWER, OFFSET, LIMIT,
    REDUCTION: tl.constexpr, RULE: tl.constexpr, CLAMP: tl.constexpr, ST: tl.constexpr,
):  # fmt: skip
    """``∂L/∂c`` of a tile (0 where not ``keep``) and its rows' share: ``"softmax"``,
    ``Σ_j (∂L/∂z_ij) g(c_ij)`` (the gradient reaching a per-row scale; ``grad`` the upstream
    ``γ_i``); ``"softplus"``, ``Σ_j ∂L/∂z_ij`` over the unclamped entries (``grad = γ_i w_-``;
    times ``β``, the bias's)."""
    if REDUCTION == "softmax":
        value, slope = _nontarget(cos, threshold, t, p0, p1, RULE)
        prob = tl.exp(value * scale[:, None] - lse[:, None])
        grad_logit = tl.where(keep, prob * grad[:, None], 0.0)
        share = tl.sum(grad_logit * tl.where(keep, value, 0.0), axis=1)
        grad_cos = grad_logit * scale[:, None] * tl.where(keep, slope, 0.0)
    else:
        tl.static_assert(REDUCTION == "softplus", "no gradient for this reduction")
        z, slope, inside = _binary_logit(cos, SCALE, POWER, OFFSET, p0, LIMIT, CLAMP, ST)
        grad_z = tl.where(keep & inside, tl.sigmoid(z) * grad[:, None], 0.0)
        share = tl.sum(grad_z, axis=1)
        grad_cos = grad_z * slope
    return grad_cos, share
