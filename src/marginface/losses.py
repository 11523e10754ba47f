"""The named losses: one thin :class:`~marginface.head.MarginSoftmaxLoss` per paper.

Each class only builds its margin; the formula, units and defaults are documented on the margin
(:mod:`marginface.margins`). Common keyword arguments of every loss:

* ``reduction``: ``"mean"`` (default), ``"sum"`` or ``"none"``.
* ``impl``: the executor (see :class:`~marginface.head.MarginSoftmaxLoss`).
* ``device``, ``dtype``: where and how the class centers (and the margin's buffers) are created.

They are passed on to :class:`~marginface.head.MarginSoftmaxLoss`, which rejects unknown ones.

**One source of truth for defaults.** A loss's margin parameters take their defaults from the
margin class's signature (:func:`margin_defaults`), read when this module is imported: change a
default on the margin and the named loss follows. The signature of each loss shows the values
(``help(ArcFaceLoss)``), and a generated "Defaults" line closes each docstring. The only
deliberate difference: :class:`AMSoftmaxLoss`'s ``scale`` (30, the AM-Softmax paper's).
"""

from __future__ import annotations

import inspect
from typing import Any, TypeVar

import torch

from .head import MarginSoftmaxLoss
from .margins import (
    AdaCosMargin,
    AdaFaceMargin,
    ArcFaceMargin,
    CombinedMargin,
    CosFaceMargin,
    CurricularFaceMargin,
    ElasticFaceMargin,
    MagFaceMargin,
    NormFaceMargin,
    SphereFaceMargin,
)
from .registry import register_loss

__all__ = [
    "AM_SOFTMAX_SCALE",
    "AMSoftmaxLoss",
    "AdaCosLoss",
    "AdaFaceLoss",
    "ArcFaceLoss",
    "CombinedMarginLoss",
    "CosFaceLoss",
    "CurricularFaceLoss",
    "ElasticFaceLoss",
    "MagFaceLoss",
    "NormFaceLoss",
    "SphereFaceLoss",
    "SubCenterArcFaceLoss",
    "margin_defaults",
]

Device = torch.device | str | None
L = TypeVar("L", bound=type)

AM_SOFTMAX_SCALE = 30.0
"""AM-Softmax's ``s`` (Wang et al., 2018), where CosFace's paper uses 64."""


def margin_defaults(margin_class: type) -> dict[str, Any]:
    """``{name: default}`` of every constructor parameter of ``margin_class`` that has one.

    >>> margin_defaults(ArcFaceMargin)["margin"]
    0.5
    """
    return {
        name: parameter.default
        for name, parameter in inspect.signature(margin_class).parameters.items()
        if parameter.default is not inspect.Parameter.empty
    }


def _document_defaults(cls: L) -> L:
    """Close ``cls``'s docstring with its defaults, read from its own signature (so from the
    margin's): the docstring cannot drift from the code."""
    shown = ", ".join(
        f"``{name}={parameter.default!r}``"
        for name, parameter in inspect.signature(cls).parameters.items()
        if parameter.default is not inspect.Parameter.empty and name != "device"
    )
    cls.__doc__ = f"{inspect.cleandoc(cls.__doc__ or '')}\n\nDefaults: {shown}.\n"
    return cls


_NORM = margin_defaults(NormFaceMargin)
_SPHERE = margin_defaults(SphereFaceMargin)
_COS = margin_defaults(CosFaceMargin)
_ARC = margin_defaults(ArcFaceMargin)
_COMBINED = margin_defaults(CombinedMargin)
_CURRICULAR = margin_defaults(CurricularFaceMargin)
_ADACOS = margin_defaults(AdaCosMargin)
_MAG = margin_defaults(MagFaceMargin)
_ADAFACE = margin_defaults(AdaFaceMargin)
_ELASTIC = margin_defaults(ElasticFaceMargin)


