"""The chunked executor as ``torch.library`` custom ops, so that ``torch.compile`` keeps it whole.

The chunk loop (its GEMMs, its reused workspace, its in-place weight gradient) is what saves the
memory of the ``N×C`` logits; traced op by op, it would lose that (and ``torch.compile`` would
break the graph at its host syncs). So the loop is two opaque operators that Dynamo and
AOTAutograd see as one node each, with shapes given by their fake implementations:

* ``marginface::chunked_nontarget_lse(x̂, W, labels, cos_target, s, threshold, t, ...)
  -> (lse_nt[N], cos_target[N], r[C·K])``: the log-sum-exp over each row's *non-target* logits
  ``lse_nt_i = log Σ_{j≠y_i} e^{s_i g(cos θ_ij)}`` (chunk by chunk,
  :meth:`~marginface.executors.chunked._Chunks.statistics`), the target cosine passed through
  (a copy), and the inverse center norms ``r_j = 1/max(‖w_j‖, eps)``.
* ``marginface::chunked_nontarget_lse_backward``: its backward, the chunk loop that recomputes
  each chunk and writes ``∂L/∂x̂`` and every row of ``∂L/∂W`` in place
  (:func:`~marginface.executors.chunk_loop.nontarget_gradient`), plus the target's share.
* ``marginface::chunked_row_statistics(x̂, W, labels, threshold, ...) -> sums[k, N]``: the
  per-row sums over the non-target classes that a margin's ``prepare`` needs (NPCFace's hard
  negatives), for the compiled rules of
  :data:`~marginface.margins.base.ROW_STATISTICS_KERNELS` that the margin declares
  (:meth:`~marginface.margins.base.Margin.row_statistics_kernel`), on PyTorch ops or the
  kernel of :mod:`~marginface.executors.triton_row_statistics`; no gradient.

Everything of size ``N`` is ordinary PyTorch around them (:func:`fused_margin_cross_entropy`):
the normalization ``x̂ = x/‖x‖``, the target cosine (an indexed dot, computed without gradient
before the op, so that the margin's :meth:`~marginface.margins.base.Margin.prepare` can see
it and update its buffers), the margin's target logit ``T_i = s_i f(cos θ_iy)`` on the op's
pass-through copy of the target cosine, and

.. math:: L_i = \\operatorname{logaddexp}(\\mathrm{lse}^{nt}_i, T_i) - T_i

Autograd (eager) or AOTAutograd (compiled) differentiates that small graph; the gradient
reaching the pass-through cosine comes back into the backward op, which adds the target's
``∂L/∂cos θ_iy`` to the same ``∂L/∂W`` buffer: one ``C·K×D`` gradient, as in eager.
The backward op is exact for any upstream gradient: with ``γ_i = ∂L/∂lse^{nt}_i``,
``∂L/∂logit_ij = γ_i e^{z_ij - lse^{nt}_i}`` (which is ``p_ij·∂L/∂L_i``).

The non-target rule travels as a code and tensors (``rule``: an index into :data:`RULE_KINDS`,
the rules of :data:`~marginface.margins.base.NONTARGET_KERNELS`, with a per-row ``threshold``
and the rule's scalars ``t``), because an operator takes no Python objects; the
margin declares which (:meth:`~marginface.margins.base.Margin.nontarget_kernel`). Margins with
another ``nontarget_cosine`` run on the autograd Function of
:mod:`~marginface.executors.chunked_function` (correct, but ``torch.compile`` breaks the graph
there). Both are thin wrappers over the same chunk loop
(:mod:`~marginface.executors.chunk_loop`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from ..margins.base import NONTARGET_KERNELS, ROW_STATISTICS_KERNELS, Margin
from ..margins.rules import ROW_STATISTICS
from ._custom_op import wire
from .chunk_loop import (
    ChunkRule,
    add_target_gradient,
    chunk_rule_for_kernel,
    nontarget_gradient,
    nontarget_statistics,
    row_statistics,
    target_cosines,
)
from .chunk_plan import (
    chunk_size_for,
    gemm_dtype,
    nontarget_kernel_of,
    normalized_with_norms,
    requested_kernels,
    scale_per_row,
    use_triton_kernels,
)
from .chunk_workspace import ChunkWorkspace
from .triton_dispatch import triton_row_statistics

__all__ = [
    "RULE_CURRICULAR",
    "RULE_IDENTITY",
    "fused_margin_cross_entropy",
    "nontarget_rule",
    "row_statistics_rule",
]

RULE_IDENTITY = 0
"""``g(cos) = cos``: every built-in margin but CurricularFace."""

RULE_CURRICULAR = 1
"""CurricularFace's :func:`~marginface.margins.curricularface.curricular_negative`, given
per-row ``threshold[N]`` and a 0-dim ``t``."""


RULE_KINDS = NONTARGET_KERNELS
"""The rule of each code: ``RULE_KINDS[code]`` is a name of
:data:`~marginface.margins.base.NONTARGET_KERNELS`."""


def nontarget_rule(margin: Margin) -> int | None:
    """The rule code of ``margin``'s declared
    :meth:`~marginface.margins.base.Margin.nontarget_kernel`, or None if it declares none,
    filters, or needs per-row statistics without declaring them compiled (another rule,
    AdaFace's ``cosine_clamp``, inter-class filtering, a statistics pass in the margin's own
    Python: those run on the autograd Function of
    :mod:`~marginface.executors.chunked_function`)."""
    kind = nontarget_kernel_of(margin)
    if margin.interclass_filtering_threshold > 0 or kind not in RULE_KINDS:
        return None
    if margin.row_statistics_size() > 0 and row_statistics_rule(margin) is None:
        return None  # a pass over the classes in the margin's own Python, before its hooks
    return RULE_KINDS.index(kind)


def row_statistics_rule(margin: Margin) -> int | None:
    """The code (an index into :data:`~marginface.margins.base.ROW_STATISTICS_KERNELS`) of
    ``margin``'s declared :meth:`~marginface.margins.base.Margin.row_statistics_kernel`, or None
    if it declares none (or needs no row statistics); ``ValueError`` naming the margin and the
    value for a name that is not compiled in, or whose number of sums differs from
    :meth:`~marginface.margins.base.Margin.row_statistics_size`."""
    if margin.row_statistics_size() == 0:
        return None
    kind = margin.row_statistics_kernel()
    if kind is None:
        return None
    if kind not in ROW_STATISTICS_KERNELS:
        raise ValueError(
            f"margin {type(margin).__name__}'s row_statistics_kernel() must be one of "
            f"{ROW_STATISTICS_KERNELS} or None, got {kind!r}"
        )
    size = ROW_STATISTICS[kind].size
    if size != margin.row_statistics_size():
        raise ValueError(
            f"margin {type(margin).__name__}'s row_statistics_kernel() {kind!r} gives {size} "
            f"sums, but its row_statistics_size() is {margin.row_statistics_size()}"
        )
    return ROW_STATISTICS_KERNELS.index(kind)


def _chunk_rule(rule: int, threshold: Tensor, t: Tensor, x_hat: Tensor, kernels: str) -> ChunkRule:
    """The loop's :class:`~marginface.executors.chunk_loop.ChunkRule` of rule code ``rule``
    (``threshold[N]``, ``t`` 0-dim: CurricularFace's; empty for the identity); ``kernels``:
    ``"triton"`` or ``"torch"``, chosen at the call's entry."""
    kind = RULE_KINDS[rule]
    parameters = {"threshold": threshold, "t": t} if kind != "identity" else {}
    return chunk_rule_for_kernel(
        kind, parameters, rows=x_hat.shape[0], device=x_hat.device, triton=kernels == "triton"
    )


def _row_statistics_impl(
    x_hat: Tensor,
    weight: Tensor,
    labels: Tensor,
    threshold: Tensor,
    sub_centers: int,
    chunk_size: int,
    kind: int,
    kernels: str,
    sample: Tensor | None,
) -> Tensor:
    """The per-row statistics ``Tensor[k, N]`` of the compiled rule
    ``ROW_STATISTICS_KERNELS[kind]`` with its per-row ``threshold`` (``Tensor[N]``), summed over
    every non-target class (every sampled one), one chunk at a time, on the Triton kernel
    (``kernels="triton"``) or PyTorch ops; no gradient."""
    gemm = gemm_dtype(x_hat, weight)
    chunks = ChunkWorkspace(x_hat, weight, labels, sub_centers, chunk_size, gemm, sample=sample)
    name = ROW_STATISTICS_KERNELS[kind]
    if kernels == "triton":
        return triton_row_statistics(chunks, name, threshold).to(chunks.inv_norms.dtype)
    declared = ROW_STATISTICS[name]
    terms = declared.terms({"threshold": threshold.to(chunks.inv_norms.dtype)})
    return row_statistics(chunks, terms, declared.size)


_row_statistics_op = torch.library.custom_op(
    "marginface::chunked_row_statistics", _row_statistics_impl, mutates_args=()
)


@_row_statistics_op.register_fake
def _row_statistics_fake(
    x_hat: Tensor,
    weight: Tensor,
    labels: Tensor,
    threshold: Tensor,
    sub_centers: int,
    chunk_size: int,
    kind: int,
    kernels: str,
    sample: Tensor | None,
) -> Tensor:
    size = ROW_STATISTICS[ROW_STATISTICS_KERNELS[kind]].size
    return x_hat.new_empty(size, x_hat.shape[0])


def _row_statistics_call(*inputs: Any) -> Tensor:
    """The statistics op under ``torch.compile``, its implementation otherwise (no gradient
    flows through either: the inputs are detached)."""
    if torch.compiler.is_compiling():
        return _row_statistics_op(*inputs)
    return _row_statistics_impl(*inputs)


def _nontarget_lse_impl(
    x_hat: Tensor,
    weight: Tensor,
    labels: Tensor,
    target_rows: Tensor,
    cos_target: Tensor,
    scale: Tensor,
    threshold: Tensor,
    t: Tensor,
    sub_centers: int,
    chunk_size: int,
    rule: int,
    kernels: str,
    sample: Tensor | None,
) -> tuple[Tensor, Tensor, Tensor]:
    """``(lse_nt[N], cos_target[N] (a copy), inv_norms[C·K] (or [S·K]))``; see the module
    docstring."""
    gemm = gemm_dtype(x_hat, weight)
    chunks = ChunkWorkspace(x_hat, weight, labels, sub_centers, chunk_size, gemm, sample=sample)
    chunk_rule = _chunk_rule(rule, threshold, t, x_hat, kernels)
    row_max, exp_sum = nontarget_statistics(chunks, chunk_rule, scale)
    lse = row_max + torch.log(exp_sum)  # (N,), -inf for a row without non-targets
    return lse, cos_target.clone(), chunks.inv_norms


_nontarget_lse = torch.library.custom_op(
    "marginface::chunked_nontarget_lse", _nontarget_lse_impl, mutates_args=()
)


@_nontarget_lse.register_fake
def _nontarget_lse_fake(
    x_hat: Tensor,
    weight: Tensor,
    labels: Tensor,
    target_rows: Tensor,
    cos_target: Tensor,
    scale: Tensor,
    threshold: Tensor,
    t: Tensor,
    sub_centers: int,
    chunk_size: int,
    rule: int,
    kernels: str,
    sample: Tensor | None,
) -> tuple[Tensor, Tensor, Tensor]:
    n = x_hat.shape[0]
    rows = weight.shape[0] if sample is None else sample.shape[0] * sub_centers
    return x_hat.new_empty(n), cos_target.new_empty(n), x_hat.new_empty(rows)


def _nontarget_lse_backward_impl(
    grad_lse: Tensor,
    grad_cos: Tensor,
    x_hat: Tensor,
    weight: Tensor,
    labels: Tensor,
    target_rows: Tensor,
    scale: Tensor,
    threshold: Tensor,
    t: Tensor,
    lse: Tensor,
    inv_norms: Tensor,
    sub_centers: int,
    chunk_size: int,
    rule: int,
    kernels: str,
    need_weight: bool,
    need_scale: bool,
    sample: Tensor | None,
) -> tuple[Tensor, Tensor, Tensor]:
    """``(∂L/∂x̂[N, D], ∂L/∂W[C·K, D] (empty if not needed), ∂L/∂s[N] (empty if not needed))``
    from ``∂L/∂lse_nt`` and ``∂L/∂cos_target``."""
    gemm = gemm_dtype(x_hat, weight)
    chunks = ChunkWorkspace(x_hat, weight, labels, sub_centers, chunk_size, gemm, inv_norms, sample)
    grad_x_hat = torch.zeros_like(x_hat)  # (N, D)
    grad_weight = None  # every row (every sampled row; the others are 0) written below
    if need_weight:
        grad_weight = torch.empty_like(weight) if sample is None else torch.zeros_like(weight)
    grad_scale = torch.zeros_like(scale) if need_scale else None  # (N,)
    nontarget_gradient(
        chunks,
        _chunk_rule(rule, threshold, t, x_hat, kernels),
        scale=scale,
        lse=lse,
        grad=grad_lse.to(x_hat.dtype),
        grad_x_hat=grad_x_hat,
        grad_weight=grad_weight,
        grad_scale=grad_scale,
    )
    add_target_gradient(chunks, grad_cos, target_rows, None, grad_x_hat, grad_weight)
    return (
        grad_x_hat,
        grad_weight if grad_weight is not None else weight.new_empty(0),
        grad_scale if grad_scale is not None else x_hat.new_empty(0),
    )


_nontarget_lse_backward = torch.library.custom_op(
    "marginface::chunked_nontarget_lse_backward", _nontarget_lse_backward_impl, mutates_args=()
)


@_nontarget_lse_backward.register_fake
def _nontarget_lse_backward_fake(
    grad_lse: Tensor,
    grad_cos: Tensor,
    x_hat: Tensor,
    weight: Tensor,
    labels: Tensor,
    target_rows: Tensor,
    scale: Tensor,
    threshold: Tensor,
    t: Tensor,
    lse: Tensor,
    inv_norms: Tensor,
    sub_centers: int,
    chunk_size: int,
    rule: int,
    kernels: str,
    need_weight: bool,
    need_scale: bool,
    sample: Tensor | None,
) -> tuple[Tensor, Tensor, Tensor]:
    grad_weight = torch.empty_like(weight) if need_weight else weight.new_empty(0)
    grad_scale = torch.empty_like(scale) if need_scale else x_hat.new_empty(0)
    return torch.empty_like(x_hat), grad_weight, grad_scale


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, ...]) -> None:
    x_hat, weight, labels, target_rows, _, scale, threshold, t = inputs[:8]
    k, chunk_size, rule, kernels, sample = inputs[8:]
    lse, _, inv_norms = output
    ctx.save_for_backward(
        x_hat, weight, labels, target_rows, scale, threshold, t, lse, inv_norms, sample
    )
    ctx.options = (k, chunk_size, rule, kernels)


