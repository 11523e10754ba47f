"""One Keras layer per registered loss, each the twin of the PyTorch margin of the same name.

Every class only writes its hooks (the formulas live in :mod:`marginface.keras.functional`); the
options, defaults, checks and state come from the PyTorch loss named by ``loss_name``
(:class:`~marginface.keras.head.MarginHead`). The formulas, units and paper defaults are
documented on the PyTorch margins (:mod:`marginface.margins`); a "Defaults" line generated from
the PyTorch signatures closes each docstring here.
"""

from __future__ import annotations

import inspect
import math
from typing import Any, TypeVar

import keras
from keras import ops

from .._registry import Registry
from ..margins._alias import alias, aliases_of
from ..registry import get_loss_class
from ._angles import clamp, cos_add
from .binary import BinaryHead, similarity_adjustment, sphereface2_target
from .functional import (
    adacos_dynamic_scale,
    adaface_target,
    additive_angular_margin,
    additive_cosine_margin,
    assign_elastic_plus,
    at_least,
    batch_mean,
    circle_negative,
    circle_positive,
    combined_margin,
    curricular_negative,
    gaussian_negative,
    hyperspherical_energy,
    linear_angle,
    lower_median,
    magface_margin,
    magface_regularizer,
    mv_negative,
    sphereface_psi,
    sphereface_r_nontarget,
    sphereface_r_target,
)
from .head import MarginHead

__all__ = [
    "HEADS",
    "AMSoftmax",
    "AdaCos",
    "AdaFace",
    "AdaMSoftmax",
    "ArcFace",
    "ArcNegFace",
    "Circle",
    "CombinedMargin",
    "CosFace",
    "CurricularFace",
    "ElasticFace",
    "LiArcFace",
    "MVAMSoftmax",
    "MVArcSoftmax",
    "MagFace",
    "NPCFace",
    "NormFace",
    "SphereFace",
    "SphereFace2",
    "SphereFace2A",
    "SphereFace2M",
    "SphereFacePlus",
    "SphereFaceR",
    "SubCenterArcFace",
    "UniFace",
    "UniFaceA",
]

H = TypeVar("H", bound=type)

HEADS: Registry[type[MarginHead]] = Registry("Keras head")
"""Registered loss name -> Keras head class (every name of ``marginface.list_losses()``)."""


def _head(cls: H) -> H:
    """Register ``cls`` under its ``loss_name``, make it Keras-serializable, and give it a
    signature, a closing "Defaults" docstring line and the unit-naming aliases of the margin's
    size (``angular_margin``...; :mod:`marginface.margins._alias`), read from the PyTorch loss's
    declaration."""
    defaults = cls.option_defaults()
    HEADS.add(cls.loss_name, cls)
    margin_class = get_loss_class(cls.loss_name).declaration.margin_class
    for name, target in aliases_of(margin_class).items():
        setattr(cls, name, alias(target, getattr(margin_class, name).__doc__))
    parameters = [inspect.Parameter("num_classes", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    parameters += [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=value)
        for name, value in defaults.items()
    ]
    parameters.append(inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD))
    cls.__signature__ = inspect.Signature(parameters)  # inspect.signature(cls) shows them
    shown = ", ".join(f"``{name}={value!r}``" for name, value in defaults.items())
    cls.__doc__ = (
        f"{inspect.cleandoc(cls.__doc__ or '')}\n\nMirrors the PyTorch loss "
        f"``{cls.loss_name!r}``. Defaults: {shown}.\n"
    )
    return keras.saving.register_keras_serializable(package="marginface")(cls)


class _FixedScale(MarginHead):
    """Heads whose scale is the float option ``scale``."""

    def scale_for(self, norms: Any, dtype: str) -> Any:
        return self.scale


@_head
class NormFace(_FixedScale):
    """NormFace: ``s·cos θ_j`` for every class, no margin (softmax on normalized embeddings and
    centers; Wang et al., 2017)."""

    loss_name = "normface"

    def target_cosine(self, cos_target: Any, norms: Any, context: dict) -> Any:
        return cos_target


@_head
class CosFace(_FixedScale):
    """CosFace / AM-Softmax: ``logit_y = s·(cos θ_y - m)``, ``m`` in cosine units."""

    loss_name = "cosface"

    def target_cosine(self, cos_target: Any, norms: Any, context: dict) -> Any:
        return additive_cosine_margin(cos_target, self.margin, conditional=self.conditional)


