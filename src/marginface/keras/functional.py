"""The margins' formulas in ``keras.ops``: one function per PyTorch function of the same name in
:mod:`marginface.margins` (same arguments, same units, same policies), tensors in and out.

These are what the Keras layers (:mod:`marginface.keras.layers`) call from their hooks; each is
parity-tested against its PyTorch twin through the layers (``tests/keras``).
"""

from __future__ import annotations

import math
from typing import Any

from keras import ops

from ..executors.dense import NORMALIZE_EPS
from ..margins.adacos import MIN_SCALE
from ..margins.arcface import ANGLE_POLICIES
from ._angles import arccos, at_least, at_most, clamp, cos_add

__all__ = [
    "adacos_dynamic_scale",
    "adaface_target",
    "additive_angular_margin",
    "additive_cosine_margin",
    "assign_elastic_plus",
    "at_least",
    "at_most",
    "batch_mean",
    "chebyshev_cos_multiple",
    "circle_negative",
    "circle_positive",
    "combined_margin",
    "curricular_negative",
    "gaussian_negative",
    "linear_angle",
    "lower_median",
    "magface_margin",
    "magface_regularizer",
    "mv_negative",
    "normalize_rows",
    "normalized_cosine",
    "row_norms",
    "sphereface_psi",
]


# Keras 3.12+ computes a few ops of a float64 tensor in float32 on the torch and JAX backends
# (on torch: ``keras.ops.matmul``, ``mean``, ``power``, ``floor``, ``norm``, ``maximum`` and
# ``minimum`` with a Python number; keras-team/keras#23704). The code here uses equivalents that
# keep float64 on torch: ``einsum``, ``sum / n``, ``exp(p·log x)``, an integer cast, ``where``,
# ``sqrt(sum(square))``. On JAX ``cos``, ``sin`` and ``arccos`` of float64 are float32 too, with
# no float64 alternative in ``keras.ops`` (docs/keras.md).


def batch_mean(x):
    """The mean of all entries of ``x``, a 0-dim tensor in x's dtype."""
    return ops.sum(x) / ops.cast(ops.size(x), x.dtype)


def _norm(x, axis, keepdims=False):
    return ops.sqrt(ops.sum(ops.square(x), axis=axis, keepdims=keepdims))


# ---------------------------------------------------------------- cosines
def row_norms(x):
    """``‖x_i‖₂`` of each row, ``[N, D] -> [N]``, pre-scaled by ``max(1, max_j |x_ij|)``
    (detached) so that a row whose norm overflows the dtype still gets the right value, as
    :func:`marginface.executors.dense.row_norms`."""
    scale = ops.stop_gradient(at_least(ops.max(ops.abs(x), axis=1, keepdims=True), 1.0))
    return _norm(x / scale, axis=1) * scale[:, 0]


def normalize_rows(x):
    """``x_i / max(‖x_i‖₂, 1e-12)``: ``[N, D]``; a zero row stays zero."""
    return x / at_least(row_norms(x), NORMALIZE_EPS)[:, None]


