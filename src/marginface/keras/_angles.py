"""Angle arithmetic on cosines with ``keras.ops``: the Keras twin of
:mod:`marginface.margins._angles` (same values, same capped derivatives, same floor).

The derivative of ``θ = arccos(c)`` is ``-1/sqrt(1 - c²)``, infinite at ``c = ±1``. Here, as in
the PyTorch helpers, θ and ``sin θ`` have their true value and their true derivative except in the
band ``1 - c² < SIN2_FLOOR``, where ``sin θ`` in the derivative is held at ``sqrt(SIN2_FLOOR)``.
The capped derivative is written with ``stop_gradient`` surrogates (``value + (f - stop(f))``),
which every Keras backend differentiates the same way, so no custom-gradient hook is needed.
"""

from __future__ import annotations

import math

from keras import ops

from ..margins._angles import SIN2_FLOOR

__all__ = ["SIN2_FLOOR", "arccos", "at_least", "at_most", "clamp", "cos_add", "sin_from_cos"]


def clamp(x, low, high):
    """``x`` clipped to ``[low, high]``, the bounds taken in x's dtype (``keras.ops.clip`` turns a
    Python float bound into a float32 tensor on torch, rounding ``π - 1e-3`` for float64)."""
    dtype = x.dtype
    return ops.clip(
        x, ops.convert_to_tensor(low, dtype=dtype), ops.convert_to_tensor(high, dtype=dtype)
    )


def at_least(x, floor):
    """``max(x, floor)`` elementwise for a Python number ``floor``, in x's dtype (Keras 3.12+'s
    ``ops.maximum`` returns float32 for a float64 tensor on torch, keras-team/keras#23704)."""
    bound = ops.convert_to_tensor(floor, dtype=x.dtype)  # a bare float would be float32
    return ops.where(x > floor, x, bound)


def at_most(x, ceiling):
    """``min(x, ceiling)`` elementwise for a Python number ``ceiling``, in x's dtype."""
    bound = ops.convert_to_tensor(ceiling, dtype=x.dtype)
    return ops.where(x < ceiling, x, bound)


def sin_from_cos(cosine):
    """``sin θ = sqrt(1 - cos²θ)`` for θ in [0, π], with a finite derivative at ``cos θ = ±1``.

    Args:
        cosine: tensor ``[...]`` of cosines in [-1, 1].

    Returns:
        tensor ``[...]`` of sines in [0, 1]; the value is exact, the derivative
        ``-c / sqrt(max(1 - c², SIN2_FLOOR))``.
    """
    sin2 = 1.0 - cosine * cosine  # >= 0 for |c| <= 1
    fixed = ops.stop_gradient(sin2)
    denominator = ops.sqrt(at_least(fixed, SIN2_FLOOR))
    surrogate = sin2 / (2.0 * denominator)  # d/dc = -c / denominator
    return ops.sqrt(at_least(fixed, 0.0)) + (surrogate - ops.stop_gradient(surrogate))


def arccos(cosine):
    """θ = arccos(c) in radians, in [0, π], with a derivative ``-1/sqrt(max(1 - c², SIN2_FLOOR))``.

    Args:
        cosine: tensor ``[...]``; values outside [-1, 1] are clamped for the value (the derivative
            is still taken at the unclamped value, as in PyTorch's ``_SafeArccos``).
    """
    fixed = ops.stop_gradient(cosine)
    value = ops.arccos(clamp(fixed, -1.0, 1.0))
    slope = -1.0 / ops.sqrt(at_least(1.0 - fixed * fixed, SIN2_FLOOR))
    return value + (cosine - fixed) * slope


def cos_add(cosine, angle):
    """``cos(θ + angle)`` from ``cos θ``, as ``c·cos(angle) - sin θ·sin(angle)`` (no arccos).

    Args:
        cosine: tensor ``[...]`` of ``cos θ`` in [-1, 1].
        angle: radians, a float or a tensor broadcastable to ``cosine``.
    """
    if isinstance(angle, (int, float)):
        return cosine * math.cos(angle) - sin_from_cos(cosine) * math.sin(angle)
    return cosine * ops.cos(angle) - sin_from_cos(cosine) * ops.sin(angle)