@_head
class AMSoftmax(CosFace):
    """AM-Softmax: CosFace with the AM-Softmax paper's ``s = 30``."""

    loss_name = "amsoftmax"


@_head
class ArcFace(_FixedScale):
    """ArcFace: ``logit_y = s·cos(θ_y + m)``, ``m`` in radians, ``policy`` where
    ``θ_y + m > π`` (``"linear"``, ``"easy"``, ``"clip"``, ``"none"``)."""

    loss_name = "arcface"

    def target_cosine(self, cos_target: Any, norms: Any, context: dict) -> Any:
        return additive_angular_margin(cos_target, self.margin, self.policy)


@_head
class SubCenterArcFace(ArcFace):
    """Sub-center ArcFace: ``K = sub_centers`` centers per class (``centers`` is
    ``(C·K, D)``, class-major), the cosine max-pooled over them, then ArcFace's margin."""

    loss_name = "subcenter-arcface"


@_head
class CombinedMargin(_FixedScale):
    """Combined margin: ``logit_y = s·(cos(m1·θ_y + m2) - m3)``."""

    loss_name = "combined"

    def target_cosine(self, cos_target: Any, norms: Any, context: dict) -> Any:
        return combined_margin(cos_target, self.m1, self.m2, self.m3, self.policy)


@_head
class CurricularFace(_FixedScale):
    """CurricularFace: ArcFace's target; hard negatives (``cos θ_j > cos(θ_y + m)``) become
    ``cos θ_j·(t + cos θ_j)``. ``t`` is a non-trainable variable (initially 0) updated before use
    with ``training=True`` only: ``t ← α·t + (1 - α)·mean(cos θ_y)``."""

    loss_name = "curricularface"

    def prepare(
        self, cos_target: Any, is_target: Any, norms: Any, cosine: Any, *, training: bool
    ) -> dict:
        t = self.t
        if training:
            mean_target = batch_mean(ops.stop_gradient(cos_target))
            t = self.update_state(
                "t", self.momentum * ops.cast(t, cosine.dtype) + (1.0 - self.momentum) * mean_target
            )
        threshold = ops.stop_gradient(cos_add(cos_target, self.margin))  # cos(θ_y + m), (N,)
        return {
            "scale": self.scale,
            "threshold": threshold[:, None],
            "t": ops.stop_gradient(ops.cast(t, cosine.dtype)),
        }

    def target_cosine(self, cos_target: Any, norms: Any, context: dict) -> Any:
        return additive_angular_margin(cos_target, self.margin, self.policy)

    def nontarget_cosine(self, cosine: Any, context: dict) -> Any:
        return curricular_negative(cosine, context["threshold"], context["t"])


@_head
class AdaCos(MarginHead):
    """AdaCos: ``s·cos θ_j``, no margin; ``scale`` is a non-trainable variable starting at
    ``√2·log(C - 1)`` and, with ``dynamic=True`` and ``training=True``, set before use to
    ``log B_avg / cos(min(π/4, θ_med))`` (``θ_med`` the lower median of the target angles)."""

    loss_name = "adacos"

    def scale_for(self, norms: Any, dtype: str) -> Any:
        return ops.cast(self.scale, dtype)

    def prepare(
        self, cos_target: Any, is_target: Any, norms: Any, cosine: Any, *, training: bool
    ) -> dict:
        scale = self.scale_for(norms, cosine.dtype)
        if training and self.dynamic:
            logits = scale * ops.stop_gradient(cosine)  # (N, C)
            others = ops.where(is_target, -math.inf, logits)  # drop the targets
            rows = ops.cast(ops.shape(cosine)[0], cosine.dtype)
            log_b_avg = ops.logsumexp(ops.reshape(others, (-1,))) - ops.log(rows)
            theta = ops.arccos(clamp(ops.stop_gradient(cos_target), -1.0, 1.0))  # (N,)
            new_scale = adacos_dynamic_scale(log_b_avg, lower_median(theta))
            scale = ops.cast(self.update_state("scale", new_scale), cosine.dtype)
        return {"scale": ops.stop_gradient(scale)}

    def target_cosine(self, cos_target: Any, norms: Any, context: dict) -> Any:
        return cos_target


