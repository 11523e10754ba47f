r"""SphereFace-R, SphereFace revived (Liu, Wen et al., "SphereFace Revived: Unifying
Hyperspherical Face Recognition", TPAMI 2022; the authors' code: ydwen/opensphere
``model/head/spherefacer.py``).

A multiplicative angular margin ``m`` (any real ``m > 1``, e.g. 1.5), introduced by a
*characteristic gradient detachment*: each logit is ``s·(cos θ + Δ)`` with ``Δ = η(θ) - cos θ``
held constant in the gradient, so the value is ``s·η(θ)`` while the gradient is that of
``s·cos θ`` (our ``gradient="straight_through"``). The three margin types of the authors' code:

* ``"v0"`` (default): the target ``ψ(θ_y) = (-1)^k cos(mθ_y) - 2k``, ``k = ⌊mθ_y/π⌋``
  (SphereFace's monotone extension, for real ``m``); non-targets unchanged.
* ``"v1"``: the target ``cos(min(max(mθ_y, 1e-5), 3.14159))``; non-targets unchanged.
* ``"v2"``: the target unchanged; non-targets ``cos(θ_j / m)`` (the margin moved onto the
  negatives).

θ is read from ``cos θ`` clamped to ``±(1 - 1e-5)``, as the authors' code does. The feature
normalization of their three heads: ``"hard"`` (``SphereFaceR_H``: fixed scale ``s``, the one
they recommend), ``"none"`` (``SphereFaceR_N``: the scale is the feature norm ``‖x‖``) and
``"soft"`` (``SphereFaceR_S``: the scale is ``‖x‖``, plus ``t·|‖x‖ - s|`` per sample).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .._validation import check_choice, check_real
from ._alias import alias
from .base import Context, Margin

__all__ = [
    "FEATURE_NORMS",
    "SPHEREFACE_R_TYPES",
    "SphereFaceRMargin",
    "sphereface_r_nontarget",
    "sphereface_r_target",
]

SPHEREFACE_R_TYPES = ("v0", "v1", "v2")
"""The margin types of the authors' ``get_d_theta`` (``magn_type``)."""

FEATURE_NORMS = ("hard", "none", "soft")
"""SphereFace-R's feature normalization: the authors' ``SphereFaceR_H``, ``_N``, ``_S``."""

ANGLE_CLAMP = 1e-5
"""θ is ``arccos`` of ``cos θ`` clamped to ``[-1 + 1e-5, 1 - 1e-5]`` (the authors' code)."""


def _theta(cosine: Tensor) -> Tensor:
    return torch.acos(cosine.clamp(-1.0 + ANGLE_CLAMP, 1.0 - ANGLE_CLAMP))


def sphereface_r_target(cos_target: Tensor, m: float, kind: str) -> Tensor:
    r"""SphereFace-R's target value ``η(θ_y)`` of margin type ``kind``.

    .. math::
        \text{v0: } (-1)^k\cos(m\theta) - 2k,\ k = \lfloor m\theta/\pi\rfloor;\qquad
        \text{v1: } \cos(\min(\max(m\theta, 10^{-5}), 3.14159));\qquad
        \text{v2: } \cos\theta

    Args:
        cos_target: ``Tensor[N]`` of ``cos θ_y`` in [-1, 1].
        m: the multiplicative margin ``m >= 1``.
        kind: one of :data:`SPHEREFACE_R_TYPES`.

    Returns:
        ``Tensor[N]``, differentiable (through the clamp) for ``gradient="exact"``.
    """
    if kind == "v2":
        return torch.cos(_theta(cos_target))
    m_theta = _theta(cos_target) * m  # (N,)
    if kind == "v1":
        return torch.cos(m_theta.clamp(1e-5, 3.14159))
    with torch.no_grad():
        k = torch.floor(m_theta / math.pi)  # (N,) the piece index
        sign = 1.0 - 2.0 * torch.remainder(k, 2)  # (-1)^k
    return sign * torch.cos(m_theta) - 2.0 * k


def sphereface_r_nontarget(cosine: Tensor, m: float, *, straight_through: bool) -> Tensor:
    """The ``"v2"`` type's non-target value ``cos(θ_j / m)``, elementwise: ``Tensor[N, c]``;
    with ``straight_through`` its gradient is 1 (the authors' detachment)."""
    value = torch.cos(_theta(cosine) / m)
    if straight_through:
        return cosine + (value - cosine).detach()
    return value


