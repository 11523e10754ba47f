r"""MV-Softmax: mis-classified vector guided softmax (Wang et al., AAAI 2020).

A margin-based target (AM-Softmax's ``cos θ_y - m`` or ArcFace's ``cos(θ_y + m)``) plus a
re-weighting of the *mis-classified* non-target classes, those whose cosine beats the target's
margin-adjusted cosine ``f(m, θ_y)``:

.. math::
    L = -\log\frac{e^{s f(m,\theta_y)}}{e^{s f(m,\theta_y)}
        + \sum_{j\ne y} h(t, \theta_j, I_j)\,e^{s\cos\theta_j}},
    \qquad I_j = [\cos\theta_j > f(m, \theta_y)]

with ``h = e^{s(t-1)I_j}`` (*fixed*) or ``h = e^{s t(\cos\theta_j + 1)I_j}`` (*adaptive*, the
rule of the authors' code, FaceX-Zoo ``head/MV_Softmax.py``). Equivalently, a mis-classified
non-target logit is ``s·(cos θ_j + t - 1)`` (fixed) or ``s·((t + 1)cos θ_j + t)`` (adaptive): an
elementwise rule given the per-row threshold ``f(m, θ_y)``, so it runs chunk by chunk
(:func:`mv_negative`).
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
from .cosface import additive_cosine_margin
from .rules import mv_negative

__all__ = [
    "MV_CONDITIONS",
    "MV_MODES",
    "MVAMSoftmaxMargin",
    "MVArcSoftmaxMargin",
    "MVSoftmaxMargin",
    "am_target",
    "mv_negative",
    "mv_weight",
]

MV_MODES = ("adaptive", "fixed")
"""MV-Softmax's re-weighting ``h``: ``"adaptive"`` (``e^{s t (cos θ_j + 1)}``) or ``"fixed"``
(``e^{s(t - 1)}``)."""

MV_CONDITIONS = (True, False, "easy")
"""Where MV-AM-Softmax subtracts its margin ``m`` from ``cos θ_y``: ``True`` where
``cos θ_y > m`` (FaceX-Zoo's ``head/MV_Softmax.py``), ``False`` everywhere (the paper),
``"easy"`` where ``cos θ_y > 0`` (the authors' own code, xiaoboCASIA/SV-X-Softmax
``fc_layers.py`` with its default ``easy_margin=True``: AM-Softmax's easy margin)."""

DEFAULT_T = {"adaptive": 0.12, "fixed": 1.2}
"""The default ``t`` of each mode: adaptive 0.12, the authors' code (FaceX-Zoo's
``mv_weight = 1.12``); fixed 1.2 (the authors' code has no fixed rule)."""


def mv_weight(mode: str, t: float) -> tuple[float, float]:
    """``(a, b)`` such that a mis-classified non-target cosine ``c`` becomes ``a·c + b``.

    ``"fixed"``: ``(1, t - 1)``; ``"adaptive"``: ``(t + 1, t)``. FaceX-Zoo's ``mv_weight = w``
    (``w·c + w - 1``) is the adaptive rule with ``t = w - 1``.
    """
    mode = check_choice("mode", mode, MV_MODES)
    return (1.0, t - 1.0) if mode == "fixed" else (t + 1.0, t)


def am_target(cos_target: Tensor, margin: float, conditional: bool | str) -> Tensor:
    r"""MV-AM-Softmax's target cosine ``f(m, θ_y)``, elementwise.

    .. math:: f = \begin{cases}\cos\theta_y - m & \text{where the condition holds}\\
        \cos\theta_y & \text{elsewhere}\end{cases}

    with the condition of ``conditional`` (:data:`MV_CONDITIONS`): ``cos θ_y > m`` (``True``),
    always (``False``), ``cos θ_y > 0`` (``"easy"``).

    Args:
        cos_target: ``Tensor[N]`` of ``cos θ_y``.
        margin: ``m >= 0``, cosine units.
        conditional: one of :data:`MV_CONDITIONS`.

    Returns:
        ``Tensor[N]``; derivative 1 with respect to ``cos θ_y`` (the condition carries none).
    """
    if conditional == "easy":
        return torch.where(cos_target > 0, cos_target - margin, cos_target)
    return additive_cosine_margin(cos_target, margin, conditional=bool(conditional))


def _check_conditional(conditional: object) -> bool | str:
    """``conditional`` if it is one of :data:`MV_CONDITIONS`; a ``TypeError`` or ``ValueError``
    naming it otherwise."""
    if isinstance(conditional, bool):
        return conditional
    if not isinstance(conditional, str):
        raise TypeError(f"conditional must be a bool or 'easy', got {conditional!r}")
    if conditional != "easy":
        raise ValueError(
            f"conditional must be True, False or 'easy' (where cos θ_y > 0), got {conditional!r}"
        )
    return conditional


class MVSoftmaxMargin(Margin):
    r"""Base of the two MV-Softmax margins: the non-target rule and its options.

    Subclasses give the target ``f(m, θ_y)`` (:meth:`target_cosine`) and the paper's threshold
    ``f(m, θ_y)`` without any fallback (:meth:`hard_threshold`).

    Args:
        margin: ``m`` (cosine units for MV-AM, radians for MV-Arc).
        scale: ``s > 0``. Default: 32.0 (the authors' code).
        mode: ``"adaptive"`` (default) or ``"fixed"`` (:data:`MV_MODES`).
        t: the re-weighting parameter: ``t >= 0`` (adaptive), ``t >= 1`` (fixed). Default: None,
            :data:`DEFAULT_T` of ``mode`` (0.12 adaptive, the authors' code; 1.2 fixed).
        gradient: ``"exact"`` (default) or ``"straight_through"`` (target only). The
            mis-classified mask carries no gradient, as in the authors' code.
        interclass_filtering_threshold: see :class:`~marginface.margins.base.Margin`.
    """

    def __init__(
        self,
        margin: float,
        scale: float = 32.0,
        *,
        mode: str = "adaptive",
        t: float | None = None,
        gradient: str = "exact",
        interclass_filtering_threshold: float = 0.0,
    ) -> None:
        super().__init__(
            gradient=gradient, interclass_filtering_threshold=interclass_filtering_threshold
        )
        self.scale = check_real("scale", scale, positive=True)
        self.mode = check_choice("mode", mode, MV_MODES)
        if t is None:
            t = DEFAULT_T[self.mode]
        self.t = check_real("t", t, nonnegative=True)
        if self.mode == "fixed" and self.t < 1.0:
            raise ValueError(f"t must be >= 1 with mode='fixed' (default 1.2), got {t!r}")
        self.slope, self.shift = mv_weight(self.mode, self.t)

    def scale_for(self, norms: Tensor | None) -> float:
        return self.scale

    def hard_threshold(self, cos_target: Tensor) -> Tensor:
        """The paper's ``f(m, θ_y)``: ``Tensor[N] -> Tensor[N]`` (no fallback)."""
        raise NotImplementedError

    def prepare(
        self,
        cos_target: Tensor,
        labels: Tensor,
        norms: Tensor | None,
        cosine: Tensor | None = None,
    ) -> Context:
        with torch.no_grad():
            threshold = self.hard_threshold(cos_target)  # (N,)
            # rows without a target here: nothing is mis-classified (cosines are <= 1 < 2)
            threshold = torch.where(labels >= 0, threshold, torch.full_like(threshold, 2.0))
        return {"scale": self.scale, "threshold": threshold.unsqueeze(1)}

    def nontarget_cosine(self, cosine: Tensor, context: Context) -> Tensor:
        threshold = context["threshold"]
        assert isinstance(threshold, Tensor)
        return mv_negative(cosine, threshold.to(cosine.dtype), self.slope, self.shift)

    def nontarget_is_identity(self) -> bool:
        """True when the re-weighting is off (``a = 1, b = 0``: fixed with ``t = 1``)."""
        return self.slope == 1.0 and self.shift == 0.0

    def nontarget_kernel(self) -> str:
        """``"mv"`` (``"identity"`` with the re-weighting off): the compiled rule."""
        return "identity" if self.nontarget_is_identity() else "mv"

    def nontarget_kernel_parameters(self, context: Context) -> dict[str, Tensor]:
        threshold = context["threshold"]
        assert isinstance(threshold, Tensor)
        t = torch.tensor([self.slope, self.shift], dtype=torch.float64, device=threshold.device)
        return {"threshold": threshold, "t": t}

    def _mv_repr(self) -> str:
        return f"scale={self.scale}, mode={self.mode!r}, t={self.t}" + self._filtering_repr()


class MVAMSoftmaxMargin(MVSoftmaxMargin):
    r"""MV-AM-Softmax (Wang et al., AAAI 2020): AM-Softmax's target, MV-Softmax's non-targets.

    .. math::
        \text{logit}_y = s(\cos\theta_y - m),\qquad
        \text{logit}_j = s\,g(\cos\theta_j),\quad
        \text{mis-classified iff } \cos\theta_j > \cos\theta_y - m

    with ``g`` of :func:`mv_negative` (``a·c + b`` on mis-classified classes: ``(1, t - 1)``
    fixed, ``(t + 1, t)`` adaptive).

    Args:
        margin: ``m >= 0`` in cosine units. Default: 0.35 (the authors' code).
        scale: ``s > 0``. Default: 32.0 (the authors' code).
        mode: ``"adaptive"`` (default; FaceX-Zoo's only rule) or ``"fixed"``.
        t: ``t >= 0`` (adaptive), ``t >= 1`` (fixed). Default: None: 0.12 adaptive (FaceX-Zoo's
            ``mv_weight=1.12``, i.e. ``w = t + 1``), 1.2 fixed (:data:`DEFAULT_T`).
        conditional: where ``m`` is subtracted (:data:`MV_CONDITIONS`, :func:`am_target`):
            ``True`` only where ``cos θ_y > m``, as FaceX-Zoo's ``head/MV_Softmax.py``;
            ``False`` everywhere, the paper's formula; ``"easy"`` only where ``cos θ_y > 0``,
            the authors' own code (SV-X-Softmax ``fc_layers.py``, ``easy_margin=True``).
            Default: True (FaceX-Zoo). The mis-classified test always uses ``cos θ_y - m``.
        gradient, interclass_filtering_threshold: see :class:`MVSoftmaxMargin`.
    """

    cosine_margin = alias(
        "margin", "``m``, the additive cosine margin (the constructor's ``margin``)."
    )

    def __init__(
        self,
        margin: float = 0.35,
        scale: float = 32.0,
        *,
        mode: str = "adaptive",
        t: float | None = None,
        conditional: bool | str = True,
        gradient: str = "exact",
        interclass_filtering_threshold: float = 0.0,
    ) -> None:
        super().__init__(
            margin,
            scale,
            mode=mode,
            t=t,
            gradient=gradient,
            interclass_filtering_threshold=interclass_filtering_threshold,
        )
        self.margin = check_real("margin", margin, nonnegative=True)
        self.conditional = _check_conditional(conditional)

    def hard_threshold(self, cos_target: Tensor) -> Tensor:
        return cos_target - self.margin

    def target_cosine(self, cos_target: Tensor, norms: Tensor | None, context: Context) -> Tensor:
        return am_target(cos_target, self.margin, self.conditional)

    def extra_repr(self) -> str:
        conditional = "" if self.conditional is True else f", conditional={self.conditional!r}"
        return f"margin={self.margin}, {self._mv_repr()}{conditional}"


class MVArcSoftmaxMargin(MVSoftmaxMargin):
    r"""MV-Arc-Softmax (Wang et al., AAAI 2020): ArcFace's target, MV-Softmax's non-targets.

    .. math::
        \text{logit}_y = s\cos(\theta_y + m),\qquad
        \text{logit}_j = s\,g(\cos\theta_j),\quad
        \text{mis-classified iff } \cos\theta_j > \cos(\theta_y + m)

    with ``g`` of :func:`mv_negative`.

    Args:
        margin: ``m`` in radians, ``0 <= m < π``. Default: 0.35 (the authors' code, FaceX-Zoo's
            one default for both targets).
        scale: ``s > 0``. Default: 32.0 (the authors' code).
        mode: ``"adaptive"`` (default) or ``"fixed"``.
        t: as :class:`MVAMSoftmaxMargin`.
        policy: the target where ``θ_y + m`` is large
            (:data:`~marginface.margins.arcface.ANGLE_POLICIES`). Default: ``"easy"``, the
            authors' code: the margin only where ``cos θ_y > 0``. The mis-classified test always
            uses ``cos(θ_y + m)``, as in the authors' code.
        gradient, interclass_filtering_threshold: see :class:`MVSoftmaxMargin`.
    """

    angular_margin = alias(
        "margin", "``m``, the additive angular margin, in radians (the constructor's ``margin``)."
    )

    def __init__(
        self,
        margin: float = 0.35,
        scale: float = 32.0,
        *,
        mode: str = "adaptive",
        t: float | None = None,
        policy: str = "easy",
        gradient: str = "exact",
        interclass_filtering_threshold: float = 0.0,
    ) -> None:
        super().__init__(
            margin,
            scale,
            mode=mode,
            t=t,
            gradient=gradient,
            interclass_filtering_threshold=interclass_filtering_threshold,
        )
        self.margin = check_real("margin", margin, nonnegative=True, below=math.pi)
        self.policy = check_choice("policy", policy, ANGLE_POLICIES)

    def hard_threshold(self, cos_target: Tensor) -> Tensor:
        return cos_add(cos_target, self.margin)

    def target_cosine(self, cos_target: Tensor, norms: Tensor | None, context: Context) -> Tensor:
        return additive_angular_margin(cos_target, self.margin, self.policy)

    def extra_repr(self) -> str:
        return f"margin={self.margin}, {self._mv_repr()}, policy={self.policy!r}"
