"""The chunk loop, written once: one forward pass and one backward pass over the classes.

Both wrappers of the chunked executor call these functions: the custom operators that
``torch.compile`` traces (:mod:`~marginface.executors.fused_op`) and the autograd Function
(:mod:`~marginface.executors.chunked_function`: eager, sharded, Partial FC, any
non-target rule), each one for both reductions. The per-chunk work runs as PyTorch ops, or on
the Triton kernels (:mod:`~marginface.executors.triton_dispatch`) when the call chose them: the
choice arrives here already made, as :attr:`ChunkRule.kernel`.

With ``x̂_i`` the normalized embeddings, ``r_j = 1/max(‖w_j‖, eps)`` and ``g`` the margin's
non-target rule, a chunk's non-target logits are ``z_ij = s_i g(r_j x̂_i·w_j)`` (the target
column excluded). The forward (:func:`nontarget_statistics`) reduces them to per-row
``(max, Σexp)`` merged exactly across chunks (:mod:`~marginface.executors._online_softmax`).
The backward (:func:`nontarget_gradient`) recomputes each chunk (a fourth GEMM) and, with
``p_ij = e^{z_ij - lse_i}`` and ``γ_i`` the gradient reaching ``lse_i``, adds
``∂L/∂x̂_i = Σ_j γ_i p_ij s_i g'(c_ij) r_j w_j`` and writes ``∂L/∂w_j`` through the Jacobian of
``w/‖w‖``. The target's share enters through :func:`add_target_gradient`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..margins.base import Context, Margin
from ..margins.rules import declared_rule
from ._online_softmax import (
    add_shifted_slice,
    empty_statistics,
    finish_log_sum_exp,
    merge_statistics,
    slice_statistics,
)
from .chunk_plan import nontarget_kernel_of, scale_in_gemm
from .chunk_workspace import ChunkWorkspace, project_scattered_rows
from .dense import NORMALIZE_EPS
from .triton_dispatch import kernel_rule, triton_gradient, triton_statistics

__all__ = [
    "ChunkRule",
    "add_target_gradient",
    "batch_log_b",
    "chunk_rule_for_kernel",
    "chunk_rule_for_margin",
    "gradient_pass",
    "nontarget_gradient",
    "nontarget_statistics",
    "row_block_pass",
    "row_statistics",
    "target_cosines",
]


@dataclass(frozen=True)
class ChunkRule:
    """How the loop turns a chunk's cosines ``c`` (``Tensor[N, c]``) into non-target values
    ``g(c)`` before the scale.

    Attributes:
        identity: ``g(c) = c`` (the loop's fast paths: the scale rides in the GEMM).
        function: ``c -> g(c)``, elementwise and differentiable (unused when ``identity``).
        derivative: ``c -> g'(c)`` elementwise, or None to take the vector-Jacobian product of
            ``function`` by autograd (which does not record inside a custom operator).
        filter_threshold: inter-class filtering's ``τ`` (0: off): cosines above it become 0,
            value and gradient, before ``g``.
        kernel: the Triton kernels' rule when this call runs them, else None (PyTorch ops).
        for_rows: ``(start, stop) -> ChunkRule``, the same rule for rows ``[start, stop)`` of
            the batch (its per-row parameters sliced), or None when it has none.
    """

    identity: bool
    function: Callable[[Tensor], Tensor] | None = None
    derivative: Callable[[Tensor], Tensor] | None = None
    filter_threshold: float = 0.0
    kernel: Any = None
    for_rows: Callable[[int, int], ChunkRule] | None = None

    def values(self, cos: Tensor) -> Tensor:
        """``g(c)`` (``cos`` itself for the identity)."""
        return cos if self.identity or self.function is None else self.function(cos)

    def rows(self, start: int, stop: int) -> ChunkRule:
        """This rule for the rows ``[start, stop)`` of the batch (a block of the row-block
        tiling)."""
        return self if self.for_rows is None else self.for_rows(start, stop)


def _rows_of(value: Any, start: int, stop: int, n: int) -> Any:
    """A per-row value (``Tensor[N, ...]``) cut to rows ``[start, stop)``; anything else (a
    float, a 0-dim tensor) as it is."""
    if isinstance(value, Tensor) and value.dim() >= 1 and value.shape[0] == n:
        return value[start:stop]
    return value


def chunk_rule_for_kernel(
    kind: str, parameters: dict[str, Tensor], *, rows: int, device: torch.device, triton: bool
) -> ChunkRule:
    """The compiled rule ``kind`` (declared in :data:`~marginface.margins.rules.NONTARGET_RULES`;
    ``ValueError`` naming it and the known ones otherwise) with its ``parameters`` (the
    per-row ``threshold`` ``Tensor[N]`` or ``[N, 1]``, ``t``), its derivative written out (no
    autograd needed); ``triton``: with the Triton kernels' form of it too."""
    declared = declared_rule(kind)
    kernel = kernel_rule(kind, parameters, rows, device) if triton else None
    if declared.slopes is None:
        return ChunkRule(identity=True, kernel=kernel)

    def for_rows(start: int, stop: int) -> ChunkRule:  # only the threshold is per row
        sliced = {
            key: _rows_of(v, start, stop, rows) if key == "threshold" else v
            for key, v in parameters.items()
        }
        return chunk_rule_for_kernel(kind, sliced, rows=stop - start, device=device, triton=False)

    function, derivative = declared.slopes(parameters)
    return ChunkRule(
        identity=False,
        function=function,
        derivative=derivative,
        kernel=kernel,
        for_rows=None if triton else for_rows,
    )


def chunk_rule_for_margin(
    margin: Margin, context: Context, *, rows: int, device: torch.device, triton: bool
) -> ChunkRule:
    """``margin``'s non-target rule for this batch (``context`` without gradients): its
    compiled rule when it declares one (:meth:`~marginface.margins.base.Margin.nontarget_kernel`)
    and filters nothing, else :meth:`~marginface.margins.base.Margin.nontarget_cosine` itself,
    differentiated by autograd, after inter-class filtering."""
    kind = nontarget_kernel_of(margin)
    threshold = margin.interclass_filtering_threshold
    if kind is not None and threshold == 0:
        parameters = margin.nontarget_kernel_parameters(context)
        return chunk_rule_for_kernel(kind, parameters, rows=rows, device=device, triton=triton)

    def for_rows(start: int, stop: int) -> ChunkRule:
        sliced = {key: _rows_of(v, start, stop, rows) for key, v in context.items()}
        return chunk_rule_for_margin(margin, sliced, rows=stop - start, device=device, triton=False)

    return ChunkRule(
        identity=margin.nontarget_is_identity(),
        function=lambda cos: margin.nontarget_cosine(cos, context),
        filter_threshold=threshold,
        for_rows=for_rows,
    )


# --------------------------------------------------------------------------- forward
def nontarget_statistics(
    chunks: ChunkWorkspace, rule: ChunkRule, scale: Tensor, *, scale_has_gradient: bool = False
) -> tuple[Tensor, Tensor]:
    """Merged ``(max, Σexp)`` over every chunk of the non-target logits ``s_i g(c_ij)``,
    ``Tensor[N]`` each (no gradient). ``scale``: ``Tensor[N]``. ``scale_has_gradient``: the
    backward will need ``∂L/∂s`` and so multiplies ``x̂`` itself (:func:`nontarget_gradient`);
    when the forward's products are kept for it (the row-block pass), the forward multiplies
    ``x̂`` too instead of ``s·x̂``."""
    with torch.no_grad():
        if rule.kernel is not None:
            return triton_statistics(chunks, scale, rule.kernel)
        plain = rule.identity and rule.filter_threshold == 0
        if _scale_rides_in_gemm(chunks, rule, scale_has_gradient):  # logits = (s·x̂) @ ŵᵀ
            return _merged_statistics(chunks, (chunks.x_hat * scale.unsqueeze(1)).to(chunks.gemm))
        scale_rows = scale.unsqueeze(1)  # (N, 1)
        if plain:  # float16: scale the float32 cosines (in place)
            return _merged_statistics(chunks, chunks.x_gemm, lambda cos: cos.mul_(scale_rows))

        def logits(cos: Tensor) -> Tensor:
            if rule.filter_threshold > 0:  # the target column is replaced afterwards
                cos = cos.masked_fill_(cos > rule.filter_threshold, 0.0)
            return rule.values(cos) * scale_rows

        return _merged_statistics(chunks, chunks.x_gemm, logits)


def _merged_statistics(
    chunks: ChunkWorkspace, rows: Tensor, transform: Callable[[Tensor], Tensor] | None = None
) -> tuple[Tensor, Tensor]:
    """``(max, Σexp)`` merged over all chunks, ``Tensor[N]`` each. ``rows``: ``s·x̂`` in the
    GEMM dtype (logits = scaled cosines) if ``transform`` is None, else ``x̂`` and
    ``transform(cosine_chunk) -> logits_chunk``."""
    n = chunks.x_hat.shape[0]

    def step(start: int, stop: int, stats: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        slot_rows, slot_cols = chunks.target_slots(start, stop)
        if transform is None and chunks.k == 1 and bool(torch.isfinite(stats[0]).all()):
            # Shift by the running max: no pass for this chunk's own max.
            shifted, _ = chunks.cosine(start, stop, rows, shift=stats[0])  # (N, c)
            shifted[slot_rows, slot_cols] = float("-inf")  # the target enters separately
            merged = add_shifted_slice(stats, shifted)
            if merged is not None:
                return merged
        logits, _ = chunks.cosine(start, stop, rows)  # (N, c)
        if transform is not None:
            logits = transform(logits)  # freed on return, before the next chunk's
        logits[slot_rows, slot_cols] = float("-inf")  # the target enters separately
        return merge_statistics(stats, slice_statistics(logits))

    empty = empty_statistics(n, dtype=chunks.inv_norms.dtype, device=chunks.x_hat.device)
    return chunks.fold(step, empty)


def batch_log_b(
    chunks: ChunkWorkspace,
    scale: Tensor,
    rule: ChunkRule,
    merge: Callable[[tuple[Tensor, Tensor]], tuple[Tensor, Tensor]] | None = None,
) -> Tensor:
    """``log B = log((1/N) Σ_i Σ_{j≠y_i} e^{s_i g(c_ij)})`` (0-dim), the statistic of
    :meth:`~marginface.margins.base.Margin.statistics_scale` (AdaCos's ``B_avg``; ``rule``:
    the identity, after inter-class filtering); ``merge`` combines the statistics across the
    ranks of a sharded head."""
    stats = nontarget_statistics(chunks, rule, scale)
    if merge is not None:
        stats = merge(stats)
    per_row = stats[0] + torch.log(stats[1])  # (N,)
    return torch.logsumexp(per_row, dim=0) - math.log(per_row.shape[0])


def row_statistics(
    chunks: ChunkWorkspace,
    terms: Callable[[Tensor], tuple[Tensor, ...]],
    size: int,
    filter_threshold: float = 0.0,
    *,
    zero_in_place: bool = False,
) -> Tensor:
    """A margin's per-row statistics summed over every non-target class of ``chunks``, one
    chunk at a time: ``Tensor[size, N]`` in the compute dtype, no gradient. ``terms``: a
    chunk's cosines ``Tensor[N, c]`` -> the ``size`` summands ``Tensor[N, c]`` (the margin's
    :meth:`~marginface.margins.base.Margin.row_statistics_terms` given the row's target, or a
    compiled one of :data:`~marginface.margins.rules.ROW_STATISTICS`).
    ``filter_threshold``: inter-class filtering's ``τ`` (0: off), applied to the cosines
    first. Sums over disjoint class slices add: a sharded head all-sums them. ``zero_in_place``:
    the summands are the pass's own temporaries (the one-vs-all's softplus terms), so the
    target column is zeroed in them rather than in a copy (one ``N×c`` temporary less)."""
    n = chunks.x_hat.shape[0]

    def step(start: int, stop: int, total: Tensor) -> Tensor:
        cos, _, _ = chunks.filtered_cosine(start, stop, filter_threshold)  # (N, c)
        slot_rows, slot_cols = chunks.target_slots(start, stop)
        summands = terms(cos)
        for q, term in enumerate(summands):
            term = term.to(total.dtype)  # (N, c)
            if zero_in_place:  # the target column (no non-target) zeroed in place
                term[slot_rows, slot_cols] = 0.0
            else:  # out of place: ``term`` may be the workspace that the next term reads
                term = term.index_put((slot_rows, slot_cols), total.new_zeros(()))
            total[q] += term.sum(dim=1)
        return total

    with torch.no_grad():
        return chunks.fold(step, chunks.x_hat.new_zeros(size, n, dtype=chunks.inv_norms.dtype))


# --------------------------------------------------------------------------- backward
def nontarget_gradient(
    chunks: ChunkWorkspace,
    rule: ChunkRule,
    *,
    scale: Tensor,
    lse: Tensor,
    grad: Tensor,
    grad_x_hat: Tensor,
    grad_weight: Tensor | None,
    grad_scale: Tensor | None,
    add_rows: bool | None = None,
    project: bool = True,
) -> None:
    """The backward's pass over the chunks: add the non-target part of ``∂L/∂x̂`` into
    ``grad_x_hat`` (``Tensor[N, D]``; and of ``∂L/∂s`` into ``grad_scale``, ``Tensor[N]``, if
    given), write every row of ``grad_weight`` (``Tensor[C·K, D]``, if given).

    ``add_rows``: None (default) writes each chunk's rows of ``∂L/∂W`` projected through
    ``w/‖w‖``; False/True (the row-block pass) writes/adds them, and projects them only if
    ``project`` (the last block: the projection is linear, so it runs once, on the sum over
    the blocks).

    ``lse``, ``grad``: ``Tensor[N]``, the log-sum-exp the probabilities are taken against and
    the gradient reaching it (``p_ij·grad_i = e^{z_ij - lse_i}·grad_i``: the full log-sum-exp
    with the loss's gradient, or the non-target one with the gradient reaching it).
    ``scale``: ``Tensor[N]``, no gradient.
    """
    if rule.kernel is not None:
        kernel_rows = (scale, rule.kernel, lse, grad)  # the softmax launchers' row arguments
        triton_gradient(chunks, kernel_rows, grad_x_hat, grad_weight, grad_scale)
        return
    fold = _scale_rides_in_gemm(chunks, rule, grad_scale is not None)
    folded = _fold(chunks, scale, lse, grad) if fold else None

    def cosine_gradient(start: int, stop: int) -> tuple[Tensor, Tensor | None, None]:
        if folded is not None:
            return *_folded_cosine_gradient(chunks, start, stop, *folded), None
        return *_cosine_gradient(chunks, rule, start, stop, scale, lse, grad, grad_scale), None

    gradient_pass(
        chunks, cosine_gradient, grad_x_hat, grad_weight, add_rows=add_rows, project=project
    )


ChunkCosineGradient = Callable[[int, int], tuple[Tensor, Tensor | None, Tensor | None]]
"""One chunk ``[start, stop)`` -> its ``∂L/∂c`` (``Tensor[N, c]``, the target column 0), the
winning sub-centers (None if K = 1) and a share to sum over the chunks (the one-vs-all's
``∂L/∂b``; None for none)."""


def gradient_pass(
    chunks: ChunkWorkspace,
    cosine_gradient: ChunkCosineGradient,
    grad_x_hat: Tensor,
    grad_weight: Tensor | None,
    *,
    add_rows: bool | None = None,
    project: bool = True,
    share: Tensor | None = None,
) -> Tensor | None:
    """The backward's loop over the chunks for any reduction: each chunk's ``∂L/∂c`` from
    ``cosine_gradient`` (the softmax's or the one-vs-all's), routed through the chunk GEMM
    into ``∂L/∂x̂`` (added into ``grad_x_hat``, ``Tensor[N, D]``) and every row of
    ``∂L/∂W`` (``grad_weight``, through ``w/‖w‖``; ``add_rows``, ``project``: as
    :func:`nontarget_gradient` says). Returns ``share`` plus the chunks' shares (None if
    neither)."""

    def step(start: int, stop: int, total: Tensor | None) -> Tensor | None:
        g_cos, best, part = cosine_gradient(start, stop)
        _add_chunk_gradient(
            chunks, start, stop, g_cos, best, grad_x_hat, grad_weight,
            add_rows=add_rows, project=project,
        )  # fmt: skip
        if part is None:
            return total
        return part if total is None else total + part

    return chunks.fold(step, share)


def _scale_rides_in_gemm(chunks: ChunkWorkspace, rule: ChunkRule, scale_has_gradient: bool) -> bool:
    """Whether the passes multiply ``s·x̂`` (the identity rule, nothing filtered, no gradient
    for ``s``, not a float16 GEMM) rather than ``x̂``: the forward and the backward agree, so
    that the row-block pass can keep the forward's products for the backward."""
    return (
        rule.identity
        and not scale_has_gradient
        and rule.filter_threshold == 0
        and scale_in_gemm(chunks.gemm)
    )


def row_block_pass(
    chunks: ChunkWorkspace,
    rule: ChunkRule,
    *,
    row_block: int,
    chunk_size: int,
    scale: Tensor,
    target_logit: Tensor,
    grad_x_hat: Tensor,
    grad_weight: Tensor | None,
    grad_scale: Tensor | None,
) -> Tensor:
    """The row-block tiling of the loop: forward and backward in one pass per block of rows.

    For each block of ``B = row_block`` rows, the forward pass over the class chunks
    (:func:`nontarget_statistics`) keeps every chunk's GEMM product (``B×C·K`` in the GEMM
    dtype, :meth:`~ChunkWorkspace.keep_products`), the block's log-sum-exp
    ``lse_i = log(e^{t_i} + Σ_{j≠y_i} e^{z_ij})`` is completed with the target logit ``t_i``,
    and the backward pass over the same chunks (:func:`nontarget_gradient`) reads the kept
    products instead of multiplying again: 3 GEMMs per chunk instead of 4, at the price of a
    ``B×C·K`` store. The gradients are those of ``Σ_i lse_i`` (an upstream gradient of 1 per
    row): ``∂/∂x̂`` into ``grad_x_hat`` (``Tensor[N, D]``), ``∂/∂s`` into ``grad_scale``
    (``Tensor[N]``, if given) and ``∂/∂W`` (summed over the row blocks, projected through
    ``w/‖w‖`` chunk by chunk in the last block) into ``grad_weight`` (``Tensor[C·K, D]``,
    zero where no chunk writes, if given). A caller whose upstream gradient is the same ``γ``
    for every row multiplies them by ``γ`` (``∂/∂x̂`` and ``∂/∂s`` are per row and scale by
    any ``γ_i``).

    ``scale``, ``target_logit``: ``Tensor[N]``, no gradient. ``chunk_size``: classes per chunk
    inside a block. PyTorch ops only (``rule.kernel`` must be None). Returns ``lse``,
    ``Tensor[N]``.
    """
    if rule.kernel is not None:
        raise ValueError("the row-block tiling runs on PyTorch ops only; use kernels='torch'")
    n = chunks.x_hat.shape[0]
    scale_has_gradient = grad_scale is not None
    lse = torch.empty_like(scale)  # (N,)
    store = torch.empty(  # (B·C·K,), the block's products, reused from block to block
        min(row_block, n) * chunks.num_classes * chunks.k,
        dtype=chunks.gemm,
        device=chunks.x_hat.device,
    )
    ones = torch.ones(min(row_block, n), dtype=scale.dtype, device=scale.device)  # (B,)
    for lo in range(0, n, row_block):
        hi = min(lo + row_block, n)
        block = chunks.row_block(lo, hi, chunk_size)
        block.keep_products(store)
        block_rule = rule.rows(lo, hi)
        block_scale = scale[lo:hi]  # (B,)
        stats = nontarget_statistics(
            block, block_rule, block_scale, scale_has_gradient=scale_has_gradient
        )
        lse[lo:hi] = finish_log_sum_exp(stats, target_logit[lo:hi])
        nontarget_gradient(
            block,
            block_rule,
            scale=block_scale,
            lse=lse[lo:hi],
            grad=ones[: hi - lo],
            grad_x_hat=grad_x_hat[lo:hi],
            grad_weight=grad_weight,
            grad_scale=None if grad_scale is None else grad_scale[lo:hi],
            add_rows=lo > 0,
            project=hi == n,
        )
        block.drop_products()
    return lse


def _fold(
    chunks: ChunkWorkspace, scale: Tensor, lse: Tensor, grad: Tensor
) -> tuple[Tensor, Tensor, Tensor | None]:
    """For the identity rule with a scale without gradient, ``∂L/∂c_ij = γ_i s_i e^{s_i c_ij -
    lse_i} = sign(γ_i s_i)·e^{(s·x̂)@ŵᵀ - (lse_i - log|γ_i s_i|)}``: one GEMM and one exp per
    chunk. Returns ``(s·x̂`` in the GEMM dtype ``[N, D]``, the shift ``[N]``, the signs
    ``[N, 1]`` or None when none is negative)."""
    factor = grad * scale  # (N,), ∂L/∂cos = factor · softmax
    shift = lse - torch.log(factor.abs())  # (N,), +inf where factor = 0
    scaled_rows = (chunks.x_hat * scale.unsqueeze(1)).to(chunks.gemm)  # (N, D)
    signs = torch.sign(factor).unsqueeze(1) if bool((factor < 0).any()) else None
    return scaled_rows, shift, signs


def _folded_cosine_gradient(
    chunks: ChunkWorkspace,
    start: int,
    stop: int,
    scaled_rows: Tensor,
    shift: Tensor,
    signs: Tensor | None,
) -> tuple[Tensor, Tensor | None]:
    """One chunk's ``∂L/∂c`` (``Tensor[N, c]``, in the workspace) by :func:`_fold`'s formula,
    and the winning sub-centers (None if K = 1)."""
    logits, best = chunks.cosine(start, stop, scaled_rows, argmax=True, shift=shift)
    g_cos = logits.exp_()  # (N, c) = ∂L/∂cos
    if signs is not None:
        g_cos.mul_(signs)
    slot_rows, slot_cols = chunks.target_slots(start, stop)
    g_cos[slot_rows, slot_cols] = 0.0
    return g_cos, best


def _cosine_gradient(
    chunks: ChunkWorkspace,
    rule: ChunkRule,
    start: int,
    stop: int,
    scale: Tensor,
    lse: Tensor,
    grad: Tensor,
    grad_scale: Tensor | None,
) -> tuple[Tensor, Tensor | None]:
    """``∂L/∂c`` of one chunk for any rule (``Tensor[N, c]``) and the winning sub-centers;
    adds the chunk's ``∂L/∂s_i = Σ_j ∂L/∂z_ij g(c_ij)`` into ``grad_scale`` if given."""
    cos, best, dirty = chunks.filtered_cosine(start, stop, rule.filter_threshold, argmax=True)
    by_autograd = not rule.identity and rule.derivative is None
    with torch.enable_grad():
        cos_in = cos.requires_grad_(by_autograd)
        g = rule.values(cos_in)  # (N, c)
    g_value = g.detach()
    prob = (g_value * scale.unsqueeze(1)).sub_(lse.unsqueeze(1)).exp_()  # (N, c)
    slot_rows, slot_cols = chunks.target_slots(start, stop)
    prob[slot_rows, slot_cols] = 0.0
    g_logit = prob.mul_(grad.unsqueeze(1))  # (N, c), ∂L/∂logit
    if grad_scale is not None:
        grad_scale.add_((g_logit * g_value).sum(dim=1))
    g_g = g_logit.mul_(scale.unsqueeze(1))  # (N, c), ∂L/∂g
    if rule.identity:
        g_cos = g_g
    elif rule.derivative is not None:  # g'(c) written out (no autograd inside an operator)
        g_cos = g_g.mul_(rule.derivative(cos))
    else:  # the vector-Jacobian product with g_g, as the gradient of a scalar
        # (torch.autograd.grad given grad_outputs imports sympy on first use)
        with torch.enable_grad():
            objective = torch.dot(g.reshape(-1), g_g.reshape(-1))
        (g_cos,) = torch.autograd.grad(objective, cos_in)
    if dirty is not None:
        g_cos = g_cos.masked_fill_(dirty, 0.0)
    return g_cos, best


def _add_chunk_gradient(
    chunks: ChunkWorkspace,
    start: int,
    stop: int,
    g_cos: Tensor,
    best: Tensor | None,
    grad_x_hat: Tensor,
    grad_weight: Tensor | None,
    *,
    add_rows: bool | None = None,
    project: bool = True,
) -> None:
    """From one chunk's ``∂L/∂c`` (``Tensor[N, c]``): add ``∂L/∂x̂`` and write the chunk's rows
    of ``∂L/∂W`` (through ``w/‖w‖``; ``add_rows`` False/True: write/add them, then project
    them only if ``project``, as :func:`nontarget_gradient` says)."""
    k, accumulate = chunks.k, chunks.inv_norms.dtype
    if best is not None:  # route each class's gradient to its winning sub-center
        pooled = g_cos.new_zeros(g_cos.shape[0], stop - start, k)  # (N, c, K)
        g_cos = pooled.scatter_(2, best.unsqueeze(2), g_cos.unsqueeze(2)).view(
            g_cos.shape[0], -1
        )  # (N, c·K)
    lo, hi = start * k, stop * k
    centers = chunks.weight_rows(start, stop)  # (c·K, D)
    if chunks.gemm == accumulate:
        g_dot = g_cos.mul_(chunks.inv_norms[lo:hi])  # (N, c·K), ∂L/∂(x̂·w)
        grad_x_hat.addmm_(g_dot, centers)
    else:  # scale, then round to the GEMM dtype into its workspace (torch.mul with a bf16
        # out= would compute into a hidden float32 N×c temporary first)
        g_cos.mul_(chunks.inv_norms[lo:hi])
        g_dot = chunks.scratch(g_cos.shape[0], g_cos.shape[1], chunks.gemm).copy_(g_cos)
        grad_x_hat.add_(torch.mm(g_dot, centers))
    if grad_weight is not None and add_rows is not None:
        chunks.add_unprojected(grad_weight, start, stop, g_dot, overwrite=not add_rows)
        if project:  # the last block: the chunk's rows are complete (and in cache)
            chunks.project_rows(grad_weight, start, stop)
    elif grad_weight is not None:
        if grad_weight.dtype == chunks.gemm:  # write in place (fp32, or a bf16 weight)
            rows = chunks.gradient_rows(grad_weight, start, stop)  # (c·K, D)
            partial = torch.mm(g_dot.t(), chunks.x_gemm, out=rows)
        else:
            partial = torch.mm(g_dot.t(), chunks.x_gemm).to(accumulate)  # (c·K, D)
        chunks.project_into(grad_weight, start, stop, partial)


# --------------------------------------------------------------------------- the target
def target_cosines(
    x_hat: Tensor, weight: Tensor, local_labels: Tensor, sub_centers: int, sample: Tensor | None
) -> tuple[Tensor, Tensor]:
    """``cos θ_{i,y_i}`` (an indexed dot, max over the target's ``K`` sub-centers) and the
    winning row among the loop's rows (``y·K + k``; ``y`` a position in ``sample`` if given),
    ``(Tensor[N], Tensor[N])``, without gradient and without a host synchronization. Rows with
    ``local_labels = -1`` (another rank owns the class) get 0 and row 0."""
    with torch.no_grad():
        k = sub_centers
        owned = local_labels >= 0  # (N,)
        safe = local_labels.clamp_min(0)  # (N,)
        offsets = torch.arange(k, device=local_labels.device)  # (K,)
        candidates = safe.unsqueeze(1) * k + offsets  # (N, K), the loop's rows
        rows = candidates if sample is None else sample[safe].unsqueeze(1) * k + offsets
        centers = weight[rows].to(x_hat.dtype)  # (N, K, D)
        inv = torch.linalg.vector_norm(centers, dim=2).clamp_min(NORMALIZE_EPS).reciprocal()
        cos_k = torch.einsum("nd,nkd->nk", x_hat, centers) * inv  # (N, K)
        if k == 1:
            values, winner = cos_k.squeeze(1), candidates.squeeze(1)
        else:
            values, best = cos_k.max(dim=1)  # (N,)
            winner = candidates.gather(1, best.unsqueeze(1)).squeeze(1)
        zero = torch.zeros_like(values)
        return torch.where(owned, values, zero), torch.where(owned, winner, 0)


def add_target_gradient(
    chunks: ChunkWorkspace,
    grad_cos: Tensor,
    target_rows: Tensor,
    owned: Tensor | None,
    grad_x_hat: Tensor,
    grad_weight: Tensor | None,
) -> None:
    """The target's share, given ``∂L/∂cos θ_iy`` (``Tensor[N]``): ``∂cos θ_iy/∂x̂_i = r·w_y``
    into ``grad_x_hat`` and ``∂cos θ_iy/∂w_y = r·x̂_i``, projected through ``w/‖w‖``, into
    ``grad_weight``. ``owned`` (``bool[N]``, or None for all): the rows whose target is among
    these weight rows; the others add nothing."""
    accumulate = chunks.x_hat.dtype
    inv = chunks.inv_norms[target_rows]  # (N,)
    coefficient = grad_cos.to(accumulate) * inv  # (N,)
    if owned is not None:
        coefficient = torch.where(owned, coefficient, torch.zeros_like(coefficient))
    coefficient = coefficient.unsqueeze(1)  # (N, 1)
    weight_rows = chunks.weight_row_of(target_rows)  # (N,), rows of the weight
    centers = chunks.weight[weight_rows].to(accumulate)  # (N, D)
    grad_x_hat.addcmul_(coefficient, centers)
    if grad_weight is not None:
        partial = coefficient * chunks.x_hat  # (N, D)
        project_scattered_rows(grad_weight, weight_rows, partial, centers, inv)
