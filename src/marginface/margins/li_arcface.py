r"""Li-ArcFace / AirFace (Li et al., 2019): logits linear in the angle.

Every logit is a linear function of its angle instead of its cosine, the target's shifted by the
additive angular margin:

.. math::
    \text{logit}_y = s\,\frac{\pi - 2(\theta_y + m)}{\pi},\qquad
    \text{logit}_j = s\,\frac{\pi - 2\theta_j}{\pi}

so the logit falls from ``s`` at θ = 0 to ``-s`` at θ = π, and the target stays monotone for every
θ (no ``θ + m > π`` policy is needed).
"""

from __future__ import annotations

import math

from torch import Tensor

from .._validation import check_real
from ._alias import alias
from .base import Context, Margin
from .rules import linear_angle

__all__ = ["LiArcFaceMargin", "linear_angle"]


class LiArcFaceMargin(Margin):
    r"""Li-ArcFace, the loss of AirFace (Li et al., 2019).

    .. math::
        \text{logit}_y = s\,\frac{\pi - 2(\theta_y + m)}{\pi},\qquad
        \text{logit}_j = s\,\frac{\pi - 2\theta_j}{\pi}

    (:func:`linear_angle`). The non-target rule is elementwise without any per-row context; it
    is the executors' compiled rule ``"linear_angle"`` (its derivative written out), so the chunked
    executor runs it inside its custom operators (no graph break under ``torch.compile``) and in
    its Triton kernels (with a polynomial ``arccos``: docs/fused.md).

    Args:
        margin: ``m`` in radians, ``0 <= m < π``. Default: 0.45 (paper).
        scale: ``s > 0``. Default: 64.0 (paper).
        gradient: ``"exact"`` (default) or ``"straight_through"`` (target only).
        interclass_filtering_threshold: see :class:`~marginface.margins.base.Margin`.
    """

    angular_margin = alias(
        "margin", "``m``, the additive angular margin, in radians (the constructor's ``margin``)."
    )

    def __init__(
        self,
        margin: float = 0.45,
        scale: float = 64.0,
        *,
        gradient: str = "exact",
        interclass_filtering_threshold: float = 0.0,
    ) -> None:
        super().__init__(
            gradient=gradient, interclass_filtering_threshold=interclass_filtering_threshold
        )
        self.margin = check_real("margin", margin, nonnegative=True, below=math.pi)
        self.scale = check_real("scale", scale, positive=True)

    def scale_for(self, norms: Tensor | None) -> float:
        return self.scale

    def target_cosine(self, cos_target: Tensor, norms: Tensor | None, context: Context) -> Tensor:
        return linear_angle(cos_target, self.margin)

    def nontarget_cosine(self, cosine: Tensor, context: Context) -> Tensor:
        return linear_angle(cosine)

    def nontarget_kernel(self) -> str:
        """``"linear_angle"``: the compiled rule (:data:`.base.NONTARGET_KERNELS`)."""
        return "linear_angle"

    def extra_repr(self) -> str:
        return f"margin={self.margin}, scale={self.scale}" + self._filtering_repr()