class SphereFaceRMargin(Margin):
    r"""SphereFace-R (Liu, Wen et al., TPAMI 2022): SphereFace revived.

    .. math::
        \text{logit}_y = s\,(\cos\theta_y + \Delta_y),\quad
        \text{logit}_j = s\,(\cos\theta_j + \Delta_j),\qquad
        \Delta = \eta(\theta) - \cos\theta \text{ (no gradient)}

    with ``η`` of :func:`sphereface_r_target` at the target and, for ``"v2"``,
    :func:`sphereface_r_nontarget` elsewhere (the identity for ``"v0"``, ``"v1"``), and ``s`` the
    fixed scale (``feature_norm="hard"``) or the feature norm ``‖x‖`` (``"none"``, ``"soft"``).

    Where the paper and the authors' code differ we take the code: their heads' defaults
    (``m = 1.5``, ``s = 30``, ``t = 0.01``, margin type ``"v0"``) and θ from ``cos θ`` clamped
    to ``±(1 - 1e-5)``. Deliberate differences (docs/parity.md): their losses are multiplied by
    a constant loss weight (``lw/s``, ``50/30``, for ``_H`` and ``_S``; ``lw`` for ``_N``), which
    scales the gradients like a learning rate: ours return the cross-entropy itself; their
    ``_N``/``_S`` heads can raise ``m`` at given iterations (``steps``, ``dm``), not
    implemented here (set ``margin`` per training phase); their non-target logits of ``"v0"`` and
    ``"v1"`` are the cosine clamped to ``±(1 - 1e-5)`` in value, ours the cosine.

    Args:
        margin: ``m >= 1``, real. Default: 1.5 (the authors' code).
        scale: ``s > 0``: the logit scale (``"hard"``) or the norm the soft penalty pulls the
            features to (``"soft"``). Default: 30.0 (the authors' code).
        kind: the margin type, one of :data:`SPHEREFACE_R_TYPES`. Default: ``"v0"``.
        feature_norm: ``"hard"`` (default, ``SphereFaceR_H``), ``"none"`` (``SphereFaceR_N``)
            or ``"soft"`` (``SphereFaceR_S``) (:data:`FEATURE_NORMS`).
        soft_weight: ``t >= 0``, the weight of ``t·|‖x‖ - s|`` with ``"soft"``. Default: 0.01.
        gradient: ``"straight_through"`` (default: the authors' detachment, which is the
            method, for the target and, with ``"v2"``, the non-targets) or ``"exact"`` (the
            derivative of ``η`` itself).
        interclass_filtering_threshold: see :class:`~marginface.margins.base.Margin`.
    """

    angle_multiplier = alias("margin", "``m``, the real number the target angle is multiplied by.")

    def __init__(
        self,
        margin: float = 1.5,
        scale: float = 30.0,
        *,
        kind: str = "v0",
        feature_norm: str = "hard",
        soft_weight: float = 0.01,
        gradient: str = "straight_through",
        interclass_filtering_threshold: float = 0.0,
    ) -> None:
        super().__init__(
            gradient=gradient, interclass_filtering_threshold=interclass_filtering_threshold
        )
        self.margin = check_real("margin", margin)
        if self.margin < 1.0:
            raise ValueError(f"margin must be >= 1 (a multiplier of the angle), got {margin!r}")
        self.scale = check_real("scale", scale, positive=True)
        self.kind = check_choice("kind", kind, SPHEREFACE_R_TYPES)
        self.feature_norm = check_choice("feature_norm", feature_norm, FEATURE_NORMS)
        self.soft_weight = check_real("soft_weight", soft_weight, nonnegative=True)
        self.requires_norms = self.feature_norm != "hard"

    def scale_for(self, norms: Tensor | None) -> Tensor | float:
        if self.feature_norm == "hard":
            return self.scale
        if norms is None:
            raise ValueError(
                f"norms is required by SphereFace-R with feature_norm={self.feature_norm!r} "
                "(the scale is the feature norm)"
            )
        return norms.unsqueeze(1)  # (N, 1)

    def target_cosine(self, cos_target: Tensor, norms: Tensor | None, context: Context) -> Tensor:
        return sphereface_r_target(cos_target, self.margin, self.kind)

    def nontarget_cosine(self, cosine: Tensor, context: Context) -> Tensor:
        if self.kind != "v2":
            return cosine
        straight = self.gradient == "straight_through"
        return sphereface_r_nontarget(cosine, self.margin, straight_through=straight)

    def nontarget_is_identity(self) -> bool:
        """True for the ``"v0"`` and ``"v1"`` types (or ``m = 1``)."""
        return self.kind != "v2" or self.margin == 1.0

    def nontarget_kernel(self) -> str:
        """``"divided_angle"`` for the ``"v2"`` type (``"identity"`` otherwise): the compiled
        rule (:data:`~marginface.margins.base.NONTARGET_KERNELS`)."""
        return "identity" if self.nontarget_is_identity() else "divided_angle"

    def nontarget_kernel_parameters(self, context: Context) -> dict[str, Tensor]:
        """``t = [m, 1]`` with the straight-through gradient, ``[m, 0]`` with the exact one."""
        straight = 1.0 if self.gradient == "straight_through" else 0.0
        return {"t": torch.tensor([self.margin, straight], dtype=torch.float64)}

    def regularizer(self, norms: Tensor | None) -> Tensor | None:
        """``t·|‖x‖ - s|`` per sample with ``feature_norm="soft"``, else None."""
        if self.feature_norm != "soft":
            return None
        if norms is None:
            raise ValueError("norms is required by SphereFace-R with feature_norm='soft'")
        return self.soft_weight * (norms - self.scale).abs()

    def extra_repr(self) -> str:
        return (
            f"margin={self.margin}, scale={self.scale}, kind={self.kind!r}, "
            f"feature_norm={self.feature_norm!r}, soft_weight={self.soft_weight}, "
            f"gradient={self.gradient!r}" + self._filtering_repr()
        )
