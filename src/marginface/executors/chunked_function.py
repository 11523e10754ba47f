"""The chunked executor as an autograd Function: eager mode, the sharded head, Partial FC, and
any margin written through the hooks (any non-target rule, inter-class filtering).

A thin wrapper over the one chunk loop (:mod:`~marginface.executors.chunk_loop`): the prologue,
the margin's hooks on a small graph of ``N``-vectors (replayed in backward), one forward pass
(:func:`~marginface.executors.chunk_loop.nontarget_statistics`) and one backward pass
(:func:`~marginface.executors.chunk_loop.nontarget_gradient`). With a
:class:`~marginface.executors.sharding.ClassShard`, the embeddings are gathered first and the
partial results merge by all-reductions. ``torch.compile`` breaks the graph here; the margins
whose non-target rule is compiled in run on the custom operators of
:mod:`~marginface.executors.fused_op` instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from ..margins.base import ROW_STATISTICS_KERNELS, Context, Margin
from ._online_softmax import finish_log_sum_exp
from .chunk_loop import (
    ChunkRule,
    add_target_gradient,
    batch_log_b,
    chunk_rule_for_margin,
    nontarget_gradient,
    nontarget_statistics,
    row_block_pass,
    row_statistics,
    target_cosines,
)
from .chunk_plan import (
    chunk_size_for,
    normalized_with_norms,
    requested_kernels,
    scale_per_row,
    use_triton_kernels,
)
from .chunk_workspace import ChunkWorkspace, through_normalization
from .fused_op import row_statistics_rule
from .sharding import ClassShard
from .triton_dispatch import kernel_rule, triton_row_statistics

__all__ = ["ChunkedMarginCrossEntropy", "stack_class_values"]


class ChunkedMarginCrossEntropy(torch.autograd.Function):
    """``(x[n, D], weight[c·K, D]) -> loss[N]`` (the cross-entropy, without the regularizer).

    ``apply(x, weight, targets, labels, margin, sub_centers, chunk_size, gemm, kernels, shard,
    sample)``: ``x`` in the compute dtype (float32/float64), autocast off. ``targets[N]`` is
    each row's class among these weight rows (``-1`` when another rank owns it), ``labels[N]``
    its global class (what the margin sees). Without a shard ``n = N`` and ``targets`` are the
    labels; with a :class:`~.sharding.ClassShard`, ``x`` holds this rank's rows, which are
    gathered into the global batch of ``N`` rows first. ``sample`` (``int64[S]``, Partial FC's
    sorted classes of ``weight``): only those classes are computed with, read in place, and
    ``targets`` are positions in ``sample``; the weight's gradient is shard-sized, zero outside
    the sample. ``chunk_size`` None: :func:`~.chunk_plan.default_chunk_size` of the global
    batch. ``gemm``: the chunk GEMM's dtype (:func:`~.chunk_plan.gemm_dtype`). ``kernels``:
    one of :data:`~.chunk_plan.KERNELS` or None (the environment variable, read here), resolved
    once for the call. ``names``, ``class_values`` (:func:`stack_class_values`): the margin's
    per-class parameters at each row's target class, ``Tensor[P, N]`` (with a shard: from this
    rank's classes, 0 elsewhere, summed over the ranks here), or ``()`` and None; their gradient
    comes out of the margin's small graph.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        x: Tensor,
        weight: Tensor,
        targets: Tensor,
        labels: Tensor,
        margin: Margin,
        sub_centers: int,
        chunk_size: int | None,
        gemm: torch.dtype,
        kernels: str | None,
        shard: ClassShard | None,
        sample: Tensor | None,
        row_block: int | None = None,
        gradients: tuple[bool, bool] = (True, True),
        names: tuple[str, ...] = (),
        class_values: Tensor | None = None,
    ) -> Tensor:
        if shard is not None:
            x = shard.gather_rows(x)  # (N, D), the global batch
        if row_block is not None and shard is not None:
            raise ValueError("row_block does not apply to a sharded head (see docs/fused.md)")
        requested = requested_kernels(kernels)
        if row_block is not None and requested == "triton":
            raise ValueError(
                "row_block runs on PyTorch ops only, got kernels='triton'; use kernels='torch'"
            )
        triton = row_block is None and use_triton_kernels(requested, x, weight, margin)
        n, k = x.shape[0], sub_centers
        x_hat, norms = normalized_with_norms(x)  # (N, D), (N,)
        block_chunk = None
        if row_block is not None:  # the class chunks of one block of rows
            block_rows = x[: min(row_block, n)]
            block_chunk = chunk_size_for(block_rows, weight, k, sample, chunk_size)
        chunk_size = chunk_size_for(x, weight, k, sample, chunk_size)
        chunks = ChunkWorkspace(x_hat, weight, targets, k, chunk_size, gemm, sample=sample)

        # The target cosine: an indexed dot on the rank that owns the target, summed over ranks.
        cos_raw, target_rows = target_cosines(x_hat, weight, targets, k, sample)
        owned = targets >= 0  # (N,)
        if shard is not None:
            shard.all_sum_(cos_raw)

        # The margin's hooks on a small graph of N-vectors, replayed in backward.
        values_leaf = None  # (P, N), every row's target-class values, summed over the ranks
        if class_values is not None:
            values_leaf = class_values.detach().clone()
            if shard is not None:
                shard.all_sum_(values_leaf)
            values_leaf.requires_grad_(True)
        with torch.enable_grad():
            cos_leaf = cos_raw.detach().requires_grad_(True)
            norms_leaf = norms.detach().requires_grad_(True) if margin.requires_norms else None
            cos_target = cos_leaf.clamp(-1.0, 1.0)
            context = _prepare(margin, chunks, cos_target, labels, norms_leaf, shard, triton)
            if values_leaf is not None:
                rows = dict(zip(names, values_leaf.unbind(0), strict=True))
                context = margin.with_class_values(context, rows)
            target = margin.adjusted_target_cosine(cos_target, norms_leaf, context)  # (N,)
            row_scale = scale_per_row(context["scale"], n, x_hat)  # (N,)
            target_logit = target.to(x.dtype) * row_scale  # (N,)

        if not margin.nontarget_is_identity():
            for key, value in context.items():
                if key != "scale" and isinstance(value, Tensor) and value.requires_grad:
                    raise ValueError(
                        f"margin {type(margin).__name__}'s context[{key!r}] carries a gradient "
                        "into nontarget_cosine, which the chunked executor cannot propagate; "
                        "use impl='dense'"
                    )
        frozen = {key: v.detach() if isinstance(v, Tensor) else v for key, v in context.items()}
        rule = chunk_rule_for_margin(margin, frozen, rows=n, device=x.device, triton=triton)
        ctx.pending = None
        if row_block is not None and any(gradients):
            # Forward and backward in one pass per block of rows: the gradients of Σ lse_i,
            # kept for the backward, which scales them by the upstream gradient.
            pending = _RowBlockGradients(
                x_hat=torch.zeros_like(x_hat),  # (N, D)
                weight=_weight_gradient(weight, sample) if gradients[1] else None,
                scale=torch.zeros_like(norms) if row_scale.requires_grad else None,  # (N,)
            )
            lse = row_block_pass(
                chunks,
                rule,
                row_block=row_block,
                chunk_size=block_chunk,
                scale=row_scale.detach(),
                target_logit=target_logit.detach(),
                grad_x_hat=pending.x_hat,
                grad_weight=pending.weight,
                grad_scale=pending.scale,
            )
            ctx.pending = [pending]  # popped in backward: the weight gradient is handed over
        else:
            stats = nontarget_statistics(chunks, rule, row_scale.detach())
            if shard is not None:
                stats = shard.merge_statistics(stats)
            lse = finish_log_sum_exp(stats, target_logit.detach())  # (N,)

        ctx.save_for_backward(norms, x_hat, lse, target_rows, owned)
        ctx.shard, ctx.chunks, ctx.rule = shard, chunks, rule
        ctx.graph = (cos_leaf, norms_leaf, target_logit, row_scale, values_leaf)
        return lse - target_logit.detach()

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_loss: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        norms, x_hat, lse, target_rows, owned = ctx.saved_tensors
        shard: ClassShard | None = ctx.shard
        chunks: ChunkWorkspace = ctx.chunks
        rule: ChunkRule = ctx.rule
        cos_leaf, norms_leaf, target_logit, row_scale, values_leaf = ctx.graph
        grad = grad_loss.to(x_hat.dtype)  # (N,)
        scale = row_scale.detach()  # (N,)
        scale_grad = row_scale.requires_grad

        pending = ctx.pending.pop() if ctx.pending else None
        uniform = pending is not None and bool((grad == grad[:1]).all())
        if uniform:  # the row-block pass's gradients of Σ lse_i, times the one upstream γ
            grad_x_hat = pending.x_hat.mul_(grad.unsqueeze(1))  # (N, D), ∂L/∂x̂
            grad_weight = pending.weight
            if grad_weight is not None:
                grad_weight.mul_(grad[0].to(grad_weight.dtype))
            grad_scale = pending.scale.mul_(grad) if pending.scale is not None else None
        else:  # the class-chunked backward (4th GEMM), exact for any upstream gradient
            pending = None  # the row-block pass's buffers (if any) are freed first
            grad_x_hat = torch.zeros_like(x_hat)  # (N, D), ∂L/∂x̂
            grad_weight = None  # (C·K, D): every row (every sampled row) is written by a chunk
            if ctx.needs_input_grad[1]:
                grad_weight = _weight_gradient(chunks.weight, chunks.sample)
            grad_scale = torch.zeros_like(scale) if scale_grad else None  # (N,)
            nontarget_gradient(
                chunks,
                rule,
                scale=scale,
                lse=lse,
                grad=grad,
                grad_x_hat=grad_x_hat,
                grad_weight=grad_weight,
                grad_scale=grad_scale,
            )
        del pending
        if not ctx.needs_input_grad[1]:
            grad_weight = None

        # The target: backward through the margin's small graph, then through the indexed dot.
        outputs, seeds = [target_logit], [grad * (torch.exp(target_logit.detach() - lse) - 1.0)]
        if scale_grad:
            if shard is not None:  # each rank summed over its own classes
                shard.all_sum_(grad_scale)
            outputs.append(row_scale)
            seeds.append(grad_scale)
        inputs = [cos_leaf] + ([norms_leaf] if norms_leaf is not None else [])
        if values_leaf is not None:
            inputs.append(values_leaf)
        # retain_graph: the small graph is kept so that backward can run again (e.g. gradcheck,
        # or retain_graph=True upstream); it holds only N-vectors. The seeds enter as one scalar
        # Σ seed·output (the same vector-Jacobian product): torch.autograd.grad given
        # grad_outputs imports sympy on first use, for the process's lifetime.
        with torch.enable_grad():
            objective = sum(torch.dot(out, seed) for out, seed in zip(outputs, seeds, strict=True))
        grads = torch.autograd.grad(objective, inputs, allow_unused=True, retain_graph=True)
        grad_cos = grads[0] if grads[0] is not None else torch.zeros_like(lse)
        add_target_gradient(chunks, grad_cos, target_rows, owned, grad_x_hat, grad_weight)

        # Through x̂ = x / max(‖x‖, eps) and through ‖x‖ itself.
        grad_x = through_normalization(x_hat, norms, grad_x_hat)  # (N, D)
        leader = shard is None or shard.rank == 0  # terms every rank computed: add them once
        if leader and norms_leaf is not None and grads[1] is not None:
            grad_x = grad_x + grads[1].unsqueeze(1) * x_hat
        grad_values = None  # (P, N): the same on every rank; each keeps its own classes' share
        if values_leaf is not None:
            grad_values = grads[-1] if grads[-1] is not None else torch.zeros_like(values_leaf)
        if shard is not None:  # Σ over ranks of each one's share; keep this rank's rows
            grad_x = shard.all_sum_(grad_x.contiguous())[shard.rows].clone()
        return grad_x, grad_weight, *([None] * 12), grad_values


