"""The one-vs-all reduction as ``torch.library`` custom ops, so that ``torch.compile`` keeps the
chunked step whole (no graph break), as :mod:`~marginface.executors.fused_op` does for softmax.

* ``marginface::chunked_binary_sums(x̂, W, labels, target_rows, cos_target, b, ...) ->
  (S[N], cos_target[N] (a copy), r[C·K])``: each row's ``S_i = Σ_{j≠y_i} softplus(z_ij)`` chunk
  by chunk, the target cosine passed through, the inverse center norms;
* ``marginface::chunked_binary_sums_backward``: the chunk loop recomputing each chunk, writing
  ``∂L/∂x̂`` and every row of ``∂L/∂W`` (the target's share included, from the gradient reaching
  the pass-through cosine) and returning the non-target share of ``∂L/∂b``.

An operator takes no Python objects, so the non-target rule travels as numbers: the margin's
declared :meth:`~marginface.margins.binary.BinaryMargin.binary_kernel_parameters` (``z = s(2u^t
- 1 + μ) + βb``, ``u = max((c + 1)/2, 0)``, the clamp and the gradient mode;
:class:`~marginface.executors.binary_loop.BinaryRule`), evaluated here in PyTorch or by the
Triton kernels of :mod:`~marginface.executors.triton_binary`. The target term stays ordinary
PyTorch around the ops (the margin's ``target_logit`` on the pass-through cosine), so autograd or
AOTAutograd differentiates it, the bias included. Margins without a declared rule, inter-class
filtering and the sharded head run on :class:`~marginface.executors.binary_loop.ChunkedBinaryLoss`
(a graph break under ``torch.compile``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..margins.binary import softplus
from ._custom_op import wire
from .binary_passes import rule_gradient, rule_sums
from .binary_rule import BinaryRule
from .chunk_loop import add_target_gradient, target_cosines
from .chunk_plan import chunk_size_for, gemm_dtype, normalized_with_norms
from .chunk_workspace import ChunkWorkspace

__all__ = ["fused_binary_loss"]


def _rule(scale: float, power: float, offset: float, sign: float, bias: Tensor, clamp: float,
          straight_through: bool) -> BinaryRule:  # fmt: skip
    return BinaryRule(
        scale=scale, power=power, offset=offset, bias_term=sign * float(bias),
        negative_weight=1.0, clamp=clamp if clamp > 0 else None,
        straight_through=straight_through,
    )  # fmt: skip


def _sums_impl(
    x_hat: Tensor,
    weight: Tensor,
    labels: Tensor,
    target_rows: Tensor,
    cos_target: Tensor,
    bias: Tensor,
    scale: float,
    power: float,
    offset: float,
    sign: float,
    clamp: float,
    straight_through: bool,
    sub_centers: int,
    chunk_size: int,
    kernels: str,
    sample: Tensor | None,
) -> tuple[Tensor, Tensor, Tensor]:
    """``(S[N], cos_target (a copy), inv_norms)``; see the module docstring."""
    gemm = gemm_dtype(x_hat, weight)
    chunks = ChunkWorkspace(x_hat, weight, labels, sub_centers, chunk_size, gemm, sample=sample)
    rule = _rule(scale, power, offset, sign, bias, clamp, straight_through)
    if kernels == "triton":
        from .triton_binary import triton_binary_sums

        sums = triton_binary_sums(chunks, rule).to(x_hat.dtype)
        return sums, cos_target.clone(), chunks.inv_norms
    return rule_sums(chunks, rule), cos_target.clone(), chunks.inv_norms


_sums = torch.library.custom_op("marginface::chunked_binary_sums", _sums_impl, mutates_args=())


@_sums.register_fake
def _sums_fake(
    x_hat: Tensor,
    weight: Tensor,
    labels: Tensor,
    target_rows: Tensor,
    cos_target: Tensor,
    bias: Tensor,
    scale: float,
    power: float,
    offset: float,
    sign: float,
    clamp: float,
    straight_through: bool,
    sub_centers: int,
    chunk_size: int,
    kernels: str,
    sample: Tensor | None,
) -> tuple[Tensor, Tensor, Tensor]:
    n = x_hat.shape[0]
    rows = weight.shape[0] if sample is None else sample.shape[0] * sub_centers
    return x_hat.new_empty(n), cos_target.new_empty(n), x_hat.new_empty(rows)


def _backward_impl(
    grad_sums: Tensor,
    grad_cos: Tensor,
    x_hat: Tensor,
    weight: Tensor,
    labels: Tensor,
    target_rows: Tensor,
    bias: Tensor,
    inv_norms: Tensor,
    scale: float,
    power: float,
    offset: float,
    sign: float,
    clamp: float,
    straight_through: bool,
    sub_centers: int,
    chunk_size: int,
    kernels: str,
    need_weight: bool,
    sample: Tensor | None,
) -> tuple[Tensor, Tensor, Tensor]:
    """``(∂L/∂x̂[N, D], ∂L/∂W[C·K, D] (empty if not needed), ∂L/∂b (0-dim, the non-target
    share))`` from ``∂L/∂S`` and ``∂L/∂cos_target``."""
    gemm = gemm_dtype(x_hat, weight)
    chunks = ChunkWorkspace(x_hat, weight, labels, sub_centers, chunk_size, gemm, inv_norms, sample)
    rule = _rule(scale, power, offset, sign, bias, clamp, straight_through)
    grad = grad_sums.to(x_hat.dtype)  # (N,)
    grad_x_hat = torch.zeros_like(x_hat)  # (N, D)
    grad_weight = None
    if need_weight:
        grad_weight = torch.empty_like(weight) if sample is None else torch.zeros_like(weight)
    if kernels == "triton":
        from .triton_binary import triton_nontarget_gradient

        grad_bias = triton_nontarget_gradient(chunks, rule, sign, grad, grad_x_hat, grad_weight)
    else:
        grad_bias = rule_gradient(chunks, rule, sign, grad, grad_x_hat, grad_weight)
    add_target_gradient(chunks, grad_cos, target_rows, None, grad_x_hat, grad_weight)
    return (
        grad_x_hat,
        grad_weight if grad_weight is not None else weight.new_empty(0),
        grad_bias.to(bias.dtype),
    )


_backward_op = torch.library.custom_op(
    "marginface::chunked_binary_sums_backward", _backward_impl, mutates_args=()
)


@_backward_op.register_fake
def _backward_fake(
    grad_sums: Tensor,
    grad_cos: Tensor,
    x_hat: Tensor,
    weight: Tensor,
    labels: Tensor,
    target_rows: Tensor,
    bias: Tensor,
    inv_norms: Tensor,
    scale: float,
    power: float,
    offset: float,
    sign: float,
    clamp: float,
    straight_through: bool,
    sub_centers: int,
    chunk_size: int,
    kernels: str,
    need_weight: bool,
    sample: Tensor | None,
) -> tuple[Tensor, Tensor, Tensor]:
    grad_weight = torch.empty_like(weight) if need_weight else weight.new_empty(0)
    return torch.empty_like(x_hat), grad_weight, torch.empty_like(bias)


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, ...]) -> None:
    x_hat, weight, labels, target_rows, _, bias = inputs[:6]
    ctx.options = inputs[6:15]  # scale ... kernels
    ctx.save_for_backward(x_hat, weight, labels, target_rows, bias, output[2], inputs[15])


def _backward_through(
    backward: Any, ctx: Any, grad_sums: Tensor | None, grad_cos: Tensor | None
) -> tuple[Tensor | None, ...]:
    """The gradients of the forward op's 16 inputs, by ``backward`` (the op or its
    implementation)."""
    x_hat, weight, labels, target_rows, bias, inv_norms, sample = ctx.saved_tensors
    n = x_hat.shape[0]
    if grad_sums is None:
        grad_sums = torch.zeros(n, dtype=x_hat.dtype, device=x_hat.device)
    if grad_cos is None:
        grad_cos = torch.zeros(n, dtype=x_hat.dtype, device=x_hat.device)
    need_weight = ctx.needs_input_grad[1]
    grad_x_hat, grad_weight, grad_bias = backward(
        grad_sums, grad_cos, x_hat, weight, labels, target_rows, bias, inv_norms,
        *ctx.options, need_weight, sample,
    )  # fmt: skip
    need_bias = ctx.needs_input_grad[5]
    return (
        grad_x_hat,
        grad_weight if need_weight else None,
        None,
        None,
        None,
        grad_bias if need_bias else None,
        *([None] * 10),
    )


_sums_call = wire(
    _sums, _sums_impl, _backward_op, _backward_impl, _setup_context, _backward_through
)
"""The forward operator under ``torch.compile``, its eager twin otherwise."""


def fused_binary_loss(
    x: Tensor,
    weight: Tensor,
    labels: Tensor,
    margin: Any,
    *,
    sub_centers: int,
    chunk_size: int | None,
    triton: bool,
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
        triton: run the per-chunk work on the Triton kernels (decided by the caller).
    """
    k = sub_centers
    chunk_size = chunk_size_for(x, weight, k, sampled_classes, chunk_size)
    x_hat, _ = normalized_with_norms(x)  # (N, D)
    cos_raw, target_rows = target_cosines(
        x_hat.detach(), weight.detach(), labels, k, sampled_classes
    )
    parameters = margin.binary_kernel_parameters()
    clamp = margin.logit_clamp if margin.logit_clamp is not None else 0.0
    sums, cos_pass, _ = _sums_call(
        x_hat, weight, labels, target_rows, cos_raw, margin.bias, float(margin.scale),
        float(parameters["power"]), float(parameters["offset"]), float(margin.bias_sign),
        float(clamp), margin.gradient == "straight_through", k, chunk_size,
        "triton" if triton else "torch", sampled_classes,
    )  # fmt: skip
    target_logit = margin.target_logit(cos_pass.clamp(-1.0, 1.0), margin.bias)  # (N,)
    return margin.positive_weight * softplus(-target_logit) + margin.negative_weight * sums
