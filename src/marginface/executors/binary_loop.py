r"""The one-vs-all (binary) reduction, dense and chunked: ``Σ softplus`` instead of log-sum-exp.

For a binary margin (:class:`~marginface.margins.binary.BinaryMargin`,
:attr:`~marginface.margins.base.Margin.objective` ``"binary"``) the per-sample loss is

.. math::
    L_i = w_+\,\mathrm{softplus}(-z_{iy_i}) + w_-\sum_{j\ne y_i}\mathrm{softplus}(z_{ij}),
    \qquad z_{ij} = s\,g(\cos\theta_{ij}) + \beta b

Every non-target term is elementwise in its own logit, so a sum over classes splits over any
partition of them with nothing to renormalize: the chunked executor takes one pass over class
chunks in forward (``S_i = Σ_j softplus(z_ij)``, the target column excluded) and one in
backward, recomputing each chunk's cosines and adding, with ``γ_i`` the gradient reaching
``L_i``,

.. math::
    \frac{\partial L}{\partial \cos\theta_{ij}} = \gamma_i w_-\,\sigma(z_{ij})\,
    \frac{\partial z_{ij}}{\partial\cos\theta_{ij}},\qquad
    \frac{\partial L}{\partial b} \mathrel{+}= \sum_{ij}\gamma_i w_-\,\sigma(z_{ij})\,
    \frac{\partial z_{ij}}{\partial b}

through the same chunk GEMM, weight-gradient projection and Partial FC gathering as the softmax
path (:mod:`~marginface.executors.chunk_workspace`, :mod:`~marginface.executors.chunk_loop`):
nothing of size ``N×C`` is kept, the extra memory is one chunk's ``N×c`` temporaries. The target
term is an ``N``-vector on a small autograd graph (the margin's own ``target_logit``), replayed
in backward. The per-chunk work runs as PyTorch ops or on the Triton kernels of
:mod:`~marginface.executors.triton_binary` (:func:`use_binary_kernels`). The dense path is
:func:`~marginface.executors.margin_loss.binary_cross_entropy` of the margin's ``N×C`` logits.

Sharded (:class:`~marginface.executors.sharding.ClassShard`): the target cosine is summed over
ranks (only the owner's is non-zero), each rank sums its own classes' softplus terms and the
sums are all-reduced, so every rank returns the same global-batch loss. The bias ``b`` is a
replicated parameter: its gradient is the target term's (computed identically on every rank)
plus the all-reduced sum of every rank's non-target share, the full derivative on every rank.

Partial FC: the non-target sum runs over the sampled classes only, not re-weighted (as UniFace's
released code, whose initial threshold ``log(10·C·r)`` follows the number of classes summed
instead; SphereFace2's authors have no Partial FC). docs/losses.md says more.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .._validation import check_int
from ..margins.base import Margin
from ..margins.binary import softplus
from .binary_op import fused_binary_loss
from .binary_passes import margin_gradient as _nontarget_gradient
from .binary_passes import margin_sums as _nontarget_sums
from .binary_passes import rule_gradient, rule_sums
from .binary_rule import BinaryRule, binary_rule_of, use_binary_kernels
from .chunk_loop import add_target_gradient, target_cosines
from .chunk_plan import (
    check_sampled_classes,
    chunk_size_for,
    gemm_dtype,
    normalized_with_norms,
)
from .chunk_workspace import ChunkWorkspace, through_normalization
from .dense import compute_dtype
from .sharding import ClassShard

__all__ = [
    "BinaryRule",
    "ChunkedBinaryLoss",
    "chunked_binary_loss",
    "sharded_binary_loss",
    "use_binary_kernels",
]


def chunked_binary_loss(
    embeddings: Tensor,
    weight: Tensor,
    labels: Tensor,
    margin: Margin,
    *,
    sub_centers: int = 1,
    chunk_size: int | None = None,
    kernels: str | None = None,
    sampled_classes: Tensor | None = None,
) -> Tensor:
    """Per-sample binary loss without the ``N×C`` logits: the arguments and the return value
    of :func:`~marginface.executors.chunked.chunked_margin_cross_entropy`, for a binary margin.
    ``kernels``: see :func:`use_binary_kernels`."""
    sampled_classes = check_sampled_classes(sampled_classes, weight)
    if chunk_size is not None:
        chunk_size = check_int("chunk_size", chunk_size, minimum=1)
    sub_centers = check_int("sub_centers", sub_centers, minimum=1)
    if weight.dim() != 2 or weight.shape[0] % sub_centers:
        raise ValueError(
            f"weight must have shape (C·K, D) with K = sub_centers = {sub_centers}, "
            f"got {tuple(weight.shape)}"
        )
    dtype = compute_dtype(embeddings, weight)
    gemm = gemm_dtype(embeddings, weight)
    triton = use_binary_kernels(margin, kernels, embeddings, weight)
    compiled_rule = (
        margin.binary_kernel_parameters() is not None and margin.interclass_filtering_threshold == 0
    )
    with torch.autocast(device_type=embeddings.device.type, enabled=False):
        if compiled_rule:  # the custom ops: torch.compile traces them without a graph break
            return fused_binary_loss(
                embeddings.to(dtype), weight, labels, margin, sub_centers=sub_centers,
                chunk_size=chunk_size, triton=triton, sampled_classes=sampled_classes,
            )  # fmt: skip
        return ChunkedBinaryLoss.apply(
            embeddings.to(dtype), weight, margin.bias, labels, labels, margin, sub_centers,
            chunk_size, gemm, None, sampled_classes, triton,
        )  # fmt: skip


def sharded_binary_loss(
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
) -> Tensor:
    """The global batch's per-sample binary loss, classes sharded over ``shard``'s ranks: the
    arguments and the return value of
    :func:`~marginface.executors.chunked.sharded_margin_cross_entropy`, for a binary margin."""
    sampled_classes = check_sampled_classes(sampled_classes, weight)
    dtype = compute_dtype(embeddings, weight)
    gemm = gemm_dtype(embeddings, weight)
    triton = use_binary_kernels(margin, kernels, embeddings, weight)
    with torch.autocast(device_type=embeddings.device.type, enabled=False):
        return ChunkedBinaryLoss.apply(
            embeddings.to(dtype), weight, margin.bias, targets, labels, margin, sub_centers,
            chunk_size, gemm, shard, sampled_classes, triton,
        )  # fmt: skip


class ChunkedBinaryLoss(torch.autograd.Function):
    """``(x[n, D], weight[c·K, D], bias[]) -> loss[N]``, the binary reduction chunk by chunk.

    ``apply(x, weight, bias, targets, labels, margin, sub_centers, chunk_size, gemm, shard,
    sample, triton)`` with the conventions of
    :class:`~marginface.executors.chunked_function.ChunkedMarginCrossEntropy` (``x`` in the
    compute dtype; ``targets`` the classes among these weight rows, ``-1`` on another rank;
    ``sample`` Partial FC's classes, read in place). ``bias`` is the margin's ``b``; its
    gradient is complete on every rank. ``triton``: run the per-chunk work on the kernels of
    :mod:`~marginface.executors.triton_binary` (:func:`use_binary_kernels`).
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        x: Tensor,
        weight: Tensor,
        bias: Tensor,
        targets: Tensor,
        labels: Tensor,
        margin: Any,
        sub_centers: int,
        chunk_size: int | None,
        gemm: torch.dtype,
        shard: ClassShard | None,
        sample: Tensor | None,
        triton: bool = False,
    ) -> Tensor:
        if shard is not None:
            x = shard.gather_rows(x)  # (N, D), the global batch
        k = sub_centers
        x_hat, norms = normalized_with_norms(x)  # (N, D), (N,)
        chunk_size = chunk_size_for(x, weight, k, sample, chunk_size)
        chunks = ChunkWorkspace(x_hat, weight, targets, k, chunk_size, gemm, sample=sample)
        b = bias.detach().to(x.dtype)  # 0-dim

        cos_raw, target_rows = target_cosines(x_hat, weight, targets, k, sample)  # (N,), (N,)
        owned = targets >= 0  # (N,)
        if shard is not None:
            shard.all_sum_(cos_raw)  # only the owner's is non-zero

        # The target term on a small graph of N-vectors, replayed in backward.
        with torch.enable_grad():
            cos_leaf = cos_raw.detach().requires_grad_(True)
            bias_leaf = b.clone().requires_grad_(True)
            target_logit = margin.target_logit(cos_leaf.clamp(-1.0, 1.0), bias_leaf)  # (N,)
            positive = margin.positive_weight * softplus(-target_logit)  # (N,)

        declared = margin.binary_kernel_parameters() is not None
        rule = binary_rule_of(margin, b) if declared else None
        threshold = margin.interclass_filtering_threshold
        if triton:
            from .triton_binary import triton_binary_sums

            assert rule is not None  # use_binary_kernels: a declared rule, no filtering
            negative = triton_binary_sums(chunks, rule).to(cos_raw.dtype)  # (N,)
        elif rule is not None:  # the declared rule in place over the chunk workspace
            negative = rule_sums(chunks, rule, threshold)  # (N,)
        else:
            negative = _nontarget_sums(chunks, margin, b)  # (N,)
        if shard is not None:
            shard.all_sum_(negative)

        ctx.save_for_backward(norms, x_hat, target_rows, owned)
        ctx.shard, ctx.chunks, ctx.margin, ctx.bias = shard, chunks, margin, b
        ctx.rule, ctx.triton = rule, triton
        ctx.graph = (cos_leaf, bias_leaf, positive)
        ctx.bias_dtype = bias.dtype
        return positive.detach() + margin.negative_weight * negative

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_loss: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        norms, x_hat, target_rows, owned = ctx.saved_tensors
        shard: ClassShard | None = ctx.shard
        chunks: ChunkWorkspace = ctx.chunks
        margin = ctx.margin
        cos_leaf, bias_leaf, positive = ctx.graph
        grad = grad_loss.to(x_hat.dtype)  # (N,)

        grad_x_hat = torch.zeros_like(x_hat)  # (N, D)
        grad_weight = None
        if ctx.needs_input_grad[1]:
            sampled = chunks.sample is not None
            weight = chunks.weight
            grad_weight = torch.zeros_like(weight) if sampled else torch.empty_like(weight)
        if ctx.triton:
            from .triton_binary import triton_nontarget_gradient

            grad_bias = triton_nontarget_gradient(
                chunks, ctx.rule, margin.bias_sign, grad, grad_x_hat, grad_weight
            )
        elif ctx.rule is not None:
            grad_bias = rule_gradient(
                chunks, ctx.rule, margin.bias_sign, grad * margin.negative_weight, grad_x_hat,
                grad_weight, margin.interclass_filtering_threshold,
            )  # fmt: skip
        else:
            grad_bias = _nontarget_gradient(chunks, margin, ctx.bias, grad, grad_x_hat, grad_weight)
        if shard is not None:
            shard.all_sum_(grad_bias)  # Σ over ranks of each one's classes

        # The target term: backward through its small graph, then through the indexed dot.
        with torch.enable_grad():
            objective = torch.dot(positive, grad)
        grad_cos, grad_bias_target = torch.autograd.grad(
            objective, [cos_leaf, bias_leaf], allow_unused=True, retain_graph=True
        )
        if grad_cos is None:
            grad_cos = torch.zeros_like(cos_leaf)
        if grad_bias_target is not None:
            grad_bias = grad_bias + grad_bias_target
        add_target_gradient(chunks, grad_cos, target_rows, owned, grad_x_hat, grad_weight)

        grad_x = through_normalization(x_hat, norms, grad_x_hat)  # (N, D), through x̂ = x/‖x‖
        if shard is not None:  # Σ over ranks of each one's share; keep this rank's rows
            grad_x = shard.all_sum_(grad_x.contiguous())[shard.rows].clone()
        grad_b = grad_bias.to(ctx.bias_dtype) if ctx.needs_input_grad[2] else None
        return grad_x, grad_weight, grad_b, None, None, None, None, None, None, None, None, None