def normalized_cosine(embeddings, centers, sub_centers: int = 1):
    r"""Cosines to every class center, max-pooled over sub-centers:
    :math:`\cos\theta_{ij} = \max_k x_i^\top w_{jk} / (\|x_i\|\|w_{jk}\|)`.

    Args:
        embeddings: ``[N, D]``.
        centers: ``[C·K, D]``, class-major (rows ``j·K .. j·K + K - 1`` are class j), the layout
            of the PyTorch losses' ``weight``.
        sub_centers: ``K >= 1``.

    Returns:
        ``[N, C]``.
    """
    x = normalize_rows(embeddings)  # (N, D)
    w = centers / at_least(_norm(centers, axis=1, keepdims=True), NORMALIZE_EPS)  # (C·K, D)
    cosine = ops.einsum("nd,cd->nc", x, w)  # (N, C·K)
    if sub_centers > 1:
        cosine = ops.max(ops.reshape(cosine, (-1, w.shape[0] // sub_centers, sub_centers)), axis=2)
    return cosine


# ---------------------------------------------------------------- targets
def additive_angular_margin(cos_target, margin, policy: str = "linear"):
    """ArcFace's ``cos(θ_y + m)`` with ``policy`` where ``θ_y + m > π``
    (:data:`~marginface.margins.arcface.ANGLE_POLICIES`); ``margin`` in radians, a float or a
    tensor ``[N]``. See :func:`marginface.margins.arcface.additive_angular_margin`."""
    shifted = cos_add(cos_target, margin)  # cos(θ + m)
    if policy == "none":
        return shifted
    if policy == "easy":
        return ops.where(cos_target > 0, shifted, cos_target)
    # cos(π - m) and sin(π - m)·m, computed as the PyTorch margin (and the reference codes) do
    if isinstance(margin, (int, float)):
        threshold = math.cos(math.pi - margin)
        fallback_shift = math.sin(math.pi - margin) * margin
    else:
        threshold = ops.cos(math.pi - margin)
        fallback_shift = ops.sin(math.pi - margin) * margin
    beyond = cos_target <= threshold  # θ + m >= π: the boundary takes the fallback
    if policy == "linear":
        return ops.where(beyond, cos_target - fallback_shift, shifted)
    if policy == "clip":
        return ops.where(beyond, ops.full_like(shifted, -1.0), shifted)
    raise ValueError(f"policy must be one of {ANGLE_POLICIES}, got {policy!r}")


def additive_cosine_margin(cos_target, margin, *, conditional: bool = False):
    """CosFace's ``cos θ_y - m`` (``conditional``: only where ``cos θ_y > m``)."""
    shifted = cos_target - margin
    if conditional:
        return ops.where(cos_target > margin, shifted, cos_target)
    return shifted


def combined_margin(cos_target, m1: float, m2: float, m3: float, policy: str = "linear"):
    """``cos(m1·θ + m2) - m3`` with ``policy`` on the angular part, as
    :func:`marginface.margins.combined.combined_margin`."""
    if m1 == 1.0:
        return additive_angular_margin(cos_target, m2, policy) - m3
    theta = arccos(cos_target)  # (N,) radians
    angle = m1 * theta + m2
    angular = ops.cos(angle)
    if policy == "easy":
        angular = ops.where(cos_target > 0, angular, cos_target)
    elif policy == "clip":
        angular = ops.where(angle >= math.pi, ops.full_like(angular, -1.0), angular)
    elif policy == "linear":
        theta_c = (math.pi - m2) / m1  # boundary angle: m1·θ_c + m2 = π
        if theta_c < math.pi:
            fallback = cos_target - (math.pi - theta_c) * math.sin(theta_c)
            angular = ops.where(angle >= math.pi, fallback, angular)
    elif policy != "none":
        raise ValueError(f"policy must be one of {ANGLE_POLICIES}, got {policy!r}")
    return angular - m3


def adaface_target(cos_target, quality, margin: float, eps: float = 1e-3):
    r"""AdaFace's :math:`\cos(\mathrm{clip}(\theta_y - m\hat z, \epsilon, \pi - \epsilon))
    - (m\hat z + m)` (``quality`` = ``ẑ``, no gradient)."""
    theta = arccos(cos_target)  # (N,) radians
    angle = clamp(theta - margin * quality, eps, math.pi - eps)
    return ops.cos(angle) - (margin * quality + margin)


def magface_margin(norms, lower_norm, upper_norm, lower_margin, upper_margin):
    """MagFace's margin, linear in ``a = clip(‖x‖, l_a, u_a)``: ``[N]`` radians."""
    a = clamp(norms, lower_norm, upper_norm)
    slope = (upper_margin - lower_margin) / (upper_norm - lower_norm)
    return slope * (a - lower_norm) + lower_margin


def magface_regularizer(norms, lower_norm, upper_norm):
    """MagFace's ``g(a) = 1/a + a/u_a²`` on the clamped norm: ``[N]``."""
    a = clamp(norms, lower_norm, upper_norm)
    return 1.0 / a + a / (upper_norm * upper_norm)


def chebyshev_cos_multiple(cosine, m: int):
    """``cos(m·θ)`` as the Chebyshev polynomial ``T_m(cos θ)`` (exact derivative everywhere)."""
    previous, current = ops.ones_like(cosine), cosine
    if m == 0:
        return previous
    for _ in range(m - 1):
        previous, current = current, 2.0 * cosine * current - previous
    return current


def sphereface_psi(cos_target, m: int):
    r"""SphereFace's :math:`\psi(\theta) = (-1)^k\cos(m\theta) - 2k`,
    :math:`k = \lfloor m\theta/\pi \rfloor` (piece index and sign carry no gradient)."""
    fixed = ops.stop_gradient(cos_target)
    theta = ops.arccos(clamp(fixed, -1.0, 1.0))
    piece = ops.clip(ops.cast(m * theta / math.pi, "int32"), 0, m - 1)  # (N,) floor, >= 0
    k = ops.cast(piece, cos_target.dtype)
    sign = 1.0 - 2.0 * ops.cast(ops.mod(piece, 2), cos_target.dtype)  # (-1)^k
    return sign * chebyshev_cos_multiple(cos_target, m) - 2.0 * k


def sphereface_r_target(cos_target, m: float, kind: str):
    """SphereFace-R's target value ``η(θ_y)`` (θ from ``cos θ`` clamped to ``±(1 - 1e-5)``):
    ``"v0"`` ``(-1)^k cos(mθ) - 2k``, ``"v1"`` ``cos(clip(mθ, 1e-5, 3.14159))``, ``"v2"``
    ``cos θ`` (the PyTorch :func:`~marginface.margins.sphereface_r.sphereface_r_target`)."""
    theta = ops.arccos(clamp(cos_target, -1.0 + 1e-5, 1.0 - 1e-5))
    if kind == "v2":
        return ops.cos(theta)
    m_theta = theta * m
    if kind == "v1":
        return ops.cos(clamp(m_theta, 1e-5, 3.14159))
    k = ops.floor(ops.stop_gradient(m_theta) / math.pi)  # the piece index, no gradient
    sign = 1.0 - 2.0 * (k - 2.0 * ops.floor(k / 2.0))  # (-1)^k
    return sign * ops.cos(m_theta) - 2.0 * k


def sphereface_r_nontarget(cosine, m: float, *, straight_through: bool):
    """SphereFace-R ``"v2"``'s non-target ``cos(θ_j/m)``; gradient 1 with ``straight_through``."""
    value = ops.cos(ops.arccos(clamp(cosine, -1.0 + 1e-5, 1.0 - 1e-5)) / m)
    if straight_through:
        return cosine + ops.stop_gradient(value - cosine)
    return value


def hyperspherical_energy(centers, rows, weight: float, power: float):
    """The mean over distinct pairs of ``arccos(ŵ_a·ŵ_b)^-p``, times ``weight`` (SphereFace+'s
    MHE; the PyTorch :class:`~marginface.weight_regularizers.MinimumHypersphericalEnergy`).
    ``centers`` ``[R, D]``, ``rows`` ``[R]`` int: equal rows are one center."""
    r = centers.shape[0]
    index = ops.arange(r)
    same = ops.equal(rows[:, None], rows[None, :])  # (R, R)
    earlier = ops.logical_and(same, index[None, :] < index[:, None])
    first = ops.logical_not(ops.any(earlier, axis=1))  # (R,)
    pairs = ops.logical_and(ops.logical_and(first[:, None], first[None, :]), index[:, None] < index)
    dtype = centers.dtype

    def constant(value: float) -> Any:  # a Python float would become a float32 tensor on torch
        return ops.convert_to_tensor(value, dtype=dtype)

    unit = centers / at_least(_norm(centers, axis=1, keepdims=True), NORMALIZE_EPS)  # (R, D)
    gram = clamp(ops.einsum("ad,bd->ab", unit, unit), -1.0 + 1e-5, 1.0 - 1e-5)  # (R, R)
    angles = ops.where(pairs, ops.arccos(gram), constant(1.0))
    energy = ops.where(pairs, ops.power(angles, constant(-power)), constant(0.0))
    distinct = ops.sum(ops.cast(first, dtype))
    count = distinct * (distinct - 1.0) / 2.0
    mean = ops.sum(energy) / ops.maximum(count, constant(1.0))
    return weight * ops.where(count > 0, mean, constant(0.0))


# ---------------------------------------------------------------- non-targets, statistics
def curricular_negative(cosine, threshold, t):
    """CurricularFace's ``cos θ_j·(t + cos θ_j)`` where ``cos θ_j > threshold`` (hard), else
    ``cos θ_j``; ``threshold`` ``[N, 1]`` and ``t`` carry no gradient."""
    hard = cosine > threshold  # (N, c)
    return ops.where(hard, cosine * (t + cosine), cosine)


def linear_angle(cosine, margin: float = 0.0):
    """Li-ArcFace's ``(π - 2(θ + m))/π`` from ``cos θ`` (``arccos`` with the capped
    derivative of :mod:`marginface.keras._angles`)."""
    return (math.pi - 2.0 * (arccos(cosine) + margin)) / math.pi


def circle_positive(cos_target, margin: float):
    """Circle loss's ``[1 + m - cos θ_y]_+ (cos θ_y - (1 - m))``, the weight without gradient."""
    alpha = at_least((1.0 + margin) - ops.stop_gradient(cos_target), 0.0)
    return alpha * (cos_target - (1.0 - margin))


def circle_negative(cosine, margin: float):
    """Circle loss's ``[cos θ_j + m]_+ (cos θ_j - m)``, the weight without gradient."""
    alpha = at_least(ops.stop_gradient(cosine) + margin, 0.0)
    return alpha * (cosine - margin)


def gaussian_negative(cosine, target, alpha: float, sigma: float):
    """ArcNegFace's ``t·cos θ_j + t - 1``, ``t = α·exp(-(cos θ_j - f_y)²/σ)`` without gradient;
    ``target`` ``[N, 1]`` (no gradient)."""
    fixed = ops.stop_gradient(cosine)
    weight = alpha * ops.exp(-((fixed - target) * (fixed - target)) / sigma)  # (N, c)
    return weight * cosine + weight - 1.0


def mv_negative(cosine, threshold, slope: float, shift: float):
    """MV-Softmax's ``a·cos θ_j + b`` where ``cos θ_j > threshold`` (mis-classified), else
    ``cos θ_j``; ``threshold`` ``[N, 1]`` carries no gradient."""
    hard = cosine > threshold  # (N, c)
    return ops.where(hard, cosine * slope + shift, cosine)


def lower_median(values):
    """The lower median of a 1-D tensor (``torch.median``'s convention: for an even count the
    smaller of the two middle values, never their mean as ``numpy.median`` gives)."""
    ordered = ops.sort(values)
    return ops.take(ordered, (ops.shape(values)[0] - 1) // 2)


def adacos_dynamic_scale(log_b_avg, theta_median):
    r"""AdaCos's :math:`s = \log B_{avg} / \cos(\min(\pi/4, \theta_{med}))`, floored at
    :data:`~marginface.margins.adacos.MIN_SCALE`."""
    capped = at_most(theta_median, math.pi / 4)
    return at_least(log_b_avg / ops.cos(capped), MIN_SCALE)


def assign_elastic_plus(margins, cos_target):
    """ElasticFace+'s assignment: the sorted margins go to the samples sorted by ``cos θ_y``
    (largest cosine, smallest margin), as
    :func:`marginface.margins.elasticface.assign_elastic_plus`."""
    ascending = ops.sort(margins)
    order = ops.argsort(-cos_target)  # easiest first
    return ops.take(ascending, ops.argsort(order))  # assigned[order] = ascending
