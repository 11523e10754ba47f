"""The chunked executor's one autograd Function, for both loss families: eager mode, the sharded
head, Partial FC, row blocks, and any margin written through the hooks (any non-target rule,
inter-class filtering).

:class:`ChunkedLoss` holds what every reduction shares, once: the prologue (the class shard's
gather of the embeddings, ``x̂ = x/‖x‖``, the chunk workspace over ``W``, read in place for a
Partial FC sample), the target cosine (an indexed dot, summed over the ranks), the margin's
small graph of ``N``-vectors (replayed in backward), the weight-gradient buffer, the target's
share of ``∂L/∂x̂`` and ``∂L/∂W``, the backward through ``x̂`` and the class shard's sum of the
rows' gradients. What differs is a :class:`Reduction`: the softmax's (:class:`SoftmaxReduction`:
online ``(max, Σexp)`` over the class chunks, the log-sum-exp with the margin's target logit)
or the one-vs-all's (:class:`~marginface.executors.binary_loop.BinaryReduction`: ``Σ
softplus``). Both run the one chunk loop (:mod:`~marginface.executors.chunk_loop`).
``torch.compile`` breaks the graph here; the margins whose non-target rule is compiled in run
on the custom operators of :mod:`~marginface.executors.fused_op` instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

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
)
from .chunk_plan import chunk_size_for, scale_per_row
from .chunk_workspace import ChunkWorkspace, through_normalization
from .fused_op import gradient_buffers, prologue, row_statistics_code
from .sharding import ClassShard
from .triton_dispatch import kernel_rule, triton_row_statistics

__all__ = [
    "ChunkedLoss",
    "ChunkedMarginCrossEntropy",
    "Reduction",
    "Seeds",
    "SoftmaxReduction",
    "TargetLeaves",
    "stack_class_values",
]


class TargetLeaves(NamedTuple):
    """What the target's small graph starts from: the clamped target cosine ``Tensor[N]`` (of
    a leaf), the global ``labels`` ``Tensor[N]``, the norms leaf ``Tensor[N]`` (None unless the
    reduction requires norms) and the parameters leaf (None without parameters)."""

    cos_target: Tensor
    labels: Tensor
    norms: Tensor | None
    parameters: Tensor | None


Seeds = list[tuple[Tensor, Tensor]]
"""``(output, seed)`` pairs on the small graph: the backward takes ``Σ seed·output``'s
gradient in the graph's leaves (a vector-Jacobian product)."""


class Reduction(Protocol):
    """One loss family's steps inside :class:`ChunkedLoss` (made per call: it keeps its
    forward's results for its backward).

    Attributes:
        requires_norms: whether :meth:`target` reads the embeddings' norms (a leaf of the small
            graph, its gradient flowing back through ``‖x‖``).
        triton: whether the call's per-chunk work runs on the Triton kernels.
    """

    requires_norms: bool
    triton: bool

    def parameter_leaf(self, parameters: Tensor, shard: ClassShard | None) -> Tensor:
        """The small graph's leaf for the Function's ``parameters`` input (a copy, same on
        every rank), without ``requires_grad`` yet."""
        ...

    def target(
        self, chunks: ChunkWorkspace, leaves: TargetLeaves, shard: ClassShard | None
    ) -> None:
        """Build the target's small graph (under ``enable_grad``) from its ``leaves``; any pass
        over the classes that the margin's hooks need first runs here."""
        ...

    def forward(self, chunks: ChunkWorkspace, shard: ClassShard | None) -> Tensor:
        """The non-target pass over the class chunks (merged over the ranks), and the loss
        ``Tensor[N]`` (without gradient)."""
        ...

    def backward(
        self, chunks: ChunkWorkspace, grad: Tensor, need_weight: bool, shard: ClassShard | None
    ) -> tuple[Tensor, Tensor | None, Seeds, Tensor | None]:
        """The non-target pass of the backward, given ``grad`` (``∂L/∂L_i``, ``Tensor[N]``):
        ``(∂L/∂x̂ [N, D], ∂L/∂W [C·K, D] or None, the small graph's seeds, the non-target share
        of the parameters' gradient summed over the ranks, or None)``."""
        ...