def _backward_through(
    backward: Any, ctx: Any, grad_lse: Tensor | None, grad_cos: Tensor | None
) -> tuple[Tensor | None, ...]:
    """The gradients of the forward op's 13 inputs, by ``backward`` (the op or its
    implementation)."""
    x_hat, weight, labels, target_rows, scale, threshold, t, lse, inv_norms, sample = (
        ctx.saved_tensors
    )
    k, chunk_size, rule, kernels = ctx.options
    need_weight, need_scale = ctx.needs_input_grad[1], ctx.needs_input_grad[5]
    if grad_lse is None:
        grad_lse = torch.zeros_like(lse)
    if grad_cos is None:
        grad_cos = torch.zeros_like(lse)
    grad_x_hat, grad_weight, grad_scale = backward(
        grad_lse,
        grad_cos,
        x_hat,
        weight,
        labels,
        target_rows,
        scale,
        threshold,
        t,
        lse,
        inv_norms,
        k,
        chunk_size,
        rule,
        kernels,
        need_weight,
        need_scale,
        sample,
    )
    return (
        grad_x_hat,
        grad_weight if need_weight else None,
        None,
        None,
        None,
        grad_scale if need_scale else None,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
    )


_nontarget_lse_call = wire(
    _nontarget_lse, _nontarget_lse_impl, _nontarget_lse_backward, _nontarget_lse_backward_impl,
    _setup_context, _backward_through,
)  # fmt: skip
"""The forward operator under ``torch.compile``, its eager twin otherwise."""