@_document_defaults
@register_loss("normface", "softmax")
class NormFaceLoss(MarginSoftmaxLoss):
    """NormFace: ``s·cos θ`` on normalized embeddings and centers (:class:`NormFaceMargin`).

    Args:
        scale: ``s``.
        interclass_filtering_threshold: non-target cosines above it are set to 0 (label
            noise; insightface's filter); 0 = off.
    """

    def __init__(
        self,
        num_classes: int,
        embedding_dim: int,
        scale: float = _NORM["scale"],
        *,
        interclass_filtering_threshold: float = _NORM["interclass_filtering_threshold"],
        device: Device = None,
        **options: Any,
    ) -> None:
        margin = NormFaceMargin(
            scale, interclass_filtering_threshold=interclass_filtering_threshold
        )
        super().__init__(
            num_classes,
            embedding_dim,
            margin,
            device=device,
            **options,
        )


@_document_defaults
@register_loss("sphereface", "a-softmax")
class SphereFaceLoss(MarginSoftmaxLoss):
    """SphereFace / A-Softmax: ``ψ(θ) = (-1)^k cos(mθ) - 2k`` with annealing
    (:class:`SphereFaceMargin`).

    Args:
        margin: integer ``m >= 1``.
        scale: None (default) scales by the feature norm (original); a float, the normalized
            variant.
        lambda_base, lambda_gamma, lambda_power, lambda_min: annealing.
        gradient: ``"exact"`` or ``"straight_through"``.
        interclass_filtering_threshold: non-target cosines above it are set to 0 (label
            noise; insightface's filter); 0 = off.
    """

    def __init__(
        self,
        num_classes: int,
        embedding_dim: int,
        margin: int = _SPHERE["margin"],
        scale: float | None = _SPHERE["scale"],
        *,
        lambda_base: float = _SPHERE["lambda_base"],
        lambda_gamma: float = _SPHERE["lambda_gamma"],
        lambda_power: float = _SPHERE["lambda_power"],
        lambda_min: float = _SPHERE["lambda_min"],
        gradient: str = _SPHERE["gradient"],
        interclass_filtering_threshold: float = _SPHERE["interclass_filtering_threshold"],
        device: Device = None,
        **options: Any,
    ) -> None:
        sphere = SphereFaceMargin(
            margin,
            scale,
            lambda_base=lambda_base,
            lambda_gamma=lambda_gamma,
            lambda_power=lambda_power,
            lambda_min=lambda_min,
            gradient=gradient,
            interclass_filtering_threshold=interclass_filtering_threshold,
            device=device,
        )
        super().__init__(
            num_classes,
            embedding_dim,
            sphere,
            device=device,
            **options,
        )


@_document_defaults
@register_loss("cosface", "lmcl")
class CosFaceLoss(MarginSoftmaxLoss):
    """CosFace: ``s·(cos θ_y - m)`` (:class:`CosFaceMargin`).

    Args:
        margin: ``m`` in cosine units.
        scale: ``s``.
        conditional: subtract ``m`` only where ``cos θ_y > m`` (seed 001).
        gradient: ``"exact"`` or ``"straight_through"``.
        interclass_filtering_threshold: non-target cosines above it are set to 0 (label
            noise; insightface's filter); 0 = off.
    """

    def __init__(
        self,
        num_classes: int,
        embedding_dim: int,
        margin: float = _COS["margin"],
        scale: float = _COS["scale"],
        *,
        conditional: bool = _COS["conditional"],
        gradient: str = _COS["gradient"],
        interclass_filtering_threshold: float = _COS["interclass_filtering_threshold"],
        device: Device = None,
        **options: Any,
    ) -> None:
        cos = CosFaceMargin(
            margin,
            scale,
            conditional=conditional,
            gradient=gradient,
            interclass_filtering_threshold=interclass_filtering_threshold,
        )
        super().__init__(
            num_classes,
            embedding_dim,
            cos,
            device=device,
            **options,
        )


@_document_defaults
@register_loss("amsoftmax", "am-softmax")
class AMSoftmaxLoss(CosFaceLoss):
    """AM-Softmax: CosFace with the AM-Softmax paper's scale, ``s = 30``
    (:data:`AM_SOFTMAX_SCALE`; CosFace's own default is 64) and CosFace's margin."""

    def __init__(
        self,
        num_classes: int,
        embedding_dim: int,
        margin: float = _COS["margin"],
        scale: float = AM_SOFTMAX_SCALE,
        **kwargs: Any,
    ) -> None:
        super().__init__(num_classes, embedding_dim, margin, scale, **kwargs)


