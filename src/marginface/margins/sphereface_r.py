r"""SphereFace-R, SphereFace revived (Liu, Wen et al., "SphereFace Revived: Unifying
Hyperspherical Face Recognition", TPAMI 2022; the authors' code: ydwen/opensphere
``model/head/spherefacer.py``).

A multiplicative angular margin ``m`` (any real ``m > 1``, e.g. 1.5), introduced by a
*characteristic gradient detachment*: each logit is ``s·(cos θ + Δ)`` with ``Δ = η(θ) - cos θ``
held constant in the gradient, so the value is ``s·η(θ)`` while the gradient is that of
``s·cos θ`` (our ``gradient="straight_through"``). The three margin types of the authors' code:

* ``"v0"`` (default): the target ``ψ(θ_y) = (-1)^k cos(mθ_y) - 2k``, ``k = ⌊mθ_y/π⌋``
  (SphereFace's monotone extension, for real ``m``); non-targets unchanged.
* ``"v1"``: the target ``cos(min(max(mθ_y, 1e-5), 3.14159))``; non-targets unchanged.
* ``"v2"``: the target unchanged; non-targets ``cos(θ_j / m)`` (the margin moved onto the
  negatives).

θ is read from ``cos θ`` clamped to ``±(1 - 1e-5)``, as the authors' code does. Their ``_N`` and
``_S`` heads raise ``m`` in steps over the iterations (``margin_steps``, ``margin_increment``:
:func:`scheduled_margin`). The feature normalization of their three heads: ``"hard"``
(``SphereFaceR_H``: fixed scale ``s``, the one they recommend), ``"none"`` (``SphereFaceR_N``:
the scale is the feature norm ``‖x‖``) and ``"soft"`` (``SphereFaceR_S``: the scale is ``‖x‖``,
plus ``t·|‖x‖ - s|`` per sample).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import torch
from torch import Tensor

from .._validation import check_choice, check_device, check_int, check_real
from ._alias import alias
from .base import Context, Margin
from .rules import ANGLE_CLAMP

__all__ = [
    "FEATURE_NORMS",
    "SPHEREFACE_R_TYPES",
    "SphereFaceRMargin",
    "scheduled_margin",
    "sphereface_r_nontarget",
    "sphereface_r_target",
]

SPHEREFACE_R_TYPES = ("v0", "v1", "v2")
"""The margin types of the authors' ``get_d_theta`` (``magn_type``)."""

FEATURE_NORMS = ("hard", "none", "soft")
"""SphereFace-R's feature normalization: the authors' ``SphereFaceR_H``, ``_N``, ``_S``."""


def _theta(cosine: Tensor) -> Tensor:
    return torch.acos(cosine.clamp(-1.0 + ANGLE_CLAMP, 1.0 - ANGLE_CLAMP))


def sphereface_r_target(cos_target: Tensor, m: float | Tensor, kind: str) -> Tensor:
    r"""SphereFace-R's target value ``η(θ_y)`` of margin type ``kind``.

    .. math::
        \text{v0: } (-1)^k\cos(m\theta) - 2k,\ k = \lfloor m\theta/\pi\rfloor;\qquad
        \text{v1: } \cos(\min(\max(m\theta, 10^{-5}), 3.14159));\qquad
        \text{v2: } \cos\theta

    Args:
        cos_target: ``Tensor[N]`` of ``cos θ_y`` in [-1, 1].
        m: the multiplicative margin ``m >= 1`` (a float, or a 0-dim tensor: a scheduled one).
        kind: one of :data:`SPHEREFACE_R_TYPES`.

    Returns:
        ``Tensor[N]``, differentiable (through the clamp) for ``gradient="exact"``.
    """
    if kind == "v2":
        return torch.cos(_theta(cos_target))
    m_theta = _theta(cos_target) * m  # (N,)
    if kind == "v1":
        return torch.cos(m_theta.clamp(1e-5, 3.14159))
    with torch.no_grad():
        k = torch.floor(m_theta / math.pi)  # (N,) the piece index
        sign = 1.0 - 2.0 * torch.remainder(k, 2)  # (-1)^k
    return sign * torch.cos(m_theta) - 2.0 * k