@dataclass
class _RowBlockGradients:
    """The gradients of ``Σ_i lse_i`` that the row-block pass forms in the forward:
    ``∂/∂x̂`` (``Tensor[N, D]``), ``∂/∂W`` (``Tensor[C·K, D]`` or None), ``∂/∂s`` (``Tensor[N]``
    or None)."""

    x_hat: Tensor
    weight: Tensor | None
    scale: Tensor | None


def stack_class_values(
    margin: Margin, class_values: Mapping[str, Tensor] | None
) -> tuple[tuple[str, ...], Tensor | None]:
    """The margin's declared per-class parameter names and their row values stacked,
    ``Tensor[P, N]`` (an autograd Function takes tensors, not mappings), or ``((), None)``.

    Raises:
        ValueError: the margin declares per-class parameters and ``class_values`` lacks one.
    """
    names = tuple(margin.class_parameters())
    if not names:
        return (), None
    margin.with_class_values({}, class_values)  # the ValueError naming the missing ones
    assert class_values is not None
    return names, torch.stack([class_values[name] for name in names])


def _weight_gradient(weight: Tensor, sample: Tensor | None) -> Tensor:
    """The weight's gradient buffer: uninitialized (every row is written by one chunk), or
    zeros for a Partial FC sample (unsampled rows get an exact 0)."""
    return torch.zeros_like(weight) if sample is not None else torch.empty_like(weight)


