"""The chunked executor as ``torch.library`` custom ops, for both loss families, so that
``torch.compile`` keeps it whole.

The chunk loop (its GEMMs, its reused workspace, its in-place weight gradient) is what saves the
memory of the ``N×C`` logits; traced op by op, it would lose that (and ``torch.compile`` would
break the graph at its host syncs). So the loop is opaque operators that Dynamo and
AOTAutograd see as one node each, with shapes given by their fake implementations. One
registration (:func:`register`) makes them for a *reduction* (:class:`OpReduction`: its
parameters, its forward pass over the class chunks, its backward pass); everything else is
written once here: the prologue, the chunk workspace over ``W`` (a Partial FC sample read in
place), the weight-gradient buffer, the target's share of ``∂L/∂x̂`` and ``∂L/∂W``, and the
autograd wiring. Each reduction has a forward operator

``marginface::<name>(x̂, W, labels, target_rows, cos_target, <parameters>, K, chunk_size,
kernels, sample) -> (reduced[N], cos_target[N] (a copy), r[C·K])``

(``r_j = 1/max(‖w_j‖, eps)``, not differentiable) and its backward ``marginface::<name>_backward``,
the chunk loop that recomputes each chunk and writes ``∂L/∂x̂`` and every row of ``∂L/∂W`` in
place, plus the target's share from the gradient reaching the pass-through cosine, and returns
the gradient of the first parameter. The two reductions:

* ``chunked_nontarget_lse`` (softmax): ``lse_nt_i = log Σ_{j≠y_i} e^{s_i g(cos θ_ij)}``, its
  parameters the per-row scale ``s`` (differentiable: SphereFace's ``‖x‖``), the rule's
  ``threshold``, ``t`` and code (:func:`~marginface.executors.chunk_loop.nontarget_statistics`,
  :func:`~marginface.executors.chunk_loop.nontarget_gradient`). With ``γ_i = ∂L/∂lse^{nt}_i``,
  ``∂L/∂logit_ij = γ_i e^{z_ij - lse^{nt}_i}``. Around it (``chunked._fused_cross_entropy``):
  ``L_i = logaddexp(lse^{nt}_i, T_i) - T_i`` with the margin's ``T_i = s_i f(cos θ_iy)``.
* ``chunked_binary_sums`` (one-vs-all): ``S_i = Σ_{j≠y_i} softplus(z_ij)``, its parameters the
  bias ``b`` (differentiable) and the declared rule's numbers (``z = s(2u^t - 1 + μ) + βb``,
  ``u = max((c + 1)/2, 0)``, the clamp and the gradient mode;
  :class:`~marginface.executors.binary_rule.BinaryRule`), on PyTorch ops
  (:mod:`~marginface.executors.binary_passes`) or the kernels of
  :mod:`~marginface.executors.triton_binary`. Around it
  (:func:`~marginface.executors.binary_loop.fused_binary_loss`):
  ``L_i = w_+ softplus(-T_i) + w_- S_i``.

Everything of size ``N`` is ordinary PyTorch around them: the normalization ``x̂ = x/‖x‖``, the
target cosine (an indexed dot, computed without gradient before the op, so that the margin's
:meth:`~marginface.margins.base.Margin.prepare` can see it), the margin's target term on the
op's pass-through copy of the target cosine. Autograd (eager) or AOTAutograd (compiled)
differentiates that small graph; the gradient reaching the pass-through cosine comes back into
the backward op, which adds the target's ``∂L/∂cos θ_iy`` to the same ``∂L/∂W`` buffer.

An operator takes no Python objects, so a non-target rule travels as a code and tensors
(``rule``: an index into :data:`RULE_KINDS`, with a per-row ``threshold`` and the rule's
scalars ``t``) or numbers; the margin declares which
(:meth:`~marginface.margins.base.Margin.nontarget_kernel`,
:meth:`~marginface.margins.binary.BinaryMargin.binary_kernel_parameters`). Margins with another
rule, inter-class filtering, row blocks and the sharded head run on the one autograd Function
(:class:`~marginface.executors.chunked_function.ChunkedLoss`; ``torch.compile`` breaks the graph
there). ``marginface::chunked_row_statistics`` (no gradient) is the per-row sums over the
non-target classes that a margin's ``prepare`` needs (NPCFace's hard negatives), for the
compiled rules of :data:`~marginface.margins.base.ROW_STATISTICS_KERNELS`.

Outside ``torch.compile`` each forward operator is called through an
:class:`torch.autograd.Function` with the same forward and backward *implementations* (a custom
operator's first call imports ``torch._dynamo``, sympy included, over a hundred MB resident,
which an eager training loop should not pay). Which of the two a call takes, and whether these
operators run at all, is decided once per call by
:func:`~marginface.executors.backend.choose_backend` and passed in (``compiled``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from ..margins.base import NONTARGET_KERNELS, ROW_STATISTICS_KERNELS, Margin
from ..margins.rules import ROW_STATISTICS
from .binary_passes import rule_gradient, rule_sums
from .binary_rule import BinaryRule
from .chunk_loop import (
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
)
from .chunk_workspace import ChunkWorkspace
from .triton_dispatch import triton_row_statistics

__all__ = [
    "BINARY_OPS",
    "RULE_CURRICULAR",
    "RULE_IDENTITY",
    "SOFTMAX_OPS",
    "OpReduction",
    "ReductionOps",
    "gradient_buffers",
    "nontarget_rule",
    "prologue",
    "register",
    "row_statistics_call",
    "row_statistics_code",
]

RULE_IDENTITY = 0
"""``g(cos) = cos``: every built-in margin but CurricularFace."""

RULE_CURRICULAR = 1
"""CurricularFace's :func:`~marginface.margins.curricularface.curricular_negative`, given
per-row ``threshold[N]`` and a 0-dim ``t``."""

RULE_KINDS = NONTARGET_KERNELS
"""The rule of each code: ``RULE_KINDS[code]`` is a name of
:data:`~marginface.margins.base.NONTARGET_KERNELS`."""

Outputs = tuple[Tensor, Tensor, Tensor]


def gradient_buffers(chunks: ChunkWorkspace, need_weight: bool) -> tuple[Tensor, Tensor | None]:
    """``(∂L/∂x̂, ∂L/∂W)`` to accumulate into: zeros ``Tensor[N, D]``, and the weight's
    gradient (``None`` if not needed): uninitialized (every row is written by one chunk), or
    zeros for a Partial FC sample (unsampled rows get an exact 0)."""
    grad_x_hat = torch.zeros_like(chunks.x_hat)  # (N, D)
    if not need_weight:
        return grad_x_hat, None
    weight = chunks.weight
    return grad_x_hat, torch.zeros_like(weight) if chunks.sample is not None else torch.empty_like(
        weight
    )


@dataclass(frozen=True)
class OpReduction:
    """One reduction as the custom operators run it.

    Attributes:
        name: the forward operator's name in the ``marginface`` namespace (the backward's is
            ``name + "_backward"``).
        parameters: the schema of its parameters, the differentiable tensor first.
        reduce: ``(chunks, kernels, parameters) -> reduced`` (``Tensor[N]``, no gradient).
        gradient: ``(chunks, kernels, parameters, grad[N], reduced[N], grad_x_hat, grad_weight,
            need_parameter) -> ∂L/∂parameters[0] or None``: the non-target share, added into
            ``grad_x_hat`` and written into every row of ``grad_weight`` (or None).
    """

    name: str
    parameters: str
    reduce: Callable[[ChunkWorkspace, str, tuple[Any, ...]], Tensor]
    gradient: Callable[..., Tensor | None]


@dataclass(frozen=True)
class ReductionOps:
    """What :func:`register` returns: ``call(*inputs, compiled)``, the forward operator
    (``compiled=True``, under ``torch.compile``) or its eager twin (``compiled=False``; the
    call's :class:`~marginface.executors.backend.Backend` decides), and ``fake(*inputs)``, its
    shapes."""

    call: Callable[..., Outputs]
    fake: Callable[..., Outputs]


_LEADING = "Tensor x_hat, Tensor weight, Tensor labels, Tensor target_rows"
_OPTIONS = "int sub_centers, int chunk_size, str kernels"
_OUTPUTS = "(Tensor, Tensor, Tensor)"


def _workspace(
    x_hat: Tensor,
    weight: Tensor,
    labels: Tensor,
    options: tuple[Any, ...],
    sample: Tensor | None,
    inv_norms: Tensor | None = None,
) -> ChunkWorkspace:
    """The chunk workspace of an operator's call (``options``: ``(K, chunk_size, kernels,
    ...)``)."""
    gemm = gemm_dtype(x_hat, weight)
    return ChunkWorkspace(
        x_hat, weight, labels, options[0], options[1], gemm, inv_norms, sample,
        triton=options[2] == "triton",
    )  # fmt: skip


def register(reduction: OpReduction) -> ReductionOps:
    """Register ``reduction``'s forward and backward operators, the backward as the forward's
    autograd formula (what ``torch.compile`` traces), and return their calls."""
    count = reduction.parameters.count(",") + 1
    forward_schema = (
        f"({_LEADING}, Tensor cos_target, {reduction.parameters}, {_OPTIONS}, Tensor? sample) "
        f"-> {_OUTPUTS}"
    )
    backward_schema = (
        f"(Tensor grad_reduced, Tensor grad_cos, {_LEADING}, Tensor reduced, Tensor inv_norms, "
        f"{reduction.parameters}, {_OPTIONS}, bool need_weight, bool need_parameter, "
        f"Tensor? sample) -> {_OUTPUTS}"
    )

    def forward_impl(*inputs: Any) -> Outputs:
        x_hat, weight, labels, _, cos_target = inputs[:5]
        parameters, options = inputs[5 : 5 + count], inputs[5 + count : -1]
        chunks = _workspace(x_hat, weight, labels, options, inputs[-1])
        reduced = reduction.reduce(chunks, options[2], parameters)  # (N,)
        return reduced, cos_target.clone(), chunks.inv_norms

    def forward_fake(*inputs: Any) -> Outputs:
        x_hat, weight, cos_target, sample = inputs[0], inputs[1], inputs[4], inputs[-1]
        n, k = x_hat.shape[0], inputs[-4]
        rows = weight.shape[0] if sample is None else sample.shape[0] * k
        return x_hat.new_empty(n), cos_target.new_empty(n), x_hat.new_empty(rows)

    def backward_impl(*inputs: Any) -> Outputs:
        grad_reduced, grad_cos, x_hat, weight, labels, target_rows, reduced, inv_norms = inputs[:8]
        parameters, options = inputs[8 : 8 + count], inputs[8 + count : -1]
        need_weight, need_parameter = options[3], options[4]
        chunks = _workspace(x_hat, weight, labels, options, inputs[-1], inv_norms)
        grad_x_hat, grad_weight = gradient_buffers(chunks, need_weight)
        grad_parameter = reduction.gradient(
            chunks, options[2], parameters, grad_reduced.to(x_hat.dtype), reduced, grad_x_hat,
            grad_weight, need_parameter,
        )  # fmt: skip
        add_target_gradient(chunks, grad_cos, target_rows, None, grad_x_hat, grad_weight)
        if grad_weight is None:
            grad_weight = weight.new_empty(0)
        if grad_parameter is None or not need_parameter:
            grad_parameter = parameters[0].new_empty(0)
        return grad_x_hat, grad_weight, grad_parameter

    def backward_fake(*inputs: Any) -> Outputs:
        x_hat, weight, parameter = inputs[2], inputs[3], inputs[8]
        need_weight, need_parameter = inputs[-3], inputs[-2]
        grad_weight = torch.empty_like(weight) if need_weight else weight.new_empty(0)
        grad_parameter = torch.empty_like(parameter) if need_parameter else parameter.new_empty(0)
        return torch.empty_like(x_hat), grad_weight, grad_parameter

    def custom_op(
        name: str, impl: Callable[..., Any], fake: Callable[..., Any], schema: str
    ) -> Any:
        op = torch.library.custom_op(f"marginface::{name}", impl, mutates_args=(), schema=schema)
        op.register_fake(fake)
        return op

    op = custom_op(reduction.name, forward_impl, forward_fake, forward_schema)
    backward_op = custom_op(
        reduction.name + "_backward", backward_impl, backward_fake, backward_schema
    )

    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Outputs) -> None:
        parameters = inputs[5 : 5 + count]
        ctx.tensor_positions = [i for i, p in enumerate(parameters) if isinstance(p, Tensor)]
        tensors = [parameters[i] for i in ctx.tensor_positions]
        ctx.save_for_backward(*inputs[:4], output[0], output[2], inputs[-1], *tensors)
        ctx.parameters = tuple(None if isinstance(p, Tensor) else p for p in parameters)
        ctx.options = inputs[5 + count : -1]  # K, chunk_size, kernels

    def backward_through(
        backward: Callable[..., Outputs], ctx: Any, grad_reduced: Tensor | None, grad_cos: Any
    ) -> tuple[Tensor | None, ...]:
        """The gradients of the forward op's inputs, by ``backward`` (the op or its
        implementation)."""
        x_hat, weight, labels, target_rows, reduced, inv_norms, sample, *tensors = ctx.saved_tensors
        parameters = list(ctx.parameters)
        for position, tensor in zip(ctx.tensor_positions, tensors, strict=True):
            parameters[position] = tensor
        need_weight, need_parameter = ctx.needs_input_grad[1], ctx.needs_input_grad[5]
        if grad_reduced is None:
            grad_reduced = torch.zeros_like(reduced)
        if grad_cos is None:
            grad_cos = torch.zeros_like(reduced)
        grad_x_hat, grad_weight, grad_parameter = backward(
            grad_reduced, grad_cos, x_hat, weight, labels, target_rows, reduced, inv_norms,
            *parameters, *ctx.options, need_weight, need_parameter, sample,
        )  # fmt: skip
        grad_weight = grad_weight if need_weight else None
        grad_parameter = grad_parameter if need_parameter else None
        return grad_x_hat, grad_weight, None, None, None, grad_parameter, *([None] * (count + 3))

    def autograd_backward(
        ctx: Any, grad_reduced: Tensor | None, grad_cos: Tensor | None, grad_inv: Tensor | None
    ) -> tuple[Tensor | None, ...]:
        return backward_through(backward_op, ctx, grad_reduced, grad_cos)

    op.register_autograd(autograd_backward, setup_context=setup_context)

    class Eager(torch.autograd.Function):
        """The forward and backward implementations called directly, outside
        ``torch.compile``."""

        @staticmethod
        def forward(ctx: Any, *inputs: Any) -> Outputs:  # type: ignore[override]
            output = forward_impl(*inputs)
            setup_context(ctx, inputs, output)
            ctx.mark_non_differentiable(output[2])
            return output

        @staticmethod
        @once_differentiable
        def backward(  # type: ignore[override]
            ctx: Any, grad_reduced: Tensor | None, grad_cos: Tensor | None, grad_inv: Any
        ) -> tuple[Tensor | None, ...]:
            return backward_through(backward_impl, ctx, grad_reduced, grad_cos)

    def call(*inputs: Any, compiled: bool) -> Outputs:
        """The forward operator (``compiled``: under ``torch.compile``), else its eager twin;
        the caller's :class:`~marginface.executors.backend.Backend` says which."""
        if compiled:
            return op(*inputs)
        return Eager.apply(*inputs)

    return ReductionOps(call=call, fake=forward_fake)


