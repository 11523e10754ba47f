"""The one-vs-all reduction's two passes over the class chunks on PyTorch ops, for a margin
with a declared rule (:class:`~marginface.executors.binary_rule.BinaryRule`), in place.

With ``u = max((c + 1)/2, 0)`` and ``z = s(2u^t - 1 + μ) + βb`` (clamped to ``[-L, L]`` if the
rule clamps):

* :func:`rule_sums`: each row's ``S_i = Σ_{j≠y_i} softplus(z_ij)``;
* :func:`rule_gradient`: ``∂L/∂c_ij = γ_i σ(z_ij) ∂z/∂c`` (0 where the clamp is active), routed
  through the chunk GEMM into ``∂L/∂x̂`` and every row of ``∂L/∂W``, and the non-target share of
  ``∂L/∂b``, ``β Σ_ij γ_i σ(z_ij)`` over the entries inside the clamp.

Each chunk's cosines are transformed over the chunk workspace itself (one ``N×c`` temporary for
the softplus tail, one for the slope of the exact gradient, a boolean mask with a clamp), in the
order of the formula above, so the values equal the margin's own
(:meth:`~marginface.margins.binary.BinaryMargin.nontarget_logit`, the dense path).
Inter-class filtering (``filter_threshold`` ``τ > 0``) sets the cosines above ``τ`` to 0 first
and their gradient to 0.
A margin without a declared rule runs the same two passes on its own logits
(:func:`margin_sums`, :func:`margin_gradient`). Both passes are steps of the one chunk loop
(:func:`~marginface.executors.chunk_loop.row_statistics`'s sum,
:func:`~marginface.executors.chunk_loop.gradient_pass`), shared with the softmax. The custom
operators (:mod:`~marginface.executors.fused_op`) and the autograd Function's one-vs-all
reduction (:class:`~marginface.executors.binary_loop.BinaryReduction`) both call these passes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..margins.binary import softplus
from .binary_rule import BinaryRule
from .chunk_loop import ChunkCosineGradient, gradient_pass, row_statistics
from .chunk_workspace import ChunkWorkspace

__all__ = ["margin_gradient", "margin_sums", "rule_gradient", "rule_sums"]


def rule_sums(chunks: ChunkWorkspace, rule: BinaryRule, filter_threshold: float = 0.0) -> Tensor:
    """Each row's ``Σ_{j≠y_i} softplus(z_ij)`` over every chunk of ``chunks``, ``Tensor[N]`` in
    the compute dtype (no gradient). ``filter_threshold``: inter-class filtering's ``τ``
    (0: off)."""

    def terms(cos: Tensor) -> tuple[Tensor]:  # over the workspace
        z = _logits_in_place(_halved_in_place(cos), rule)  # (N, c)
        if rule.clamp is not None:
            z.clamp_(-rule.clamp, rule.clamp)
        return (_softplus_in_place(z),)

    return row_statistics(chunks, terms, 1, filter_threshold, zero_in_place=True)[0]


def margin_sums(chunks: ChunkWorkspace, margin: Any, b: Tensor) -> Tensor:
    """:func:`rule_sums` for a margin without a declared rule: its own
    :meth:`~marginface.margins.binary.BinaryMargin.nontarget_logit` (PyTorch ops, out of
    place), ``Tensor[N]``."""

    def terms(cos: Tensor) -> tuple[Tensor]:
        return (softplus(margin.nontarget_logit(cos, b)),)  # (N, c)

    threshold = margin.interclass_filtering_threshold
    return row_statistics(chunks, terms, 1, threshold, zero_in_place=True)[0]


def rule_gradient(
    chunks: ChunkWorkspace,
    rule: BinaryRule,
    sign: float,
    row_grad: Tensor,
    grad_x_hat: Tensor,
    grad_weight: Tensor | None,
    filter_threshold: float = 0.0,
) -> Tensor:
    """The backward's pass over the chunks: add the non-target part of ``∂L/∂x̂``
    (``Tensor[N, D]``) into ``grad_x_hat``, write every row of ``grad_weight`` (``Tensor[C·K,
    D]``, or None), and return the non-target share of ``∂L/∂b`` (0-dim). ``row_grad``:
    ``Tensor[N]``, the gradient reaching each row's sum (``γ_i w_-``); ``sign``: ``β``."""
    row_grad = row_grad.unsqueeze(1)  # (N, 1)

    def cosine_gradient(start: int, stop: int) -> tuple[Tensor, Tensor | None, Tensor]:
        cos, best, dirty = chunks.filtered_cosine(start, stop, filter_threshold, argmax=True)
        g_cos = _nontarget_cosine_gradient(chunks, start, stop, cos, rule, row_grad, sign)
        if dirty is not None:  # filtered entries: value 0, gradient 0
            g_cos.value.masked_fill_(dirty, 0.0)
        return g_cos.value, best, g_cos.bias_share

    return _gradient_pass(chunks, cosine_gradient, grad_x_hat, grad_weight)