def sphereface_r_nontarget(cosine: Tensor, m: float | Tensor, *, straight_through: bool) -> Tensor:
    """The ``"v2"`` type's non-target value ``cos(θ_j / m)``, elementwise: ``Tensor[N, c]``;
    with ``straight_through`` its gradient is 1 (the authors' detachment)."""
    value = torch.cos(_theta(cosine) / m)
    if straight_through:
        return cosine + (value - cosine).detach()
    return value


def scheduled_margin(iteration: Tensor, start: float, increment: float, steps: Tensor) -> Tensor:
    r"""SphereFace-R's stepped margin at ``iteration`` (the authors' ``_N``/``_S`` heads).

    .. math::
        m(t) = m_0 + \Delta m\cdot\big|\{\,s \in \text{steps} : s < t\,\}\big|

    ``t`` counts the training forward passes from 1 (the current one included), so a step
    ``s`` raises the margin from forward ``s + 1`` on.

    Args:
        iteration: 0-dim integer tensor ``t``.
        start: ``m_0 >= 1`` (theirs: 1).
        increment: ``Δm >= 0`` (their ``dm``).
        steps: ``int64[S]``, the iterations after which ``m`` grows (their ``steps``).

    Returns:
        0-dim float64 tensor on ``iteration``'s device (no host sync).
    """
    passed = (steps.to(iteration.device) < iteration).sum()  # ()
    return start + increment * passed.to(torch.float64)


