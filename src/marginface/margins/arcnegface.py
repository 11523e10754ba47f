r"""ArcNegFace (Liu et al., 2019, "Towards Flops-constrained Face Recognition"): ArcFace's target
plus a Gaussian re-weighting of every non-target cosine by its distance to the target's.

.. math::
    \text{logit}_y = s\,f_y,\qquad f_y = \cos(\theta_y + m),\qquad
    \text{logit}_j = s\,\big(t_{ij}\cos\theta_j + t_{ij} - 1\big),\qquad
    t_{ij} = \alpha\,e^{-(\cos\theta_j - f_y)^2/\sigma}

``t`` is a per-entry weight computed from the per-row ``f_y`` and carries no gradient (as in the
authors' code), so the non-target rule is elementwise given the row context
(:func:`gaussian_negative`) and runs chunk by chunk.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .._validation import check_choice, check_real
from ._alias import alias
from .arcface import ANGLE_POLICIES, additive_angular_margin
from .base import Context, Margin

__all__ = ["ArcNegFaceMargin", "gaussian_negative"]


def gaussian_negative(cosine: Tensor, target: Tensor, alpha: float, sigma: float) -> Tensor:
    r"""ArcNegFace's non-target rule, elementwise: ``t·cos θ_j + t - 1`` with
    ``t = α·exp(-(cos θ_j - f_y)²/σ)`` held constant in the gradient.

    Args:
        cosine: ``Tensor[N, c]`` of ``cos θ_j``.
        target: ``Tensor[N, 1]``, the margin-adjusted target cosine ``f_y`` per row (no
            gradient).
        alpha: ``α > 0``, the largest weight.
        sigma: ``σ > 0``, the Gaussian's width (in squared cosine units).

    Returns:
        ``Tensor[N, c]``; derivative ``t`` with respect to ``cos θ_j``.
    """
    weight = alpha * torch.exp(-((cosine.detach() - target) ** 2) / sigma)  # (N, c)
    return weight * cosine + weight - 1.0


class ArcNegFaceMargin(Margin):
    r"""ArcNegFace (Liu et al., 2019).

    .. math::
        \text{logit}_y = s\cos(\theta_y + m),\qquad
        \text{logit}_j = s\,(t_{ij}\cos\theta_j + t_{ij} - 1),\qquad
        t_{ij} = \alpha\,e^{-(\cos\theta_j - \cos(\theta_y + m))^2/\sigma}

    (:func:`gaussian_negative`; ``cos(θ_y + m)`` with ``policy``'s fallback, as the authors'
    code, which compares with the adjusted target it uses). Non-target classes close to the
    target's adjusted cosine get ``t`` up to ``α > 1`` (hard negatives emphasized); far ones
    ``t → 0`` (logit ``→ -s``).

    Args:
        margin: ``m`` in radians, ``0 <= m < π``. Default: 0.5 (paper and authors' code).
        scale: ``s > 0``. Default: 64.0 (paper and authors' code).
        alpha: ``α > 0``. Default: 1.2 (paper and authors' code).
        sigma: ``σ > 0``. Default: 2.0 (paper and authors' code, which divide by ``σ``, not
            ``2σ²``).
        policy: the target where ``θ_y + m > π``
            (:data:`~marginface.margins.arcface.ANGLE_POLICIES`). Default: ``"linear"`` (the
            authors' code: ``cos θ_y - m·sin m`` beyond ``cos(π - m)``).
        gradient: ``"exact"`` (default) or ``"straight_through"`` (target only). ``t`` and the
            ``f_y`` inside it carry no gradient.
        interclass_filtering_threshold: see :class:`~marginface.margins.base.Margin`.
    """

    angular_margin = alias(
        "margin", "``m``, the additive angular margin, in radians (the constructor's ``margin``)."
    )

    def __init__(
        self,
        margin: float = 0.5,
        scale: float = 64.0,
        *,
        alpha: float = 1.2,
        sigma: float = 2.0,
        policy: str = "linear",
        gradient: str = "exact",
        interclass_filtering_threshold: float = 0.0,
    ) -> None:
        super().__init__(
            gradient=gradient, interclass_filtering_threshold=interclass_filtering_threshold
        )
        self.margin = check_real("margin", margin, nonnegative=True, below=math.pi)
        self.scale = check_real("scale", scale, positive=True)
        self.alpha = check_real("alpha", alpha, positive=True)
        self.sigma = check_real("sigma", sigma, positive=True)
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
        with torch.no_grad():
            target = additive_angular_margin(cos_target, self.margin, self.policy)  # (N,)
        return {"scale": self.scale, "target": target.unsqueeze(1)}

    def target_cosine(self, cos_target: Tensor, norms: Tensor | None, context: Context) -> Tensor:
        return additive_angular_margin(cos_target, self.margin, self.policy)

    def nontarget_cosine(self, cosine: Tensor, context: Context) -> Tensor:
        target = context["target"]
        assert isinstance(target, Tensor)
        return gaussian_negative(cosine, target.to(cosine.dtype), self.alpha, self.sigma)

    def nontarget_kernel(self) -> str:
        """``"gaussian"``: the compiled rule (:data:`.base.NONTARGET_KERNELS`)."""
        return "gaussian"

    def nontarget_kernel_parameters(self, context: Context) -> dict[str, Tensor]:
        target = context["target"]
        assert isinstance(target, Tensor)
        t = torch.tensor([self.alpha, self.sigma], dtype=torch.float64, device=target.device)
        return {"threshold": target, "t": t}

    def extra_repr(self) -> str:
        return (
            f"margin={self.margin}, scale={self.scale}, alpha={self.alpha}, sigma={self.sigma}, "
            f"policy={self.policy!r}" + self._filtering_repr()
        )