# --------------------------------------------------------------------------- softmax
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
    if margin.row_statistics_size() > 0 and row_statistics_code(margin) is None:
        return None  # a pass over the classes in the margin's own Python, before its hooks
    return RULE_KINDS.index(kind)


def row_statistics_code(margin: Margin) -> int | None:
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


def _chunk_rule(chunks: ChunkWorkspace, kernels: str, parameters: tuple[Any, ...]) -> Any:
    """The loop's :class:`~marginface.executors.chunk_loop.ChunkRule` of the softmax
    parameters ``(scale, threshold[N], t, rule code)`` (threshold and ``t``: CurricularFace's;
    empty for the identity); ``kernels``: ``"triton"`` or ``"torch"``."""
    _, threshold, t, rule = parameters
    kind = RULE_KINDS[rule]
    values = {"threshold": threshold, "t": t} if kind != "identity" else {}
    x_hat = chunks.x_hat
    return chunk_rule_for_kernel(
        kind, values, rows=x_hat.shape[0], device=x_hat.device, triton=kernels == "triton"
    )


def _softmax_reduce(chunks: ChunkWorkspace, kernels: str, parameters: tuple[Any, ...]) -> Tensor:
    rule = _chunk_rule(chunks, kernels, parameters)
    row_max, exp_sum = nontarget_statistics(chunks, rule, parameters[0])
    return row_max + torch.log(exp_sum)  # (N,), -inf for a row without non-targets


