r"""AdaM-Softmax, the adaptive margin of AdaptiveFace (Liu et al., CVPR 2019, "AdaptiveFace:
Adaptive Margin and Sampling for Face Recognition").

CosFace's target with a *learnable* margin ``m_c`` per class, and a regularizer that rewards
large margins (without it every margin would shrink to 0):

.. math::
    \text{logit}_y = s(\cos\theta_y - m_{y}),\qquad \text{logit}_j = s\cos\theta_j,\qquad
    L = \mathrm{CE} + \lambda\Big(1 - \frac1C\sum_{c=1}^{C} m_c\Big)

The margins are a per-class parameter (:class:`~marginface.margins.base.ClassParameter`): the
head owns them (shape ``(C,)``, sharded with the class centers on a class-sharded head, sampled
with them by Partial FC) and every executor hands this margin ``m_{y_i}`` per row, with its
gradient (``∂L/∂m_{y_i} = -s·∂L/∂logit_{y_i}``), and the sum ``Σ_c m_c`` for the regularizer.
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor

from .._validation import check_real
from .base import ClassParameter, Context, Margin

__all__ = ["AdaMSoftmaxMargin"]


class AdaMSoftmaxMargin(Margin):
    r"""AdaM-Softmax / AdaptiveFace (Liu et al., CVPR 2019).

    .. math::
        \text{logit}_y = s(\cos\theta_y - m_{y}),\qquad
        \text{logit}_j = s\cos\theta_j,\qquad
        R = \lambda\Big(1 - \frac1C\sum_c m_c\Big)

    ``m_c`` in cosine units, one learnable value per class (the head's
    ``class_parameters["margin"]``, ``Parameter[C]``), seen clamped to ``[0, 1]``. ``R`` is added
    to every sample's loss (so to the mean once).

    Where the paper and the authors' code (FaceX-Zoo ``head/AdaM_Softmax.py``) differ, we take
    the code: the regularizer is ``λ(1 - mean(m))`` (the paper's ``L_m = -mean(m)`` plus the
    constant ``λ``, which keeps the loss positive; same gradient), ``λ = 70``, ``s = 30``, the
    margins drawn from ``U(0.3, 0.4)`` and clamped to ``[0, 1]``. The authors clamp the
    parameter itself in place at each forward (its gradient passes unchanged); we never modify
    a parameter in ``forward``: the clamp is applied to the values used, with the gradient passed
    through unchanged, which gives the same losses and gradients while the margins stay in
    ``[0, 1]`` (and the parameter may then leave the interval where the authors' would be held
    at its edge). The paper's adaptive data sampling and hard prototype mining are training-loop
    choices, not part of the loss.

    Args:
        scale: ``s > 0``. Default: 30.0 (the authors' code).
        lambda_m: ``λ >= 0``, the weight of the margins' regularizer. Default: 70.0 (the
            authors' code).
        margin_init_low, margin_init_high: each ``m_c`` is drawn from
            ``U(margin_init_low, margin_init_high)``, ``0 <= low <= high <= 1``. Default: 0.3,
            0.4 (the authors' code).
        gradient: ``"exact"`` (default) or ``"straight_through"`` (the target's margin treated
            as a constant: then the margins learn from the regularizer only).
        interclass_filtering_threshold: see :class:`~marginface.margins.base.Margin`.
    """

    def __init__(
        self,
        scale: float = 30.0,
        *,
        lambda_m: float = 70.0,
        margin_init_low: float = 0.3,
        margin_init_high: float = 0.4,
        gradient: str = "exact",
        interclass_filtering_threshold: float = 0.0,
    ) -> None:
        super().__init__(
            gradient=gradient, interclass_filtering_threshold=interclass_filtering_threshold
        )
        self.scale = check_real("scale", scale, positive=True)
        self.lambda_m = check_real("lambda_m", lambda_m, nonnegative=True)
        self.margin_init_low = check_real(
            "margin_init_low", margin_init_low, nonnegative=True, at_most=1.0
        )
        self.margin_init_high = check_real(
            "margin_init_high", margin_init_high, nonnegative=True, at_most=1.0
        )
        if self.margin_init_high < self.margin_init_low:
            raise ValueError(
                f"margin_init_high must be >= margin_init_low = {margin_init_low!r}, "
                f"got {margin_init_high!r}"
            )

    def scale_for(self, norms: Tensor | None) -> float:
        return self.scale

    def class_parameters(self) -> Mapping[str, ClassParameter]:
        return {
            "margin": ClassParameter(
                self.margin_init_low,
                self.margin_init_high,
                low=0.0,
                high=1.0,
                doc="m_c, the additive cosine margin of class c (cosine units)",
            )
        }

    def class_regularizer(self, sums: Mapping[str, Tensor], num_classes: int) -> Tensor:
        """``λ(1 - Σ_c m_c / C)`` (0-dim), the authors' ``λ·L_m`` shifted to be positive."""
        return self.lambda_m * (1.0 - sums["margin"] / num_classes)

    def target_cosine(self, cos_target: Tensor, norms: Tensor | None, context: Context) -> Tensor:
        margin = context["margin"]
        assert isinstance(margin, Tensor)
        return cos_target - margin.to(cos_target.dtype)

    def extra_repr(self) -> str:
        return (
            f"scale={self.scale}, lambda_m={self.lambda_m}, margin_init=("
            f"{self.margin_init_low}, {self.margin_init_high})" + self._filtering_repr()
        )
