r"""SphereFace2 (Wen et al., ICLR 2022): binary classification is all you need.

Every class is a binary classifier (:mod:`~marginface.margins.binary`): with the similarity
adjustment ``g(c) = 2((c + 1)/2)^t - 1`` and a learned bias ``b``,

.. math::
    L_i = \frac{w}{r}\Big[\lambda\,\mathrm{softplus}\big(-(r\,f(\cos\theta_{iy_i}) + b)\big)
          + (1-\lambda)\sum_{j\ne y_i}\mathrm{softplus}\big(r\,h(\cos\theta_{ij}) + b\big)\Big]

with the margin variants of OpenSphere (``ydwen/opensphere`` ``model/head/sphereface2*.py``):

* ``"C"`` (additive cosine): ``f(c) = g(c) - m``, ``h(c) = g(c) + m``;
* ``"A"`` (additive angular): ``f(c) = g(cos(min(θ + m, π)))``, ``h = g``;
* ``"M"`` (multiplicative angular): ``f(c) = g(cos(min(m·θ, π)))``, ``h = g``.

``w/r`` is the authors' loss weight (their ``lw·C/r`` on the mean over ``N×C`` entries, i.e.
``lw/r`` on the per-sample sum) and the bias starts where the authors start it
(:func:`sphereface2_initial_bias`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .._validation import check_choice, check_int, check_real
from ._alias import alias
from ._angles import arccos, cos_add
from .binary import BinaryMargin

__all__ = [
    "SPHEREFACE2_VARIANTS",
    "SphereFace2Margin",
    "similarity_adjustment",
    "sphereface2_initial_bias",
]

SPHEREFACE2_VARIANTS = ("C", "A", "M")
"""SphereFace2's margin variants: additive cosine (the authors' default), additive angular,
multiplicative angular."""


def similarity_adjustment(cosine: Tensor, power: float) -> Tensor:
    """SphereFace2's ``g(c) = 2((c + 1)/2)^t - 1``: maps [-1, 1] onto itself, ``g(0) = 2^{1-t}
    - 1``; ``t = 1`` is the identity. ``Tensor[...] -> Tensor[...]``. ``(c + 1)/2`` is floored
    at 0 (a cosine rounded below -1 by a few ulps would otherwise give NaN for a fractional
    ``t``)."""
    return 2.0 * ((cosine + 1.0) * 0.5).clamp_min(0.0).pow(power) - 1.0


def _similarity_adjustment_slope(cosine: Tensor, power: float) -> Tensor:
    """``g'(c) = t((c + 1)/2)^{t-1}``."""
    return power * ((cosine + 1.0) * 0.5).clamp_min(0.0).pow(power - 1.0)


def sphereface2_initial_bias(
    num_classes: int, balance: float, target_logit: float, nontarget_logit: float
) -> float:
    r"""The authors' initial bias (OpenSphere ``sphereface2*.py``): with
    ``z = λ/((1 - λ)(C - 1))`` and the bias-free logits ``a_y``, ``a_i`` of a target and a
    non-target at ``cos θ = 0``,

    .. math:: b_0 = \log 2z - a_i - \log\Big(1 - z + \sqrt{(1 - z)^2 + 4z\,e^{a_y - a_i}}\Big)

    For ``z > 1`` (``C <= 3`` at ``λ = 0.7``) and a large margin, ``1 - z + √·`` cancels to 0 in
    floating point; it is then computed as ``4z·e^{a_y - a_i} / (√· + z - 1)`` (the same value,
    rationalized), in logarithms.

    Args:
        num_classes: ``C >= 2``.
        balance: ``λ`` in (0, 1).
        target_logit, nontarget_logit: ``a_y = r·f(0)``, ``a_i = r·h(0)``.
    """
    z = balance / ((1.0 - balance) * (num_classes - 1.0))
    gap = target_logit - nontarget_logit
    root = math.sqrt((1.0 - z) ** 2 + 4.0 * z * math.exp(gap))
    if z <= 1.0:  # 1 - z >= 0: no cancellation
        return math.log(2.0 * z) - nontarget_logit - math.log(1.0 - z + root)
    log_term = math.log(4.0 * z) + gap - math.log(root + z - 1.0)
    return math.log(2.0 * z) - nontarget_logit - log_term


