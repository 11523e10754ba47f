"""The dense executor: materialize the ``N×C`` cosines, apply the margin, softmax cross-entropy."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..margins.base import Margin

__all__ = ["compute_dtype", "dense_margin_cross_entropy", "normalized_cosine"]

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
    x = F.normalize(embeddings, dim=1, eps=NORMALIZE_EPS)  # (N, D)
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

    Returns:
        ``Tensor[N]``, float32 (or float64).
    """
    dtype = compute_dtype(embeddings, weight)
    with torch.autocast(device_type=embeddings.device.type, enabled=False):
        x = embeddings.to(dtype)
        w = weight.to(dtype)
        norms = torch.linalg.vector_norm(x, dim=1) if margin.requires_norms else None  # (N,)
        cosine = normalized_cosine(x, w, sub_centers)  # (N, C)
        logits = margin.apply(cosine, labels, norms)  # (N, C)
        loss = F.cross_entropy(logits, labels, reduction="none")  # (N,)
        extra = margin.regularizer(norms)
        if extra is not None:
            loss = loss + extra
    return loss