def _softmax_gradient(
    chunks: ChunkWorkspace,
    kernels: str,
    parameters: tuple[Any, ...],
    grad: Tensor,
    lse: Tensor,
    grad_x_hat: Tensor,
    grad_weight: Tensor | None,
    need_scale: bool,
) -> Tensor | None:
    scale = parameters[0]
    grad_scale = torch.zeros_like(scale) if need_scale else None  # (N,)
    nontarget_gradient(
        chunks, _chunk_rule(chunks, kernels, parameters), scale=scale, lse=lse, grad=grad,
        grad_x_hat=grad_x_hat, grad_weight=grad_weight, grad_scale=grad_scale,
    )  # fmt: skip
    return grad_scale


SOFTMAX_OPS = register(
    OpReduction(
        "chunked_nontarget_lse",
        "Tensor scale, Tensor threshold, Tensor t, int rule",
        _softmax_reduce,
        _softmax_gradient,
    )
)
"""``marginface::chunked_nontarget_lse`` and its backward."""

_ROW_STATISTICS_SCHEMA = (
    "(Tensor x_hat, Tensor weight, Tensor labels, Tensor threshold, int sub_centers, "
    "int chunk_size, int kind, str kernels, Tensor? sample) -> Tensor"
)


def _row_statistics_impl(*inputs: Any) -> Tensor:
    """The per-row statistics ``Tensor[k, N]`` of the compiled rule
    ``ROW_STATISTICS_KERNELS[kind]`` with its per-row ``threshold`` (``Tensor[N]``), summed over
    every non-target class (every sampled one), one chunk at a time, on the Triton kernel
    (``kernels="triton"``) or PyTorch ops; no gradient."""
    x_hat, weight, labels, threshold, k, chunk_size, kind, kernels, sample = inputs
    chunks = _workspace(x_hat, weight, labels, (k, chunk_size, kernels), sample)
    name = ROW_STATISTICS_KERNELS[kind]
    if kernels == "triton":
        return triton_row_statistics(chunks, name, threshold).to(chunks.inv_norms.dtype)
    declared = ROW_STATISTICS[name]
    terms = declared.terms({"threshold": threshold.to(chunks.inv_norms.dtype)})
    return row_statistics(chunks, terms, declared.size)


