"""Triton kernel for a margin's per-row statistics pass: the ``N×C`` cosines stay on chip.

Some margins need, before the loss, a sum over every non-target class of each row
(:meth:`~marginface.margins.base.Margin.row_statistics_size`); those that declare it as one of
:data:`~marginface.margins.base.ROW_STATISTICS_KERNELS` get it here when the call runs on the
Triton kernels. The one declared rule, ``"above_threshold"`` (NPCFace's hard negatives), sums

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

# Compile-time (tl.constexpr) kernel arguments are UPPER_CASE, Triton's convention.
# ruff: noqa: N803

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from .kernel_options import Blocks, default_blocks
from .triton_kernels import _check, _cosine_tile, _dot_upcast, _precision

__all__ = ["above_threshold_sums"]


@triton.jit
def _above_threshold_kernel(
    x_ptr,
    w_ptr,
    inv_norm_ptr,
    label_ptr,
    threshold_ptr,
    sum_ptr,
    count_ptr,
    rows_total,
    classes,
    dim,
    chunk,
    stride_x,
    stride_w,
    K: tl.constexpr,
    PRECISION: tl.constexpr,
    DOT_UPCAST: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Program ``(row block, chunk)``: the chunk's ``(S_i, H_i)`` of its rows."""
    pid_n = tl.program_id(0)
    pid_c = tl.program_id(1)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < rows_total
    label = tl.load(label_ptr + rows, mask=row_ok, other=-1)
    threshold = tl.load(threshold_ptr + rows, mask=row_ok, other=2.0)
    total = tl.zeros((BLOCK_N,), tl.float32)
    count = tl.zeros((BLOCK_N,), tl.float32)
    lo = pid_c * chunk
    hi = tl.minimum(lo + chunk, classes)
    for c0 in range(lo, hi, BLOCK_C):
        cols = c0 + tl.arange(0, BLOCK_C)
        col_ok = cols < hi
        cos, _ = _cosine_tile(
            x_ptr, w_ptr, inv_norm_ptr, rows, cols, row_ok, col_ok, dim, stride_x, stride_w,
            K, PRECISION, DOT_UPCAST, BLOCK_N, BLOCK_C, BLOCK_D,
        )  # fmt: skip
        keep = row_ok[:, None] & col_ok[None, :] & (cols[None, :] != label[:, None])
        hard = keep & (cos > threshold[:, None])
        total += tl.sum(tl.where(hard, cos, 0.0), axis=1)
        count += tl.sum(tl.where(hard, 1.0, 0.0), axis=1)
    out = pid_c.to(tl.int64) * rows_total + rows
    tl.store(sum_ptr + out, total, mask=row_ok)
    tl.store(count_ptr + out, count, mask=row_ok)


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

    Args:
        x_hat: ``Tensor[N, D]`` normalized embeddings, in the GEMM dtype (float32/bf16/fp16).
        weight: ``Tensor[C·K, D]`` raw centers, same dtype as ``x_hat``.
        inv_norms: ``Tensor[C·K]`` float32, ``1/max(‖w‖, eps)``.
        labels: ``Tensor[N]`` int64, the target column of each row (a value outside
            ``[0, C)``: no target among these classes).
        threshold: ``Tensor[N]``, the per-row ``τ_i`` (read as float32).
        sub_centers: ``K``.
        chunk_size: classes per program.
        blocks: tile sizes; default :func:`~marginface.executors.kernel_options.default_blocks`.

    Returns:
        ``Tensor[2, N]`` float32: the sums ``S`` and the counts ``H``.
    """
    _check(x_hat, weight, sub_centers)
    n, dim = x_hat.shape
    if threshold.shape != (n,):
        raise ValueError(f"threshold must have shape ({n},), got {tuple(threshold.shape)}")
    classes = weight.shape[0] // sub_centers
    blocks = blocks or default_blocks(n, min(chunk_size, classes), dim)
    chunks = triton.cdiv(classes, chunk_size)
    partial = torch.empty(2, chunks, n, dtype=torch.float32, device=x_hat.device)
    _above_threshold_kernel[(triton.cdiv(n, blocks.n), chunks)](
        x_hat, weight, inv_norms, labels.contiguous(),
        threshold.to(torch.float32).contiguous(), partial[0], partial[1],
        n, classes, dim, chunk_size, x_hat.stride(0), weight.stride(0),
        K=sub_centers, PRECISION=_precision(x_hat.dtype), DOT_UPCAST=_dot_upcast(x_hat.dtype),
        BLOCK_N=blocks.n, BLOCK_C=blocks.c, BLOCK_D=blocks.d,
        num_warps=blocks.warps, num_stages=blocks.stages,
    )  # fmt: skip
    return partial.sum(dim=1)  # (2, N)