def margin_gradient(
    chunks: ChunkWorkspace,
    margin: Any,
    b: Tensor,
    grad: Tensor,
    grad_x_hat: Tensor,
    grad_weight: Tensor | None,
) -> Tensor:
    """:func:`rule_gradient` for a margin without a declared rule, through its own
    :meth:`~marginface.margins.binary.BinaryMargin.nontarget_logit_slopes`; ``grad``: the
    gradient reaching each row's loss (``γ_i``). Returns this shard's non-target share of
    ``∂L/∂b`` (0-dim)."""
    row_weight = (grad * margin.negative_weight).unsqueeze(1)  # (N, 1)
    threshold = margin.interclass_filtering_threshold

    def cosine_gradient(start: int, stop: int) -> tuple[Tensor, Tensor | None, Tensor]:
        cos, best, dirty = chunks.filtered_cosine(start, stop, threshold, argmax=True)
        z, slope, bias_slope = margin.nontarget_logit_slopes(cos, b)
        g_logit = torch.sigmoid(z).mul_(row_weight)  # (N, c), ∂L/∂z
        slot_rows, slot_cols = chunks.target_slots(start, stop)
        g_logit[slot_rows, slot_cols] = 0.0
        if isinstance(bias_slope, Tensor):
            share = (g_logit * bias_slope).sum()
        else:
            share = g_logit.sum() * bias_slope
        g_cos = g_logit.mul_(slope)  # (N, c), ∂L/∂cos
        if dirty is not None:  # filtered entries: value 0, gradient 0
            g_cos = g_cos.masked_fill_(dirty, 0.0)
        return g_cos, best, share

    return _gradient_pass(chunks, cosine_gradient, grad_x_hat, grad_weight)


def _gradient_pass(
    chunks: ChunkWorkspace,
    cosine_gradient: ChunkCosineGradient,
    grad_x_hat: Tensor,
    grad_weight: Tensor | None,
) -> Tensor:
    """:func:`~marginface.executors.chunk_loop.gradient_pass` from a 0-dim zero share."""
    zero = torch.zeros((), dtype=grad_x_hat.dtype, device=grad_x_hat.device)
    total = gradient_pass(chunks, cosine_gradient, grad_x_hat, grad_weight, share=zero)
    assert total is not None
    return total


def _halved_in_place(cos: Tensor) -> Tensor:
    """``u = max((c + 1)/2, 0)`` written over ``cos`` (``Tensor[N, c]``, the chunk workspace)."""
    return cos.add_(1.0).mul_(0.5).clamp_min_(0.0)


def _logits_in_place(u: Tensor, rule: BinaryRule) -> Tensor:
    """``z = s(2u^t - 1 + μ) + βb`` (before the clamp) written over ``u`` (``Tensor[N, c]``),
    in the formula's order, without ``N×c`` temporaries."""
    z = u.pow_(rule.power).mul_(2.0).sub_(1.0).add_(rule.offset)
    return z.mul_(rule.scale).add_(rule.bias_term)


def _softplus_in_place(z: Tensor) -> Tensor:
    """:func:`~marginface.margins.binary.softplus` (``max(z, 0) + log1p(e^{-|z|})``) written
    over ``z`` (``Tensor[N, c]``), with one ``N×c`` temporary."""
    tail = z.abs().neg_().exp_().log1p_()  # (N, c)
    return z.clamp_min_(0.0).add_(tail)


@dataclass
class _ChunkGradient:
    """One chunk's ``∂L/∂cos`` (``value``, ``Tensor[N, c]``, over the workspace) and its
    non-target share of ``∂L/∂b`` (``bias_share``, 0-dim)."""

    value: Tensor
    bias_share: Tensor


def _nontarget_cosine_gradient(
    chunks: ChunkWorkspace,
    start: int,
    stop: int,
    cos: Tensor,
    rule: BinaryRule,
    row_grad: Tensor,
    sign: float,
) -> _ChunkGradient:
    """``∂L/∂c_ij = γ_i σ(z_ij) ∂z/∂c`` of one chunk's cosines ``cos`` (``Tensor[N, c]``, the
    workspace, overwritten), the target column zeroed, and the chunk's ``∂L/∂b`` share
    ``β Σ γ_i σ(z_ij) ∂z/∂(βb)``. In place: the workspace, plus one ``N×c`` buffer for the
    slope of the exact gradient and a boolean mask with a clamp."""
    u = _halved_in_place(cos)  # (N, c)
    slope: Tensor | float = rule.scale  # ∂z/∂c, straight-through
    if not rule.straight_through:
        slope = u.pow(rule.power - 1.0).mul_(rule.power * rule.scale)  # (N, c)
    z = _logits_in_place(u, rule)  # (N, c), over the workspace
    outside = None
    if rule.clamp is not None:  # ∂z/∂c = ∂z/∂b = 0 where the clamp is active
        outside = (z < -rule.clamp) | (z > rule.clamp)  # (N, c) bool
        z.clamp_(-rule.clamp, rule.clamp)
    g_logit = z.sigmoid_().mul_(row_grad)  # (N, c), ∂L/∂z
    slot_rows, slot_cols = chunks.target_slots(start, stop)
    g_logit[slot_rows, slot_cols] = 0.0
    if outside is not None:
        g_logit.masked_fill_(outside, 0.0)
    bias_share = g_logit.sum() * sign
    return _ChunkGradient(g_logit.mul_(slope), bias_share)  # (N, c), ∂L/∂cos