class ChunkedLoss(torch.autograd.Function):
    """``(x[n, D], weight[c·K, D], parameters) -> loss[N]``: the one autograd boundary of the
    chunked executor, for a :class:`Reduction`.

    ``apply(x, weight, parameters, local_labels, labels, reduction, sub_centers, chunk_size,
    gemm, shard, sample)``: ``x`` in the compute dtype (float32/float64), autocast off.
    ``parameters``: the reduction's differentiable input besides ``x`` and ``weight`` (the
    softmax margin's per-class values ``Tensor[P, N]``, the one-vs-all bias ``b``), or None.
    ``local_labels[N]`` is each row's class among these weight rows (``-1`` when another rank
    owns it), ``labels[N]`` its global class (what the margin sees). Without a shard ``n = N``
    and the two are the same tensor; with a :class:`~.sharding.ClassShard`, ``x`` holds this
    rank's rows, which are gathered into the global batch of ``N`` rows first. ``sample``
    (``int64[S]``, Partial FC's sorted classes of ``weight``): only those classes are computed
    with, read in place, and ``local_labels`` are positions in ``sample``; the weight's gradient
    is shard-sized, zero outside the sample. ``chunk_size`` None:
    :func:`~.chunk_plan.default_chunk_size` of the global batch. ``gemm``: the chunk GEMM's dtype
    (:func:`~.chunk_plan.gemm_dtype`).
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        x: Tensor,
        weight: Tensor,
        parameters: Tensor | None,
        local_labels: Tensor,
        labels: Tensor,
        reduction: Reduction,
        sub_centers: int,
        chunk_size: int | None,
        gemm: torch.dtype,
        shard: ClassShard | None,
        sample: Tensor | None,
    ) -> Tensor:
        if shard is not None:
            x = shard.gather_rows(x)  # (N, D), the global batch
        k = sub_centers
        # x̂ (N, D), ‖x‖ (N,), the target cosine (an indexed dot on the rank that owns the
        # target, summed over the ranks below) and its weight row (N,), as the custom ops'.
        start = prologue(x, weight, local_labels, k, sample, chunk_size)
        x_hat, norms, cos_raw, target_rows, chunk_size = start
        chunks = ChunkWorkspace(
            x_hat, weight, local_labels, k, chunk_size, gemm, sample=sample,
            triton=reduction.triton,
        )  # fmt: skip
        owned = local_labels >= 0  # (N,)
        if shard is not None:
            shard.all_sum_(cos_raw)

        # The margin's target on a small graph of N-vectors, replayed in backward.
        leaf = None
        if parameters is not None:
            leaf = reduction.parameter_leaf(parameters, shard).requires_grad_(True)
        with torch.enable_grad():
            cos_leaf = cos_raw.detach().requires_grad_(True)
            norms_leaf = norms.detach().requires_grad_(True) if reduction.requires_norms else None
            leaves = TargetLeaves(cos_leaf.clamp(-1.0, 1.0), labels, norms_leaf, leaf)
            reduction.target(chunks, leaves, shard)
        loss = reduction.forward(chunks, shard)  # (N,)

        ctx.save_for_backward(norms, x_hat, target_rows, owned)
        ctx.shard, ctx.chunks, ctx.reduction = shard, chunks, reduction
        ctx.leaves = (cos_leaf, norms_leaf, leaf)
        ctx.parameters_dtype = parameters.dtype if parameters is not None else None
        return loss

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_loss: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        norms, x_hat, target_rows, owned = ctx.saved_tensors
        shard: ClassShard | None = ctx.shard
        chunks: ChunkWorkspace = ctx.chunks
        cos_leaf, norms_leaf, leaf = ctx.leaves
        grad = grad_loss.to(x_hat.dtype)  # (N,)
        need_weight = ctx.needs_input_grad[1]
        grad_x_hat, grad_weight, seeds, share = ctx.reduction.backward(
            chunks, grad, need_weight, shard
        )
        if not need_weight:
            grad_weight = None

        # The target: backward through the small graph, then through the indexed dot.
        inputs = [cos_leaf] + [t for t in (norms_leaf, leaf) if t is not None]
        # retain_graph: the small graph is kept so that backward can run again (e.g. gradcheck,
        # or retain_graph=True upstream); it holds only N-vectors. The seeds enter as one scalar
        # Σ seed·output (the same vector-Jacobian product): torch.autograd.grad given
        # grad_outputs imports sympy on first use, for the process's lifetime.
        with torch.enable_grad():
            objective = sum(torch.dot(out, seed) for out, seed in seeds)
        grads = torch.autograd.grad(objective, inputs, allow_unused=True, retain_graph=True)
        grad_cos = grads[0] if grads[0] is not None else torch.zeros_like(cos_leaf)
        add_target_gradient(chunks, grad_cos, target_rows, owned, grad_x_hat, grad_weight)

        # Through x̂ = x / max(‖x‖, eps) and through ‖x‖ itself.
        grad_x = through_normalization(x_hat, norms, grad_x_hat)  # (N, D)
        leader = shard is None or shard.rank == 0  # terms every rank computed: add them once
        if leader and norms_leaf is not None and grads[1] is not None:
            grad_x = grad_x + grads[1].unsqueeze(1) * x_hat
        grad_parameters = None  # the same on every rank: the target's share + Σ of the others
        if leaf is not None and ctx.needs_input_grad[2]:
            grad_parameters = grads[-1] if grads[-1] is not None else torch.zeros_like(leaf)
            if share is not None:
                grad_parameters = grad_parameters + share
            grad_parameters = grad_parameters.to(ctx.parameters_dtype)
        if shard is not None:  # Σ over ranks of each one's share; keep this rank's rows
            grad_x = shard.all_sum_(grad_x.contiguous())[shard.rows].clone()
        return grad_x, grad_weight, grad_parameters, *([None] * 8)


@dataclass
class _RowBlockGradients:
    """The gradients of ``Σ_i lse_i`` that the row-block pass forms in the forward:
    ``∂/∂x̂`` (``Tensor[N, D]``), ``∂/∂W`` (``Tensor[C·K, D]`` or None), ``∂/∂s`` (``Tensor[N]``
    or None)."""

    x_hat: Tensor
    weight: Tensor | None
    scale: Tensor | None


class SoftmaxReduction:
    """The softmax's :class:`Reduction`: ``L_i = log(e^{T_i} + Σ_{j≠y_i} e^{s_i g(c_ij)}) -
    T_i`` with the margin's target logit ``T_i = s_i f(cos θ_iy)``, the non-target sum by the
    online ``(max, Σexp)`` of the class chunks, merged exactly over the ranks.

    Args:
        margin: the margin (any non-target rule; its context may carry no gradient into
            ``nontarget_cosine`` unless the rule is the identity).
        triton: run the per-chunk work on the Triton kernels (decided once per call).
        row_block: tile the rows too (:func:`~.chunk_loop.row_block_pass`), or None.
        chunk_size: the caller's classes per chunk (None: the default), for the row blocks.
        gradients: whether ``x`` and ``weight`` will need gradients (the row blocks form them
            in the forward).
        names: the margin's per-class parameter names, the rows of the Function's
            ``parameters`` (:func:`stack_class_values`).
    """

    def __init__(
        self,
        margin: Margin,
        *,
        triton: bool,
        row_block: int | None = None,
        chunk_size: int | None = None,
        gradients: tuple[bool, bool] = (True, True),
        names: tuple[str, ...] = (),
    ) -> None:
        self.margin, self.triton, self.row_block = margin, triton, row_block
        self.chunk_size, self.gradients, self.names = chunk_size, gradients, names
        self.requires_norms = margin.requires_norms
        self.pending: list[_RowBlockGradients] = []

    def parameter_leaf(self, parameters: Tensor, shard: ClassShard | None) -> Tensor:
        """Every row's target-class values ``Tensor[P, N]``, summed over the ranks."""
        leaf = parameters.detach().clone()
        return shard.all_sum_(leaf) if shard is not None else leaf

    def target(
        self, chunks: ChunkWorkspace, leaves: TargetLeaves, shard: ClassShard | None
    ) -> None:
        """The margin's context (after its statistics pass, if any), its target logit
        ``T = s·f(cos θ_y)`` and per-row scale, and its non-target rule."""
        margin, (cos_target, labels, norms, parameters) = self.margin, leaves
        n = cos_target.shape[0]
        context = _prepare(margin, chunks, cos_target, labels, norms, shard, self.triton)
        if parameters is not None:
            rows = dict(zip(self.names, parameters.unbind(0), strict=True))
            context = margin.with_class_values(context, rows)
        target = margin.adjusted_target_cosine(cos_target, norms, context)  # (N,)
        self.row_scale = scale_per_row(context["scale"], n, chunks.x_hat)  # (N,)
        self.target_logit = target.to(chunks.x_hat.dtype) * self.row_scale  # (N,)
        if not margin.nontarget_is_identity():
            for key, value in context.items():
                if key != "scale" and isinstance(value, Tensor) and value.requires_grad:
                    raise ValueError(
                        f"margin {type(margin).__name__}'s context[{key!r}] carries a gradient "
                        "into nontarget_cosine, which the chunked executor cannot propagate; "
                        "use impl='dense'"
                    )
        frozen = {key: v.detach() if isinstance(v, Tensor) else v for key, v in context.items()}
        device = chunks.x_hat.device
        self.rule = chunk_rule_for_margin(margin, frozen, rows=n, device=device, triton=self.triton)

    def forward(self, chunks: ChunkWorkspace, shard: ClassShard | None) -> Tensor:
        """``L_i = lse_i - T_i``; with row blocks, the gradients of ``Σ lse_i`` formed too."""
        scale, target_logit = self.row_scale.detach(), self.target_logit.detach()
        if self.row_block is not None and any(self.gradients):
            # Forward and backward in one pass per block of rows: the gradients of Σ lse_i,
            # kept for the backward, which scales them by the upstream gradient.
            block_rows = chunks.x_hat[: min(self.row_block, chunks.x_hat.shape[0])]
            block_chunk = chunk_size_for(
                block_rows, chunks.weight, chunks.k, chunks.sample, self.chunk_size
            )
            grad_x_hat, grad_weight = gradient_buffers(chunks, self.gradients[1])
            pending = _RowBlockGradients(
                x_hat=grad_x_hat,  # (N, D)
                weight=grad_weight,
                scale=torch.zeros_like(scale) if self.row_scale.requires_grad else None,  # (N,)
            )
            self.lse = row_block_pass(
                chunks,
                self.rule,
                row_block=self.row_block,
                chunk_size=block_chunk,
                scale=scale,
                target_logit=target_logit,
                grad_x_hat=pending.x_hat,
                grad_weight=pending.weight,
                grad_scale=pending.scale,
            )
            self.pending = [pending]  # popped in backward: the weight gradient is handed over
        else:
            stats = nontarget_statistics(chunks, self.rule, scale)
            if shard is not None:
                stats = shard.merge_statistics(stats)
            self.lse = finish_log_sum_exp(stats, target_logit)  # (N,)
        return self.lse - target_logit

    def backward(
        self, chunks: ChunkWorkspace, grad: Tensor, need_weight: bool, shard: ClassShard | None
    ) -> tuple[Tensor, Tensor | None, Seeds, Tensor | None]:
        """``∂L/∂logit_ij = γ_i e^{z_ij - lse_i}`` through the chunks (or the row blocks'
        kept gradients times a uniform ``γ``), the target's seed ``γ(p_iy - 1)`` and the
        scale's."""
        scale = self.row_scale.detach()  # (N,)
        scale_grad = self.row_scale.requires_grad
        pending = self.pending.pop() if self.pending else None
        uniform = pending is not None and bool((grad == grad[:1]).all())
        if uniform:  # the row-block pass's gradients of Σ lse_i, times the one upstream γ
            grad_x_hat = pending.x_hat.mul_(grad.unsqueeze(1))  # (N, D), ∂L/∂x̂
            grad_weight = pending.weight
            if grad_weight is not None:
                grad_weight.mul_(grad[0].to(grad_weight.dtype))
            grad_scale = pending.scale.mul_(grad) if pending.scale is not None else None
        else:  # the class-chunked backward (4th GEMM), exact for any upstream gradient
            pending = None  # the row-block pass's buffers (if any) are freed first
            grad_x_hat, grad_weight = gradient_buffers(chunks, need_weight)
            grad_scale = torch.zeros_like(scale) if scale_grad else None  # (N,)
            nontarget_gradient(
                chunks,
                self.rule,
                scale=scale,
                lse=self.lse,
                grad=grad,
                grad_x_hat=grad_x_hat,
                grad_weight=grad_weight,
                grad_scale=grad_scale,
            )
        del pending
        seed = grad * (torch.exp(self.target_logit.detach() - self.lse) - 1.0)
        seeds = [(self.target_logit, seed)]
        if scale_grad:
            if shard is not None:  # each rank summed over its own classes
                shard.all_sum_(grad_scale)
            seeds.append((self.row_scale, grad_scale))
        return grad_x_hat, grad_weight, seeds, None


