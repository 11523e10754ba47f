"""A margin's per-row statistics pass on the Triton kernels: the ``N×C`` cosines stay on chip.

Some margins need, before the loss, a sum over every non-target class of each row
(:meth:`~marginface.margins.base.Margin.row_statistics_size`); those that declare it as one of
:data:`~marginface.margins.base.ROW_STATISTICS_KERNELS` get it here when the call runs on the
Triton kernels (the forward kernel of :mod:`~marginface.executors.triton_kernels` with the
reduction ``"above_threshold"``). The one declared rule, ``"above_threshold"`` (NPCFace's hard
negatives), sums

.. math::
    S_i = \\sum_{j \\ne y_i} [c_{ij} > \\tau_i]\\,c_{ij},\\qquad
    H_i = \\sum_{j \\ne y_i} [c_{ij} > \\tau_i]

with ``c_ij`` the cosine of row ``i`` and class ``j`` (max-pooled over the sub-centers, as the
softmax kernels of :mod:`~marginface.executors.triton_kernels`), ``τ_i`` the row's threshold
(strict ``>``), and no gradient. The PyTorch reference is
:func:`~marginface.margins.npcface.above_threshold_terms` summed by
:func:`~marginface.executors.chunk_loop.row_statistics`. Importing this module imports
:mod:`triton` (see :mod:`~marginface.executors.triton_kernels` on ``TRITON_INTERPRET``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .kernel_options import Blocks, RowInputs
from .triton_kernels import kernel_partials

__all__ = ["above_threshold_sums"]


def above_threshold_sums(
    x_hat: Tensor,
    weight: Tensor,
    inv_norms: Tensor,
    labels: Tensor,
    threshold: Tensor,
    *,
    sub_centers: int,
    chunk_size: int,
    blocks: Blocks | None = None,
) -> Tensor:
    """Per-row ``(S_i, H_i)`` of the ``"above_threshold"`` rule (module docstring).

    One program per (block of rows, chunk of ``chunk_size`` classes); the chunks' partial sums
    are added in PyTorch (``O(N·C/chunk_size)`` floats).

    Args: as :func:`~marginface.executors.triton_kernels.nontarget_statistics` (``labels``: a
    value outside ``[0, C)``, no target among these classes), with ``threshold``:
    ``Tensor[N]``, the per-row ``τ_i`` (read as float32), in place of the scale and the rule.

    Returns:
        ``Tensor[2, N]`` float32: the sums ``S`` and the counts ``H``.
    """
    n = x_hat.shape[0]
    if threshold.shape != (n,):
        raise ValueError(f"threshold must have shape ({n},), got {tuple(threshold.shape)}")
    inputs = RowInputs("above_threshold", threshold=threshold.to(torch.float32).contiguous())
    partial = kernel_partials(
        x_hat, weight, inv_norms, labels.contiguous(), inputs,
        sub_centers=sub_centers, chunk_size=chunk_size, blocks=blocks,
    )  # fmt: skip
    return partial.sum(dim=1)  # (2, N)
