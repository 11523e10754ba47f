"""Cross-entropy + the margin's regularizer + the reduction: written once, for every executor.

.. math:: L = \\operatorname{reduce}_i\\big(\\mathrm{CE}_i + R(\\|x_i\\|)\\big)

with ``CE_i`` the per-sample softmax cross-entropy of the margin's logits (however the executor
computed it: from the ``N×C`` logits, chunk by chunk, or across processes), ``R`` the margin's
:meth:`~marginface.margins.base.Margin.regularizer` (MagFace's ``λ_g·g(a)``; none for the other
margins) and the reduction ``"mean"``, ``"sum"`` or ``"none"``. The dense and chunked executors,
the head and :func:`marginface.functional.margin_cross_entropy` all end here.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ..margins.base import Margin
from ..margins.binary import softplus

__all__ = [
    "REDUCTIONS",
    "binary_cross_entropy",
    "logits_cross_entropy",
    "margin_loss",
    "reduce_loss",
]

REDUCTIONS = ("mean", "sum", "none")


def reduce_loss(loss: Tensor, reduction: str) -> Tensor:
    """``loss`` (``Tensor[N]``) reduced: its mean, its sum (0-dim), or itself (``"none"``)."""
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    return loss


def margin_loss(
    cross_entropy: Tensor,
    margin: Margin,
    norms: Tensor | None,
    *,
    reduction: str = "none",
    place_regularizer: Callable[[Tensor], Tensor] | None = None,
) -> Tensor:
    """``reduce(CE_i + R(‖x_i‖))`` from the per-sample cross-entropy.

    Args:
        cross_entropy: ``Tensor[N]``, float32 (or float64).
        margin: the margin whose :meth:`~marginface.margins.base.Margin.regularizer` is added.
        norms: ``Tensor[n]`` embedding norms (``n = N`` except on a sharded head, where they are
            this rank's rows), or None when the margin needs none.
        reduction: ``"mean"``, ``"sum"`` or ``"none"`` (default: ``Tensor[N]``).
        place_regularizer: maps this rank's ``R`` (``Tensor[n]``) to the global batch's
            ``Tensor[N]`` (a sharded head); None: ``n = N``.
    """
    extra = margin.regularizer(norms)
    if extra is not None:
        if place_regularizer is not None:
            extra = place_regularizer(extra)
        cross_entropy = cross_entropy + extra
    return reduce_loss(cross_entropy, reduction)


def logits_cross_entropy(
    logits: Tensor,
    labels: Tensor,
    margin: Margin,
    norms: Tensor | None,
    *,
    reduction: str = "none",
) -> Tensor:
    """:func:`margin_loss` of the softmax cross-entropy of the margin's ``logits``
    (``Tensor[N, C]``, labels ``Tensor[N]`` int64 in ``[0, C)``), or, for a margin whose
    :attr:`~marginface.margins.base.Margin.objective` is ``"binary"``, of its one-vs-all loss
    (:func:`binary_cross_entropy`)."""
    if margin.objective == "binary":
        cross_entropy = binary_cross_entropy(logits, labels, margin)  # (N,)
        return margin_loss(cross_entropy, margin, norms, reduction=reduction)
    cross_entropy = F.cross_entropy(logits, labels, reduction="none")  # (N,)
    return margin_loss(cross_entropy, margin, norms, reduction=reduction)


def binary_cross_entropy(logits: Tensor, labels: Tensor, margin: Margin) -> Tensor:
    """The one-vs-all loss of a binary margin (:mod:`marginface.margins.binary`), per sample:
    ``w_+·softplus(-z_y) + w_-·Σ_{j≠y} softplus(z_j)`` of its ``logits`` (``Tensor[N, C]``,
    :meth:`~marginface.margins.binary.BinaryMargin.apply`) and ``labels`` (``Tensor[N]``
    int64 in ``[0, C)``, or -1: no target term), ``Tensor[N]``. The chunked executor computes
    the same chunk by chunk (:mod:`~marginface.executors.binary_loop`)."""
    has_target = labels >= 0  # (N,)
    index = labels.clamp_min(0)  # (N,)
    is_target = torch.zeros_like(logits, dtype=torch.bool)  # (N, C), one byte per entry
    is_target.scatter_(1, index.unsqueeze(1), has_target.unsqueeze(1))
    negative = torch.where(is_target, 0.0, softplus(logits)).sum(dim=1)  # (N,)
    positive = softplus(-logits.gather(1, index.unsqueeze(1)).squeeze(1))  # (N,)
    positive = torch.where(has_target, positive, 0.0)
    return margin.positive_weight * positive + margin.negative_weight * negative
