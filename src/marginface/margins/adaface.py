"""AdaFace: a margin that adapts to image quality, estimated by the feature norm."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .._validation import check_device, check_real
from ._alias import alias
from ._angles import arccos
from .base import Context, Margin

__all__ = ["AdaFaceMargin", "adaface_target"]


def adaface_target(cos_target: Tensor, quality: Tensor, margin: float, eps: float = 1e-3) -> Tensor:
    r"""AdaFace's target cosine for normalized norms ``ẑ`` in [-1, 1]:

    .. math::
        f(\theta_y) = \cos\big(\mathrm{clip}(\theta_y + g_{angle}, \epsilon, \pi - \epsilon)\big)
                      - g_{add},\qquad g_{angle} = -m\hat z,\quad g_{add} = m\hat z + m

    High-quality samples (``ẑ → 1``) get a CosFace-like margin ``2m``; low-quality ones
    (``ẑ → -1``) an ArcFace-like angular margin ``m``.

    Args:
        cos_target: ``Tensor[N]`` of ``cos θ_y``.
        quality: ``Tensor[N]``, ``ẑ`` (no gradient).
        margin: ``m`` (radians for the angular part, cosine units for the additive part).
        eps: the angle clip, radians. Default: 1e-3 (authors' code).
    """
    theta = arccos(cos_target)  # (N,) radians
    angle = (theta - margin * quality).clamp(eps, math.pi - eps)
    return torch.cos(angle) - (margin * quality + margin)


class AdaFaceMargin(Margin):
    r"""AdaFace (Kim et al., 2022): quality-adaptive margin.

    The feature norm ``‖z‖`` (clipped to [0.001, 100], no gradient) is normalized with running
    batch statistics, :math:`\hat z = \mathrm{clip}(h\,(\|z\| - \mu)/(\sigma + \epsilon), -1, 1)`,
    and the target becomes :func:`adaface_target`. ``μ, σ`` are exponential moving averages
    (``μ ← α·mean + (1 - α)·μ``, likewise ``σ`` with the unbiased batch std), updated before use in
    training mode only, and saved in ``state_dict``; they start at 20 and 100 (authors' code).

    The statistics are not updated from a batch of one row: its unbiased std is NaN, which the
    authors' code writes into its running ``σ`` (every later ``ẑ`` is then NaN); here ``μ`` and
    ``σ`` keep their values and that row is normalized with them.

    Args:
        margin: ``m >= 0``. Default: 0.4 (paper).
        scale: ``s > 0``. Default: 64.0 (paper).
        h: concentration ``h > 0``. Default: 0.333 (paper).
        momentum: ``α`` in [0, 1], weight of the new batch. Default: 0.01 (authors' ``t_alpha``).
        cosine_clamp: ``δ`` in [0, 1). ``δ > 0`` clamps every cosine, target and non-target, to
            ``[-1 + δ, 1 - δ]`` before the margin, with zero gradient outside (the authors' code
            uses ``δ = 1e-3``, "for stability"). Default: 0.0, no clamp: the target's arccos has a
            finite gradient at ``±1`` here anyway (:mod:`~marginface.margins._angles`), a clamp
            would zero the gradient of a non-target class lying within ``acos(1 - δ)`` (2.6° for
            ``δ = 1e-3``) of the embedding, the most confusable class, and with it the non-target
            rule stops being the identity, which costs the chunked executor its fastest path
            (scale folded into the GEMM) and the Triton kernels.
        gradient: ``"exact"`` (default) or ``"straight_through"``.
        interclass_filtering_threshold: ``τ`` in [0, 1]: non-target cosines above it are set to
            0 (insightface's label-noise filter; see :class:`~marginface.margins.base.Margin`).
            Default: 0 (off).
    """

    requires_norms = True
    stateful = True
    eps = 1e-3

    base_margin = alias(
        "margin",
        "``m``, from which the adaptive margins are made: angular ``-m·ẑ`` (radians) and "
        "additive ``m·ẑ + m`` (cosine units) (the constructor's ``margin``).",
    )

    def __init__(
        self,
        margin: float = 0.4,
        scale: float = 64.0,
        *,
        h: float = 0.333,
        momentum: float = 0.01,
        cosine_clamp: float = 0.0,
        gradient: str = "exact",
        interclass_filtering_threshold: float = 0.0,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__(
            gradient=gradient, interclass_filtering_threshold=interclass_filtering_threshold
        )
        self.margin = check_real("margin", margin, nonnegative=True, below=math.pi)
        self.scale = check_real("scale", scale, positive=True)
        self.h = check_real("h", h, positive=True)
        self.momentum = check_real("momentum", momentum, nonnegative=True, at_most=1.0)
        self.cosine_clamp = check_real("cosine_clamp", cosine_clamp, nonnegative=True, below=1.0)
        device = check_device("device", device)
        self.register_buffer("batch_mean", torch.tensor(20.0, device=device))
        self.register_buffer("batch_std", torch.tensor(100.0, device=device))

    def scale_for(self, norms: Tensor | None) -> float:
        return self.scale

    def prepare(
        self,
        cos_target: Tensor,
        labels: Tensor,
        norms: Tensor | None,
        cosine: Tensor | None = None,
    ) -> Context:
        if norms is None:
            raise ValueError("norms is required by AdaFace (its margin depends on the norm)")
        with torch.no_grad():
            safe = norms.detach().clamp(0.001, 100.0)  # (N,)
            if self.training and safe.numel() > 1:
                mean, std = safe.mean(), safe.std()
                alpha = self.momentum
                self.batch_mean.mul_(1 - alpha).add_(alpha * mean.to(self.batch_mean))
                self.batch_std.mul_(1 - alpha).add_(alpha * std.to(self.batch_std))
            quality = (safe - self.batch_mean) / (self.batch_std + self.eps) * self.h
            quality = quality.clamp(-1.0, 1.0)
        return {"scale": self.scale, "quality": quality}

    def target_cosine(self, cos_target: Tensor, norms: Tensor | None, context: Context) -> Tensor:
        quality = context["quality"]
        cos_target = self.clamp_cosine(cos_target)  # (N,)
        return adaface_target(cos_target, quality.to(cos_target.dtype), self.margin, self.eps)

    def nontarget_cosine(self, cosine: Tensor, context: Context) -> Tensor:
        return self.clamp_cosine(cosine)

    def nontarget_is_identity(self) -> bool:
        return self.cosine_clamp == 0.0

    def clamp_cosine(self, cosine: Tensor) -> Tensor:
        """``clamp(cos, -1 + δ, 1 - δ)``, ``δ = cosine_clamp``: ``Tensor[...]``; as is if δ = 0."""
        if self.cosine_clamp == 0.0:
            return cosine
        return cosine.clamp(-1.0 + self.cosine_clamp, 1.0 - self.cosine_clamp)

    def extra_repr(self) -> str:
        text = f"margin={self.margin}, scale={self.scale}, h={self.h}, momentum={self.momentum}"
        text += f", cosine_clamp={self.cosine_clamp}" if self.cosine_clamp else ""
        return text + self._filtering_repr()
