"""ElasticFace: ArcFace or CosFace with a margin drawn per sample from a normal distribution."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .._validation import check_choice, check_int, check_real
from ._alias import alias
from .arcface import ANGLE_POLICIES, additive_angular_margin
from .base import Context, Margin
from .cosface import additive_cosine_margin

__all__ = ["ELASTIC_KINDS", "ElasticFaceMargin", "assign_elastic_plus"]

ELASTIC_KINDS = ("arc", "cos")


def assign_elastic_plus(margins: Tensor, cos_target: Tensor) -> Tensor:
    """ElasticFace+'s assignment: the sorted margins go to the samples sorted by ``cos θ_y``.

    The sample closest to its center (largest ``cos θ_y``) gets the smallest margin, the hardest
    sample the largest (the pairing the authors' code sets up by sorting the margins ascending
    and the cosines descending).

    Args:
        margins: ``Tensor[N]`` of drawn margins.
        cos_target: ``Tensor[N]`` of ``cos θ_y``.

    Returns:
        ``Tensor[N]``: the same margins, permuted.
    """
    ascending, _ = torch.sort(margins)
    order = torch.argsort(cos_target, descending=True)  # easiest first
    assigned = torch.empty_like(margins)
    assigned[order] = ascending
    return assigned


class ElasticFaceMargin(Margin):
    r"""ElasticFace (Boutros et al., 2022): a per-sample margin ``m_i ~ N(m, σ)``.

    .. math::
        \text{ElasticFace-Arc: } \text{logit}_y = s\cos(\theta_y + m_i),\qquad
        \text{ElasticFace-Cos: } \text{logit}_y = s(\cos\theta_y - m_i)

    The "+" variant (``plus=True``) assigns the sorted draws by the samples' target cosines
    (:func:`assign_elastic_plus`). Margins are drawn in training mode from ``generator`` (seed it
    with ``seed``); in eval mode every sample gets the mean ``m``, so validation losses are
    deterministic. The draw carries no gradient.

    Args:
        kind: ``"arc"`` (angular, radians) or ``"cos"`` (cosine units). Default: ``"arc"``.
        margin: the mean ``m >= 0``. Default: 0.5 for arc, 0.35 for cos (paper).
        scale: ``s > 0``. Default: 64.0 (paper).
        std: ``σ >= 0``. Default: 0.05 (paper and authors' config, plain losses), whatever
            ``plus`` is. For "+": 0.0175 for arc (paper and config); for cos 0.025 (paper) or
            0.02 (the authors' ``config/config.py``).
        plus: the ElasticFace+ assignment. Default: False.
        seed: seed of the margin generator, or None for torch's global generator. The seeded
            generator's state is the tensor attribute ``generator_state`` (not a buffer: not
            in ``state_dict``, as before); :attr:`generator` returns a generator holding it.
        policy: (arc only) behaviour where ``θ_y + m_i > π``. Default: ``"linear"`` (the authors'
            code applies ``cos(θ + m_i)`` unguarded, which is ``"none"``).
        gradient: ``"exact"`` (default) or ``"straight_through"``.
        interclass_filtering_threshold: ``τ`` in [0, 1]: non-target cosines above it are set to
            0 (insightface's label-noise filter; see :class:`~marginface.margins.base.Margin`).
            Default: 0 (off).
    """

    mean_margin = alias(
        "margin",
        "``m``, the mean of the per-sample margins: radians for ``kind='arc'``, cosine units "
        "for ``'cos'`` (the constructor's ``margin``).",
    )

    def __init__(
        self,
        kind: str = "arc",
        margin: float | None = None,
        scale: float = 64.0,
        *,
        std: float = 0.05,
        plus: bool = False,
        seed: int | None = None,
        policy: str = "linear",
        gradient: str = "exact",
        interclass_filtering_threshold: float = 0.0,
    ) -> None:
        super().__init__(
            gradient=gradient, interclass_filtering_threshold=interclass_filtering_threshold
        )
        self.kind = check_choice("kind", kind, ELASTIC_KINDS)
        default = 0.5 if self.kind == "arc" else 0.35
        below = math.pi if self.kind == "arc" else None
        self.margin = check_real(
            "margin", default if margin is None else margin, nonnegative=True, below=below
        )
        self.scale = check_real("scale", scale, positive=True)
        self.std = check_real("std", std, nonnegative=True)
        self.plus = bool(plus)
        self.policy = check_choice("policy", policy, ANGLE_POLICIES)
        self.seeded = seed is not None
        if seed is not None:  # the generator's state (CPU uint8), advanced in place by draws
            state = torch.Generator().manual_seed(check_int("seed", seed)).get_state()
            self.generator_state = state  # not a buffer: not model state, stays on the CPU

    @property
    def generator(self) -> torch.Generator | None:
        """A generator holding the margin's current draw state (a copy), or None if unseeded."""
        if not self.seeded:
            return None
        generator = torch.Generator()
        generator.set_state(self.generator_state.cpu())
        return generator

    def scale_for(self, norms: Tensor | None) -> float:
        return self.scale

    def draw(self, cos_target: Tensor) -> Tensor:
        """Per-sample margins ``Tensor[N]`` for this batch (the mean in eval mode)."""
        n = cos_target.shape[0]
        if not self.training or self.std == 0.0:
            return torch.full((n,), self.margin, dtype=cos_target.dtype, device=cos_target.device)
        if self.seeded:  # a custom op: torch.compile keeps it in the graph, same draws
            from ._compile_ops import seeded_normal

            drawn = seeded_normal(self.generator_state, n, self.margin, self.std)
        else:
            drawn = torch.normal(self.margin, self.std, size=(n,))
        drawn = drawn.to(device=cos_target.device, dtype=cos_target.dtype)
        if self.plus:
            drawn = assign_elastic_plus(drawn, cos_target.detach())
        if self.kind == "arc":
            drawn = drawn.clamp(0.0, math.pi - 1e-6)
        return drawn

    def prepare(
        self,
        cos_target: Tensor,
        labels: Tensor,
        norms: Tensor | None,
        cosine: Tensor | None = None,
    ) -> Context:
        return {"scale": self.scale, "margin": self.draw(cos_target)}

    def target_cosine(self, cos_target: Tensor, norms: Tensor | None, context: Context) -> Tensor:
        margin = context["margin"]
        if self.kind == "arc":
            return additive_angular_margin(cos_target, margin, self.policy)
        return additive_cosine_margin(cos_target, margin)

    def extra_repr(self) -> str:
        return (
            f"kind={self.kind!r}, margin={self.margin}, scale={self.scale}, std={self.std}, "
            f"plus={self.plus}" + self._filtering_repr()
        )
