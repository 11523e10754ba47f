"""The chunk loop on the Triton kernels (:mod:`~marginface.executors.triton_kernels`).

Plain functions with the same contract as the PyTorch passes of
:mod:`~marginface.executors.chunk_loop`, which calls them when the call chose the Triton
kernels (:func:`~marginface.executors.chunk_plan.use_triton_kernels`, once per call). The
kernels see only what is elementwise per logit; the non-target rule reaches them as a
:class:`~marginface.executors.triton_kernels.NonTargetRule` (:func:`kernel_rule`).
:mod:`triton` is imported only when one of these functions runs.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..margins.rules import declared_rule
from ._online_softmax import empty_statistics, merge_statistics
from .chunk_workspace import ChunkWorkspace
from .kernel_options import NonTargetRule

__all__ = ["kernel_rule", "triton_gradient", "triton_row_statistics", "triton_statistics"]


def kernel_rule(
    kind: str, parameters: dict[str, Tensor], rows: int, device: torch.device
) -> NonTargetRule:
    """The rule ``kind`` with the margin's ``parameters``
    (:meth:`~marginface.margins.base.Margin.nontarget_kernel_parameters`) as the kernels'
    :class:`~marginface.executors.kernel_options.NonTargetRule`, as its declaration
    (:data:`~marginface.margins.rules.NONTARGET_RULES`) says: a per-row ``threshold`` and a
    per-row ``t`` (scalars, ``[N]`` or ``[N, 1]``) as float32 ``[N]`` vectors, the scalars of
    ``t`` (``[a, b]``, ``[α, σ]``, ``[m]``, ``[m, straight]``) as the float32 ``constants``
    (zero-padded to 2). ``ValueError`` naming an unknown ``kind`` and the known ones.

    No value is read back to the host (the constants stay tensors on ``device``).
    """
    declared = declared_rule(kind)

    def per_row(name: str) -> Tensor:  # (N,) float32
        value = torch.as_tensor(parameters[name], dtype=torch.float32, device=device)
        return value.reshape(-1).expand(rows).contiguous()

    constants = None
    if declared.constants:
        t = torch.as_tensor(parameters["t"], dtype=torch.float32, device=device).reshape(-1)
        constants = torch.zeros(2, dtype=torch.float32, device=device)
        constants[: t.numel()] = t  # (2,): [a, b], [α, σ], [m, 0] or [m, straight]
    return NonTargetRule(
        threshold=per_row("threshold") if declared.threshold else None,
        t=per_row("t") if declared.row_t else None,
        kind=kind,
        constants=constants,
    )


def triton_statistics(
    chunks: ChunkWorkspace, scale_rows: Tensor, rule: Any
) -> tuple[Tensor, Tensor]:
    """Merged ``(max, Σexp)`` of the non-target logits over every chunk, ``Tensor[N]`` each
    (the kernels' :func:`~marginface.executors.triton_kernels.nontarget_statistics`)."""
    from .triton_kernels import nontarget_statistics

    scale_rows = scale_rows.contiguous()
    if chunks.sample is not None:
        return _sampled_statistics(chunks, scale_rows, rule)
    return nontarget_statistics(
        chunks.x_gemm,
        chunks.weight,
        chunks.inv_norms,
        chunks.labels,
        scale_rows,
        rule,
        sub_centers=chunks.k,
        chunk_size=chunks.chunk_size,
    )


def triton_row_statistics(chunks: ChunkWorkspace, kind: str, threshold: Tensor) -> Tensor:
    """A margin's declared per-row statistics ``kind`` (one of
    :data:`~marginface.margins.base.ROW_STATISTICS_KERNELS`) over every non-target class of
    ``chunks`` (every sampled one) by the kernel of
    :mod:`~marginface.executors.triton_row_statistics`: ``Tensor[k, N]`` float32, as
    :func:`~marginface.executors.chunk_loop.row_statistics` gives. ``threshold``: the rule's
    per-row ``τ`` (``Tensor[N]``)."""
    from .triton_row_statistics import above_threshold_sums

    if kind != "above_threshold":
        raise ValueError(f"kind must be 'above_threshold', got {kind!r}")
    k = chunks.k
    with torch.no_grad():
        threshold = threshold.reshape(-1).to(torch.float32).contiguous()  # (N,)
        if chunks.sample is None:
            return above_threshold_sums(
                chunks.x_gemm, chunks.weight, chunks.inv_norms, chunks.labels, threshold,
                sub_centers=k, chunk_size=chunks.chunk_size,
            )  # fmt: skip
        total = threshold.new_zeros(2, chunks.x_hat.shape[0])  # (2, N)
        for start, stop in chunks.ranges():  # each chunk's sampled rows gathered once
            total += above_threshold_sums(
                chunks.x_gemm,
                chunks.weight_rows(start, stop),
                chunks.inv_norms[start * k : stop * k].contiguous(),
                chunks.labels - start,  # outside [0, stop - start): not in this chunk
                threshold,
                sub_centers=k,
                chunk_size=stop - start,
            )
        chunks.release()
    return total


def triton_gradient(
    chunks: ChunkWorkspace,
    rule: Any,
    scale: Tensor,
    lse: Tensor,
    grad: Tensor,
    grad_x_hat: Tensor,
    grad_weight: Tensor | None,
    grad_scale: Tensor | None,
) -> None:
    """The backward's pass over the chunks by the kernels: add the non-target part of
    ``∂L/∂x̂`` (and of ``∂L/∂s`` into ``grad_scale``), write every row of ``grad_weight``
    (see :func:`~marginface.executors.chunk_loop.nontarget_gradient`)."""
    scale, lse, grad = scale.contiguous(), lse.contiguous(), grad.contiguous()
    if chunks.sample is not None:  # one pass, each chunk's sampled rows gathered once
        _sampled_backward(chunks, rule, scale, lse, grad, grad_x_hat, grad_weight, grad_scale)
        return
    _embedding_gradient(chunks, rule, scale, lse, grad, grad_x_hat, grad_scale)
    if grad_weight is not None:
        _weight_gradient(chunks, rule, scale, lse, grad, grad_weight)


def _embedding_gradient(
    chunks: ChunkWorkspace,
    rule: Any,
    scale: Tensor,
    lse: Tensor,
    grad: Tensor,
    grad_x_hat: Tensor,
    grad_scale: Tensor | None,
) -> None:
    """Add the non-target part of ``∂L/∂x̂`` (and of ``∂L/∂s`` if wanted) by the Triton kernel."""
    from .triton_kernels import embedding_gradient

    part_x, part_scale = embedding_gradient(
        chunks.x_gemm,
        chunks.weight,
        chunks.inv_norms,
        chunks.labels,
        scale.contiguous(),
        rule,
        lse.contiguous(),
        grad.contiguous(),
        sub_centers=chunks.k,
        chunk_size=chunks.chunk_size,
    )
    grad_x_hat += part_x.to(grad_x_hat.dtype)
    if grad_scale is not None:
        grad_scale += part_scale.to(grad_scale.dtype)


def _weight_gradient(
    chunks: ChunkWorkspace,
    rule: Any,
    scale: Tensor,
    lse: Tensor,
    grad: Tensor,
    grad_weight: Tensor,
) -> None:
    """Write the non-target part of ``∂L/∂W`` chunk by chunk (Triton kernel, then the projection
    through ``w/‖w‖``): float32 rows of ``grad_weight`` are accumulated in place, other dtypes
    through one float32 chunk."""
    from .triton_kernels import weight_gradient

    k = chunks.k
    scale, lse, grad = scale.contiguous(), lse.contiguous(), grad.contiguous()
    for start, stop in chunks.ranges():
        rows = grad_weight[start * k : stop * k]
        in_place = rows.dtype == torch.float32 and rows.is_contiguous()
        partial = weight_gradient(
            chunks.x_gemm,
            chunks.weight,
            chunks.inv_norms,
            chunks.labels,
            scale,
            rule,
            lse,
            grad,
            sub_centers=k,
            start=start,
            stop=stop,
            out=rows if in_place else None,
        )  # (c·K, D), float32
        chunks.project_into(grad_weight, start, stop, partial)


def _sampled_statistics(
    chunks: ChunkWorkspace, scale_rows: Tensor, rule: Any
) -> tuple[Tensor, Tensor]:
    """:func:`triton_statistics` over a sample: one kernel launch per chunk, on the chunk's
    gathered rows (the labels shifted to the chunk's columns), merged in PyTorch."""
    from .triton_kernels import nontarget_statistics

    k = chunks.k
    stats = empty_statistics(chunks.x_hat.shape[0], dtype=torch.float32, device=scale_rows.device)
    for start, stop in chunks.ranges():
        part = nontarget_statistics(
            chunks.x_gemm,
            chunks.weight_rows(start, stop),
            chunks.inv_norms[start * k : stop * k].contiguous(),
            chunks.labels - start,  # outside [0, stop - start): not in this chunk
            scale_rows,
            rule,
            sub_centers=k,
            chunk_size=stop - start,
        )
        stats = merge_statistics(stats, part)
    chunks.release()
    return stats


def _sampled_backward(
    chunks: ChunkWorkspace,
    rule: Any,
    scale: Tensor,
    lse: Tensor,
    grad: Tensor,
    grad_x_hat: Tensor,
    grad_weight: Tensor | None,
    grad_scale: Tensor | None,
) -> None:
    """:func:`_embedding_gradient` and :func:`_weight_gradient` over a sample: per chunk,
    its rows gathered once, both kernels on them, its weight gradient stored into its rows of
    ``grad_weight``."""
    from .triton_kernels import embedding_gradient, weight_gradient

    k = chunks.k
    scale, lse, grad = scale.contiguous(), lse.contiguous(), grad.contiguous()
    for start, stop in chunks.ranges():
        centers = chunks.weight_rows(start, stop)  # (c·K, D), gathered
        inv_norms = chunks.inv_norms[start * k : stop * k].contiguous()  # (c·K,)
        labels = chunks.labels - start  # (N,), the chunk's columns
        part_x, part_scale = embedding_gradient(
            chunks.x_gemm, centers, inv_norms, labels, scale, rule, lse, grad,
            sub_centers=k, chunk_size=stop - start,
        )  # fmt: skip
        grad_x_hat += part_x.to(grad_x_hat.dtype)
        if grad_scale is not None:
            grad_scale += part_scale.to(grad_scale.dtype)
        if grad_weight is None:
            continue
        rows = chunks.gradient_rows(grad_weight, start, stop)  # (c·K, D)
        partial = weight_gradient(
            chunks.x_gemm, centers, inv_norms, labels, scale, rule, lse, grad,
            sub_centers=k, start=0, stop=stop - start,
            out=rows if rows.dtype == torch.float32 else None,
        )  # fmt: skip
        chunks.project_into(grad_weight, start, stop, partial)
    chunks.release()
