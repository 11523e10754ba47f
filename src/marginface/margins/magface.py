"""MagFace: an ArcFace margin that grows with the feature norm, plus a norm regularizer."""

from __future__ import annotations

import math

from torch import Tensor

from .._validation import check_choice, check_real
from .arcface import ANGLE_POLICIES, additive_angular_margin
from .base import Context, Margin

__all__ = ["MagFaceMargin", "magface_margin", "magface_regularizer"]


def magface_margin(
    norms: Tensor, lower_norm: float, upper_norm: float, lower_margin: float, upper_margin: float
) -> Tensor:
    r"""MagFace's magnitude-aware margin, linear in the clamped norm ``a``:

    .. math::
        m(a) = \frac{u_m - l_m}{u_a - l_a}(a - l_a) + l_m,\qquad
        a = \mathrm{clamp}(\|x\|, l_a, u_a)

    Args:
        norms: ``Tensor[N]`` of feature norms (gradient flows through them inside [l_a, u_a]).
        lower_norm, upper_norm: ``l_a < u_a``.
        lower_margin, upper_margin: ``l_m <= u_m`` in radians.

    Returns:
        ``Tensor[N]`` of margins in radians.
    """
    a = norms.clamp(lower_norm, upper_norm)
    slope = (upper_margin - lower_margin) / (upper_norm - lower_norm)
    return slope * (a - lower_norm) + lower_margin


def magface_regularizer(norms: Tensor, lower_norm: float, upper_norm: float) -> Tensor:
    r"""MagFace's regularizer :math:`g(a) = 1/a + a/u_a^2` on the clamped norm: ``Tensor[N]``."""
    a = norms.clamp(lower_norm, upper_norm)
    return 1.0 / a + a / (upper_norm * upper_norm)


class MagFaceMargin(Margin):
    r"""MagFace (Meng et al., 2021).

    .. math::
        \text{logit}_y = s\cos(\theta_y + m(a)),\qquad \text{logit}_j = s\cos\theta_j,\qquad
        L = \mathrm{CE} + \lambda_g\, g(a)

    with ``a = clamp(‖x‖, l_a, u_a)``, :func:`magface_margin` and :func:`magface_regularizer`.

    Args:
        scale: ``s > 0``. Default: 64.0.
        lower_norm, upper_norm: ``l_a, u_a``. Defaults: 10, 110 (paper).
        lower_margin, upper_margin: ``l_m, u_m`` in radians. Defaults: 0.45, 0.8 (paper).
        regularizer_weight: ``λ_g >= 0``. Default: 35.0 (paper).
        policy: behaviour of the target. Default: ``"easy"``, the authors' code (``MagLinear``'s
            ``easy_margin=True``, which their training builder never overrides): the margin
            only where ``cos θ_y > 0``. ``"linear"`` is their ``easy_margin=False`` branch.
        gradient: ``"exact"`` (default): the gradient reaches the norm through ``m(a)`` as well
            as through ``g(a)``. ``"straight_through"``: the whole target shift is a constant
            (no gradient through ``m(a)``); the regularizer keeps its gradient.
        interclass_filtering_threshold: ``τ`` in [0, 1]: non-target cosines above it are set to
            0 (insightface's label-noise filter; see :class:`~marginface.margins.base.Margin`).
            Default: 0 (off).
    """

    requires_norms = True
    feature_norm_is_quality = True  # the magnitude it learns ranks samples by quality

    def __init__(
        self,
        scale: float = 64.0,
        *,
        lower_norm: float = 10.0,
        upper_norm: float = 110.0,
        lower_margin: float = 0.45,
        upper_margin: float = 0.8,
        regularizer_weight: float = 35.0,
        policy: str = "easy",
        gradient: str = "exact",
        interclass_filtering_threshold: float = 0.0,
    ) -> None:
        super().__init__(
            gradient=gradient, interclass_filtering_threshold=interclass_filtering_threshold
        )
        self.scale = check_real("scale", scale, positive=True)
        self.lower_norm = check_real("lower_norm", lower_norm, positive=True)
        self.upper_norm = check_real("upper_norm", upper_norm, positive=True)
        if self.upper_norm <= self.lower_norm:
            raise ValueError(
                f"upper_norm must be > lower_norm = {lower_norm!r}, got {upper_norm!r}"
            )
        self.lower_margin = check_real("lower_margin", lower_margin, nonnegative=True)
        self.upper_margin = check_real(
            "upper_margin", upper_margin, nonnegative=True, below=math.pi
        )
        if self.upper_margin < self.lower_margin:
            raise ValueError(
                f"upper_margin must be >= lower_margin = {lower_margin!r}, got {upper_margin!r}"
            )
        self.regularizer_weight = check_real(
            "regularizer_weight", regularizer_weight, nonnegative=True
        )
        self.policy = check_choice("policy", policy, ANGLE_POLICIES)

    def scale_for(self, norms: Tensor | None) -> float:
        return self.scale

    def prepare(
        self,
        cos_target: Tensor,
        labels: Tensor,
        norms: Tensor | None,
        cosine: Tensor | None = None,
    ) -> Context:
        if norms is None:
            raise ValueError("norms is required by MagFace (its margin depends on the norm)")
        margin = magface_margin(
            norms, self.lower_norm, self.upper_norm, self.lower_margin, self.upper_margin
        )
        return {"scale": self.scale, "margin": margin}

    def target_cosine(self, cos_target: Tensor, norms: Tensor | None, context: Context) -> Tensor:
        margin = context["margin"]
        return additive_angular_margin(cos_target, margin.to(cos_target.dtype), self.policy)

    def regularizer(self, norms: Tensor | None) -> Tensor | None:
        if norms is None:
            raise ValueError("norms is required by MagFace (its regularizer depends on the norm)")
        g = magface_regularizer(norms, self.lower_norm, self.upper_norm)
        return self.regularizer_weight * g

    def extra_repr(self) -> str:
        return (
            f"scale={self.scale}, norm=[{self.lower_norm}, {self.upper_norm}], "
            f"margin=[{self.lower_margin}, {self.upper_margin}], "
            f"regularizer_weight={self.regularizer_weight}" + self._filtering_repr()
        )
