"""The named losses: one thin :class:`~marginface.head.MarginSoftmaxLoss` per paper.

Each class only builds its margin; the formula, units and defaults are documented on the margin
(:mod:`marginface.margins`). Common keyword arguments of every loss:

* ``reduction``: ``"mean"`` (default), ``"sum"`` or ``"none"``.
* ``impl``: the executor (see :class:`~marginface.head.MarginSoftmaxLoss`).
* ``device``, ``dtype``: where and how the class centers (and the margin's buffers) are created.

They are passed on to :class:`~marginface.head.MarginSoftmaxLoss`, which rejects unknown ones.
"""

from __future__ import annotations

from typing import Any

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
]

Device = torch.device | str | None


@register_loss("normface", "softmax")
class NormFaceLoss(MarginSoftmaxLoss):
    """NormFace: ``s·cos θ`` on normalized embeddings and centers (:class:`NormFaceMargin`).

    Args:
        scale: ``s``. Default: 30.0.
    """

    def __init__(
        self,
        num_classes: int,
        embedding_dim: int,
        scale: float = 30.0,
        *,
        device: Device = None,
        **options: Any,
    ) -> None:
        margin = NormFaceMargin(scale)
        super().__init__(
            num_classes,
            embedding_dim,
            margin,
            device=device,
            **options,
        )


@register_loss("sphereface", "a-softmax")
class SphereFaceLoss(MarginSoftmaxLoss):
    """SphereFace / A-Softmax: ``ψ(θ) = (-1)^k cos(mθ) - 2k`` with annealing
    (:class:`SphereFaceMargin`).

    Args:
        margin: integer ``m >= 1``. Default: 4.
        scale: None (default) scales by the feature norm (original); a float, the normalized
            variant.
        lambda_base, lambda_gamma, lambda_power, lambda_min: annealing. Defaults: 1000, 0.12, 1, 5.
        gradient: ``"exact"`` or ``"straight_through"``.
    """

    def __init__(
        self,
        num_classes: int,
        embedding_dim: int,
        margin: int = 4,
        scale: float | None = None,
        *,
        lambda_base: float = 1000.0,
        lambda_gamma: float = 0.12,
        lambda_power: float = 1.0,
        lambda_min: float = 5.0,
        gradient: str = "exact",
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
            device=device,
        )
        super().__init__(
            num_classes,
            embedding_dim,
            sphere,
            device=device,
            **options,
        )


@register_loss("cosface", "lmcl")
class CosFaceLoss(MarginSoftmaxLoss):
    """CosFace: ``s·(cos θ_y - m)`` (:class:`CosFaceMargin`).

    Args:
        margin: ``m`` in cosine units. Default: 0.35.
        scale: ``s``. Default: 64.0.
        conditional: subtract ``m`` only where ``cos θ_y > m`` (seed 001). Default: False.
    """

    def __init__(
        self,
        num_classes: int,
        embedding_dim: int,
        margin: float = 0.35,
        scale: float = 64.0,
        *,
        conditional: bool = False,
        gradient: str = "exact",
        device: Device = None,
        **options: Any,
    ) -> None:
        cos = CosFaceMargin(margin, scale, conditional=conditional, gradient=gradient)
        super().__init__(
            num_classes,
            embedding_dim,
            cos,
            device=device,
            **options,
        )


