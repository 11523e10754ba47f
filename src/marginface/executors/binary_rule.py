"""The one-vs-all reduction's compiled rule: what the custom operators
(:mod:`~marginface.executors.fused_op`) and the Triton kernels
(:mod:`~marginface.executors.triton_binary`) compute per logit, and the choice of kernels.

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

from .chunk_plan import requested_kernels, use_triton_kernels

__all__ = ["BinaryRule", "binary_rule_of", "use_binary_kernels"]


@dataclass(frozen=True)
class BinaryRule:
    """A binary margin's non-target logit as the Triton kernels compute it
    (:mod:`~marginface.executors.triton_binary`): ``z = s(2u^t - 1 + μ) + βb`` with
    ``u = max((c + 1)/2, 0)``, clamped to ``[-clamp, clamp]`` if ``clamp``; ``negative_weight``
    ``w_-``; ``straight_through``: ``∂z/∂c = s``."""

    scale: float
    power: float
    offset: float
    bias_term: float
    negative_weight: float
    clamp: float | None = None
    straight_through: bool = False


def use_binary_kernels(margin: Any, kernels: str | None, x: Tensor, weight: Tensor) -> bool:
    """Whether this call's binary reduction runs on the Triton kernels, decided once per call.

    ``"torch"``: no. ``"auto"``: yes for CUDA tensors when triton imports, the GEMM dtype and
    the weight suit the kernels, the margin declares its rule
    (:meth:`~marginface.margins.binary.BinaryMargin.binary_kernel_parameters`), and there is no
    inter-class filtering (a Partial FC sample runs on them, one launch per chunk of its
    gathered rows). ``"triton"``: yes, or ``ValueError`` naming the margin and what is
    unsupported.
    """
    requested = requested_kernels(kernels)
    if requested == "torch":
        return False
    name = type(margin).__name__
    problems = []
    if margin.binary_kernel_parameters() is None:
        problems.append(f"{name}'s non-target rule has no Triton kernel")
    if margin.interclass_filtering_threshold > 0:
        problems.append("interclass_filtering_threshold > 0 has no Triton kernel")
    if requested == "auto":
        return not problems and use_triton_kernels("auto", x, weight)
    if problems:
        raise ValueError(
            f"kernels='triton' for the binary (one-vs-all) reduction of {name}: "
            f"{'; '.join(problems)}; use kernels='torch' (or 'auto')"
        )
    return use_triton_kernels("triton", x, weight)  # the dtype and interpreter checks


def binary_rule_of(margin: Any, bias: Tensor) -> BinaryRule:
    """``margin``'s declared rule
    (:meth:`~marginface.margins.binary.BinaryMargin.binary_kernel_parameters`, not None) with
    the bias value ``bias`` (0-dim)."""
    parameters = margin.binary_kernel_parameters()
    return BinaryRule(
        scale=margin.scale,
        power=parameters["power"],
        offset=parameters["offset"],
        bias_term=margin.bias_sign * float(bias),
        negative_weight=margin.negative_weight,
        clamp=margin.logit_clamp,
        straight_through=margin.gradient == "straight_through",
    )