@_document_defaults
@register_loss("arcface", "aam-softmax")
class ArcFaceLoss(MarginSoftmaxLoss):
    """ArcFace: ``s·cos(θ_y + m)`` (:class:`ArcFaceMargin`).

    Args:
        margin: ``m`` in radians, ``[0, π)``.
        scale: ``s``.
        policy: where ``θ_y + m > π``: ``"linear"``, ``"easy"``, ``"clip"``, ``"none"``.
        gradient: ``"exact"`` or ``"straight_through"``.
        interclass_filtering_threshold: non-target cosines above it are set to 0 (label
            noise; insightface's filter); 0 = off.
    """

    def __init__(
        self,
        num_classes: int,
        embedding_dim: int,
        margin: float = _ARC["margin"],
        scale: float = _ARC["scale"],
        *,
        policy: str = _ARC["policy"],
        gradient: str = _ARC["gradient"],
        interclass_filtering_threshold: float = _ARC["interclass_filtering_threshold"],
        device: Device = None,
        **options: Any,
    ) -> None:
        arc = ArcFaceMargin(
            margin,
            scale,
            policy=policy,
            gradient=gradient,
            interclass_filtering_threshold=interclass_filtering_threshold,
        )
        super().__init__(
            num_classes,
            embedding_dim,
            arc,
            device=device,
            **options,
        )


@_document_defaults
@register_loss("combined", "combined-margin")
class CombinedMarginLoss(MarginSoftmaxLoss):
    """Combined margin: ``s·(cos(m1·θ_y + m2) - m3)`` (:class:`CombinedMargin`).

    Args:
        m1: multiplicative angular (SphereFace).
        m2: additive angular, radians (ArcFace).
        m3: additive cosine (CosFace).
        scale: ``s``.
        policy, gradient: as for :class:`ArcFaceLoss`.
        interclass_filtering_threshold: non-target cosines above it are set to 0 (label
            noise; insightface's filter); 0 = off.
    """

    def __init__(
        self,
        num_classes: int,
        embedding_dim: int,
        m1: float = _COMBINED["m1"],
        m2: float = _COMBINED["m2"],
        m3: float = _COMBINED["m3"],
        scale: float = _COMBINED["scale"],
        *,
        policy: str = _COMBINED["policy"],
        gradient: str = _COMBINED["gradient"],
        interclass_filtering_threshold: float = _COMBINED["interclass_filtering_threshold"],
        device: Device = None,
        **options: Any,
    ) -> None:
        combined = CombinedMargin(
            m1,
            m2,
            m3,
            scale,
            policy=policy,
            gradient=gradient,
            interclass_filtering_threshold=interclass_filtering_threshold,
        )
        super().__init__(
            num_classes,
            embedding_dim,
            combined,
            device=device,
            **options,
        )


@_document_defaults
@register_loss("curricularface", "curricular")
class CurricularFaceLoss(MarginSoftmaxLoss):
    """CurricularFace: ArcFace positive, hard negatives ``cos θ_j·(t + cos θ_j)``
    (:class:`CurricularFaceMargin`).

    Args:
        margin: ``m`` in radians.
        scale: ``s``.
        momentum: ``α`` of ``t``'s moving average.
        policy, gradient: as for :class:`ArcFaceLoss`.
        interclass_filtering_threshold: non-target cosines above it are set to 0 (label
            noise; insightface's filter); 0 = off.
    """

    def __init__(
        self,
        num_classes: int,
        embedding_dim: int,
        margin: float = _CURRICULAR["margin"],
        scale: float = _CURRICULAR["scale"],
        *,
        momentum: float = _CURRICULAR["momentum"],
        policy: str = _CURRICULAR["policy"],
        gradient: str = _CURRICULAR["gradient"],
        interclass_filtering_threshold: float = _CURRICULAR["interclass_filtering_threshold"],
        device: Device = None,
        **options: Any,
    ) -> None:
        curricular = CurricularFaceMargin(
            margin,
            scale,
            momentum=momentum,
            policy=policy,
            gradient=gradient,
            interclass_filtering_threshold=interclass_filtering_threshold,
            device=device,
        )
        super().__init__(
            num_classes,
            embedding_dim,
            curricular,
            device=device,
            **options,
        )


