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
  (:meth:`~marginface.executors.chunked._Chunks.nontarget_gradient`), plus the target's share.

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

The non-target rule travels as tensors (``rule``: :data:`RULE_IDENTITY` or
:data:`RULE_CURRICULAR`, CurricularFace's ``cos·(t + cos)`` above the row's ``threshold``),
because an operator takes no Python objects; margins with another ``nontarget_cosine`` run on
the autograd-Function path of :mod:`~marginface.executors.chunked` (correct, but
``torch.compile`` breaks the graph there).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from ..margins.adacos import AdaCosMargin
from ..margins.base import Margin
from ..margins.curricularface import CurricularFaceMargin, curricular_negative
from .chunked import (
    _Chunks,
    _curricular_triton_rule,
    _overrides,
    _project_rows_into,
    _resolve_kernels,
    _row_scale,
    _triton_statistics,
    default_chunk_size,
    gemm_dtype,
    scale_in_gemm,
)
from .dense import NORMALIZE_EPS, row_norms

__all__ = [
    "RULE_CURRICULAR",
    "RULE_IDENTITY",
    "fused_margin_cross_entropy",
    "nontarget_rule",
]

RULE_IDENTITY = 0
"""``g(cos) = cos``: every built-in margin but CurricularFace."""

RULE_CURRICULAR = 1
"""CurricularFace's :func:`~marginface.margins.curricularface.curricular_negative`, given
per-row ``threshold[N]`` and a 0-dim ``t``."""


def nontarget_rule(margin: Margin) -> int | None:
    """The rule code of ``margin``'s ``nontarget_cosine``, or None if the ops do not know it
    (another rule, AdaFace's ``cosine_clamp``, inter-class filtering: those run on the autograd
    Function of :mod:`~marginface.executors.chunked`)."""
    if margin.interclass_filtering_threshold > 0:
        return None
    if margin.nontarget_is_identity():
        return RULE_IDENTITY
    method = type(margin).nontarget_cosine
    if method is CurricularFaceMargin.nontarget_cosine:
        return RULE_CURRICULAR
    return None


def _rule_function(rule: int, threshold: Tensor, t: Tensor) -> Any:
    """``cos -> g(cos)`` for the rule (differentiable in ``cos``)."""
    if rule == RULE_IDENTITY:
        return lambda cos: cos
    return lambda cos: curricular_negative(cos, threshold.unsqueeze(1).to(cos.dtype), t)


def _rule_derivative(rule: int, threshold: Tensor, t: Tensor) -> Any:
    """``cos -> g'(cos)`` for a non-identity rule: ``t + 2cos`` on hard negatives, 1 elsewhere
    (:func:`~marginface.margins.curricularface.curricular_negative`)."""

    def derivative(cos: Tensor) -> Tensor:
        hard = cos > threshold.unsqueeze(1).to(cos.dtype)  # (N, c)
        return torch.where(hard, cos * 2.0 + t.to(cos.dtype), torch.ones_like(cos))

    return derivative