def _prepare(
    margin: Margin,
    chunks: ChunkWorkspace,
    cos_target: Tensor,
    labels: Tensor,
    norms: Tensor | None,
    shard: ClassShard | None,
    triton: bool,
) -> Context:
    """The margin's context; first, if it asks for one
    (:meth:`~marginface.margins.base.Margin.statistics_scale`), the batch statistic ``log B``,
    or (:meth:`~marginface.margins.base.Margin.row_statistics_size`) its per-row sums over the
    non-target classes, by one more pass over the classes (merged over the ranks of ``shard``)."""
    if margin.row_statistics_size() > 0:
        target = cos_target.detach().to(chunks.inv_norms.dtype)  # (N,)
        kind = row_statistics_rule(margin)
        if triton and kind is not None:  # the declared rule on its kernel (no filtering here)
            threshold = margin.row_statistics_kernel_parameters(target)["threshold"]
            sums = triton_row_statistics(chunks, ROW_STATISTICS_KERNELS[kind], threshold)
            sums = sums.to(chunks.inv_norms.dtype)  # (k, N), this rank's classes
        else:
            sums = row_statistics(
                chunks,
                lambda cos: margin.row_statistics_terms(cos, target),
                margin.row_statistics_size(),
                margin.interclass_filtering_threshold,
            )  # (k, N), this rank's classes
        if shard is not None:
            shard.all_sum_(sums)
        return margin.prepare_with_row_statistics(cos_target, labels, norms, sums)
    statistics_scale = margin.statistics_scale()
    if statistics_scale is None:
        return margin.prepare(cos_target, labels, norms)
    n, device = chunks.x_hat.shape[0], chunks.x_hat.device
    rule = ChunkRule(  # the identity, after inter-class filtering (never on the kernels)
        identity=True,
        filter_threshold=margin.interclass_filtering_threshold,
        kernel=kernel_rule("identity", {}, n, device) if triton else None,
    )
    with torch.no_grad():
        scale = scale_per_row(statistics_scale, n, chunks.x_hat)  # (N,)
        merge = shard.merge_statistics if shard is not None else None
        log_b = batch_log_b(chunks, scale, rule, merge)
    return margin.prepare_with_statistics(cos_target, labels, norms, log_b)
