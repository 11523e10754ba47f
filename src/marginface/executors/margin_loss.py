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

import torch.nn.functional as F
from torch import Tensor

from ..margins.base import Margin

__all__ = ["REDUCTIONS", "logits_cross_entropy", "margin_loss", "reduce_loss"]

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
    (``Tensor[N, C]``, labels ``Tensor[N]`` int64 in ``[0, C)``)."""
    cross_entropy = F.cross_entropy(logits, labels, reduction="none")  # (N,)
    return margin_loss(cross_entropy, margin, norms, reduction=reduction)