@register_loss("amsoftmax", "am-softmax")
class AMSoftmaxLoss(CosFaceLoss):
    """AM-Softmax: CosFace with the AM-Softmax paper's defaults, ``s = 30, m = 0.35``."""

    def __init__(
        self,
        num_classes: int,
        embedding_dim: int,
        margin: float = 0.35,
        scale: float = 30.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(num_classes, embedding_dim, margin, scale, **kwargs)


@register_loss("arcface", "aam-softmax")
class ArcFaceLoss(MarginSoftmaxLoss):
    """ArcFace: ``s·cos(θ_y + m)`` (:class:`ArcFaceMargin`).

    Args:
        margin: ``m`` in radians, ``[0, π)``. Default: 0.5.
        scale: ``s``. Default: 64.0.
        policy: where ``θ_y + m > π``: ``"linear"`` (default), ``"easy"``, ``"clip"``, ``"none"``.
        gradient: ``"exact"`` or ``"straight_through"``.
    """

    def __init__(
        self,
        num_classes: int,
        embedding_dim: int,
        margin: float = 0.5,
        scale: float = 64.0,
        *,
        policy: str = "linear",
        gradient: str = "exact",
        device: Device = None,
        **options: Any,
    ) -> None:
        arc = ArcFaceMargin(margin, scale, policy=policy, gradient=gradient)
        super().__init__(
            num_classes,
            embedding_dim,
            arc,
            device=device,
            **options,
        )


@register_loss("combined", "combined-margin")
class CombinedMarginLoss(MarginSoftmaxLoss):
    """Combined margin: ``s·(cos(m1·θ_y + m2) - m3)`` (:class:`CombinedMargin`).

    Args:
        m1: multiplicative angular (SphereFace). Default: 1.0.
        m2: additive angular, radians (ArcFace). Default: 0.5.
        m3: additive cosine (CosFace). Default: 0.0.
        scale: ``s``. Default: 64.0.
        policy, gradient: as for :class:`ArcFaceLoss`.
    """

    def __init__(
        self,
        num_classes: int,
        embedding_dim: int,
        m1: float = 1.0,
        m2: float = 0.5,
        m3: float = 0.0,
        scale: float = 64.0,
        *,
        policy: str = "linear",
        gradient: str = "exact",
        device: Device = None,
        **options: Any,
    ) -> None:
        combined = CombinedMargin(m1, m2, m3, scale, policy=policy, gradient=gradient)
        super().__init__(
            num_classes,
            embedding_dim,
            combined,
            device=device,
            **options,
        )


@register_loss("curricularface", "curricular")
class CurricularFaceLoss(MarginSoftmaxLoss):
    """CurricularFace: ArcFace positive, hard negatives ``cos θ_j·(t + cos θ_j)``
    (:class:`CurricularFaceMargin`).

    Args:
        margin: ``m`` in radians. Default: 0.5.
        scale: ``s``. Default: 64.0.
        momentum: ``α`` of ``t``'s moving average. Default: 0.99.
        policy, gradient: as for :class:`ArcFaceLoss`.
    """

    def __init__(
        self,
        num_classes: int,
        embedding_dim: int,
        margin: float = 0.5,
        scale: float = 64.0,
        *,
        momentum: float = 0.99,
        policy: str = "linear",
        gradient: str = "exact",
        device: Device = None,
        **options: Any,
    ) -> None:
        curricular = CurricularFaceMargin(
            margin, scale, momentum=momentum, policy=policy, gradient=gradient, device=device
        )
        super().__init__(
            num_classes,
            embedding_dim,
            curricular,
            device=device,
            **options,
        )


@register_loss("adacos")
class AdaCosLoss(MarginSoftmaxLoss):
    """AdaCos: no margin, scale ``√2·log(C - 1)`` or adapted per batch (:class:`AdaCosMargin`).

    Args:
        dynamic: adapt the scale per batch in training mode. Default: True.
    """

    def __init__(
        self,
        num_classes: int,
        embedding_dim: int,
        *,
        dynamic: bool = True,
        device: Device = None,
        **options: Any,
    ) -> None:
        ada = AdaCosMargin(num_classes, dynamic=dynamic, device=device)
        super().__init__(
            num_classes,
            embedding_dim,
            ada,
            device=device,
            **options,
        )


@register_loss("subcenter-arcface", "subcenter")
class SubCenterArcFaceLoss(MarginSoftmaxLoss):
    """Sub-center ArcFace (Deng et al., 2020): ``K`` centers per class, the cosine max-pooled
    over them, then ArcFace's margin.

    Args:
        sub_centers: ``K >= 1``. Default: 3 (paper). ``.weight`` has shape ``(C·K, D)``,
            class-major.
        margin, scale, policy, gradient: as for :class:`ArcFaceLoss`.
    """

    def __init__(
        self,
        num_classes: int,
        embedding_dim: int,
        margin: float = 0.5,
        scale: float = 64.0,
        *,
        sub_centers: int = 3,
        policy: str = "linear",
        gradient: str = "exact",
        device: Device = None,
        **options: Any,
    ) -> None:
        arc = ArcFaceMargin(margin, scale, policy=policy, gradient=gradient)
        super().__init__(
            num_classes,
            embedding_dim,
            arc,
            sub_centers=sub_centers,
            device=device,
            **options,
        )


@register_loss("magface")
class MagFaceLoss(MarginSoftmaxLoss):
    """MagFace: margin linear in the clamped feature norm, plus ``λ_g·g(a)``
    (:class:`MagFaceMargin`).

    Args:
        scale: ``s``. Default: 64.0.
        lower_norm, upper_norm: ``l_a, u_a``. Defaults: 10, 110.
        lower_margin, upper_margin: ``l_m, u_m`` radians. Defaults: 0.45, 0.8.
        regularizer_weight: ``λ_g``. Default: 35.0.
        policy, gradient: as for :class:`ArcFaceLoss`.
    """

    def __init__(
        self,
        num_classes: int,
        embedding_dim: int,
        scale: float = 64.0,
        *,
        lower_norm: float = 10.0,
        upper_norm: float = 110.0,
        lower_margin: float = 0.45,
        upper_margin: float = 0.8,
        regularizer_weight: float = 35.0,
        policy: str = "linear",
        gradient: str = "exact",
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
        )
        super().__init__(
            num_classes,
            embedding_dim,
            mag,
            device=device,
            **options,
        )


@register_loss("adaface")
class AdaFaceLoss(MarginSoftmaxLoss):
    """AdaFace: quality-adaptive margin from normalized feature norms (:class:`AdaFaceMargin`).

    Args:
        margin: ``m``. Default: 0.4.
        scale: ``s``. Default: 64.0.
        h: concentration. Default: 0.333.
        momentum: weight of the new batch in the norm statistics. Default: 0.01.
        gradient: ``"exact"`` or ``"straight_through"``.
    """

    def __init__(
        self,
        num_classes: int,
        embedding_dim: int,
        margin: float = 0.4,
        scale: float = 64.0,
        *,
        h: float = 0.333,
        momentum: float = 0.01,
        gradient: str = "exact",
        device: Device = None,
        **options: Any,
    ) -> None:
        ada = AdaFaceMargin(margin, scale, h=h, momentum=momentum, gradient=gradient, device=device)
        super().__init__(
            num_classes,
            embedding_dim,
            ada,
            device=device,
            **options,
        )


@register_loss("elasticface", "elastic")
class ElasticFaceLoss(MarginSoftmaxLoss):
    """ElasticFace: per-sample margin ``~ N(m, σ)`` on ArcFace or CosFace
    (:class:`ElasticFaceMargin`).

    Args:
        margin: the mean ``m``. Default: 0.5 for ``kind="arc"``, 0.35 for ``"cos"``.
        scale: ``s``. Default: 64.0.
        kind: ``"arc"`` (default) or ``"cos"``.
        std: ``σ``. Default: 0.05.
        plus: ElasticFace+ assignment. Default: False.
        seed: seed for the margin draws, or None.
        policy, gradient: as for :class:`ArcFaceLoss`.
    """

    def __init__(
        self,
        num_classes: int,
        embedding_dim: int,
        margin: float | None = None,
        scale: float = 64.0,
        *,
        kind: str = "arc",
        std: float = 0.05,
        plus: bool = False,
        seed: int | None = None,
        policy: str = "linear",
        gradient: str = "exact",
        device: Device = None,
        **options: Any,
    ) -> None:
        elastic = ElasticFaceMargin(
            kind, margin, scale, std=std, plus=plus, seed=seed, policy=policy, gradient=gradient
        )
        super().__init__(
            num_classes,
            embedding_dim,
            elastic,
            device=device,
            **options,
        )