@_document_defaults
@register_loss("adacos")
class AdaCosLoss(MarginSoftmaxLoss):
    """AdaCos: no margin, scale ``√2·log(C - 1)`` or adapted per batch (:class:`AdaCosMargin`).

    Args:
        dynamic: adapt the scale per batch in training mode.
        interclass_filtering_threshold: non-target cosines above it are set to 0 (label
            noise; insightface's filter); 0 = off.
    """

    def __init__(
        self,
        num_classes: int,
        embedding_dim: int,
        *,
        dynamic: bool = _ADACOS["dynamic"],
        interclass_filtering_threshold: float = _ADACOS["interclass_filtering_threshold"],
        device: Device = None,
        **options: Any,
    ) -> None:
        ada = AdaCosMargin(
            num_classes,
            dynamic=dynamic,
            interclass_filtering_threshold=interclass_filtering_threshold,
            device=device,
        )
        super().__init__(
            num_classes,
            embedding_dim,
            ada,
            device=device,
            **options,
        )


@_document_defaults
@register_loss("subcenter-arcface", "subcenter")
class SubCenterArcFaceLoss(MarginSoftmaxLoss):
    """Sub-center ArcFace (Deng et al., 2020): ``K`` centers per class, the cosine max-pooled
    over them, then ArcFace's margin.

    Args:
        sub_centers: ``K >= 1`` (paper: 3). ``.weight`` has shape ``(C·K, D)``, class-major.
        margin, scale, policy, gradient: as for :class:`ArcFaceLoss`.
        interclass_filtering_threshold: non-target cosines above it are set to 0 (label
            noise; insightface's filter); 0 = off.
    """

    def __init__(
        self,
        num_classes: int,
        embedding_dim: int,
        margin: float = _ARC["margin"],
        scale: float = _ARC["scale"],
        *,
        sub_centers: int = 3,
        policy: str = _ARC["policy"],
        gradient: str = _ARC["gradient"],
        interclass_filtering_threshold: float = _ARC["interclass_filtering_threshold"],
        device: Device = None,
        **options: Any,
    ) -> None:
        arc = ArcFaceMargin(
            margin,
            scale,
            policy=policy,
            gradient=gradient,
            interclass_filtering_threshold=interclass_filtering_threshold,
        )
        super().__init__(
            num_classes,
            embedding_dim,
            arc,
            sub_centers=sub_centers,
            device=device,
            **options,
        )


@_document_defaults
@register_loss("magface")
class MagFaceLoss(MarginSoftmaxLoss):
    """MagFace: margin linear in the clamped feature norm, plus ``λ_g·g(a)``
    (:class:`MagFaceMargin`).

    Args:
        scale: ``s``.
        lower_norm, upper_norm: ``l_a, u_a``.
        lower_margin, upper_margin: ``l_m, u_m`` radians.
        regularizer_weight: ``λ_g``.
        policy, gradient: as for :class:`ArcFaceLoss`.
        interclass_filtering_threshold: non-target cosines above it are set to 0 (label
            noise; insightface's filter); 0 = off.
    """

    def __init__(
        self,
        num_classes: int,
        embedding_dim: int,
        scale: float = _MAG["scale"],
        *,
        lower_norm: float = _MAG["lower_norm"],
        upper_norm: float = _MAG["upper_norm"],
        lower_margin: float = _MAG["lower_margin"],
        upper_margin: float = _MAG["upper_margin"],
        regularizer_weight: float = _MAG["regularizer_weight"],
        policy: str = _MAG["policy"],
        gradient: str = _MAG["gradient"],
        interclass_filtering_threshold: float = _MAG["interclass_filtering_threshold"],
        device: Device = None,
        **options: Any,
    ) -> None:
        mag = MagFaceMargin(
            scale,
            lower_norm=lower_norm,
            upper_norm=upper_norm,
            lower_margin=lower_margin,
            upper_margin=upper_margin,
            regularizer_weight=regularizer_weight,
            policy=policy,
            gradient=gradient,
            interclass_filtering_threshold=interclass_filtering_threshold,
        )
        super().__init__(
            num_classes,
            embedding_dim,
            mag,
            device=device,
            **options,
        )


