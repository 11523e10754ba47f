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
:mod:`~marginface.executors.triton_binary`. The dense path is
:func:`~marginface.executors.margin_loss.binary_cross_entropy` of the margin's ``N×C`` logits.
A declared rule without inter-class filtering runs on the custom operators of
:mod:`~marginface.executors.fused_op`; the rest (and the sharded head) on the one autograd
Function, :class:`~marginface.executors.chunked_function.ChunkedLoss`, with this module's
:class:`BinaryReduction`. Both choices are the call's
:class:`~marginface.executors.backend.Backend`, made once at its entry
(:func:`~marginface.executors.backend.choose_backend`).

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

from ..margins.base import Margin
from ..margins.binary import softplus
from .backend import Backend
from .binary_passes import margin_gradient as _nontarget_gradient
from .binary_passes import margin_sums as _nontarget_sums
from .binary_passes import rule_gradient, rule_sums
from .binary_rule import BinaryRule, binary_rule_of
from .chunk_plan import gemm_dtype
from .chunk_workspace import ChunkWorkspace
from .chunked_function import ChunkedLoss, Seeds, TargetLeaves
from .dense import compute_dtype
from .fused_op import BINARY_OPS, gradient_buffers, prologue
from .sharding import ClassShard

__all__ = [
    "BinaryReduction",
    "BinaryRule",
    "ChunkedBinaryLoss",
    "binary_loss",
]


def binary_loss(
    embeddings: Tensor,
    weight: Tensor,
    local_labels: Tensor,
    labels: Tensor,
    margin: Margin,
    shard: ClassShard | None,
    backend: Backend,
    *,
    sub_centers: int = 1,
    chunk_size: int | None = None,
    sampled_classes: Tensor | None = None,
) -> Tensor:
    """Per-sample binary loss without the ``N×C`` logits, for a binary margin: the arguments
    (checked by the caller) and the return value of
    :func:`~marginface.executors.chunked.sharded_margin_cross_entropy` (``shard`` None: one
    process, ``local_labels`` the labels, as
    :func:`~marginface.executors.chunked.chunked_margin_cross_entropy`). ``backend``: the
    call's :class:`~marginface.executors.backend.Backend`: a custom-op path (one process with a
    declared rule and no inter-class filtering) runs :func:`fused_binary_loss`, no graph break
    under ``torch.compile``; ``"function"`` the autograd Function with a
    :class:`BinaryReduction`; either on the Triton kernels if ``backend.triton``."""
    dtype = compute_dtype(embeddings, weight)
    with torch.autocast(device_type=embeddings.device.type, enabled=False):
        x = embeddings.to(dtype)
        if backend.custom_ops:
            return fused_binary_loss(
                x, weight, labels, margin, sub_centers=sub_centers, chunk_size=chunk_size,
                backend=backend, sampled_classes=sampled_classes,
            )  # fmt: skip
        return ChunkedBinaryLoss.apply(
            x, weight, margin.bias, local_labels, labels, margin, sub_centers, chunk_size,
            gemm_dtype(embeddings, weight), shard, sampled_classes, backend.triton,
        )  # fmt: skip


class BinaryReduction:
    """The one-vs-all :class:`~marginface.executors.chunked_function.Reduction`: ``L_i =
    w_+ softplus(-T_i) + w_- S_i`` with the margin's target logit ``T_i`` (its bias a leaf of
    the small graph) and ``S_i = Σ_{j≠y_i} softplus(z_ij)``, summed over the ranks.

    Args:
        margin: the binary margin; its declared rule
            (:meth:`~marginface.margins.binary.BinaryMargin.binary_kernel_parameters`) runs in
            place (:func:`~.binary_passes.rule_sums`), any other on its own logits.
        triton: run the per-chunk work on the kernels of
            :mod:`~marginface.executors.triton_binary` (the call's backend).
        dtype: the compute dtype (the bias leaf's).
    """

    requires_norms = False

    def __init__(self, margin: Any, *, triton: bool, dtype: torch.dtype) -> None:
        self.margin, self.triton, self.dtype = margin, triton, dtype

    def parameter_leaf(self, parameters: Tensor, shard: ClassShard | None) -> Tensor:
        """The bias ``b`` in the compute dtype (0-dim, replicated: the same on every rank)."""
        return parameters.detach().to(self.dtype).clone()

    def target(
        self, chunks: ChunkWorkspace, leaves: TargetLeaves, shard: ClassShard | None
    ) -> None:
        """The target term ``w_+ softplus(-T_i)`` on the small graph; the rule at this bias."""
        margin, parameters = self.margin, leaves.parameters
        bias = parameters if parameters is not None else margin.bias.detach().to(self.dtype)
        self.bias = bias.detach()  # 0-dim
        target_logit = margin.target_logit(leaves.cos_target, bias)  # (N,)
        self.positive = margin.positive_weight * softplus(-target_logit)  # (N,)
        declared = margin.binary_kernel_parameters() is not None
        self.rule = binary_rule_of(margin, self.bias) if declared else None

    def forward(self, chunks: ChunkWorkspace, shard: ClassShard | None) -> Tensor:
        """``L_i``, the non-target sums over this rank's classes summed over the ranks."""
        if self.triton:
            from .triton_binary import triton_binary_sums

            assert self.rule is not None  # the backend's Triton rows: a declared rule
            negative = triton_binary_sums(chunks, self.rule).to(chunks.x_hat.dtype)  # (N,)
        elif self.rule is not None:  # the declared rule in place over the chunk workspace
            negative = rule_sums(chunks, self.rule, self.margin.interclass_filtering_threshold)
        else:
            negative = _nontarget_sums(chunks, self.margin, self.bias)  # (N,)
        if shard is not None:
            shard.all_sum_(negative)
        return self.positive.detach() + self.margin.negative_weight * negative

    def backward(
        self, chunks: ChunkWorkspace, grad: Tensor, need_weight: bool, shard: ClassShard | None
    ) -> tuple[Tensor, Tensor | None, Seeds, Tensor | None]:
        """The non-target pass (``∂L/∂c_ij = γ_i w_- σ(z_ij) ∂z/∂c``), the target's seed
        ``γ`` and the bias's non-target share summed over the ranks."""
        margin, rule = self.margin, self.rule
        grad_x_hat, grad_weight = gradient_buffers(chunks, need_weight)
        if self.triton:
            from .triton_binary import triton_nontarget_gradient

            grad_bias = triton_nontarget_gradient(
                chunks, rule, margin.bias_sign, grad, grad_x_hat, grad_weight
            )
        elif rule is not None:
            grad_bias = rule_gradient(
                chunks, rule, margin.bias_sign, grad * margin.negative_weight, grad_x_hat,
                grad_weight, margin.interclass_filtering_threshold,
            )  # fmt: skip
        else:
            grad_bias = _nontarget_gradient(
                chunks, margin, self.bias, grad, grad_x_hat, grad_weight
            )
        if shard is not None:
            shard.all_sum_(grad_bias)  # Σ over ranks of each one's classes
        return grad_x_hat, grad_weight, [(self.positive, grad)], grad_bias