@_head
class MagFace(_FixedScale):
    """MagFace: ``logit_y = s·cos(θ_y + m(a))`` with ``m`` linear in ``a = clip(‖x‖, l_a, u_a)``,
    plus ``λ_g·g(a)``, ``g(a) = 1/a + a/u_a²``, added through ``add_loss`` (batch mean)."""

    loss_name = "magface"

    def prepare(
        self, cos_target: Any, is_target: Any, norms: Any, cosine: Any, *, training: bool
    ) -> dict:
        margin = magface_margin(
            norms, self.lower_norm, self.upper_norm, self.lower_margin, self.upper_margin
        )
        return {"scale": self.scale, "margin": margin}

    def target_cosine(self, cos_target: Any, norms: Any, context: dict) -> Any:
        return additive_angular_margin(cos_target, context["margin"], self.policy)

    def regularizer(self, norms: Any) -> Any:
        return self.regularizer_weight * magface_regularizer(
            norms, self.lower_norm, self.upper_norm
        )


@_head
class AdaFace(_FixedScale):
    """AdaFace: quality ``ẑ = clip(h·(‖x‖ - μ)/(σ + ε), -1, 1)`` from the clipped feature norm,
    target ``cos(clip(θ_y - m·ẑ, ε, π - ε)) - (m·ẑ + m)``. ``batch_mean`` (μ, initially 20) and
    ``batch_std`` (σ, initially 100) are non-trainable variables, moving averages of the batch
    mean and unbiased std updated before use with ``training=True`` only (not by a batch of one
    row). ``cosine_clamp`` δ > 0 clips every cosine to ``[-1 + δ, 1 - δ]`` before the margin."""

    loss_name = "adaface"
    eps = 1e-3

    def prepare(
        self, cos_target: Any, is_target: Any, norms: Any, cosine: Any, *, training: bool
    ) -> dict:
        dtype = cosine.dtype
        safe = clamp(ops.stop_gradient(norms), 0.001, 100.0)  # (N,)
        mean = ops.cast(self.batch_mean, dtype)
        std = ops.cast(self.batch_std, dtype)
        rows = safe.shape[0]
        if training and (rows is None or rows > 1):
            count = ops.cast(ops.shape(safe)[0], dtype)
            mean_now = batch_mean(safe)
            std_now = ops.sqrt(ops.sum(ops.square(safe - mean_now)) / (count - 1.0))
            alpha = self.momentum
            mean = self.update_state("batch_mean", mean * (1 - alpha) + alpha * mean_now)
            std = self.update_state("batch_std", std * (1 - alpha) + alpha * std_now)
            mean, std = ops.cast(mean, dtype), ops.cast(std, dtype)
        quality = clamp((safe - mean) / (std + self.eps) * self.h, -1.0, 1.0)
        return {"scale": self.scale, "quality": ops.stop_gradient(quality)}

    def target_cosine(self, cos_target: Any, norms: Any, context: dict) -> Any:
        cos_target = self.clamp_cosine(cos_target)  # (N,)
        return adaface_target(cos_target, context["quality"], self.margin, self.eps)

    def nontarget_cosine(self, cosine: Any, context: dict) -> Any:
        return self.clamp_cosine(cosine)

    def clamp_cosine(self, cosine: Any) -> Any:
        """``clip(cos, -1 + δ, 1 - δ)`` with ``δ = cosine_clamp`` (the authors' ``1e-3``); as is
        for δ = 0, the default."""
        delta = self.cosine_clamp
        return cosine if delta == 0 else clamp(cosine, -1.0 + delta, 1.0 - delta)


@_head
class ElasticFace(_FixedScale):
    """ElasticFace: a per-sample margin ``m_i ~ N(m, σ)`` (``kind="arc"``: ``cos(θ_y + m_i)``;
    ``"cos"``: ``cos θ_y - m_i``), drawn with ``training=True`` from a Keras ``SeedGenerator``
    (``seed``); the mean ``m`` otherwise. ``plus=True``: ElasticFace+'s assignment."""

    loss_name = "elasticface"

    def __init__(self, num_classes: int, **kwargs: Any) -> None:
        super().__init__(num_classes, **kwargs)
        self.seed_generator = keras.random.SeedGenerator(self.options["seed"])

    def sample_margins(self, rows: Any, dtype: str) -> Any:
        """``rows`` draws from ``N(m, σ)``, ``[N]`` (before ElasticFace+'s assignment)."""
        return keras.random.normal(
            (rows,), mean=self.margin, stddev=self.std, dtype=dtype, seed=self.seed_generator
        )

    def prepare(
        self, cos_target: Any, is_target: Any, norms: Any, cosine: Any, *, training: bool
    ) -> dict:
        if not training or self.std == 0.0:
            return {"scale": self.scale, "margin": self.margin}
        drawn = self.sample_margins(ops.shape(cos_target)[0], cosine.dtype)  # (N,)
        if self.plus:
            drawn = assign_elastic_plus(drawn, ops.stop_gradient(cos_target))
        if self.kind == "arc":
            drawn = clamp(drawn, 0.0, math.pi - 1e-6)
        return {"scale": self.scale, "margin": ops.stop_gradient(drawn)}

    def target_cosine(self, cos_target: Any, norms: Any, context: dict) -> Any:
        if self.kind == "arc":
            return additive_angular_margin(cos_target, context["margin"], self.policy)
        return additive_cosine_margin(cos_target, context["margin"])