_row_statistics_op = torch.library.custom_op(
    "marginface::chunked_row_statistics",
    _row_statistics_impl,
    mutates_args=(),
    schema=_ROW_STATISTICS_SCHEMA,
)


@_row_statistics_op.register_fake
def _row_statistics_fake(*inputs: Any) -> Tensor:
    size = ROW_STATISTICS[ROW_STATISTICS_KERNELS[inputs[6]]].size
    return inputs[0].new_empty(size, inputs[0].shape[0])


def row_statistics_call(*inputs: Any, compiled: bool) -> Tensor:
    """The statistics op (``compiled``: under ``torch.compile``), else its implementation (no
    gradient flows through either: the inputs are detached); the caller's
    :class:`~marginface.executors.backend.Backend` says which."""
    if compiled:
        return _row_statistics_op(*inputs)
    return _row_statistics_impl(*inputs)


def prologue(
    x: Tensor, weight: Tensor, labels: Tensor, k: int, sample: Tensor | None, chunk: int | None
) -> tuple[Tensor, Tensor, Tensor, Tensor, int]:
    """``(x̂[N, D], ‖x‖[N], cos θ_iy[N] (raw, no gradient), the target rows[N], chunk_size)``:
    what the operators' callers compute before the forward operator (``k``: sub-centers,
    ``chunk``: the caller's chunk size or None)."""
    chunk_size = chunk_size_for(x, weight, k, sample, chunk)
    x_hat, norms = normalized_with_norms(x)  # (N, D), (N,)
    cos_raw, rows = target_cosines(x_hat.detach(), weight.detach(), labels, k, sample)
    return x_hat, norms, cos_raw, rows, chunk_size


