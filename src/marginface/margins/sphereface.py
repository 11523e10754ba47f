"""SphereFace / A-Softmax: multiplicative angular margin ``ψ(θ) = (-1)^k cos(mθ) - 2k``."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .._validation import check_device, check_int, check_real
from ._alias import alias
from .base import Context, Margin

__all__ = ["SphereFaceMargin", "chebyshev_cos_multiple", "sphereface_psi"]


def chebyshev_cos_multiple(cosine: Tensor, m: int) -> Tensor:
    """``cos(m·θ)`` as the Chebyshev polynomial ``T_m(cos θ)``: a polynomial, so its derivative
    ``m·sin(mθ)/sin θ`` is exact and finite everywhere, ``cos θ = ±1`` included.

    Args:
        cosine: ``Tensor[...]`` of ``cos θ``.
        m: integer ``>= 0``.
    """
    previous, current = torch.ones_like(cosine), cosine
    if m == 0:
        return previous
    for _ in range(m - 1):
        previous, current = current, 2.0 * cosine * current - previous
    return current


def sphereface_psi(cos_target: Tensor, m: int) -> Tensor:
    r"""SphereFace's monotone extension of ``cos(mθ)`` to θ in [0, π].

    .. math::
        \psi(\theta) = (-1)^k\cos(m\theta) - 2k,\qquad
        \theta\in\Big[\frac{k\pi}{m}, \frac{(k+1)\pi}{m}\Big],\;
        k = \lfloor m\theta/\pi \rfloor

    ψ is continuous and decreasing from 1 (θ = 0) to ``1 - 2m`` (θ = π).

    Args:
        cos_target: ``Tensor[N]`` of ``cos θ`` in [-1, 1].
        m: integer margin ``>= 1`` (paper: 4).

    Returns:
        ``Tensor[N]``; the derivative with respect to ``cos θ`` is ``(-1)^k T_m'(cos θ)``, exact.
    """
    with torch.no_grad():
        theta = torch.arccos(cos_target.clamp(-1.0, 1.0))
        k = torch.floor(m * theta / math.pi).clamp(0, m - 1)  # (N,) piece index
        sign = 1.0 - 2.0 * torch.remainder(k, 2)  # (-1)^k
    return sign * chebyshev_cos_multiple(cos_target, m) - 2.0 * k


class SphereFaceMargin(Margin):
    r"""SphereFace / A-Softmax (Liu et al., 2017): multiplicative angular margin with annealing.

    .. math::
        \text{logit}_y = s\,\frac{\lambda\cos\theta_y + \psi(\theta_y)}{1 + \lambda},\qquad
        \text{logit}_j = s\cos\theta_j

    with ``s = ‖x‖`` (the original A-Softmax: unnormalized features, gradient flows into the
    norm) or a fixed ``s`` (the normalized variant). λ anneals from a large value towards
    ``lambda_min`` as in the authors' code:
    ``λ = max(lambda_min, lambda_base·(1 + lambda_gamma·iteration)^(-lambda_power))``, the iteration
    counter advancing once per training-mode call and saved in ``state_dict``.

    Args:
        margin: integer ``m >= 1``. Default: 4 (paper).
        scale: ``None`` (default) for the feature norm; a float ``s > 0`` for the normalized
            variant.
        lambda_base, lambda_gamma, lambda_power, lambda_min: the annealing schedule. Defaults:
            1000, 0.12, 1, 5 (the authors' Caffe prototxt). ``lambda_base = lambda_min = 0``
            gives plain ψ.
        gradient: ``"exact"`` (default) or ``"straight_through"``.
        interclass_filtering_threshold: ``τ`` in [0, 1]: non-target cosines above it are set to
            0 (insightface's label-noise filter; see :class:`~marginface.margins.base.Margin`).
            Default: 0 (off).
    """

    stateful = True

    angle_multiplier = alias(
        "margin",
        "``m``, the integer the target angle is multiplied by (the constructor's ``margin``).",
    )

    def __init__(
        self,
        margin: int = 4,
        scale: float | None = None,
        *,
        lambda_base: float = 1000.0,
        lambda_gamma: float = 0.12,
        lambda_power: float = 1.0,
        lambda_min: float = 5.0,
        gradient: str = "exact",
        interclass_filtering_threshold: float = 0.0,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__(
            gradient=gradient, interclass_filtering_threshold=interclass_filtering_threshold
        )
        self.margin = check_int("margin", margin, minimum=1)
        self.scale = None if scale is None else check_real("scale", scale, positive=True)
        self.requires_norms = self.scale is None
        self.lambda_base = check_real("lambda_base", lambda_base, nonnegative=True)
        self.lambda_gamma = check_real("lambda_gamma", lambda_gamma, nonnegative=True)
        self.lambda_power = check_real("lambda_power", lambda_power, nonnegative=True)
        self.lambda_min = check_real("lambda_min", lambda_min, nonnegative=True)
        device = check_device("device", device)
        self.register_buffer("iteration", torch.zeros((), dtype=torch.long, device=device))

    @property
    def current_lambda(self) -> float:
        """λ at the current iteration."""
        return float(self.lambda_tensor())

    def lambda_tensor(self, iteration: Tensor | None = None) -> Tensor:
        """λ at the current iteration (or at ``iteration``) as a 0-dim float64 tensor on the
        buffers' device (no host sync, so ``torch.compile`` traces it without a graph break)."""
        from ._compile_ops import annealed_lambda  # an operator: saved, never recomputed

        step = self.iteration if iteration is None else iteration
        return annealed_lambda(
            step, self.lambda_base, self.lambda_gamma, self.lambda_power, self.lambda_min
        )

    def scale_for(self, norms: Tensor | None) -> Tensor | float:
        if self.scale is not None:
            return self.scale
        if norms is None:
            raise ValueError("norms is required by SphereFace with scale=None (the feature norm)")
        return norms.unsqueeze(1)  # (N, 1)

    def prepare(
        self,
        cos_target: Tensor,
        labels: Tensor,
        norms: Tensor | None,
        cosine: Tensor | None = None,
    ) -> Context:
        iteration = self.iteration
        if self.training:
            iteration = self.iteration + 1
            self.iteration.copy_(iteration)
        return {"scale": self.scale_for(norms), "lambda": self.lambda_tensor(iteration)}

    def target_cosine(self, cos_target: Tensor, norms: Tensor | None, context: Context) -> Tensor:
        lam = context["lambda"]
        lam = lam.to(cos_target.dtype) if isinstance(lam, Tensor) else float(lam)
        psi = sphereface_psi(cos_target, self.margin)
        return (lam * cos_target + psi) / (1.0 + lam)

    def extra_repr(self) -> str:
        return (
            f"margin={self.margin}, scale={self.scale}, lambda_min={self.lambda_min}"
            + self._filtering_repr()
        )
