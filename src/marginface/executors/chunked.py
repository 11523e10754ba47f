"""The chunked (fused) executor: margin softmax cross-entropy without the ``N×C`` logits.

This module holds the two entry points, :func:`chunked_margin_cross_entropy` and
:func:`sharded_margin_cross_entropy`; the algorithm lives in one chunk loop
(:mod:`~marginface.executors.chunk_plan`: the prologue; :mod:`~marginface.executors.chunk_loop`:
the forward and backward passes; :mod:`~marginface.executors.chunk_workspace`: the chunk GEMM
and its buffers; :mod:`~marginface.executors.triton_dispatch`: the same passes on the Triton
kernels), wrapped twice: as custom operators that ``torch.compile`` traces without a graph break
(:mod:`~marginface.executors.fused_op`, the margins whose non-target rule is compiled in) and as
an autograd Function (:mod:`~marginface.executors.chunked_function`: any rule, the sharded
head). docs/fused.md describes the design.

The classes are visited in chunks of ``chunk_size``. Each chunk's cosines are one GEMM of the
normalized embeddings with the chunk's raw class centers, scaled per column by the centers'
inverse norms (weight normalization fused: no normalized copy of the weight is ever made). The
margin's non-target hook and scale turn them into logits, the target column is excluded, and the
chunk is reduced to per-row partial statistics ``(max, Σexp)``
(:mod:`~marginface.executors._online_softmax`) that merge exactly across chunks -- or across
processes holding different slices of the classes.

The target cosine is an indexed dot ``x̂_i·w_{y_i}/‖w_{y_i}‖``; the margin is applied to it
exactly, through the margin's own hooks, *before* it enters the log-sum-exp:

.. math:: L_i = \\log\\Big(e^{s_i f(\\cos\\theta_{iy_i})}
          + \\sum_{j\\ne y_i} e^{s_i g(\\cos\\theta_{ij})}\\Big) - s_i f(\\cos\\theta_{iy_i})
          + R(\\|x_i\\|)

The backward recomputes each chunk's cosines (a fourth GEMM; nothing of size ``N×C`` is saved)
and writes each chunk's weight gradient, through ``w/‖w‖``, straight into the weight's gradient.
Extra memory is ``O(N·chunk + chunk·D)`` beyond the weight and its gradient.

Partial FC (``sampled_classes``): the loop runs over the sampled classes only, gathering each
chunk's rows from the whole weight into a reused buffer and writing each chunk's weight gradient
into those rows of one weight-sized gradient (zero elsewhere), so the extra memory stays
``O(N·chunk + chunk·D)``: no copy of the ``S·K×D`` sampled rows, nor of their gradient.

The per-chunk work (GEMM, non-target rule, online log-sum-exp, and the backward's recomputation)
runs either as PyTorch ops (``kernels="torch"``, the reference) or as the Triton kernels of
:mod:`~marginface.executors.triton_kernels` (``kernels="triton"``), which keep each tile of logits
on chip; ``"auto"`` (default) takes Triton for CUDA tensors when triton imports. The N-sized
target math is the same PyTorch code either way.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from .._validation import check_int
from ..margins.base import Margin
from .binary_loop import chunked_binary_loss, sharded_binary_loss
from .chunk_plan import (
    DEFAULT_CHUNK_BYTES,
    KERNELS,
    KERNELS_ENV,
    MIN_DEFAULT_CHUNK,
    check_chunkable,
    check_sampled_classes,
    default_chunk_size,
    gemm_dtype,
    requested_kernels,
    scale_in_gemm,
    triton_available,
)
from .chunk_workspace import PROJECTION_BLOCK, ROW_DOT_BLOCK
from .chunked_function import ChunkedMarginCrossEntropy, stack_class_values
from .dense import compute_dtype, row_norms
from .fused_op import fused_margin_cross_entropy, nontarget_rule
from .margin_loss import margin_loss
from .sharding import ClassShard

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "KERNELS",
    "KERNELS_ENV",
    "MIN_DEFAULT_CHUNK",
    "PROJECTION_BLOCK",
    "ROW_DOT_BLOCK",
    "check_chunkable",
    "check_sampled_classes",
    "chunked_margin_cross_entropy",
    "default_chunk_size",
    "gemm_dtype",
    "scale_in_gemm",
    "sharded_margin_cross_entropy",
    "triton_available",
]


def chunked_margin_cross_entropy(
    embeddings: Tensor,
    weight: Tensor,
    labels: Tensor,
    margin: Margin,
    *,
    sub_centers: int = 1,
    chunk_size: int | None = None,
    kernels: str | None = None,
    sampled_classes: Tensor | None = None,
    class_values: Mapping[str, Tensor] | None = None,
    row_block: int | None = None,
) -> Tensor:
    """Per-sample margin softmax cross-entropy, never materializing the ``N×C`` logits.

    Same value and gradients as
    :func:`~marginface.executors.dense.dense_margin_cross_entropy` (up to rounding), with
    ``O(N·chunk_size·K)`` extra memory (one chunk's logits, reused from chunk to chunk).
    Stateful margins update exactly as on the dense path. AdaCos with ``dynamic=True`` in
    training mode takes one extra pass over the classes (its scale must be known before the
    logits are formed). Runs in float32 (float64 if an input is float64); a bf16/fp16 weight is
    multiplied in its own dtype, with fp32 normalization, margin and log-sum-exp.
    Supports one backward (no double backward).

    Args:
        embeddings: ``Tensor[N, D]``, unnormalized.
        weight: ``Tensor[C·K, D]`` class centers, unnormalized, class-major.
        labels: ``Tensor[N]`` int64 in ``[0, C)`` (not checked here; the heads check).
        margin: the margin; see :func:`check_chunkable` for which run chunked.
        sub_centers: ``K >= 1``. Chunks hold whole classes (``chunk_size·K`` weight rows).
        chunk_size: classes per chunk, ``>= 1``. Default: None,
            :func:`default_chunk_size` (a 16 MiB workspace: 8192 classes for N = 512, K = 1
            in float32, 5461 with a bf16 weight; with ``sampled_classes`` and D = 512, 2730
            and 3276).
        kernels: who runs the per-chunk work, one of :data:`KERNELS`. Default: None, read
            from the environment variable :data:`KERNELS_ENV` (``MARGINFACE_KERNELS``) once at
            this call's entry; unset means ``"auto"``: Triton for CUDA tensors when triton
            imports, for the non-target rules the margin declares compiled in
            (:meth:`~marginface.margins.base.Margin.nontarget_kernel`) and float32/bf16/fp16
            GEMMs; else PyTorch. ``"triton"`` raises ``ValueError`` where the kernels cannot
            run. Resolved once per call and passed down to the chunk loop.
        sampled_classes: Partial FC's sample, ``int64[S]``: sorted distinct classes in
            ``[0, C)`` (not checked here; the heads build it). The softmax then runs over these
            ``S`` classes only, ``labels`` are positions in ``sampled_classes`` (in
            ``[0, S)``), and the sampled rows are read from ``weight`` in place, one chunk at a
            time: the same loss and gradients as passing ``weight.view(C, K, D)
            [sampled_classes].reshape(-1, D)``, without that ``S·K×D`` copy or its gradient
            (the weight's gradient is ``Tensor[C·K, D]``, exactly 0 outside the sample).
            Default: None (every class).
        class_values: ``{name: Tensor[N]}``, the margin's per-class parameters at each row's
            target class (:meth:`~marginface.margins.base.Margin.class_parameters`; the head
            gathers them), or None. Their gradient is an ``N``-vector's: no ``N×C`` term.
        row_block: tile the rows too: blocks of ``row_block >= 1`` rows, each run forward and
            backward in one pass over the classes (3 GEMMs per chunk instead of 4: the
            backward reads the forward's kept products), holding a ``row_block × C·K`` store
            of products in the GEMM dtype instead of ``N × chunk_size·K``
            (:func:`~marginface.executors.chunk_loop.row_block_pass`). The gradients are formed
            in the forward for an upstream gradient that is the same for every row
            (``reduction="mean"``/``"sum"``, scaled in the backward); any other upstream
            gradient is exact too but pays the class-chunked backward on top. PyTorch ops only
            (``kernels="triton"`` raises ``ValueError``); an autograd Function, so
            ``torch.compile`` breaks the graph here. Default: None (tile the classes only).
            docs/fused.md, "Row blocks", says when it is the faster.

    Returns:
        ``Tensor[N]``, float32 (or float64).
    """
    check_chunkable(margin)
    if margin.objective == "binary":  # one-vs-all: Σ softplus instead of log-sum-exp
        if row_block is not None:
            raise ValueError(
                f"row_block tiles the softmax reduction; {type(margin).__name__} is one-vs-all "
                f"(got row_block={row_block!r}): use impl='chunked'"
            )
        return chunked_binary_loss(
            embeddings, weight, labels, margin, sub_centers=sub_centers, chunk_size=chunk_size,
            kernels=kernels, sampled_classes=sampled_classes,
        )  # fmt: skip
    sampled_classes = check_sampled_classes(sampled_classes, weight)
    if chunk_size is not None:
        chunk_size = check_int("chunk_size", chunk_size, minimum=1)
    if row_block is not None:
        row_block = check_int("row_block", row_block, minimum=1)
    sub_centers = check_int("sub_centers", sub_centers, minimum=1)
    kernels = requested_kernels(kernels)  # the environment variable, read once
    if weight.dim() != 2 or weight.shape[0] % sub_centers:
        raise ValueError(
            f"weight must have shape (C·K, D) with K = sub_centers = {sub_centers}, "
            f"got {tuple(weight.shape)}"
        )
    dtype = compute_dtype(embeddings, weight)
    gemm = gemm_dtype(embeddings, weight)
    rule = nontarget_rule(margin)
    with torch.autocast(device_type=embeddings.device.type, enabled=False):
        x = embeddings.to(dtype)
        if row_block is not None:  # the row-block tiling, on the autograd Function
            grad = torch.is_grad_enabled()
            gradients = (grad and x.requires_grad, grad and weight.requires_grad)
            names, stacked = stack_class_values(margin, class_values)
            loss = ChunkedMarginCrossEntropy.apply(
                x, weight, labels, labels, margin, sub_centers, chunk_size, gemm, kernels,
                None, sampled_classes, row_block, gradients, names, stacked,
            )  # fmt: skip
        elif rule is not None:  # the custom ops: torch.compile traces them without graph breaks
            loss = fused_margin_cross_entropy(
                x,
                weight,
                labels,
                margin,
                rule,
                sub_centers=sub_centers,
                chunk_size=chunk_size,
                kernels=kernels,
                sampled_classes=sampled_classes,
                class_values=class_values,
            )
        else:  # another non-target rule: the autograd Function (a graph break under compile)
            names, stacked = stack_class_values(margin, class_values)
            loss = ChunkedMarginCrossEntropy.apply(
                x, weight, labels, labels, margin, sub_centers, chunk_size, gemm, kernels,
                None, sampled_classes, None, (True, True), names, stacked,
            )  # fmt: skip
        norms = row_norms(x) if margin.requires_norms else None  # (N,)
        return margin_loss(loss, margin, norms)


def sharded_margin_cross_entropy(
    embeddings: Tensor,
    weight: Tensor,
    targets: Tensor,
    labels: Tensor,
    margin: Margin,
    shard: ClassShard,
    *,
    sub_centers: int = 1,
    chunk_size: int | None = None,
    kernels: str | None = None,
    sampled_classes: Tensor | None = None,
    class_values: Mapping[str, Tensor] | None = None,
) -> Tensor:
    """Per-sample margin softmax cross-entropy of the *global* batch, classes sharded over the
    ranks of ``shard`` (:mod:`~marginface.executors.sharding`).

    Every rank calls it with its own rows; the embeddings are all-gathered, each rank runs the
    chunked executor over its own classes, and the partial results merge by all-reductions, so
    every rank returns the same ``Tensor[N_global]``. No rank holds more than
    ``N_global × chunk_size·K`` logits. The labels were checked and gathered by the caller
    (:meth:`~marginface.executors.sharding.ClassShard.gather_metadata`).

    Args:
        embeddings: ``Tensor[n_r, D]``, this rank's rows (``n_r`` may differ between ranks).
        weight: ``Tensor[c·K, D]``, the centers of this rank's classes.
        targets: ``Tensor[N_global]`` int64, each row's class among ``weight``'s (among
            ``sampled_classes``, if given), ``-1`` where another rank owns it.
        labels: ``Tensor[N_global]`` int64, the global labels (what the margin sees).
        margin: the margin (every margin that runs chunked).
        shard: this rank's :class:`~marginface.executors.sharding.ClassShard` (its ``counts``
            set for this step).
        sub_centers, chunk_size, kernels: as :func:`chunked_margin_cross_entropy`.
        sampled_classes: this rank's Partial FC sample, ``int64[S_r]`` sorted distinct classes
            of ``weight`` (local indices), read in place as in
            :func:`chunked_margin_cross_entropy`; the softmax runs over every rank's sample.
            Default: None (every class).
        class_values: ``{name: Tensor[N_global]}``, the margin's per-class parameters at each
            row's target class, from *this rank's* classes (0 where another rank owns the
            target); summed over the ranks inside, and each rank's own parameters get their
            gradient. None when the margin declares none.

    Returns:
        ``Tensor[N_global]``, float32 (or float64), identical on every rank. The gradient
        reaching ``embeddings`` is this rank's rows of the gradient of the global loss.
    """
    check_chunkable(margin)
    if margin.objective == "binary":  # one-vs-all: Σ softplus, the sums all-reduced
        return sharded_binary_loss(
            embeddings, weight, targets, labels, margin, shard, sub_centers=sub_centers,
            chunk_size=chunk_size, kernels=kernels, sampled_classes=sampled_classes,
        )  # fmt: skip
    sampled_classes = check_sampled_classes(sampled_classes, weight)
    kernels = requested_kernels(kernels)  # the environment variable, read once
    dtype = compute_dtype(embeddings, weight)
    gemm = gemm_dtype(embeddings, weight)
    with torch.autocast(device_type=embeddings.device.type, enabled=False):
        x = embeddings.to(dtype)
        names, stacked = stack_class_values(margin, class_values)
        loss = ChunkedMarginCrossEntropy.apply(
            x, weight, targets, labels, margin, sub_centers, chunk_size, gemm, kernels, shard,
            sampled_classes, None, (True, True), names, stacked,
        )  # fmt: skip
        norms = row_norms(x) if margin.requires_norms else None  # (n_r,)
        rows = shard.rows

        def place(extra: Tensor) -> Tensor:  # (n_r,) -> (N,), the same on every rank
            gathered = shard.gather_rows(extra.detach())  # (N,), only this rank's rows keep
            return torch.cat([gathered[: rows.start], extra, gathered[rows.stop :]])

        return margin_loss(loss, margin, norms, place_regularizer=place)