@_head
class SphereFace(MarginHead):
    """SphereFace / A-Softmax: ``logit_y = s·(λ·cos θ_y + ψ(θ_y))/(1 + λ)``, ``s`` the feature
    norm (``scale=None``, gradient into the norm) or a fixed float; ``λ`` anneals with the
    non-trainable ``iteration`` counter, advanced before use with ``training=True`` only."""

    loss_name = "sphereface"

    def scale_for(self, norms: Any, dtype: str) -> Any:
        if self.scale is not None:
            return self.scale
        return norms[:, None]  # (N, 1)

    def prepare(
        self, cos_target: Any, is_target: Any, norms: Any, cosine: Any, *, training: bool
    ) -> dict:
        iteration = self.iteration
        if training:
            iteration = self.update_state("iteration", iteration + 1)
        step = ops.cast(iteration, cosine.dtype)
        growth = ops.log(1.0 + self.lambda_gamma * step)
        annealed = self.lambda_base * ops.exp(-self.lambda_power * growth)  # base·(1 + γ·i)^-p
        lam = at_least(annealed, self.lambda_min)
        return {"scale": self.scale_for(norms, cosine.dtype), "lambda": lam}

    def target_cosine(self, cos_target: Any, norms: Any, context: dict) -> Any:
        lam = context["lambda"]
        return (lam * cos_target + sphereface_psi(cos_target, self.margin)) / (1.0 + lam)


class _MVSoftmax(_FixedScale):
    """MV-Softmax's non-target rule: ``a·cos θ_j + b`` on the mis-classified classes
    (``cos θ_j > f(m, θ_y)``); ``(a, b)`` are the PyTorch margin's ``slope`` and ``shift``."""

    def hard_threshold(self, cos_target: Any) -> Any:
        raise NotImplementedError

    def prepare(
        self, cos_target: Any, is_target: Any, norms: Any, cosine: Any, *, training: bool
    ) -> dict:
        threshold = ops.stop_gradient(self.hard_threshold(cos_target))  # (N,)
        return {"scale": self.scale, "threshold": threshold[:, None]}

    def nontarget_cosine(self, cosine: Any, context: dict) -> Any:
        return mv_negative(cosine, context["threshold"], self.slope, self.shift)


@_head
class MVAMSoftmax(_MVSoftmax):
    """MV-AM-Softmax: ``logit_y = s·(cos θ_y - m)`` (``conditional``: where ``cos θ_y > m`` if
    True, ``> 0`` if ``"easy"``); non-targets with ``cos θ_j > cos θ_y - m`` re-weighted (``mode``
    ``"adaptive"``: ``(t + 1)cos θ_j + t``; ``"fixed"``: ``cos θ_j + t - 1``)."""

    loss_name = "mv-am-softmax"

    def hard_threshold(self, cos_target: Any) -> Any:
        return cos_target - self.margin

    def target_cosine(self, cos_target: Any, norms: Any, context: dict) -> Any:
        if self.conditional == "easy":  # SV-X-Softmax's easy margin: only where cos θ_y > 0
            return ops.where(cos_target > 0.0, cos_target - self.margin, cos_target)
        return additive_cosine_margin(cos_target, self.margin, conditional=self.conditional)


@_head
class MVArcSoftmax(_MVSoftmax):
    """MV-Arc-Softmax: ``logit_y = s·cos(θ_y + m)`` (``policy`` where ``θ_y + m`` is large);
    non-targets with ``cos θ_j > cos(θ_y + m)`` re-weighted as :class:`MVAMSoftmax`'s."""

    loss_name = "mv-arc-softmax"

    def hard_threshold(self, cos_target: Any) -> Any:
        return cos_add(cos_target, self.margin)

    def target_cosine(self, cos_target: Any, norms: Any, context: dict) -> Any:
        return additive_angular_margin(cos_target, self.margin, self.policy)


