"""CurricularFace: ArcFace's positive plus adaptive re-weighting of hard negatives."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .._validation import check_choice, check_device, check_real
from ._alias import alias
from ._angles import cos_add
from .arcface import ANGLE_POLICIES, additive_angular_margin
from .base import Context, Margin
from .rules import curricular_negative

__all__ = ["CurricularFaceMargin", "curricular_negative"]


class CurricularFaceMargin(Margin):
    r"""CurricularFace (Huang et al., 2020).

    .. math::
        \text{logit}_y = s\cos(\theta_y + m),\qquad
        \text{logit}_j = s\,N(t, \cos\theta_j),\qquad
        t \leftarrow \alpha\,t + (1 - \alpha)\,\overline{\cos\theta_y}

    where ``N`` is :func:`curricular_negative`, the mean is over the batch's target cosines, and
    ``t`` is updated (before use, as in the authors' code) in training mode only. ``t`` starts at 0
    and is a buffer, saved in ``state_dict``.

    Args:
        margin: ``m`` in radians, ``0 <= m < π``. Default: 0.5 (paper).
        scale: ``s > 0``. Default: 64.0 (paper).
        momentum: ``α`` in ``[0, 1]``. Default: 0.99 (paper).
        policy: the positive's behaviour where ``θ_y + m > π``. Default: ``"linear"`` (paper's
            code).
        gradient: ``"exact"`` (default) or ``"straight_through"`` (target only). ``t`` and the
            hard-negative mask carry no gradient, as in the paper.
        interclass_filtering_threshold: ``τ`` in [0, 1]: non-target cosines above it are set to
            0 (insightface's label-noise filter; see :class:`~marginface.margins.base.Margin`).
            Default: 0 (off).
    """

    stateful = True

    angular_margin = alias(
        "margin", "``m``, the additive angular margin, in radians (the constructor's ``margin``)."
    )

    def __init__(
        self,
        margin: float = 0.5,
        scale: float = 64.0,
        *,
        momentum: float = 0.99,
        policy: str = "linear",
        gradient: str = "exact",
        interclass_filtering_threshold: float = 0.0,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__(
            gradient=gradient, interclass_filtering_threshold=interclass_filtering_threshold
        )
        self.margin = check_real("margin", margin, nonnegative=True, below=math.pi)
        self.scale = check_real("scale", scale, positive=True)
        self.momentum = check_real("momentum", momentum, nonnegative=True, at_most=1.0)
        self.policy = check_choice("policy", policy, ANGLE_POLICIES)
        device = check_device("device", device)
        self.register_buffer("t", torch.zeros((), device=device))

    def scale_for(self, norms: Tensor | None) -> float:
        return self.scale

    def prepare(
        self,
        cos_target: Tensor,
        labels: Tensor,
        norms: Tensor | None,
        cosine: Tensor | None = None,
    ) -> Context:
        has_target = labels >= 0  # (N,)
        with torch.no_grad():
            if self.training:  # no host sync: a batch without targets leaves t unchanged
                count = has_target.sum()
                total = torch.where(has_target, cos_target, torch.zeros_like(cos_target)).sum()
                mean_target = (total / count.clamp_min(1)).to(self.t)
                updated = self.t * self.momentum + (1.0 - self.momentum) * mean_target
                self.t.copy_(torch.where(count > 0, updated, self.t))
            threshold = cos_add(cos_target, self.margin)  # cos(θ_y + m), (N,)
            threshold = torch.where(has_target, threshold, torch.full_like(threshold, 2.0))
        return {"scale": self.scale, "threshold": threshold.unsqueeze(1), "t": self.t.detach()}

    def target_cosine(self, cos_target: Tensor, norms: Tensor | None, context: Context) -> Tensor:
        return additive_angular_margin(cos_target, self.margin, self.policy)

    def nontarget_cosine(self, cosine: Tensor, context: Context) -> Tensor:
        threshold = context["threshold"]
        assert isinstance(threshold, Tensor)
        return curricular_negative(cosine, threshold.to(cosine.dtype), context["t"])

    def nontarget_kernel(self) -> str | None:
        """``"curricular"``: :func:`curricular_negative` is compiled into the executors' kernels
        (None for a subclass with its own :meth:`nontarget_cosine`)."""
        if type(self).nontarget_cosine is not CurricularFaceMargin.nontarget_cosine:
            return super().nontarget_kernel()
        return "curricular"

    def nontarget_kernel_parameters(self, context: Context) -> dict[str, Tensor]:
        """The rule's ``threshold`` ``cos(θ_y + m)`` (``Tensor[N, 1]``) and ``t`` (0-dim)."""
        threshold, t = context["threshold"], context["t"]
        assert isinstance(threshold, Tensor) and isinstance(t, Tensor)
        return {"threshold": threshold.detach(), "t": t.detach()}

    def extra_repr(self) -> str:
        return (
            f"margin={self.margin}, scale={self.scale}, momentum={self.momentum}"
            + self._filtering_repr()
        )
