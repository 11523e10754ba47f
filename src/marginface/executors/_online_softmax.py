"""Per-row partial statistics of a log-sum-exp over a slice of the classes, and how to merge them.

A slice of classes (one chunk on one process, or one process's shard of the class centers)
reduces its logits ``z[N, c]`` to two numbers per row, :math:`m = \\max_j z_j` and
:math:`\\sigma = \\sum_j e^{z_j - m}`. Two slices merge exactly (associative and commutative, so
the merge can equally be an all-reduce across processes):

.. math:: m = \\max(m_1, m_2),\\qquad \\sigma = \\sigma_1 e^{m_1 - m} + \\sigma_2 e^{m_2 - m}

and the log-sum-exp over all classes is :math:`m + \\log\\sigma`. A slice whose logits are all
``-inf`` (e.g. a chunk holding only the target column, which is excluded) has ``m = -inf``,
``σ = 0`` and merges as the identity.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = [
    "add_shifted_slice",
    "empty_statistics",
    "finish_log_sum_exp",
    "merge_statistics",
    "slice_statistics",
]


def empty_statistics(
    rows: int, *, dtype: torch.dtype, device: torch.device
) -> tuple[Tensor, Tensor]:
    """The identity of :func:`merge_statistics`: ``(m, σ) = (-inf, 0)``, each ``Tensor[rows]``."""
    row_max = torch.full((rows,), float("-inf"), dtype=dtype, device=device)
    return row_max, torch.zeros(rows, dtype=dtype, device=device)


def slice_statistics(logits: Tensor) -> tuple[Tensor, Tensor]:
    """``(m, σ)`` of one slice of logits ``Tensor[N, c]`` (entries ``-inf`` are excluded).

    Overwrites ``logits`` (it becomes ``exp(z - m)``) to spare one ``N×c`` temporary.

    Returns:
        ``(Tensor[N], Tensor[N])`` in ``logits``' dtype.
    """
    row_max = logits.amax(dim=1)  # (N,)
    shift = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    exp_sum = logits.sub_(shift.unsqueeze(1)).exp_().sum(dim=1)  # (N,)
    return row_max, exp_sum


def add_shifted_slice(
    statistics: tuple[Tensor, Tensor], shifted: Tensor
) -> tuple[Tensor, Tensor] | None:
    """Add a slice given as ``z - m`` (shifted by the running max ``m``, finite) to ``(m, σ)``.

    Saves the slice's own max pass. Exact: ``σ >= 1`` already (it holds ``e^0`` for the max), so
    terms that underflow (``z < m - 87`` in fp32) are below its rounding. Returns None if some
    row's sum overflows (a slice maximum ``> m + 88``); the caller then uses
    :func:`slice_statistics` and :func:`merge_statistics`. Overwrites ``shifted``.
    """
    row_max, exp_sum = statistics
    partial = shifted.exp_().sum(dim=1)  # (N,)
    if not bool(torch.isfinite(partial).all()):
        return None
    return row_max, exp_sum + partial


def merge_statistics(
    first: tuple[Tensor, Tensor], second: tuple[Tensor, Tensor]
) -> tuple[Tensor, Tensor]:
    """Merge the ``(m, σ)`` of two disjoint slices of the same rows (see the module docstring)."""
    max1, sum1 = first
    max2, sum2 = second
    row_max = torch.maximum(max1, max2)  # (N,)
    shift = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    return row_max, sum1 * torch.exp(max1 - shift) + sum2 * torch.exp(max2 - shift)


def finish_log_sum_exp(statistics: tuple[Tensor, Tensor], extra_logit: Tensor) -> Tensor:
    """``log(σ·e^m + e^{extra})``: the log-sum-exp of the merged slices plus one more logit per
    row (the margin-adjusted target, which the slices exclude), ``Tensor[N]``."""
    row_max, exp_sum = statistics
    return torch.logaddexp(row_max + torch.log(exp_sum), extra_logit)