# --------------------------------------------------------------------------- one-vs-all
def _binary_rule(parameters: tuple[Any, ...]) -> BinaryRule:
    """The :class:`~marginface.executors.binary_rule.BinaryRule` of the one-vs-all parameters
    ``(bias, scale, power, offset, sign, clamp, straight_through)`` (``w_-`` = 1: the
    operators return the plain sums)."""
    bias, scale, power, offset, sign, clamp, straight_through = parameters
    return BinaryRule(
        scale=scale, power=power, offset=offset, bias_term=bias.detach() * sign,
        negative_weight=1.0, clamp=clamp if clamp > 0 else None,
        straight_through=straight_through,
    )  # fmt: skip


def _binary_reduce(chunks: ChunkWorkspace, kernels: str, parameters: tuple[Any, ...]) -> Tensor:
    rule = _binary_rule(parameters)
    if kernels == "triton":
        from .triton_binary import triton_binary_sums

        return triton_binary_sums(chunks, rule).to(chunks.x_hat.dtype)
    return rule_sums(chunks, rule)


def _binary_gradient(
    chunks: ChunkWorkspace,
    kernels: str,
    parameters: tuple[Any, ...],
    grad: Tensor,
    sums: Tensor,
    grad_x_hat: Tensor,
    grad_weight: Tensor | None,
    need_bias: bool,
) -> Tensor:
    rule, sign = _binary_rule(parameters), parameters[4]
    if kernels == "triton":
        from .triton_binary import triton_nontarget_gradient

        grad_bias = triton_nontarget_gradient(chunks, rule, sign, grad, grad_x_hat, grad_weight)
    else:
        grad_bias = rule_gradient(chunks, rule, sign, grad, grad_x_hat, grad_weight)
    return grad_bias.to(parameters[0].dtype)


BINARY_OPS = register(
    OpReduction(
        "chunked_binary_sums",
        "Tensor bias, float scale, float power, float offset, float sign, float clamp, "
        "bool straight_through",
        _binary_reduce,
        _binary_gradient,
    )
)
"""``marginface::chunked_binary_sums`` and its backward."""