@_document_defaults
@register_loss("adaface")
class AdaFaceLoss(MarginSoftmaxLoss):
    """AdaFace: quality-adaptive margin from normalized feature norms (:class:`AdaFaceMargin`).

    Args:
        margin: ``m``.
        scale: ``s``.
        h: concentration.
        momentum: weight of the new batch in the norm statistics.
        cosine_clamp: ``δ``; ``δ > 0`` clamps every cosine to ``[-1 + δ, 1 - δ]`` before the
            margin (the authors' code: ``1e-3``); 0 (default) does not.
        gradient: ``"exact"`` or ``"straight_through"``.
        interclass_filtering_threshold: non-target cosines above it are set to 0 (label
            noise; insightface's filter); 0 = off.
    """

    def __init__(
        self,
        num_classes: int,
        embedding_dim: int,
        margin: float = _ADAFACE["margin"],
        scale: float = _ADAFACE["scale"],
        *,
        h: float = _ADAFACE["h"],
        momentum: float = _ADAFACE["momentum"],
        cosine_clamp: float = _ADAFACE["cosine_clamp"],
        gradient: str = _ADAFACE["gradient"],
        interclass_filtering_threshold: float = _ADAFACE["interclass_filtering_threshold"],
        device: Device = None,
        **options: Any,
    ) -> None:
        ada = AdaFaceMargin(
            margin,
            scale,
            h=h,
            momentum=momentum,
            cosine_clamp=cosine_clamp,
            gradient=gradient,
            interclass_filtering_threshold=interclass_filtering_threshold,
            device=device,
        )
        super().__init__(
            num_classes,
            embedding_dim,
            ada,
            device=device,
            **options,
        )


@_document_defaults
@register_loss("elasticface", "elastic")
class ElasticFaceLoss(MarginSoftmaxLoss):
    """ElasticFace: per-sample margin ``~ N(m, σ)`` on ArcFace or CosFace
    (:class:`ElasticFaceMargin`).

    Args:
        margin: the mean ``m``; None: 0.5 for ``kind="arc"``, 0.35 for ``"cos"``.
        scale: ``s``.
        kind: ``"arc"`` or ``"cos"``.
        std: ``σ``.
        plus: ElasticFace+ assignment.
        seed: seed for the margin draws, or None.
        policy, gradient: as for :class:`ArcFaceLoss`.
        interclass_filtering_threshold: non-target cosines above it are set to 0 (label
            noise; insightface's filter); 0 = off.
    """

    def __init__(
        self,
        num_classes: int,
        embedding_dim: int,
        margin: float | None = _ELASTIC["margin"],
        scale: float = _ELASTIC["scale"],
        *,
        kind: str = _ELASTIC["kind"],
        std: float = _ELASTIC["std"],
        plus: bool = _ELASTIC["plus"],
        seed: int | None = _ELASTIC["seed"],
        policy: str = _ELASTIC["policy"],
        gradient: str = _ELASTIC["gradient"],
        interclass_filtering_threshold: float = _ELASTIC["interclass_filtering_threshold"],
        device: Device = None,
        **options: Any,
    ) -> None:
        elastic = ElasticFaceMargin(
            kind,
            margin,
            scale,
            std=std,
            plus=plus,
            seed=seed,
            policy=policy,
            gradient=gradient,
            interclass_filtering_threshold=interclass_filtering_threshold,
        )
        super().__init__(
            num_classes,
            embedding_dim,
            elastic,
            device=device,
            **options,
        )