def fused_margin_cross_entropy(
    x: Tensor,
    weight: Tensor,
    labels: Tensor,
    margin: Margin,
    rule: int,
    *,
    sub_centers: int,
    chunk_size: int | None,
    kernels: str | None,
    sampled_classes: Tensor | None = None,
    class_values: Mapping[str, Tensor] | None = None,
) -> Tensor:
    """The chunked executor's cross-entropy ``Tensor[N]`` (without the regularizer) through the
    custom ops: traceable by ``torch.compile`` without a graph break.

    Args:
        x: ``Tensor[N, D]`` in the compute dtype (float32/float64), autocast off.
        weight: ``Tensor[C·K, D]``, labels: ``Tensor[N]`` int64 in ``[0, C)`` (in ``[0, S)``:
            positions in ``sampled_classes``, if given).
        margin: a margin whose :func:`nontarget_rule` is ``rule`` (not None).
        sub_centers, chunk_size, kernels, sampled_classes, class_values: as
            :func:`~marginface.executors.chunked.chunked_margin_cross_entropy` (the per-class
            values enter the target's small graph of ``N``-vectors, so autograd differentiates
            them).
    """
    n, k = x.shape[0], sub_centers
    triton = use_triton_kernels(requested_kernels(kernels), x, weight, margin)
    kernels = "triton" if triton else "torch"  # chosen once for the call's operators
    chunk_size = chunk_size_for(x, weight, k, sampled_classes, chunk_size)
    x_hat, norms = normalized_with_norms(x)  # (N, D), (N,)
    sample = sampled_classes
    cos_raw, target_rows = target_cosines(x_hat.detach(), weight.detach(), labels, k, sample)
    cos_target = cos_raw.clamp(-1.0, 1.0)  # (N,)
    norms_arg = norms if margin.requires_norms else None
    empty = x.new_empty(0)
    statistics_scale = margin.statistics_scale()
    statistics_rule = row_statistics_rule(margin)
    if statistics_rule is not None:  # per-row sums over the classes, one more pass
        with torch.no_grad():
            parameters = margin.row_statistics_kernel_parameters(cos_target)
            threshold = parameters.get("threshold", empty).reshape(-1).to(x.dtype)  # (N,)
            sums = _row_statistics_call(
                x_hat.detach(), weight.detach(), labels, threshold, k, chunk_size,
                statistics_rule, kernels, sample,
            )  # fmt: skip
        context = margin.prepare_with_row_statistics(cos_target, labels, norms_arg, sums)
    elif statistics_scale is not None:
        with torch.no_grad():  # log B at the old scale: one more pass over the classes
            old = scale_per_row(statistics_scale, n, x)  # (N,)
            per_row, _, _ = _nontarget_lse_call(
                x_hat.detach(), weight.detach(), labels, target_rows, cos_raw, old, empty,
                empty, k, chunk_size, RULE_IDENTITY, kernels, sample,
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
    lse_nt, cos_pass, _ = _nontarget_lse_call(
        x_hat, weight, labels, target_rows, cos_raw, row_scale, threshold, t, k, chunk_size,
        rule, kernels, sample,
    )  # fmt: skip
    target = margin.adjusted_target_cosine(cos_pass.clamp(-1.0, 1.0), norms_arg, context)
    target_logit = target.to(x.dtype) * row_scale  # (N,)
    return torch.logaddexp(lse_nt, target_logit) - target_logit
