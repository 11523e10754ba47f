r"""UniFace (Zhou et al., ICCV 2023): the unified cross-entropy (UCE) loss.

One threshold ``b`` (learned, shared by all classes) separates every positive sample-to-class
similarity from every negative one (:mod:`~marginface.margins.binary`):

.. math::
    L_i = \log\big(1 + e^{-(s(\cos\theta_{iy_i} - m) - b)}\big)
          + \lambda\sum_{j\ne y_i}\log\big(1 + e^{s\cos\theta_{ij} - b}\big)

``m = 0`` is the plain UCE loss, ``m > 0`` UCE with a margin: the additive cosine margin
``cos θ_y - m`` (variant ``"C"``, the authors' released head, ``CVI-SZU/UniFace`` ``head.py``
``Unified_Cross_Entropy_Loss``) or ArcFace's additive angular margin ``cos(θ_y + m)`` (variant
``"A"``, with ArcFace's policies where ``θ_y + m >= π``).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .._validation import check_choice, check_int, check_real
from ._alias import alias
from .arcface import ANGLE_POLICIES, additive_angular_margin
from .binary import BinaryMargin

__all__ = ["UNIFACE_VARIANTS", "UniFaceMargin", "uniface_initial_bias"]

UNIFACE_VARIANTS = ("C", "A")
"""UniFace's target margins: additive cosine (the authors' code) and additive angular."""


def uniface_initial_bias(num_classes: int, sample_rate: float = 1.0) -> float:
    """The authors' initial threshold ``b_0 = log(10·C·r)`` (``head.py``), with ``r`` the
    Partial FC sampling rate (the number of classes a step sums over is ``C·r``)."""
    return math.log(10.0 * num_classes * sample_rate)


class UniFaceMargin(BinaryMargin):
    r"""UniFace's unified cross-entropy (Zhou et al., ICCV 2023), with a target margin.

    .. math::
        z_y = s\,f(\cos\theta_y) - b, \qquad z_j = s\cos\theta_j - b, \qquad
        L = \mathrm{softplus}(-z_y) + \lambda\textstyle\sum_{j\ne y}\mathrm{softplus}(z_j)

    with ``f(c) = c - m`` (variant ``"C"``) or ``f(c) = cos(θ + m)`` (variant ``"A"``,
    :func:`~marginface.margins.arcface.additive_angular_margin` with ``policy``). Defaults are
    the authors' released code's (``head.py``: ``m = 0.4``, ``s = 64``, ``l = 1``,
    ``b_0 = log(10·C·r)``), which has variant C only.

    Args:
        margin: ``m >= 0``: cosine units for ``"C"`` (0: UCE without margin), radians in
            ``[0, π)`` for ``"A"`` (ArcFace's 0.5 in ``"uniface-a"``). Default: 0.4.
        scale: ``s > 0``. Default: 64.0.
        negative_weight: ``λ >= 0``, the weight of each negative term (the code's ``l``).
            Default: 1.0.
        variant: ``"C"`` (default, additive cosine) or ``"A"`` (additive angular).
        policy: variant A's target where ``θ_y + m >= π``, one of
            :data:`~marginface.margins.arcface.ANGLE_POLICIES` (ArcFace's; default
            ``"linear"``: ``cos θ - m·sin m``); ignored by variant C.
        clamp_logits: clamp every logit to ``[-s, s]`` before the softplus (value and
            gradient), as the authors' code does to keep its ``log(1 + exp(·))`` finite.
            Default: False (the paper's loss; marginface's softplus is finite everywhere).
        gradient: ``"exact"`` (default) or ``"straight_through"`` (``∂z_y/∂cos θ_y = s``, the
            margin held constant; identical to exact for variant C, where it is a shift).
        interclass_filtering_threshold: ``τ`` in [0, 1] (0: off; see
            :class:`~marginface.margins.binary.BinaryMargin`). Default: 0.
        num_classes, sample_rate: ``C`` and the Partial FC rate ``r``, for the initial
            threshold :func:`uniface_initial_bias` (filled from the head).
        device: where the bias is created (filled from the head).

    Attributes:
        bias: ``Parameter[]``, the threshold ``b`` in logit units.
    """

    bias_sign = -1.0

    variant_margin = alias(
        "margin",
        "``m`` of the variant: cosine units (C) or radians (A) (the constructor's ``margin``).",
    )

    def __init__(
        self,
        margin: float = 0.4,
        scale: float = 64.0,
        *,
        negative_weight: float = 1.0,
        variant: str = "C",
        policy: str = "linear",
        clamp_logits: bool = False,
        gradient: str = "exact",
        interclass_filtering_threshold: float = 0.0,
        num_classes: int = 2,
        sample_rate: float = 1.0,
        device: torch.device | str | None = None,
    ) -> None:
        self.variant = check_choice("variant", variant, UNIFACE_VARIANTS)
        self.policy = check_choice("policy", policy, ANGLE_POLICIES)
        if variant == "A":
            margin = check_real("margin", margin, nonnegative=True, below=math.pi)
        if not isinstance(clamp_logits, bool):
            raise TypeError(f"clamp_logits must be a bool, got {clamp_logits!r}")
        scale = check_real("scale", scale, positive=True)
        num_classes = check_int("num_classes", num_classes, minimum=2)
        sample_rate = check_real("sample_rate", sample_rate, positive=True, at_most=1.0)
        super().__init__(
            scale=scale,
            positive_weight=1.0,
            negative_weight=negative_weight,
            bias=uniface_initial_bias(num_classes, sample_rate),
            logit_clamp=scale if clamp_logits else None,
            gradient=gradient,
            interclass_filtering_threshold=interclass_filtering_threshold,
            device=device,
        )
        self.margin = check_real("margin", margin, nonnegative=True)
        self.clamp_logits = clamp_logits

    def target_similarity(self, cos_target: Tensor) -> Tensor:
        if self.variant == "A":
            return additive_angular_margin(cos_target, self.margin, self.policy)
        return cos_target - self.margin

    def nontarget_similarity(self, cosine: Tensor) -> Tensor:
        return cosine

    def nontarget_similarity_slope(self, cosine: Tensor) -> Tensor:
        return torch.ones_like(cosine)

    def binary_kernel_parameters(self) -> dict[str, float] | None:
        """``g(c) = c``: ``{"power": 1, "offset": 0}``."""
        if type(self).nontarget_similarity is not UniFaceMargin.nontarget_similarity:
            return None
        return {"power": 1.0, "offset": 0.0}

    def extra_repr(self) -> str:
        variant = f", variant='A', policy={self.policy!r}" if self.variant == "A" else ""
        return (
            f"margin={self.margin}{variant}, {super().extra_repr()}, "
            f"negative_weight={self.negative_weight}"
        )
