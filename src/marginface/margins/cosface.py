"""CosFace / AM-Softmax: additive cosine margin, ``s·(cos θ_y - m)``."""

from __future__ import annotations

import torch
from torch import Tensor

from .._validation import check_real
from ._alias import alias
from .base import Context, Margin

__all__ = ["CosFaceMargin", "additive_cosine_margin"]


def additive_cosine_margin(
    cos_target: Tensor, margin: float | Tensor, *, conditional: bool = False
) -> Tensor:
    r"""The CosFace / AM-Softmax target: ``cos θ_y - m``.

    Args:
        cos_target: ``Tensor[N]`` of ``cos θ_y``.
        margin: ``m``, in cosine units (a float or ``Tensor[N]``).
        conditional: subtract ``m`` only where ``cos θ_y > m`` (a variant some AM-Softmax
            implementations use); the paper subtracts it everywhere.

    Returns:
        ``Tensor[N]``; derivative 1 with respect to ``cos θ_y``.
    """
    shifted = cos_target - margin
    if conditional:
        return torch.where(cos_target > margin, shifted, cos_target)
    return shifted


class CosFaceMargin(Margin):
    r"""CosFace (Wang et al., 2018) = AM-Softmax (Wang et al., 2018): additive cosine margin.

    .. math::
        \text{logit}_y = s(\cos\theta_y - m), \qquad \text{logit}_j = s\cos\theta_j

    Args:
        margin: ``m >= 0`` in cosine units. Default: 0.35 (both papers).
        scale: ``s > 0``. Default: 64.0 (CosFace paper; AM-Softmax uses 30).
        conditional: subtract ``m`` only where ``cos θ_y > m`` (a variant of some
            implementations; the papers subtract it everywhere). Default: False.
        gradient: ``"exact"`` or ``"straight_through"`` (identical here: the margin is a shift).
        interclass_filtering_threshold: ``τ`` in [0, 1]: non-target cosines above it are set to
            0 (insightface's label-noise filter; see :class:`~marginface.margins.base.Margin`).
            Default: 0 (off).
    """

    cosine_margin = alias(
        "margin",
        "``m``, the additive cosine margin, in cosine units (the constructor's ``margin``).",
    )

    def __init__(
        self,
        margin: float = 0.35,
        scale: float = 64.0,
        *,
        conditional: bool = False,
        gradient: str = "exact",
        interclass_filtering_threshold: float = 0.0,
    ) -> None:
        super().__init__(
            gradient=gradient, interclass_filtering_threshold=interclass_filtering_threshold
        )
        self.margin = check_real("margin", margin, nonnegative=True)
        self.scale = check_real("scale", scale, positive=True)
        self.conditional = bool(conditional)

    def scale_for(self, norms: Tensor | None) -> float:
        return self.scale

    def target_cosine(self, cos_target: Tensor, norms: Tensor | None, context: Context) -> Tensor:
        return additive_cosine_margin(cos_target, self.margin, conditional=self.conditional)

    def extra_repr(self) -> str:
        return (
            f"margin={self.margin}, scale={self.scale}, conditional={self.conditional}"
            + self._filtering_repr()
        )
