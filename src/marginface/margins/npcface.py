r"""NPCFace (Zeng et al., 2020, "NPCFace: Negative-Positive Collaborative Training for Large-scale
Face Recognition"): ArcFace's target with a margin that grows with the row's hard negatives, and
those hard negatives emphasized.

A non-target class is a *hard negative* of row ``i`` when its cosine beats the target's
ArcFace-adjusted cosine, ``cos θ_j > cos(θ_y + m)``. With ``H_i`` the row's hard negatives,

.. math::
    m'_i = m_0 + m_1\,\frac{\sum_{j\in H_i}\cos\theta_j}{\max(1, |H_i|)},\qquad
    \text{logit}_y = s\cos(\theta_y + m'_i),\qquad
    \text{logit}_j = s\begin{cases} t\cos\theta_j + a & j \in H_i\\
                                  \cos\theta_j & \text{otherwise}\end{cases}

``m'_i`` carries no gradient (as in the authors' code). It needs, per row, the count and the
sum of the hard-negative cosines over *all* classes: a per-row statistics pass
(:meth:`~marginface.margins.base.Margin.row_statistics_terms`) that the chunked executor runs
chunk by chunk and a class-sharded head sums over its ranks. The non-target rule is elementwise
given the per-row threshold ``cos(θ_y + m)`` (MV-Softmax's rule with ``(t, a)``,
:func:`~marginface.margins.mv_softmax.mv_negative`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .._validation import check_choice, check_real
from ._alias import alias
from ._angles import cos_add
from .arcface import ANGLE_POLICIES, additive_angular_margin
from .base import Context, Margin
from .rules import above_threshold_terms, mv_negative

__all__ = ["NPCFaceMargin", "above_threshold_terms"]


class NPCFaceMargin(Margin):
    r"""NPCFace (Zeng et al., 2020).

    .. math::
        \text{hard}_{ij} = [\cos\theta_j > \cos(\theta_y + m)],\qquad
        m'_i = m_0 + m_1\,\overline{\cos\theta}_{\text{hard},i},\qquad
        \text{logit}_y = s\cos(\theta_y + m'_i),\qquad
        \text{logit}_j = s\,(t\cos\theta_j + a)^{\text{hard}_{ij}}\cos\theta_j^{1-\text{hard}_{ij}}

    where ``\overline{\cos\theta}_{hard,i}`` is the mean cosine of row ``i``'s hard negatives (0
    when it has none, so ``m' = m_0``). All angles in radians.

    The defaults are the authors' code's (FaceX-Zoo ``head/NPCFace.py``; two of its authors are
    the paper's): ``m = 0.5``, ``s = 64``, ``m_0 = 0.4``, ``m_1 = 0.2``, ``t = 1.1``,
    ``a = 0.2``; the target keeps its margin only where ``cos θ_y > 0`` (``policy="easy"``),
    and the hard-negative test always uses the exact ``cos(θ_y + m)``.

    Args:
        margin: ``m`` in radians, ``0 <= m < π``, the margin of the hard-negative test.
            Default: 0.5.
        scale: ``s > 0``. Default: 64.0.
        m0: ``m_0 >= 0``, the target margin of a row without hard negatives, radians.
            Default: 0.4.
        m1: ``m_1 >= 0``, the target margin's growth with the hard negatives' mean cosine.
            Default: 0.2.
        t: ``t >= 1``, the hard negatives' slope. Default: 1.1.
        a: ``a >= 0``, the hard negatives' shift, cosine units. Default: 0.2.
        policy: the target where ``θ_y + m'`` is large
            (:data:`~marginface.margins.arcface.ANGLE_POLICIES`). Default: ``"easy"`` (the
            authors' code).
        gradient: ``"exact"`` (default) or ``"straight_through"`` (target only). The hard mask
            and ``m'`` carry no gradient, as in the authors' code.
        interclass_filtering_threshold: see :class:`~marginface.margins.base.Margin`.
    """

    angular_margin = alias("margin", "``m``, the hard-negative test's angular margin, in radians.")

    def __init__(
        self,
        margin: float = 0.5,
        scale: float = 64.0,
        *,
        m0: float = 0.4,
        m1: float = 0.2,
        t: float = 1.1,
        a: float = 0.2,
        policy: str = "easy",
        gradient: str = "exact",
        interclass_filtering_threshold: float = 0.0,
    ) -> None:
        super().__init__(
            gradient=gradient, interclass_filtering_threshold=interclass_filtering_threshold
        )
        self.margin = check_real("margin", margin, nonnegative=True, below=math.pi)
        self.scale = check_real("scale", scale, positive=True)
        self.m0 = check_real("m0", m0, nonnegative=True, below=math.pi)
        self.m1 = check_real("m1", m1, nonnegative=True, below=math.pi)
        self.t = check_real("t", t)
        if self.t < 1.0:
            raise ValueError(f"t must be >= 1, got {t!r}")
        self.a = check_real("a", a, nonnegative=True)
        self.policy = check_choice("policy", policy, ANGLE_POLICIES)

    def scale_for(self, norms: Tensor | None) -> float:
        return self.scale

    def hard_threshold(self, cos_target: Tensor) -> Tensor:
        """``cos(θ_y + m)`` per row: ``Tensor[N] -> Tensor[N, 1]`` (no gradient)."""
        with torch.no_grad():
            return cos_add(cos_target, self.margin).unsqueeze(1)

    # ------------------------------------------------------- the per-row statistics pass
    def row_statistics_size(self) -> int:
        return 2

    def row_statistics_terms(self, cosine: Tensor, cos_target: Tensor) -> tuple[Tensor, Tensor]:
        """``(hard·cos θ_j, hard)``: summed over the non-targets, the hard negatives' cosine
        sum and count."""
        return above_threshold_terms(cosine, self.hard_threshold(cos_target))

    def row_statistics_kernel(self) -> str:
        """``"above_threshold"`` with the threshold ``cos(θ_y + m)``: the statistics pass runs
        as the chunked executor's custom operator (no graph break under ``torch.compile``)."""
        return "above_threshold"

    def row_statistics_kernel_parameters(self, cos_target: Tensor) -> dict[str, Tensor]:
        return {"threshold": self.hard_threshold(cos_target)}

    def prepare(
        self,
        cos_target: Tensor,
        labels: Tensor,
        norms: Tensor | None,
        cosine: Tensor | None = None,
    ) -> Context:
        if cosine is None:
            raise ValueError(
                "NPCFaceMargin.prepare needs the cosine matrix (its hard negatives over all "
                "classes); executors without it call prepare_with_row_statistics"
            )
        sums = self.dense_row_statistics(cosine, cos_target, labels)  # (2, N)
        return self.prepare_with_row_statistics(cos_target, labels, norms, sums)

    def prepare_with_row_statistics(
        self, cos_target: Tensor, labels: Tensor, norms: Tensor | None, sums: Tensor
    ) -> Context:
        with torch.no_grad():
            mean_hard = sums[0] / sums[1].clamp_min(1.0)  # (N,), 0 without hard negatives
            target_margin = self.m0 + self.m1 * mean_hard  # (N,)
            threshold = self.hard_threshold(cos_target)  # (N, 1)
            # rows without a target here: nothing is hard (cosines are <= 1 < 2)
            threshold = torch.where(labels.unsqueeze(1) >= 0, threshold, 2.0)
        return {"scale": self.scale, "threshold": threshold, "target_margin": target_margin}

    # ------------------------------------------------------------------ the hooks
    def target_cosine(self, cos_target: Tensor, norms: Tensor | None, context: Context) -> Tensor:
        target_margin = context["target_margin"]
        assert isinstance(target_margin, Tensor)
        return additive_angular_margin(cos_target, target_margin.to(cos_target.dtype), self.policy)

    def nontarget_cosine(self, cosine: Tensor, context: Context) -> Tensor:
        threshold = context["threshold"]
        assert isinstance(threshold, Tensor)
        return mv_negative(cosine, threshold.to(cosine.dtype), self.t, self.a)

    def nontarget_is_identity(self) -> bool:
        """True when the re-weighting is off (``t = 1, a = 0``)."""
        return self.t == 1.0 and self.a == 0.0

    def nontarget_kernel(self) -> str:
        """``"mv"`` with ``(t, a)`` (``"identity"`` with the re-weighting off)."""
        return "identity" if self.nontarget_is_identity() else "mv"

    def nontarget_kernel_parameters(self, context: Context) -> dict[str, Tensor]:
        threshold = context["threshold"]
        assert isinstance(threshold, Tensor)
        t = torch.tensor([self.t, self.a], dtype=torch.float64, device=threshold.device)
        return {"threshold": threshold, "t": t}

    def extra_repr(self) -> str:
        return (
            f"margin={self.margin}, scale={self.scale}, m0={self.m0}, m1={self.m1}, t={self.t}, "
            f"a={self.a}, policy={self.policy!r}" + self._filtering_repr()
        )