class SphereFace2Margin(BinaryMargin):
    r"""SphereFace2 (Wen et al., ICLR 2022), one-vs-all with the variants C, A and M.

    .. math::
        z_y = r\,f(\cos\theta_y) + b, \qquad z_j = r\,h(\cos\theta_j) + b, \qquad
        L = \tfrac{w}{r}\big[\lambda\,\mathrm{softplus}(-z_y)
            + (1 - \lambda)\textstyle\sum_{j\ne y}\mathrm{softplus}(z_j)\big]

    (``f``, ``h`` per variant: :mod:`marginface.margins.sphereface2`). Defaults are the
    authors' code's (OpenSphere ``sphereface2.py``; its paper-section configs use the same
    ``λ``, ``r``, ``t``).

    Args:
        margin: ``m``. ``"C"``: cosine units, ``>= 0``, default 0.4; ``"A"``: radians in
            ``[0, π)`` (the authors' configuration: 0.5); ``"M"``: a factor ``>= 1`` on θ
            (configuration: 1.7). Default: 0.4 (variant C).
        scale: ``r > 0``. Default: 40.0.
        variant: ``"C"`` (default), ``"A"`` or ``"M"``.
        balance: ``λ`` in (0, 1), the positive/negative balance (paper Eq. 5). Default: 0.7.
        power: ``t >= 1``, the similarity adjustment's exponent. Default: 3.0.
        loss_weight: ``w > 0`` (the authors' ``lw``). Default: 50.0.
        gradient: ``"exact"`` (default): the true derivative of ``f`` and ``h``.
            ``"straight_through"``: ``∂z/∂cos θ = r`` for every class, as the authors'
            ``A``/``M`` heads (whose margin is computed under ``no_grad``) and their ``C`` head
            at OpenSphere ``9d53d28``; at ``26494db`` and ``cdb62a1`` it differentiates ``G``
            (``"exact"``).
        interclass_filtering_threshold: ``τ`` in [0, 1] (0: off; see
            :class:`~marginface.margins.binary.BinaryMargin`). Default: 0.
        num_classes: ``C``, for the initial bias (filled from the head).
        device: where the bias is created (filled from the head).

    Attributes:
        bias: ``Parameter[]``, ``b``, initialized by :func:`sphereface2_initial_bias`.
    """

    bias_sign = 1.0

    variant_margin = alias(
        "margin",
        "``m`` of the variant: cosine units (C), radians (A) or a factor on θ (M) (the "
        "constructor's ``margin``).",
    )

    def __init__(
        self,
        margin: float = 0.4,
        scale: float = 40.0,
        *,
        variant: str = "C",
        balance: float = 0.7,
        power: float = 3.0,
        loss_weight: float = 50.0,
        gradient: str = "exact",
        interclass_filtering_threshold: float = 0.0,
        num_classes: int = 2,
        device: torch.device | str | None = None,
    ) -> None:
        self.variant = check_choice("variant", variant, SPHEREFACE2_VARIANTS)
        if variant == "A":
            margin = check_real("margin", margin, nonnegative=True, below=math.pi)
        elif variant == "M":
            margin = check_real("margin", margin)
            if margin < 1.0:
                raise ValueError(f"margin must be >= 1 for variant 'M' (m·θ), got {margin!r}")
        else:
            margin = check_real("margin", margin, nonnegative=True)
        scale = check_real("scale", scale, positive=True)
        balance = check_real("balance", balance, positive=True, below=1.0)
        power = check_real("power", power)
        if power < 1.0:
            raise ValueError(f"power must be >= 1, got {power!r}")
        loss_weight = check_real("loss_weight", loss_weight, positive=True)
        num_classes = check_int("num_classes", num_classes, minimum=2)
        self.margin, self.power = margin, power
        self.balance, self.loss_weight = balance, loss_weight
        zero = torch.zeros((), dtype=torch.float64)
        bias = sphereface2_initial_bias(
            num_classes,
            balance,
            scale * float(self._target(zero)),
            scale * float(self._nontarget(zero)),
        )
        super().__init__(
            scale=scale,
            positive_weight=loss_weight * balance / scale,
            negative_weight=loss_weight * (1.0 - balance) / scale,
            bias=bias,
            gradient=gradient,
            interclass_filtering_threshold=interclass_filtering_threshold,
            device=device,
        )

    def _target(self, cosine: Tensor) -> Tensor:
        if self.variant == "C":
            return similarity_adjustment(cosine, self.power) - self.margin
        if self.variant == "A":  # cos(θ + m), held at cos π = -1 once θ + m >= π
            beyond = cosine <= math.cos(math.pi - self.margin)
            shifted = torch.where(beyond, -1.0, cos_add(cosine, self.margin))
        else:  # cos(m·θ), held at -1 once m·θ >= π
            theta = arccos(cosine)
            angle = theta * self.margin
            shifted = torch.where(angle >= math.pi, -1.0, torch.cos(angle))
        return similarity_adjustment(shifted, self.power)

    def _nontarget(self, cosine: Tensor) -> Tensor:
        adjusted = similarity_adjustment(cosine, self.power)
        return adjusted + self.margin if self.variant == "C" else adjusted

    def target_similarity(self, cos_target: Tensor) -> Tensor:
        return self._target(cos_target)

    def nontarget_similarity(self, cosine: Tensor) -> Tensor:
        return self._nontarget(cosine)

    def nontarget_similarity_slope(self, cosine: Tensor) -> Tensor:
        return _similarity_adjustment_slope(cosine, self.power)

    def binary_kernel_parameters(self) -> dict[str, float] | None:
        """``g(c) = G(c) + m`` (C) or ``G(c)`` (A, M): ``{"power": t, "offset": m or 0}``."""
        if type(self).nontarget_similarity is not SphereFace2Margin.nontarget_similarity:
            return None
        return {"power": self.power, "offset": self.margin if self.variant == "C" else 0.0}

    def extra_repr(self) -> str:
        return (
            f"variant={self.variant!r}, margin={self.margin}, {super().extra_repr()}, "
            f"balance={self.balance}, power={self.power}, loss_weight={self.loss_weight}"
        )