class ChunkedMarginCrossEntropy:
    """The softmax's call of :class:`ChunkedLoss` (no autograd Function of its own).

    ``apply(x, weight, local_labels, labels, margin, sub_centers, chunk_size, gemm, triton,
    shard, sample, row_block=None, gradients=(True, True), names=(), class_values=None) ->
    loss[N]`` (the cross-entropy, without the regularizer), with :class:`ChunkedLoss`'s
    conventions. ``triton``: run the per-chunk work on the Triton kernels, as the call's
    :class:`~marginface.executors.backend.Backend` decided (never with row blocks: the backend
    does not pair them). ``names``, ``class_values``
    (:func:`stack_class_values`): the margin's per-class parameters at each row's target class,
    ``Tensor[P, N]`` (with a shard: from this rank's classes, 0 elsewhere, summed over the ranks
    inside), or ``()`` and None; their gradient comes out of the margin's small graph.
    """

    @staticmethod
    def apply(
        x: Tensor,
        weight: Tensor,
        local_labels: Tensor,
        labels: Tensor,
        margin: Margin,
        sub_centers: int,
        chunk_size: int | None,
        gemm: torch.dtype,
        triton: bool,
        shard: ClassShard | None,
        sample: Tensor | None,
        row_block: int | None = None,
        gradients: tuple[bool, bool] = (True, True),
        names: tuple[str, ...] = (),
        class_values: Tensor | None = None,
    ) -> Tensor:
        """The loss ``Tensor[N]``; ``ValueError`` for row blocks on a sharded head."""
        if row_block is not None and shard is not None:
            raise ValueError("row_block does not apply to a sharded head (see docs/fused.md)")
        reduction = SoftmaxReduction(
            margin, triton=triton, row_block=row_block, chunk_size=chunk_size,
            gradients=gradients, names=names,
        )  # fmt: skip
        return ChunkedLoss.apply(
            x, weight, class_values, local_labels, labels, reduction, sub_centers, chunk_size,
            gemm, shard, sample,
        )  # fmt: skip


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
        kind = row_statistics_code(margin)
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