class SphereFaceRMargin(Margin):
    r"""SphereFace-R (Liu, Wen et al., TPAMI 2022): SphereFace revived.

    .. math::
        \text{logit}_y = s\,(\cos\theta_y + \Delta_y),\quad
        \text{logit}_j = s\,(\cos\theta_j + \Delta_j),\qquad
        \Delta = \eta(\theta) - \cos\theta \text{ (no gradient)}

    with ``η`` of :func:`sphereface_r_target` at the target and, for ``"v2"``,
    :func:`sphereface_r_nontarget` elsewhere (the identity for ``"v0"``, ``"v1"``), and ``s`` the
    fixed scale (``feature_norm="hard"``) or the feature norm ``‖x‖`` (``"none"``, ``"soft"``).

    Where the paper and the authors' code differ we take the code: their heads' defaults
    (``m = 1.5``, ``s = 30``, ``t = 0.01``, margin type ``"v0"``) and θ from ``cos θ`` clamped
    to ``±(1 - 1e-5)``. Deliberate differences (docs/parity.md): their losses are multiplied by
    a constant loss weight (``lw/s``, ``50/30``, for ``_H`` and ``_S``; ``lw`` for ``_N``), which
    scales the gradients like a learning rate: ours return the cross-entropy itself; their
    ``_N``/``_S`` heads compute ``m = 1 + dm·#{steps passed}`` whatever their other options (so
    ``m = 1`` when ``steps`` is empty, their default): ``margin=1.0, margin_increment=dm,
    margin_steps=steps`` reproduces them (:func:`scheduled_margin`); their non-target logits of
    ``"v0"`` and ``"v1"`` are the cosine clamped to ``±(1 - 1e-5)`` in value, ours the cosine.

    Args:
        margin: ``m >= 1``, real. Default: 1.5 (the authors' code).
        scale: ``s > 0``: the logit scale (``"hard"``) or the norm the soft penalty pulls the
            features to (``"soft"``). Default: 30.0 (the authors' code).
        kind: the margin type, one of :data:`SPHEREFACE_R_TYPES`. Default: ``"v0"``.
        feature_norm: ``"hard"`` (default, ``SphereFaceR_H``), ``"none"`` (``SphereFaceR_N``)
            or ``"soft"`` (``SphereFaceR_S``) (:data:`FEATURE_NORMS`).
        soft_weight: ``t >= 0``, the weight of ``t·|‖x‖ - s|`` with ``"soft"``. Default: 0.01.
        margin_steps: the iterations (training forward passes, counted from 1) after which
            ``m`` grows by ``margin_increment``: increasing integers ``>= 0``. Default: ``()``
            (a fixed ``m``). With steps, the margin keeps an ``iteration`` buffer (in
            ``state_dict``, so a resumed run continues the schedule) advanced once per
            training-mode forward.
        margin_increment: ``Δm >= 0``, added to ``margin`` at each step passed. Default: 0.0.
        gradient: ``"straight_through"`` (default: the authors' detachment, which is the
            method, for the target and, with ``"v2"``, the non-targets) or ``"exact"`` (the
            derivative of ``η`` itself).
        interclass_filtering_threshold: see :class:`~marginface.margins.base.Margin`.
    """

    angle_multiplier = alias("margin", "``m``, the real number the target angle is multiplied by.")

    def __init__(
        self,
        margin: float = 1.5,
        scale: float = 30.0,
        *,
        kind: str = "v0",
        feature_norm: str = "hard",
        soft_weight: float = 0.01,
        margin_steps: Sequence[int] = (),
        margin_increment: float = 0.0,
        gradient: str = "straight_through",
        interclass_filtering_threshold: float = 0.0,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__(
            gradient=gradient, interclass_filtering_threshold=interclass_filtering_threshold
        )
        self.margin = check_real("margin", margin)
        if self.margin < 1.0:
            raise ValueError(f"margin must be >= 1 (a multiplier of the angle), got {margin!r}")
        self.scale = check_real("scale", scale, positive=True)
        self.kind = check_choice("kind", kind, SPHEREFACE_R_TYPES)
        self.feature_norm = check_choice("feature_norm", feature_norm, FEATURE_NORMS)
        self.soft_weight = check_real("soft_weight", soft_weight, nonnegative=True)
        self.requires_norms = self.feature_norm != "hard"
        self.margin_steps = _check_steps(margin_steps)
        self.margin_increment = check_real("margin_increment", margin_increment, nonnegative=True)
        device = check_device("device", device)
        self.stateful = bool(self.margin_steps)
        if self.margin_steps:  # only then: a fixed margin's state_dict stays empty
            self.register_buffer("iteration", torch.zeros((), dtype=torch.long, device=device))
            steps = torch.tensor(self.margin_steps, dtype=torch.long, device=device)
            self.register_buffer("step_iterations", steps, persistent=False)

    @property
    def current_margin(self) -> float:
        """``m`` at the current iteration (``margin`` without steps)."""
        if not self.margin_steps:
            return self.margin
        return float(self._margin_at(self.iteration))

    def _margin_at(self, iteration: Tensor) -> Tensor:
        return scheduled_margin(iteration, self.margin, self.margin_increment, self.step_iterations)

    def prepare(
        self,
        cos_target: Tensor,
        labels: Tensor,
        norms: Tensor | None,
        cosine: Tensor | None = None,
    ) -> Context:
        context: Context = {"scale": self.scale_for(norms)}
        if self.margin_steps:
            iteration = self.iteration
            if self.training:
                iteration = self.iteration + 1
                self.iteration.copy_(iteration)
            context["margin"] = self._margin_at(iteration)
        return context

    def _m(self, context: Context, dtype: torch.dtype) -> Tensor | float:
        """``m`` of this step: the scheduled 0-dim tensor, or ``margin``."""
        value = context.get("margin", self.margin)
        return value.to(dtype) if isinstance(value, Tensor) else value

    def scale_for(self, norms: Tensor | None) -> Tensor | float:
        if self.feature_norm == "hard":
            return self.scale
        if norms is None:
            raise ValueError(
                f"norms is required by SphereFace-R with feature_norm={self.feature_norm!r} "
                "(the scale is the feature norm)"
            )
        return norms.unsqueeze(1)  # (N, 1)

    def target_cosine(self, cos_target: Tensor, norms: Tensor | None, context: Context) -> Tensor:
        return sphereface_r_target(cos_target, self._m(context, cos_target.dtype), self.kind)

    def nontarget_cosine(self, cosine: Tensor, context: Context) -> Tensor:
        if self.kind != "v2":
            return cosine
        straight = self.gradient == "straight_through"
        m = self._m(context, cosine.dtype)
        return sphereface_r_nontarget(cosine, m, straight_through=straight)

    def nontarget_is_identity(self) -> bool:
        """True for the ``"v0"`` and ``"v1"`` types (or a fixed ``m = 1``)."""
        fixed = not self.margin_steps or self.margin_increment == 0.0
        return self.kind != "v2" or (self.margin == 1.0 and fixed)

    def nontarget_kernel(self) -> str:
        """``"divided_angle"`` for the ``"v2"`` type (``"identity"`` otherwise): the compiled
        rule (:data:`~marginface.margins.base.NONTARGET_KERNELS`)."""
        return "identity" if self.nontarget_is_identity() else "divided_angle"

    def nontarget_kernel_parameters(self, context: Context) -> dict[str, Tensor]:
        """``t = [m, 1]`` with the straight-through gradient, ``[m, 0]`` with the exact one;
        ``m`` this step's (:meth:`prepare`'s scheduled margin with ``margin_steps``)."""
        straight = 1.0 if self.gradient == "straight_through" else 0.0
        m = self._m(context, torch.float64)
        if not isinstance(m, Tensor):
            return {"t": torch.tensor([m, straight], dtype=torch.float64)}
        m = m.detach().reshape(1)  # stays on its device: no host read
        return {"t": torch.cat([m, torch.full_like(m, straight)])}

    def regularizer(self, norms: Tensor | None) -> Tensor | None:
        """``t·|‖x‖ - s|`` per sample with ``feature_norm="soft"``, else None.

        ``norms``: ``Tensor[N]`` (the head's row norms,
        :func:`~marginface.executors.dense.row_norms`); returns ``Tensor[N]``. At the kink
        ``‖x‖ = s`` the subgradient taken is 0 (``torch.abs``'s): ``∂/∂‖x‖ = t·sign(‖x‖ - s)``,
        so a row whose computed norm is ``s`` exactly gets no gradient from the penalty. The
        authors' code takes the same 0 at their own ``torch.norm``, but the two norms round
        differently (ours is pre-scaled by ``max_j |x_j|``): a row that ours rounds to ``s`` and
        theirs to just below gets ``-t`` there, so ``∂x`` differs by ``(t/N)·x̂`` on that row
        only (tests/margins/test_sphereface_r_kink.py; docs/losses.md).
        """
        if self.feature_norm != "soft":
            return None
        if norms is None:
            raise ValueError("norms is required by SphereFace-R with feature_norm='soft'")
        return self.soft_weight * (norms - self.scale).abs()

    def extra_repr(self) -> str:
        return (
            f"margin={self.margin}, scale={self.scale}, kind={self.kind!r}, "
            f"feature_norm={self.feature_norm!r}, soft_weight={self.soft_weight}, "
            f"gradient={self.gradient!r}"
            + (
                f", margin_steps={list(self.margin_steps)}, "
                f"margin_increment={self.margin_increment}"
                if self.margin_steps
                else ""
            )
            + self._filtering_repr()
        )


def _check_steps(steps: object) -> tuple[int, ...]:
    """``margin_steps`` as a tuple of increasing integers ``>= 0``, or raise naming it."""
    if isinstance(steps, (str, bytes)) or not isinstance(steps, Sequence):
        raise TypeError(
            f"margin_steps must be a sequence of integers, got {steps!r} ({type(steps).__name__})"
        )
    values = tuple(check_int("margin_steps", step, minimum=0) for step in steps)
    if any(b <= a for a, b in itertools.pairwise(values)):
        raise ValueError(f"margin_steps must be strictly increasing, got {list(steps)!r}")
    return values