def _triton_rule(rule: int, threshold: Tensor, t: Tensor, rows: int) -> Any:
    from .triton_kernels import NonTargetRule

    if rule == RULE_IDENTITY:
        return NonTargetRule()
    return _curricular_triton_rule(threshold, t, rows, threshold.device)


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
    kernels: str | None,
    sample: Tensor | None,
) -> tuple[Tensor, Tensor, Tensor]:
    """``(lse_nt[N], cos_target[N] (a copy), inv_norms[C·K] (or [S·K]))``; see the module
    docstring."""
    gemm = gemm_dtype(x_hat, weight)
    n = x_hat.shape[0]
    chunks = _Chunks(x_hat, weight, labels, sub_centers, chunk_size, gemm, sample=sample)
    use_triton = _resolve_kernels(kernels, x_hat, weight, gemm)
    with torch.no_grad():
        if use_triton:
            triton_rule = _triton_rule(rule, threshold, t, n)
            stats = _triton_statistics(chunks, scale.contiguous(), triton_rule)
        elif rule == RULE_IDENTITY and scale_in_gemm(gemm):  # logits = (s·x̂) @ ŵᵀ: the
            # scale rides in the GEMM
            stats = chunks.statistics((x_hat * scale.unsqueeze(1)).to(gemm))
        elif rule == RULE_IDENTITY:  # float16: scale the float32 cosines (in place)
            stats = chunks.statistics(chunks.x_gemm, lambda cos: cos.mul_(scale.unsqueeze(1)))
        else:
            transform = _rule_function(rule, threshold, t)

            def logits(cos: Tensor) -> Tensor:
                return transform(cos) * scale.unsqueeze(1)

            stats = chunks.statistics(chunks.x_gemm, logits)
        row_max, exp_sum = stats
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
    kernels: str | None,
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
    kernels: str | None,
    need_weight: bool,
    need_scale: bool,
    sample: Tensor | None,
) -> tuple[Tensor, Tensor, Tensor]:
    """``(∂L/∂x̂[N, D], ∂L/∂W[C·K, D] (empty if not needed), ∂L/∂s[N] (empty if not needed))``
    from ``∂L/∂lse_nt`` and ``∂L/∂cos_target``."""
    gemm = gemm_dtype(x_hat, weight)
    n = x_hat.shape[0]
    accumulate = x_hat.dtype
    chunks = _Chunks(x_hat, weight, labels, sub_centers, chunk_size, gemm, inv_norms, sample)
    use_triton = _resolve_kernels(kernels, x_hat, weight, gemm)
    grad = grad_lse.to(accumulate)  # (N,)
    grad_x_hat = torch.zeros_like(x_hat)  # (N, D)
    grad_weight = None  # every row (every sampled row; the others are 0) written below
    if need_weight:
        grad_weight = torch.empty_like(weight) if sample is None else torch.zeros_like(weight)
    grad_scale = torch.zeros_like(scale) if need_scale else None  # (N,)
    identity = rule == RULE_IDENTITY
    chunks.nontarget_gradient(
        fold=identity and not need_scale and scale_in_gemm(gemm),
        identity=identity,
        nontarget=_rule_function(rule, threshold, t),
        rule=_triton_rule(rule, threshold, t, n) if use_triton else None,
        scale=scale,
        lse=lse,
        grad=grad,
        grad_x_hat=grad_x_hat,
        grad_weight=grad_weight,
        grad_scale=grad_scale,
        derivative=None if identity else _rule_derivative(rule, threshold, t),
    )
    # The target: ∂cos θ_iy/∂x̂_i = r·w_y, ∂cos θ_iy/∂w_y = r·x̂_i projected through w/‖w‖.
    coefficient = (grad_cos.to(accumulate) * inv_norms[target_rows]).unsqueeze(1)  # (N, 1)
    weight_rows = chunks.weight_row_of(target_rows)  # (N,), rows of the weight
    centers = weight[weight_rows].to(accumulate)  # (N, D)
    grad_x_hat.addcmul_(coefficient, centers)
    if grad_weight is not None:
        partial = coefficient * x_hat  # (N, D)
        _project_rows_into(grad_weight, weight_rows, partial, centers, inv_norms[target_rows])
    empty = x_hat.new_empty(0)
    return (
        grad_x_hat,
        grad_weight if grad_weight is not None else weight.new_empty(0),
        grad_scale if grad_scale is not None else empty,
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
    kernels: str | None,
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


def _backward(
    ctx: Any, grad_lse: Tensor | None, grad_cos: Tensor | None, grad_inv_norms: Tensor | None
) -> tuple[Tensor | None, ...]:
    return _backward_through(_nontarget_lse_backward, ctx, grad_lse, grad_cos)


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


_nontarget_lse.register_autograd(_backward, setup_context=_setup_context)


class _EagerNontargetLse(torch.autograd.Function):
    """The same forward and backward as the operators, called directly (outside
    ``torch.compile``): a custom op's first call imports ``torch._dynamo`` (sympy included,
    ~140 MB resident, measured), which an eager training loop should not pay."""

    @staticmethod
    def forward(ctx: Any, *inputs: Any) -> tuple[Tensor, Tensor, Tensor]:  # type: ignore[override]
        output = _nontarget_lse_impl(*inputs)
        _setup_context(ctx, inputs, output)
        ctx.mark_non_differentiable(output[2])
        return output

    @staticmethod
    @once_differentiable
    def backward(  # type: ignore[override]
        ctx: Any, grad_lse: Tensor | None, grad_cos: Tensor | None, grad_inv_norms: Tensor | None
    ) -> tuple[Tensor | None, ...]:
        return _backward_through(_nontarget_lse_backward_impl, ctx, grad_lse, grad_cos)


def _nontarget_lse_call(*inputs: Any) -> tuple[Tensor, Tensor, Tensor]:
    """The forward op under ``torch.compile``, its eager twin otherwise."""
    if torch.compiler.is_compiling():
        return _nontarget_lse(*inputs)
    return _EagerNontargetLse.apply(*inputs)


def _target_cosine(
    x_hat: Tensor, weight: Tensor, labels: Tensor, k: int, sample: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """``cos θ_{i,y_i}`` (max over the target's ``K`` sub-centers) and the winning row
    (``y·K + k``; ``y`` a position in ``sample`` if given), ``(Tensor[N], Tensor[N])``, without
    gradient and without a host sync (every label in ``[0, C)``, or ``[0, S)``)."""
    with torch.no_grad():
        candidates = labels.unsqueeze(1) * k + torch.arange(k, device=labels.device)  # (N, K)
        rows = candidates  # (N, K), rows of the weight
        if sample is not None:
            rows = sample[labels].unsqueeze(1) * k + torch.arange(k, device=labels.device)
        centers = weight[rows].to(x_hat.dtype)  # (N, K, D)
        inv = torch.linalg.vector_norm(centers, dim=2).clamp_min(NORMALIZE_EPS).reciprocal()
        cos_k = torch.einsum("nd,nkd->nk", x_hat, centers) * inv  # (N, K)
        if k == 1:
            return cos_k.squeeze(1), candidates.squeeze(1)
        values, best = cos_k.max(dim=1)  # (N,)
        return values, candidates.gather(1, best.unsqueeze(1)).squeeze(1)


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
) -> Tensor:
    """The chunked executor's cross-entropy ``Tensor[N]`` (without the regularizer) through the
    custom ops: traceable by ``torch.compile`` without a graph break.

    Args:
        x: ``Tensor[N, D]`` in the compute dtype (float32/float64), autocast off.
        weight: ``Tensor[C·K, D]``, labels: ``Tensor[N]`` int64 in ``[0, C)`` (in ``[0, S)``:
            positions in ``sampled_classes``, if given).
        margin: a margin whose :func:`nontarget_rule` is ``rule`` (not None).
        sub_centers, chunk_size, kernels, sampled_classes: as
            :func:`~marginface.executors.chunked.chunked_margin_cross_entropy`.
    """
    n, k = x.shape[0], sub_centers
    gemm = gemm_dtype(x, weight)
    if chunk_size is None:
        per_logit = x.dtype.itemsize + (gemm.itemsize if gemm != x.dtype else 0)
        per_center = 0 if sampled_classes is None else 2 * weight.shape[1] * weight.dtype.itemsize
        chunk_size = default_chunk_size(n, k, per_logit, per_center)
    norms = row_norms(x)  # (N,), no overflow for entries beyond ~1.8e19 in float32
    x_hat = x / norms.clamp_min(NORMALIZE_EPS).unsqueeze(1)  # (N, D)
    sample = sampled_classes
    cos_raw, target_rows = _target_cosine(x_hat.detach(), weight.detach(), labels, k, sample)
    cos_target = cos_raw.clamp(-1.0, 1.0)  # (N,)
    norms_arg = norms if margin.requires_norms else None
    empty = x.new_empty(0)
    if isinstance(margin, AdaCosMargin) and margin.training and margin.dynamic:
        with torch.no_grad():  # log B_avg with the old scale: one more pass over the classes
            old = _row_scale(margin.scale.detach(), n, x)  # (N,)
            per_row, _, _ = _nontarget_lse_call(
                x_hat.detach(), weight.detach(), labels, target_rows, cos_raw, old, empty,
                empty, k, chunk_size, RULE_IDENTITY, kernels, sample,
            )  # fmt: skip
            log_b_avg = torch.logsumexp(per_row, dim=0) - math.log(n)
        margin.update_scale(log_b_avg, cos_target)
        context: dict[str, Any] = {"scale": margin.scale_for(norms_arg)}
    else:
        context = margin.prepare(cos_target, labels, norms_arg)
    if rule == RULE_CURRICULAR:
        threshold = context["threshold"].detach().reshape(n).to(x.dtype)  # (N,)
        t = torch.as_tensor(context["t"], dtype=x.dtype, device=x.device).detach()
    else:
        threshold, t = empty, empty
    row_scale = _row_scale(context["scale"], n, x)  # (N,), a gradient for SphereFace's ‖x‖
    lse_nt, cos_pass, _ = _nontarget_lse_call(
        x_hat, weight, labels, target_rows, cos_raw, row_scale, threshold, t, k, chunk_size,
        rule, kernels, sample,
    )  # fmt: skip
    target = margin.adjusted_target_cosine(cos_pass.clamp(-1.0, 1.0), norms_arg, context)
    target_logit = target.to(x.dtype) * row_scale  # (N,)
    return torch.logaddexp(lse_nt, target_logit) - target_logit


def uses_fused_op(margin: Margin) -> bool:
    """Whether :func:`fused_margin_cross_entropy` runs ``margin`` (its non-target rule is one
    the ops know, and it is written through the hooks)."""
    return nontarget_rule(margin) is not None and not _overrides(margin, "apply")
