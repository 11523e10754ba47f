r"""Circle loss, class-level form (Sun et al., CVPR 2020): self-paced weights on every logit.

With one positive (the label's class center) and ``C - 1`` negatives per sample, circle loss is
a softmax cross-entropy on

.. math::
    \text{logit}_y = \gamma\,\alpha_p(\cos\theta_y - \Delta_p),\qquad
    \text{logit}_j = \gamma\,\alpha_n(\cos\theta_j - \Delta_n),

    \alpha_p = [O_p - \cos\theta_y]_+,\quad \alpha_n = [\cos\theta_j - O_n]_+,\quad
    O_p = 1 + m,\ O_n = -m,\ \Delta_p = 1 - m,\ \Delta_n = m

where the weights ``α_p``, ``α_n`` are treated as constants in the gradient (the paper's
"self-paced" weighting; ``detach`` in the authors' and FaceX-Zoo's code).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._validation import check_real
from ._alias import alias
from .base import Context, Margin

__all__ = ["CircleMargin", "circle_negative", "circle_positive"]


def circle_positive(cos_target: Tensor, margin: float) -> Tensor:
    r"""``α_p (cos θ_y - Δ_p)`` with ``α_p = [1 + m - cos θ_y]_+`` (no gradient through ``α_p``).

    Args:
        cos_target: ``Tensor[N]`` of ``cos θ_y``.
        margin: ``m`` (the relaxation; cosine units).
    """
    alpha = torch.clamp_min(1.0 + margin - cos_target.detach(), 0.0)
    return alpha * (cos_target - (1.0 - margin))


def circle_negative(cosine: Tensor, margin: float) -> Tensor:
    r"""``α_n (cos θ_j - Δ_n)`` with ``α_n = [cos θ_j + m]_+`` (no gradient through ``α_n``),
    elementwise on ``Tensor[N, c]``."""
    alpha = torch.clamp_min(cosine.detach() + margin, 0.0)
    return alpha * (cosine - margin)


class CircleMargin(Margin):
    r"""Circle loss, class-level (Sun et al., 2020), as in FaceX-Zoo ``head/CircleLoss.py``.

    .. math::
        \text{logit}_y = \gamma\,[1 + m - \cos\theta_y]_+(\cos\theta_y - (1 - m)),\qquad
        \text{logit}_j = \gamma\,[\cos\theta_j + m]_+(\cos\theta_j - m)

    (:func:`circle_positive`, :func:`circle_negative`); the bracketed weights carry no gradient.
    The non-target rule is elementwise without any per-row context: the executors' compiled rule
    ``"circle"`` (its derivative, the detached weight, written out), run inside the chunked
    executor's custom operators (no graph break under ``torch.compile``) and in its Triton
    kernels.

    Args:
        margin: the relaxation ``m`` in cosine units, ``0 <= m <= 1`` (``O_p = 1 + m``,
            ``O_n = -m``, ``Δ_p = 1 - m``, ``Δ_n = m``). Default: 0.25 (paper, face
            recognition; FaceX-Zoo).
        scale: ``γ > 0``. Default: 256.0 (paper, face recognition; FaceX-Zoo).
        gradient: ``"exact"`` (default) or ``"straight_through"`` (target only).
        interclass_filtering_threshold: see :class:`~marginface.margins.base.Margin`.
    """

    relaxation = alias(
        "margin", "``m``, the relaxation, in cosine units (the constructor's ``margin``)."
    )

    def __init__(
        self,
        margin: float = 0.25,
        scale: float = 256.0,
        *,
        gradient: str = "exact",
        interclass_filtering_threshold: float = 0.0,
    ) -> None:
        super().__init__(
            gradient=gradient, interclass_filtering_threshold=interclass_filtering_threshold
        )
        self.margin = check_real("margin", margin, nonnegative=True, at_most=1.0)
        self.scale = check_real("scale", scale, positive=True)

    def scale_for(self, norms: Tensor | None) -> float:
        return self.scale

    def target_cosine(self, cos_target: Tensor, norms: Tensor | None, context: Context) -> Tensor:
        return circle_positive(cos_target, self.margin)

    def nontarget_cosine(self, cosine: Tensor, context: Context) -> Tensor:
        return circle_negative(cosine, self.margin)

    def nontarget_kernel(self) -> str:
        """``"circle"``: the compiled rule (:data:`~marginface.margins.base.NONTARGET_KERNELS`)."""
        return "circle"

    def nontarget_kernel_parameters(self, context: Context) -> dict[str, Tensor]:
        return {"t": torch.tensor([self.margin], dtype=torch.float64)}

    def extra_repr(self) -> str:
        return f"margin={self.margin}, scale={self.scale}" + self._filtering_repr()
