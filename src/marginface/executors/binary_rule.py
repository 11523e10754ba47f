"""The one-vs-all reduction's compiled rule: what the custom operators
(:mod:`~marginface.executors.fused_op`) and the Triton kernels
(:mod:`~marginface.executors.triton_binary`) compute per logit (whether they run is
:func:`~marginface.executors.backend.use_binary_kernels`'s answer, asked once per call by
:func:`~marginface.executors.backend.choose_backend`).

A binary margin declares its non-target rule as numbers
(:meth:`~marginface.margins.binary.BinaryMargin.binary_kernel_parameters`): with
``u = max((c + 1)/2, 0)``,

.. math:: z = s\\,(2u^t - 1 + \\mu) + \beta b

clamped to ``[-L, L]`` if the margin clamps, with ``∂z/∂c = s`` for the straight-through
gradient (SphereFace2: ``t``, ``μ = m`` for variant C else 0, ``β = 1``; UniFace: ``t = 1``,
``μ = 0``, ``β = -1``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor

__all__ = ["BinaryRule", "binary_rule_of"]


@dataclass(frozen=True)
class BinaryRule:
    """A binary margin's non-target logit as the Triton kernels compute it
    (:mod:`~marginface.executors.triton_binary`): ``z = s(2u^t - 1 + μ) + βb`` with
    ``u = max((c + 1)/2, 0)``, clamped to ``[-clamp, clamp]`` if ``clamp``; ``negative_weight``
    ``w_-``; ``straight_through``: ``∂z/∂c = s``. ``bias_term`` ``βb``: a 0-dim tensor on the
    computation's device (the learned bias, never read back to the host) or a float."""

    scale: float
    power: float
    offset: float
    bias_term: Tensor | float
    negative_weight: float
    clamp: float | None = None
    straight_through: bool = False


def binary_rule_of(margin: Any, bias: Tensor) -> BinaryRule:
    """``margin``'s declared rule
    (:meth:`~marginface.margins.binary.BinaryMargin.binary_kernel_parameters`, not None) with
    the bias value ``bias`` (0-dim)."""
    parameters = margin.binary_kernel_parameters()
    return BinaryRule(
        scale=margin.scale,
        power=parameters["power"],
        offset=parameters["offset"],
        bias_term=bias.detach() * margin.bias_sign,
        negative_weight=margin.negative_weight,
        clamp=margin.logit_clamp,
        straight_through=margin.gradient == "straight_through",
    )