@_head
class LiArcFace(_FixedScale):
    """Li-ArcFace / AirFace: ``logit_y = s·(π - 2(θ_y + m))/π``, ``logit_j = s·(π - 2θ_j)/π``."""

    loss_name = "li-arcface"

    def target_cosine(self, cos_target: Any, norms: Any, context: dict) -> Any:
        return linear_angle(cos_target, self.margin)

    def nontarget_cosine(self, cosine: Any, context: dict) -> Any:
        return linear_angle(cosine)


@_head
class Circle(_FixedScale):
    """Circle loss, class-level: ``logit_y = γ·[1 + m - cos θ_y]_+·(cos θ_y - (1 - m))``,
    ``logit_j = γ·[cos θ_j + m]_+·(cos θ_j - m)``; the bracketed weights carry no gradient."""

    loss_name = "circle"

    def target_cosine(self, cos_target: Any, norms: Any, context: dict) -> Any:
        return circle_positive(cos_target, self.margin)

    def nontarget_cosine(self, cosine: Any, context: dict) -> Any:
        return circle_negative(cosine, self.margin)


@_head
class ArcNegFace(_FixedScale):
    """ArcNegFace: ArcFace's target ``f_y = cos(θ_y + m)`` (``policy``); non-targets
    ``t·cos θ_j + t - 1`` with ``t = α·exp(-(cos θ_j - f_y)²/σ)`` (no gradient through ``t``)."""

    loss_name = "arcnegface"

    def prepare(
        self, cos_target: Any, is_target: Any, norms: Any, cosine: Any, *, training: bool
    ) -> dict:
        target = additive_angular_margin(cos_target, self.margin, self.policy)  # (N,)
        return {"scale": self.scale, "target": ops.stop_gradient(target)[:, None]}

    def target_cosine(self, cos_target: Any, norms: Any, context: dict) -> Any:
        return additive_angular_margin(cos_target, self.margin, self.policy)

    def nontarget_cosine(self, cosine: Any, context: dict) -> Any:
        return gaussian_negative(cosine, context["target"], self.alpha, self.sigma)


@_head
class SphereFace2(BinaryHead):
    """SphereFace2 (one-vs-all): ``z_y = r·f(cos θ_y) + b``, ``z_j = r·h(cos θ_j) + b`` with the
    variant's ``f``, ``h`` (C: ``g ∓ m``; A, M: angular margins on the target); returns the
    binary logits, trained with :meth:`~marginface.keras.binary.BinaryHead.loss`."""

    loss_name = "sphereface2"

    def target_similarity(self, cos_target: Any) -> Any:
        return sphereface2_target(cos_target, self.variant, self.margin, self.power)

    def nontarget_similarity(self, cosine: Any) -> Any:
        adjusted = similarity_adjustment(cosine, self.power)
        return adjusted + self.margin if self.variant == "C" else adjusted


@_head
class SphereFace2A(SphereFace2):
    """SphereFace2-A: ``g(cos(θ_y + m))``, ``m = 0.5`` rad."""

    loss_name = "sphereface2-a"


@_head
class SphereFace2M(SphereFace2):
    """SphereFace2-M: ``g(cos(m·θ_y))``, ``m = 1.7``."""

    loss_name = "sphereface2-m"


@_head
class UniFace(BinaryHead):
    """UniFace (unified cross-entropy): ``z_y = s·f(cos θ_y) - b``, ``z_j = s·cos θ_j - b``,
    one learned threshold ``b``, ``f(c) = c - m`` (variant C) or ``cos(θ + m)`` with
    ``policy`` (A); binary logits, trained with
    :meth:`~marginface.keras.binary.BinaryHead.loss`."""

    loss_name = "uniface"
    bias_sign = -1.0

    def target_similarity(self, cos_target: Any) -> Any:
        if self.variant == "A":
            return additive_angular_margin(cos_target, self.margin, self.policy)
        return cos_target - self.margin

    def nontarget_similarity(self, cosine: Any) -> Any:
        return cosine


@_head
class UniFaceA(UniFace):
    """UniFace with ArcFace's additive angular margin: ``f(c) = cos(θ + m)``, ``m = 0.5``."""

    loss_name = "uniface-a"


