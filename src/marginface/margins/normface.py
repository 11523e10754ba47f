"""NormFace: plain softmax on normalized features and weights, ``logit_j = s·cos θ_j``."""

from __future__ import annotations

from torch import Tensor

from .._validation import check_real
from .base import Context, Margin

__all__ = ["NormFaceMargin"]


class NormFaceMargin(Margin):
    r"""NormFace (Wang et al., 2017): no margin, a fixed scale.

    .. math:: \text{logit}_j = s \cos\theta_j

    This is the plain softmax on L2-normalized embeddings and class centers.

    Args:
        scale: ``s > 0``, the radius of the hypersphere the logits live on. Default: 30.0
            (the scale low-dimensional embeddings train well at, as the training pipeline's
            ``marginface.train.config.PIPELINE_SCALE``).
        gradient: see :class:`~marginface.margins.base.Margin` (no effect: there is no margin).
        interclass_filtering_threshold: ``τ`` in [0, 1]: non-target cosines above it are set to
            0 (insightface's label-noise filter; see :class:`~marginface.margins.base.Margin`).
            Default: 0 (off).
    """

    def __init__(
        self,
        scale: float = 30.0,
        *,
        gradient: str = "exact",
        interclass_filtering_threshold: float = 0.0,
    ) -> None:
        super().__init__(
            gradient=gradient, interclass_filtering_threshold=interclass_filtering_threshold
        )
        self.scale = check_real("scale", scale, positive=True)

    def scale_for(self, norms: Tensor | None) -> float:
        return self.scale

    def target_cosine(self, cos_target: Tensor, norms: Tensor | None, context: Context) -> Tensor:
        return cos_target

    def extra_repr(self) -> str:
        return f"scale={self.scale}" + self._filtering_repr()
