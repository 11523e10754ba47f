"""Combined margin: ``s·(cos(m1·θ_y + m2) - m3)`` (SphereFace × ArcFace × CosFace)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .._validation import check_choice, check_real
from ._angles import arccos
from .arcface import ANGLE_POLICIES, additive_angular_margin
from .base import Context, Margin

__all__ = ["CombinedMargin", "combined_margin"]


def combined_margin(
    cos_target: Tensor, m1: float, m2: float, m3: float, policy: str = "linear"
) -> Tensor:
    r"""``cos(m1·θ + m2) - m3`` with ``policy`` where the angle ``m1·θ + m2`` reaches π.

    The boundary ``m1·θ + m2 = π`` takes the fallback, as in
    :func:`~marginface.margins.arcface.additive_angular_margin`.

    All three margins are active at once (insightface's ``CombinedMarginLoss`` drops m2
    whenever m3 > 0). The policy acts on the angular part only; m3 is always subtracted, so
    ``m1 = 1, m3 = 0`` is exactly ArcFace(m2) and ``m1 = 1, m2 = 0`` is CosFace(m3).

    ``"linear"`` generalizes ArcFace's fallback: beyond ``θ_c = (π - m2)/m1`` the angular part is
    ``cos θ - (π - θ_c)·sin θ_c``, the first-order expansion of ``cos(θ + Δ)`` at the boundary
    (``Δ = π - θ_c``); for ``m1 = 1`` that is ``cos θ - m2·sin m2``.

    Args:
        cos_target: ``Tensor[N]`` of ``cos θ_y`` in [-1, 1].
        m1: multiplicative angular margin (SphereFace), ``> 0``; 1 disables it.
        m2: additive angular margin in radians (ArcFace), ``>= 0``.
        m3: additive cosine margin (CosFace), ``>= 0``.
        policy: one of :data:`~marginface.margins.arcface.ANGLE_POLICIES`.

    Returns:
        ``Tensor[N]``.
    """
    if m1 == 1.0:
        return additive_angular_margin(cos_target, m2, policy) - m3
    theta = arccos(cos_target)  # (N,) radians
    angle = m1 * theta + m2
    angular = torch.cos(angle)
    if policy == "easy":
        angular = torch.where(cos_target > 0, angular, cos_target)
    elif policy == "clip":
        angular = torch.where(angle >= math.pi, torch.full_like(angular, -1.0), angular)
    elif policy == "linear":
        theta_c = (math.pi - m2) / m1  # boundary angle: m1·θ_c + m2 = π
        if theta_c < math.pi:
            fallback = cos_target - (math.pi - theta_c) * math.sin(theta_c)
            angular = torch.where(angle >= math.pi, fallback, angular)
    elif policy != "none":
        raise ValueError(f"policy must be one of {ANGLE_POLICIES}, got {policy!r}")
    return angular - m3


class CombinedMargin(Margin):
    r"""Combined margin (insightface; Deng et al., 2019, Sec. 3.3).

    .. math::
        \text{logit}_y = s\,(\cos(m_1\theta_y + m_2) - m_3), \qquad
        \text{logit}_j = s\cos\theta_j

    Args:
        m1: multiplicative angular margin (SphereFace's m), ``> 0``. Default: 1.0.
        m2: additive angular margin in radians (ArcFace's m), ``0 <= m2 < π``. Default: 0.5.
        m3: additive cosine margin (CosFace's m), ``>= 0``. Default: 0.0.
        scale: ``s > 0``. Default: 64.0.
        policy: behaviour where ``m1·θ + m2 > π``. Default: ``"linear"``.
        gradient: ``"exact"`` (default) or ``"straight_through"``.
        interclass_filtering_threshold: ``τ`` in [0, 1]: non-target cosines above it are set to
            0 (insightface's label-noise filter; see :class:`~marginface.margins.base.Margin`).
            Default: 0 (off).

    insightface's published combinations include ``(1.0, 0.3, 0.2)`` and ``(1.0, 0.5, 0.0)``.
    """

    def __init__(
        self,
        m1: float = 1.0,
        m2: float = 0.5,
        m3: float = 0.0,
        scale: float = 64.0,
        *,
        policy: str = "linear",
        gradient: str = "exact",
        interclass_filtering_threshold: float = 0.0,
    ) -> None:
        super().__init__(
            gradient=gradient, interclass_filtering_threshold=interclass_filtering_threshold
        )
        self.m1 = check_real("m1", m1, positive=True)
        self.m2 = check_real("m2", m2, nonnegative=True, below=math.pi)
        self.m3 = check_real("m3", m3, nonnegative=True)
        self.scale = check_real("scale", scale, positive=True)
        self.policy = check_choice("policy", policy, ANGLE_POLICIES)

    def scale_for(self, norms: Tensor | None) -> float:
        return self.scale

    def target_cosine(self, cos_target: Tensor, norms: Tensor | None, context: Context) -> Tensor:
        return combined_margin(cos_target, self.m1, self.m2, self.m3, self.policy)

    def extra_repr(self) -> str:
        return (
            f"m1={self.m1}, m2={self.m2}, m3={self.m3}, scale={self.scale}, policy={self.policy!r}"
            + self._filtering_repr()
        )
