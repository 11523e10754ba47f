"""The dense executor: materialize the ``N×C`` cosines, apply the margin, softmax cross-entropy."""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import Tensor

from ..margins.base import Margin
from .margin_loss import logits_cross_entropy

__all__ = [
    "compute_dtype",
    "dense_margin_cross_entropy",
    "normalize_rows",
    "normalized_cosine",
    "row_norms",
]

NORMALIZE_EPS = 1e-12
"""``F.normalize``'s floor on the norm: a zero embedding normalizes to zero (all cosines 0)."""


def compute_dtype(*tensors: Tensor) -> torch.dtype:
    """The dtype the cosine/margin math runs in: float64 if any input is, else float32.

    Half-precision inputs (fp16/bf16, e.g. under ``torch.autocast``) are upcast: margins take
    arccos, sin and differences of nearby numbers that half precision cannot resolve.
    """
    if any(t.dtype == torch.float64 for t in tensors):
        return torch.float64
    return torch.float32


def _norm_prescale(x: Tensor) -> Tensor:
    """``c_i = max(1, max_j |x_ij|)`` per row, ``Tensor[N, 1]``, detached. Rows whose entries
    are all within [-1, 1] cannot overflow and are divided by exactly 1 (unchanged, bit for
    bit, zero rows and ``F.normalize``'s ``eps`` semantics included)."""
    return x.detach().abs().amax(dim=1, keepdim=True).clamp_min(1.0)


def row_norms(x: Tensor) -> Tensor:
    """``‖x_i‖₂`` of each row, ``Tensor[N, D] -> Tensor[N]``, without overflow or underflow:
    computed as ``c_i·‖x_i / c_i‖`` with ``c_i = max(1, max_j |x_ij|)`` (detached; the gradient is
    still exactly ``x_i / ‖x_i‖``). A plain float32 norm of a row with entries above ~1.8e19
    squares to inf."""
    scale = _norm_prescale(x)  # (N, 1)
    return torch.linalg.vector_norm(x / scale, dim=1) * scale.squeeze(1)


def normalize_rows(x: Tensor) -> Tensor:
    """``x_i / ‖x_i‖₂`` of each row, ``Tensor[N, D]``, correct for rows whose norm overflows
    the dtype (pre-scaled by ``max(1, max_j |x_ij|)``, detached: normalization is scale-invariant,
    so values and gradients are those of ``F.normalize``); a zero row stays zero."""
    return x / row_norms(x).clamp_min(NORMALIZE_EPS).unsqueeze(1)


def normalized_cosine(embeddings: Tensor, weight: Tensor, sub_centers: int = 1) -> Tensor:
    """Cosines between rows of ``embeddings`` and class centers, max-pooled over sub-centers.

    .. math:: \\cos\\theta_{ij} = \\max_k \\frac{x_i^\\top w_{jk}}{\\|x_i\\|\\,\\|w_{jk}\\|}

    Args:
        embeddings: ``Tensor[N, D]``.
        weight: ``Tensor[C·K, D]``, class-major (rows ``j·K .. j·K + K - 1`` are class j).
        sub_centers: ``K >= 1``.

    Returns:
        ``Tensor[N, C]`` in the inputs' dtype (call under autocast-disabled code for fp32).
    """
    x = normalize_rows(embeddings)  # (N, D), safe for norms beyond the dtype's range
    w = F.normalize(weight, dim=1, eps=NORMALIZE_EPS)  # (C·K, D)
    cosine = x @ w.t()  # (N, C·K)
    if sub_centers > 1:
        cosine = cosine.view(cosine.shape[0], -1, sub_centers).amax(dim=2)  # (N, C)
    return cosine


def dense_margin_cross_entropy(
    embeddings: Tensor,
    weight: Tensor,
    labels: Tensor,
    margin: Margin,
    *,
    sub_centers: int = 1,
    class_values: Mapping[str, Tensor] | None = None,
) -> Tensor:
    """Per-sample margin softmax cross-entropy through the full ``N×C`` logit matrix.

    .. math:: L_i = -\\log\\frac{e^{\\mathrm{logit}_{i,y_i}}}{\\sum_j e^{\\mathrm{logit}_{ij}}}
              + R(\\|x_i\\|)

    with the margin's logits and its regularizer ``R`` (MagFace; zero otherwise). Runs in
    float32 (float64 if an input is float64) with autocast disabled, whatever the input dtype.
    No argument checks: the heads and the functional API check before calling.

    Args:
        embeddings: ``Tensor[N, D]``, unnormalized.
        weight: ``Tensor[C·K, D]`` class centers, unnormalized.
        labels: ``Tensor[N]`` int64 in ``[0, C)``.
        margin: the margin.
        sub_centers: ``K``.
        class_values: ``{name: Tensor[N]}``, the margin's per-class parameters at each row's
            target class (:meth:`~marginface.margins.base.Margin.class_parameters`), or None.

    Returns:
        ``Tensor[N]``, float32 (or float64).
    """
    dtype = compute_dtype(embeddings, weight)
    with torch.autocast(device_type=embeddings.device.type, enabled=False):
        x = embeddings.to(dtype)
        w = weight.to(dtype)
        norms = row_norms(x) if margin.requires_norms else None  # (N,)
        cosine = normalized_cosine(x, w, sub_centers)  # (N, C)
        logits = margin.apply(cosine, labels, norms, class_values)  # (N, C)
        return logits_cross_entropy(logits, labels, margin, norms)  # (N,)