class ChunkedBinaryLoss:
    """The one-vs-all call of :class:`~marginface.executors.chunked_function.ChunkedLoss` (no
    autograd Function of its own).

    ``apply(x, weight, bias, local_labels, labels, margin, sub_centers, chunk_size, gemm,
    shard, sample, triton=False) -> loss[N]`` with :class:`ChunkedLoss`'s conventions. ``bias``
    is the margin's ``b``; its gradient is complete on every rank. ``triton``: run the
    per-chunk work on the kernels of :mod:`~marginface.executors.triton_binary` (the call's
    :class:`~marginface.executors.backend.Backend`).
    """

    @staticmethod
    def apply(
        x: Tensor,
        weight: Tensor,
        bias: Tensor,
        local_labels: Tensor,
        labels: Tensor,
        margin: Any,
        sub_centers: int,
        chunk_size: int | None,
        gemm: torch.dtype,
        shard: ClassShard | None,
        sample: Tensor | None,
        triton: bool = False,
    ) -> Tensor:
        """The loss ``Tensor[N]``."""
        reduction = BinaryReduction(margin, triton=triton, dtype=x.dtype)
        return ChunkedLoss.apply(
            x, weight, bias, local_labels, labels, reduction, sub_centers, chunk_size, gemm,
            shard, sample,
        )  # fmt: skip


def fused_binary_loss(
    x: Tensor,
    weight: Tensor,
    labels: Tensor,
    margin: Any,
    *,
    sub_centers: int,
    chunk_size: int | None,
    backend: Backend,
    sampled_classes: Tensor | None = None,
) -> Tensor:
    """The chunked binary loss ``Tensor[N]`` through the custom ops (no graph break under
    ``torch.compile``), for a margin whose
    :meth:`~marginface.margins.binary.BinaryMargin.binary_kernel_parameters` is not None and
    without inter-class filtering.

    Args:
        x: ``Tensor[N, D]`` in the compute dtype, autocast off. weight, labels, sub_centers,
            chunk_size, sampled_classes: as
            :func:`~marginface.executors.chunked.chunked_margin_cross_entropy`.
        backend: the call's :class:`~marginface.executors.backend.Backend` (a custom-op path):
            compiled operators or their eager twin, on the Triton kernels or PyTorch ops.
    """
    k, sample = sub_centers, sampled_classes
    start = prologue(x, weight, labels, k, sample, chunk_size)
    x_hat, _, cos_raw, target_rows, chunk_size = start
    parameters = margin.binary_kernel_parameters()
    clamp = margin.logit_clamp if margin.logit_clamp is not None else 0.0
    sums, cos_pass, _ = BINARY_OPS.call(
        x_hat, weight, labels, target_rows, cos_raw, margin.bias, float(margin.scale),
        float(parameters["power"]), float(parameters["offset"]), float(margin.bias_sign),
        float(clamp), margin.gradient == "straight_through", k, chunk_size, backend.kernels,
        sample, compiled=backend.compiled,
    )  # fmt: skip
    target_logit = margin.target_logit(cos_pass.clamp(-1.0, 1.0), margin.bias)  # (N,)
    return margin.positive_weight * softplus(-target_logit) + margin.negative_weight * sums
