"""The chunked (fused) executor: margin softmax cross-entropy without the ``N×C`` logits.

This module holds the two entry points, :func:`chunked_margin_cross_entropy` and
:func:`sharded_margin_cross_entropy`; the algorithm lives in one chunk loop
(:mod:`~marginface.executors.chunk_plan`: the prologue; :mod:`~marginface.executors.chunk_loop`:
the forward and backward passes; :mod:`~marginface.executors.chunk_workspace`: the chunk GEMM
and its buffers; :mod:`~marginface.executors.triton_dispatch`: the same passes on the Triton
kernels), wrapped twice: as custom operators that ``torch.compile`` traces without a graph break
(:mod:`~marginface.executors.fused_op`, the margins whose non-target rule is compiled in) and as
an autograd Function (:mod:`~marginface.executors.chunked_function`: any rule, row blocks, the
sharded head), each one for both loss families: binary margins go to
:func:`~marginface.executors.binary_loop.binary_loss`. docs/fused.md describes the design.

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

import math
from collections.abc import Mapping

import torch
from torch import Tensor

from .._validation import check_int
from ..margins.base import Margin
from .backend import Backend, choose_backend, triton_available
from .binary_loop import binary_loss
from .chunk_plan import (
    DEFAULT_CHUNK_BYTES,
    KERNELS,
    KERNELS_ENV,
    MIN_DEFAULT_CHUNK,
    check_chunk_arguments,
    check_chunkable,
    check_sampled_classes,
    default_chunk_size,
    gemm_dtype,
    scale_in_gemm,
    scale_per_row,
)
from .chunk_workspace import PROJECTION_BLOCK, ROW_DOT_BLOCK
from .chunked_function import ChunkedMarginCrossEntropy, stack_class_values
from .dense import compute_dtype, row_norms
from .fused_op import (
    RULE_IDENTITY,
    SOFTMAX_OPS,
    nontarget_rule,
    prologue,
    row_statistics_call,
    row_statistics_code,
)
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
            run. Resolved once per call, with the autograd path, by
            :func:`~marginface.executors.backend.choose_backend`, and passed down.
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
    binary = margin.objective == "binary"  # one-vs-all: Σ softplus instead of log-sum-exp
    if binary and row_block is not None:
        raise ValueError(
            f"row_block tiles the softmax reduction; {type(margin).__name__} is one-vs-all "
            f"(got row_block={row_block!r}): use impl='chunked'"
        )
    sub_centers, chunk_size, sampled_classes = check_chunk_arguments(
        weight, sub_centers, chunk_size, sampled_classes
    )
    if row_block is not None:
        row_block = check_int("row_block", row_block, minimum=1)
    backend = choose_backend(margin, embeddings, weight, kernels=kernels, row_block=row_block)
    if binary:
        return binary_loss(
            embeddings, weight, labels, labels, margin, None, backend, sub_centers=sub_centers,
            chunk_size=chunk_size, sampled_classes=sampled_classes,
        )  # fmt: skip
    if backend.custom_ops:  # a compiled-in rule: no graph break under compile
        dtype = compute_dtype(embeddings, weight)
        with torch.autocast(device_type=embeddings.device.type, enabled=False):
            x = embeddings.to(dtype)
            loss = _fused_cross_entropy(
                x, weight, labels, margin, backend, sub_centers=sub_centers,
                chunk_size=chunk_size, sampled_classes=sampled_classes, class_values=class_values,
            )  # fmt: skip
            return margin_loss(loss, margin, row_norms(x) if margin.requires_norms else None)
    # Row blocks, another non-target rule: the autograd Function (a graph break under compile).
    return _function_loss(
        embeddings, weight, labels, labels, margin, None, sub_centers, chunk_size, backend,
        sampled_classes, class_values, row_block,
    )  # fmt: skip


def sharded_margin_cross_entropy(
    embeddings: Tensor,
    weight: Tensor,
    local_labels: Tensor,
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
        local_labels: ``Tensor[N_global]`` int64, each row's class among ``weight``'s (among
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
    sampled_classes = check_sampled_classes(sampled_classes, weight)
    backend = choose_backend(margin, embeddings, weight, kernels=kernels, shard=shard)
    if margin.objective == "binary":  # one-vs-all: Σ softplus, the sums all-reduced
        return binary_loss(
            embeddings, weight, local_labels, labels, margin, shard, backend,
            sub_centers=sub_centers, chunk_size=chunk_size, sampled_classes=sampled_classes,
        )  # fmt: skip
    return _function_loss(
        embeddings, weight, local_labels, labels, margin, shard, sub_centers, chunk_size,
        backend, sampled_classes, class_values, None,
    )  # fmt: skip


def _function_loss(
    embeddings: Tensor,
    weight: Tensor,
    local_labels: Tensor,
    labels: Tensor,
    margin: Margin,
    shard: ClassShard | None,
    sub_centers: int,
    chunk_size: int | None,
    backend: Backend,
    sampled_classes: Tensor | None,
    class_values: Mapping[str, Tensor] | None,
    row_block: int | None,
) -> Tensor:
    """The softmax loss ``Tensor[N]`` (the regularizer added, placed on a sharded head) on the
    autograd Function (:class:`~.chunked_function.ChunkedLoss`), the arguments checked, the
    per-chunk work where ``backend`` says."""
    dtype = compute_dtype(embeddings, weight)
    gemm = gemm_dtype(embeddings, weight)
    with torch.autocast(device_type=embeddings.device.type, enabled=False):
        x = embeddings.to(dtype)
        grad = torch.is_grad_enabled()  # the row blocks form the gradients in the forward
        gradients = (grad and x.requires_grad, grad and weight.requires_grad)
        names, stacked = stack_class_values(margin, class_values)
        loss = ChunkedMarginCrossEntropy.apply(
            x, weight, local_labels, labels, margin, sub_centers, chunk_size, gemm,
            backend.triton, shard, sampled_classes, row_block, gradients, names, stacked,
        )  # fmt: skip
        norms = row_norms(x) if margin.requires_norms else None  # (n_r,)
        if shard is None:
            return margin_loss(loss, margin, norms)
        rows = shard.rows

        def place(extra: Tensor) -> Tensor:  # (n_r,) -> (N,), the same on every rank
            gathered = shard.gather_rows(extra.detach())  # (N,), only this rank's rows keep
            return torch.cat([gathered[: rows.start], extra, gathered[rows.stop :]])

        return margin_loss(loss, margin, norms, place_regularizer=place)


def _fused_cross_entropy(
    x: Tensor,
    weight: Tensor,
    labels: Tensor,
    margin: Margin,
    backend: Backend,
    *,
    sub_centers: int,
    chunk_size: int | None,
    sampled_classes: Tensor | None = None,
    class_values: Mapping[str, Tensor] | None = None,
) -> Tensor:
    """The chunked executor's cross-entropy ``Tensor[N]`` (without the regularizer) through the
    custom ops: traceable by ``torch.compile`` without a graph break.

    Args:
        x: ``Tensor[N, D]`` in the compute dtype (float32/float64), autocast off.
        weight: ``Tensor[C·K, D]``, labels: ``Tensor[N]`` int64 in ``[0, C)`` (in ``[0, S)``:
            positions in ``sampled_classes``, if given).
        margin: a margin whose :func:`~.fused_op.nontarget_rule` is not None.
        backend: the call's :class:`~.backend.Backend` (a custom-op path): compiled operators
            or their eager twin, on the Triton kernels or PyTorch ops.
        sub_centers, chunk_size, sampled_classes, class_values: as
            :func:`~marginface.executors.chunked.chunked_margin_cross_entropy` (the per-class
            values enter the target's small graph of ``N``-vectors, so autograd differentiates
            them).
    """
    n, k, sample = x.shape[0], sub_centers, sampled_classes
    rule = nontarget_rule(margin)  # the declared rule's code (the backend checked it is one)
    kernels, compiled = backend.kernels, backend.compiled  # chosen once, at the call's entry
    start = prologue(x, weight, labels, k, sample, chunk_size)
    x_hat, norms, cos_raw, target_rows, chunk_size = start
    cos_target = cos_raw.clamp(-1.0, 1.0)  # (N,)
    norms_arg = norms if margin.requires_norms else None
    empty = x.new_empty(0)
    statistics_scale = margin.statistics_scale()
    statistics_code = row_statistics_code(margin)
    if statistics_code is not None:  # per-row sums over the classes, one more pass
        with torch.no_grad():
            parameters = margin.row_statistics_kernel_parameters(cos_target)
            threshold = parameters.get("threshold", empty).reshape(-1).to(x.dtype)  # (N,)
            sums = row_statistics_call(
                x_hat.detach(), weight.detach(), labels, threshold, k, chunk_size,
                statistics_code, kernels, sample, compiled=compiled,
            )  # fmt: skip
        context = margin.prepare_with_row_statistics(cos_target, labels, norms_arg, sums)
    elif statistics_scale is not None:
        with torch.no_grad():  # log B at the old scale: one more pass over the classes
            old = scale_per_row(statistics_scale, n, x)  # (N,)
            per_row, _, _ = SOFTMAX_OPS.call(
                x_hat.detach(), weight.detach(), labels, target_rows, cos_raw, old, empty,
                empty, RULE_IDENTITY, k, chunk_size, kernels, sample, compiled=compiled,
            )  # fmt: skip
            log_b = torch.logsumexp(per_row, dim=0) - math.log(n)
        context = margin.prepare_with_statistics(cos_target, labels, norms_arg, log_b)
    else:
        context = margin.prepare(cos_target, labels, norms_arg)
    context = margin.with_class_values(context, class_values)
    threshold, t = empty, empty
    if rule != RULE_IDENTITY:
        parameters = margin.nontarget_kernel_parameters(context)
        if "threshold" in parameters:
            threshold = parameters["threshold"].detach().reshape(n).to(x.dtype)  # (N,)
        if "t" in parameters:
            t = torch.as_tensor(parameters["t"], dtype=x.dtype, device=x.device).detach()
    row_scale = scale_per_row(context["scale"], n, x)  # (N,), a gradient for SphereFace's ‖x‖
    lse_nt, cos_pass, _ = SOFTMAX_OPS.call(
        x_hat, weight, labels, target_rows, cos_raw, row_scale, threshold, t, rule, k,
        chunk_size, kernels, sample, compiled=compiled,
    )  # fmt: skip
    target = margin.adjusted_target_cosine(cos_pass.clamp(-1.0, 1.0), norms_arg, context)
    target_logit = target.to(x.dtype) * row_scale  # (N,)
    return torch.logaddexp(lse_nt, target_logit) - target_logit
