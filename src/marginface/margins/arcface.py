"""ArcFace: additive angular margin, ``s·cos(θ_y + m)``, with a policy for ``θ_y + m > π``."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .._validation import check_choice, check_real
from ._alias import alias
from ._angles import cos_add
from .base import Context, Margin

__all__ = ["ANGLE_POLICIES", "ArcFaceMargin", "additive_angular_margin"]

ANGLE_POLICIES = ("linear", "easy", "clip", "none")
"""What to do where ``θ + m > π`` (``cos(θ + m)`` would start increasing again):

* ``"linear"``: ``cos θ - m·sin m`` there (insightface's code before December 2022,
  CurricularFace's and MagFace's with ``easy_margin=False``). The target logit stays monotone
  non-increasing in θ; it steps down by ``cos m + m sin m - 1`` at ``θ = π - m``.
* ``"easy"``: apply the margin only where ``cos θ > 0`` (``θ < π/2``); elsewhere ``cos θ``.
* ``"clip"``: clip ``θ + m`` to π (target cosine -1, zero gradient beyond).
* ``"none"``: ``cos(θ + m)`` everywhere (non-monotone beyond ``π - m``).

The boundary ``θ = π - m`` itself belongs to the fallback (``"linear"``, ``"clip"``): the margin
is kept only where ``cos θ > cos(π - m)``, the comparison of insightface's, CurricularFace's and
MagFace's code, with the threshold computed as they do (``cos(π - m)``, shift ``sin(π - m)·m``).
"""


def additive_angular_margin(
    cos_target: Tensor, margin: float | Tensor, policy: str = "linear"
) -> Tensor:
    r"""``cos(θ_y + m)`` from ``cos θ_y``, with ``policy`` where ``θ_y + m >= π``.

    Computed as ``c·cos m - sin θ·sin m`` (no arccos), so the value is exact near θ = 0. The
    derivative ``cos m + sin m·cos θ / sin θ`` is the true one, capped near ``cos θ = ±1``
    (:func:`~marginface.margins._angles.sin_from_cos`).

    Args:
        cos_target: ``Tensor[N]`` of ``cos θ_y`` in [-1, 1].
        margin: ``m`` in radians, a float or a per-sample ``Tensor[N]``.
        policy: one of :data:`ANGLE_POLICIES`.

    Returns:
        ``Tensor[N]``.
    """
    shifted = cos_add(cos_target, margin)  # cos(θ + m)
    if policy == "none":
        return shifted
    if policy == "easy":
        return torch.where(cos_target > 0, shifted, cos_target)
    # cos(π - m) and sin(π - m)·m, computed as the reference codes do (bit-identical thresholds)
    if isinstance(margin, Tensor):
        threshold = torch.cos(math.pi - margin)
        fallback_shift = torch.sin(math.pi - margin) * margin
    else:
        threshold = math.cos(math.pi - margin)
        fallback_shift = math.sin(math.pi - margin) * margin
    beyond = cos_target <= threshold  # θ + m >= π: the boundary takes the fallback
    if policy == "linear":
        return torch.where(beyond, cos_target - fallback_shift, shifted)
    if policy == "clip":
        return torch.where(beyond, torch.full_like(shifted, -1.0), shifted)
    raise ValueError(f"policy must be one of {ANGLE_POLICIES}, got {policy!r}")


class ArcFaceMargin(Margin):
    r"""ArcFace (Deng et al., 2019): additive angular margin.

    .. math::
        \text{logit}_y = s\cos(\theta_y + m), \qquad \text{logit}_j = s\cos\theta_j

    Args:
        margin: ``m`` in radians, ``0 <= m < π``. Default: 0.5 (paper).
        scale: ``s > 0``. Default: 64.0 (paper).
        policy: behaviour where ``θ_y + m > π``, one of :data:`ANGLE_POLICIES`.
            Default: ``"linear"``.
        gradient: ``"exact"`` (default) or ``"straight_through"``.
        interclass_filtering_threshold: ``τ`` in [0, 1]: non-target cosines above it are set to
            0 (insightface's label-noise filter; see :class:`~marginface.margins.base.Margin`).
            Default: 0 (off).
    """

    angular_margin = alias(
        "margin", "``m``, the additive angular margin, in radians (the constructor's ``margin``)."
    )

    def __init__(
        self,
        margin: float = 0.5,
        scale: float = 64.0,
        *,
        policy: str = "linear",
        gradient: str = "exact",
        interclass_filtering_threshold: float = 0.0,
    ) -> None:
        super().__init__(
            gradient=gradient, interclass_filtering_threshold=interclass_filtering_threshold
        )
        self.margin = check_real("margin", margin, nonnegative=True, below=math.pi)
        self.scale = check_real("scale", scale, positive=True)
        self.policy = check_choice("policy", policy, ANGLE_POLICIES)

    def scale_for(self, norms: Tensor | None) -> float:
        return self.scale

    def target_cosine(self, cos_target: Tensor, norms: Tensor | None, context: Context) -> Tensor:
        return additive_angular_margin(cos_target, self.margin, self.policy)

    def extra_repr(self) -> str:
        return (
            f"margin={self.margin}, scale={self.scale}, policy={self.policy!r}"
            + self._filtering_repr()
        )