@_head
class AdaMSoftmax(_FixedScale):
    """AdaM-Softmax / AdaptiveFace: ``logit_y = s·(cos θ_y - m_y)`` with a learnable margin per
    class (:attr:`class_margin`, ``(C,)``, seen clamped to [0, 1]); ``λ(1 - mean(m))`` is added
    through ``add_loss``."""

    loss_name = "adam-softmax"

    def target_cosine(self, cos_target: Any, norms: Any, context: dict) -> Any:
        return cos_target - context["margin"]

    def class_regularizer(self, sums: dict) -> Any:
        return self.lambda_m * (1.0 - sums["margin"] / self.num_classes)


@_head
class NPCFace(_FixedScale):
    """NPCFace: hard negatives ``cos θ_j > cos(θ_y + m)`` become ``t·cos θ_j + a``; the target
    ``cos(θ_y + m')`` (``policy``) with ``m' = m0 + m1·mean(hard cosines)`` (``m0`` without
    any); the hard mask and ``m'`` carry no gradient."""

    loss_name = "npcface"

    def prepare(
        self, cos_target: Any, is_target: Any, norms: Any, cosine: Any, *, training: bool
    ) -> dict:
        threshold = ops.stop_gradient(cos_add(cos_target, self.margin))[:, None]  # (N, 1)
        hard = ops.logical_and(cosine > threshold, ops.logical_not(is_target))  # (N, C)
        hard_sum = ops.sum(ops.where(hard, cosine, 0.0), axis=1)  # (N,)
        hard_count = ops.sum(ops.cast(hard, cosine.dtype), axis=1)  # (N,)
        mean_hard = hard_sum / ops.maximum(hard_count, 1.0)
        target_margin = ops.stop_gradient(self.m0 + self.m1 * mean_hard)  # (N,)
        return {"scale": self.scale, "threshold": threshold, "target_margin": target_margin}

    def target_cosine(self, cos_target: Any, norms: Any, context: dict) -> Any:
        return additive_angular_margin(cos_target, context["target_margin"], self.policy)

    def nontarget_cosine(self, cosine: Any, context: dict) -> Any:
        return mv_negative(cosine, context["threshold"], self.t, self.a)


@_head
class SphereFaceR(MarginHead):
    """SphereFace-R: ``s·(cos θ + Δ)``, ``Δ = η(θ) - cos θ`` detached (``gradient``); ``η`` of
    margin type ``kind`` (``"v0"``/``"v1"``: the target; ``"v2"``: the non-targets
    ``cos(θ_j/m)``); ``s`` fixed (``feature_norm="hard"``) or ``‖x‖`` (``"none"``, ``"soft"``:
    plus ``t·|‖x‖ - s|`` through ``add_loss``)."""

    loss_name = "sphereface-r"

    def scale_for(self, norms: Any, dtype: str) -> Any:
        return self.scale if self.feature_norm == "hard" else norms[:, None]  # (N, 1)

    def target_cosine(self, cos_target: Any, norms: Any, context: dict) -> Any:
        return sphereface_r_target(cos_target, self.margin, self.kind)

    def nontarget_cosine(self, cosine: Any, context: dict) -> Any:
        if self.kind != "v2":
            return cosine
        straight = self.gradient == "straight_through"
        return sphereface_r_nontarget(cosine, self.margin, straight_through=straight)

    def regularizer(self, norms: Any) -> Any:
        if self.feature_norm != "soft":
            return None
        return self.soft_weight * ops.abs(norms - self.scale)


@_head
class SphereFacePlus(SphereFaceR):
    """SphereFace+: SphereFace-R's ``"v0"`` target plus the minimum hyperspherical energy of the
    batch's class centers through ``add_loss`` (the PyTorch loss's default
    ``weight_regularizer``: its ``weight`` λ and ``power``)."""

    loss_name = "sphereface-plus"

    def weight_regularizer(self, labels: Any, dtype: str) -> Any:
        regularizer = get_loss_class(self.loss_name).declaration.head_options["weight_regularizer"]
        k = self.sub_centers
        rows = ops.reshape(labels[:, None] * k + ops.arange(k)[None, :], (-1,))  # (N·K,)
        centers = ops.take(ops.cast(self.centers, dtype), rows, axis=0)  # (N·K, D)
        return hyperspherical_energy(centers, rows, regularizer.weight, regularizer.power)
