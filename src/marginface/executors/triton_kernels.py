"""Triton kernels for the chunked executor's per-chunk work: the ``N×C`` logits stay on chip.

Importing this module imports :mod:`triton`; :mod:`marginface.executors.triton_dispatch` imports
it only when it is about to use it (tensors on CUDA and triton installed, or
``kernels="triton"``), so marginface imports and runs without triton. Kernels are decorated at
import time: to run them on the CPU through Triton's interpreter, ``TRITON_INTERPRET=1`` must be
in the environment *before this module is first imported*. Their launch options and the rule they
take are in :mod:`~marginface.executors.kernel_options` (importable without triton).

Three kernels serve every loss: the forward's reduction over a chunk's classes, the backward's
``∂x̂`` and ``∂W``. They share the cosine tile, the row inputs and the masks, and differ only
in their reduction step (:mod:`~.triton_rules`), a compile-time ``REDUCTION``: ``"softmax"``,
``"softplus"`` (one-vs-all, :mod:`~.triton_binary`) or ``"above_threshold"`` (a margin's row
statistics, :mod:`~.triton_row_statistics`; forward only).

The kernels see only what is elementwise per entry ``(i, j)`` of the logit matrix; everything of
size ``N`` (the target cosine, the margin's target rule, its context, the stateful updates) stays
in PyTorch in :mod:`~marginface.executors.chunk_loop`. Per entry, with ``x̂_i`` the normalized
embedding, ``w_{jk}`` the raw centers and ``r_{jk} = 1/max(‖w_{jk}‖, eps)``:

.. math::
    c_{ij} = \\max_k r_{jk}\\,\\hat x_i\\cdot w_{jk},\\qquad
    z_{ij} = s_i\\,g_i(c_{ij})

with ``g_i`` the margin's non-target rule, one of
:data:`~marginface.margins.base.NONTARGET_KERNELS` (the identity; CurricularFace's
``c(t_i + c)`` above ``τ_i``; MV-Softmax's and NPCFace's ``a·c + b`` above ``τ_i``; ArcNegFace's
Gaussian re-weighting; circle loss's ``[c + m]_+(c - m)``; Li-ArcFace's ``(π - 2 arccos c)/π``:
:class:`~marginface.executors.kernel_options.NonTargetRule`, a compile-time ``RULE`` of each
kernel), and the target column ``j = y_i`` excluded. The softmax's forward reduces ``z`` to
per-row partial statistics ``(max, Σexp)`` per chunk (merged exactly in PyTorch, as in
:mod:`~marginface.executors._online_softmax`); the backward recomputes ``z`` tile by tile,
``p_ij = exp(z_ij - LSE_i)`` and ``∂L/∂c_ij = γ_i p_ij s_i g_i'(c_ij)`` (``γ`` the upstream
gradient), routed to the winning sub-center, and accumulates ``∂x̂`` and ``∂W``. All dot
products accumulate in float32 (``tl.dot`` with IEEE precision for float32 inputs, no TF32); the
inputs may be float32, bfloat16 or float16.
"""

# Compile-time (tl.constexpr) kernel arguments are UPPER_CASE, Triton's convention.
# ruff: noqa: N803

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor

from .kernel_options import Blocks, NonTargetRule, RowInputs, default_blocks, launch_blocks
from .triton_rules import _gradient_step, _reduce_step

__all__ = [
    "Blocks",
    "NonTargetRule",
    "RowInputs",
    "default_blocks",
    "embedding_gradient",
    "interpreted",
    "kernel_embedding_gradient",
    "kernel_partials",
    "kernel_weight_gradient",
    "nontarget_statistics",
    "weight_gradient",
]

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
"""Dtypes the kernels multiply in (the GEMM dtype of the chunked executor)."""

EMBEDDING_GRADIENT_WORKSPACE_BYTES = 64 * 2**20
"""Bound on :func:`embedding_gradient`'s float32 buffer of per-chunk partial sums, bytes."""


# --------------------------------------------------------------------------- device functions
@triton.jit
def _load_tile(ptr, index, ok, stride, dims, d_ok):
    """Rows ``index`` (int64 ``[B]``, valid where ``ok``) of a row-major matrix, columns ``dims``
    (valid where ``d_ok``), 0 outside: ``[B, BLOCK_D]``."""
    return tl.load(
        ptr + index[:, None] * stride + dims[None, :], mask=ok[:, None] & d_ok[None, :], other=0.0
    )


@triton.jit
def _cosine_tile(
    x_ptr, w_ptr, inv_norm_ptr, rows, cols, row_ok, col_ok, label, dim, stride_x, stride_w,
    K: tl.constexpr, PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """Cosines ``[BLOCK_N, BLOCK_C]`` (float32), max-pooled over the K sub-centers, the winning
    sub-center (first maximum, as ``Tensor.max``) and ``keep``: the tile's valid non-target
    entries (``cols != label``)."""
    best_cos = tl.full((BLOCK_N, BLOCK_C), float("-inf"), tl.float32)
    best = tl.zeros((BLOCK_N, BLOCK_C), tl.int32)
    for k in tl.static_range(K):
        centers = cols.to(tl.int64) * K + k
        acc = tl.zeros((BLOCK_N, BLOCK_C), tl.float32)
        for d0 in range(0, dim, BLOCK_D):
            dims = d0 + tl.arange(0, BLOCK_D)
            d_ok = dims < dim
            x = _load_tile(x_ptr, rows.to(tl.int64), row_ok, stride_x, dims, d_ok)
            w = _load_tile(w_ptr, centers, col_ok, stride_w, dims, d_ok)
            if DOT_UPCAST:  # Triton's interpreter cannot multiply bf16 (see _dot_upcast)
                x = x.to(tl.float32)
                w = w.to(tl.float32)
            acc = tl.dot(x, tl.trans(w), acc, input_precision=PRECISION)
        inv_norm = tl.load(inv_norm_ptr + centers, mask=col_ok, other=0.0)
        cos = acc * inv_norm[None, :]
        better = cos > best_cos
        best = tl.where(better, k, best)
        best_cos = tl.where(better, cos, best_cos)
    keep = row_ok[:, None] & col_ok[None, :] & (cols[None, :] != label[:, None])
    return best_cos, best, keep


@triton.jit
def _row_inputs(
    label_ptr, scale_ptr, threshold_ptr, t_ptr, const_ptr, rows, row_ok,
    REDUCTION: tl.constexpr, RULE: tl.constexpr,
):  # fmt: skip
    """Per-row label, scale, threshold and t of a block of rows, and the two scalars of
    ``const_ptr`` (the softmax: the non-target rule's; ``"softplus"``: ``p0``, the bias term
    ``βb``), each loaded only where ``REDUCTION`` and ``RULE`` read it (the softmax's scale,
    threshold and t; ``"above_threshold"``'s threshold), else a stand-in."""
    label = tl.load(label_ptr + rows, mask=row_ok, other=-1)
    scale = rows.to(tl.float32)  # a stand-in for what is not read
    threshold = scale
    t = scale
    p0 = 0.0
    p1 = 0.0
    if REDUCTION == "softmax":
        scale = tl.load(scale_ptr + rows, mask=row_ok, other=0.0)
        threshold = scale
        t = scale
        if RULE == "curricular" or RULE == "mv" or RULE == "gaussian":
            threshold = tl.load(threshold_ptr + rows, mask=row_ok, other=2.0)
        if RULE == "curricular":
            t = tl.load(t_ptr + rows, mask=row_ok, other=0.0)
        p0 = tl.load(const_ptr)
        p1 = tl.load(const_ptr + 1)
    if REDUCTION == "softplus":  # the learned bias, read on the device
        p0 = tl.load(const_ptr)
    if REDUCTION == "above_threshold":
        threshold = tl.load(threshold_ptr + rows, mask=row_ok, other=2.0)
    return label, scale, threshold, t, p0, p1


@triton.jit
def _row_gradient_inputs(lse_ptr, grad_ptr, rows, row_ok, REDUCTION: tl.constexpr):
    """Per-row ``(lse, grad)`` of a block of rows: the log-sum-exp (read by the softmax only;
    else the gradient stands in for it) and the gradient reaching the reduction."""
    grad = tl.load(grad_ptr + rows, mask=row_ok, other=0.0)
    lse = grad
    if REDUCTION == "softmax":
        lse = tl.load(lse_ptr + rows, mask=row_ok, other=0.0)
    return lse, grad


@triton.jit
def _tile_gradient(
    x_ptr, w_ptr, inv_norm_ptr, rows, cols, row_ok, col_ok, label, scale, threshold, t, p0, p1,
    lse, grad, dim, stride_x, stride_w, SCALE, POWER, OFFSET, LIMIT,
    REDUCTION: tl.constexpr, RULE: tl.constexpr, CLAMP: tl.constexpr, ST: tl.constexpr,
    K: tl.constexpr, PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """A tile's cosines (:func:`_cosine_tile`) and their gradient (:func:`_gradient_step`):
    ``(∂L/∂c, the rows' share, the winning sub-center)``."""
    cos, best, keep = _cosine_tile(
        x_ptr, w_ptr, inv_norm_ptr, rows, cols, row_ok, col_ok, label, dim, stride_x, stride_w,
        K, PRECISION, DOT_UPCAST, BLOCK_N, BLOCK_C, BLOCK_D,
    )  # fmt: skip
    grad_cos, share = _gradient_step(
        cos, keep, scale, threshold, t, p0, p1, lse, grad, SCALE, POWER, OFFSET, LIMIT,
        REDUCTION, RULE, CLAMP, ST,
    )  # fmt: skip
    return grad_cos, share, best


@triton.jit
def _sub_center_gradient(grad_cos, best, cols, col_ok, inv_norm_ptr, k, K: tl.constexpr):
    """The rows of sub-center ``k`` of the classes ``cols`` and their share of ``∂L/∂(x̂·w)``:
    ``∂L/∂c`` where ``k`` won, times ``r_{jk}``."""
    centers = cols.to(tl.int64) * K + k
    inv_norm = tl.load(inv_norm_ptr + centers, mask=col_ok, other=0.0)
    return centers, tl.where(best == k, grad_cos, 0.0) * inv_norm[None, :]


@triton.jit
def _add_product(out, out_ok, a, b, PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr):
    """``out += a @ b`` on a float32 tile in memory (where ``out_ok``)."""
    acc = tl.load(out, mask=out_ok, other=0.0)
    if DOT_UPCAST:
        acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    else:
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
    tl.store(out, acc, mask=out_ok)


# --------------------------------------------------------------------------------- kernels
@triton.jit
def _reduce_kernel(
    x_ptr, w_ptr, inv_norm_ptr, label_ptr, scale_ptr, threshold_ptr, t_ptr, const_ptr, out_ptr,
    rows_total, classes, dim, chunk, stride_x, stride_w, SCALE, POWER, OFFSET, LIMIT,
    REDUCTION: tl.constexpr, RULE: tl.constexpr, CLAMP: tl.constexpr, ST: tl.constexpr,
    K: tl.constexpr, PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """Program ``(row block, chunk)``: the chunk's ``(first, second)`` of :func:`_reduce_step`
    into ``out[:, chunk, rows]`` (float32 ``[2, chunks, N]``; ``[1, chunks, N]``: softplus)."""
    pid_c = tl.program_id(1)
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < rows_total
    label, scale, threshold, t, p0, p1 = _row_inputs(
        label_ptr, scale_ptr, threshold_ptr, t_ptr, const_ptr, rows, row_ok, REDUCTION, RULE
    )
    first = tl.zeros((BLOCK_N,), tl.float32)
    if REDUCTION == "softmax":  # the running max
        first = tl.full((BLOCK_N,), float("-inf"), tl.float32)
    second = tl.zeros((BLOCK_N,), tl.float32)
    lo = pid_c * chunk
    hi = tl.minimum(lo + chunk, classes)
    for c0 in range(lo, hi, BLOCK_C):
        cols = c0 + tl.arange(0, BLOCK_C)
        cos, _, keep = _cosine_tile(
            x_ptr, w_ptr, inv_norm_ptr, rows, cols, row_ok, cols < hi, label, dim, stride_x,
            stride_w, K, PRECISION, DOT_UPCAST, BLOCK_N, BLOCK_C, BLOCK_D,
        )  # fmt: skip
        first, second = _reduce_step(
            cos, keep, first, second, scale, threshold, t, p0, p1, SCALE, POWER, OFFSET, LIMIT,
            REDUCTION, RULE, CLAMP, ST,
        )  # fmt: skip
    out = pid_c.to(tl.int64) * rows_total + rows
    tl.store(out_ptr + out, first, mask=row_ok)
    if REDUCTION != "softplus":
        tl.store(out_ptr + tl.num_programs(1).to(tl.int64) * rows_total + out, second, mask=row_ok)


@triton.jit
def _embedding_gradient_kernel(
    x_ptr, w_ptr, inv_norm_ptr, label_ptr, scale_ptr, threshold_ptr, t_ptr, const_ptr, lse_ptr,
    grad_ptr, grad_x_ptr, share_ptr, rows_total, classes, dim, chunk, stride_x, stride_w,
    SCALE, POWER, OFFSET, LIMIT,
    REDUCTION: tl.constexpr, RULE: tl.constexpr, CLAMP: tl.constexpr, ST: tl.constexpr,
    K: tl.constexpr, PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """Program ``(row block, chunk)``: the chunk's share of ``∂L/∂x̂`` (into its own slice
    ``[chunk, rows, :]`` of a float32 buffer, so no atomics) and its rows' share of
    :func:`_gradient_step` (``∂L/∂s``, or the bias terms)."""
    pid_c = tl.program_id(1)
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < rows_total
    label, scale, threshold, t, p0, p1 = _row_inputs(
        label_ptr, scale_ptr, threshold_ptr, t_ptr, const_ptr, rows, row_ok, REDUCTION, RULE
    )
    lse, grad = _row_gradient_inputs(lse_ptr, grad_ptr, rows, row_ok, REDUCTION)
    share = tl.zeros((BLOCK_N,), tl.float32)
    base = grad_x_ptr + pid_c.to(tl.int64) * rows_total * dim
    lo = pid_c * chunk
    hi = tl.minimum(lo + chunk, classes)
    for c0 in range(lo, hi, BLOCK_C):
        cols = c0 + tl.arange(0, BLOCK_C)
        col_ok = cols < hi
        grad_cos, partial, best = _tile_gradient(
            x_ptr, w_ptr, inv_norm_ptr, rows, cols, row_ok, col_ok, label, scale, threshold, t,
            p0, p1, lse, grad, dim, stride_x, stride_w, SCALE, POWER, OFFSET, LIMIT,
            REDUCTION, RULE, CLAMP, ST, K, PRECISION, DOT_UPCAST, BLOCK_N, BLOCK_C, BLOCK_D,
        )  # fmt: skip
        share += partial
        for k in tl.static_range(K):
            centers, grad_dot = _sub_center_gradient(
                grad_cos, best, cols, col_ok, inv_norm_ptr, k, K
            )
            grad_dot = grad_dot.to(w_ptr.dtype.element_ty)
            for d0 in range(0, dim, BLOCK_D):
                dims = d0 + tl.arange(0, BLOCK_D)
                d_ok = dims < dim
                w = _load_tile(w_ptr, centers, col_ok, stride_w, dims, d_ok)
                out = base + rows[:, None].to(tl.int64) * dim + dims[None, :]
                _add_product(
                    out, row_ok[:, None] & d_ok[None, :], grad_dot, w, PRECISION, DOT_UPCAST
                )
    tl.store(share_ptr + pid_c.to(tl.int64) * rows_total + rows, share, mask=row_ok)


@triton.jit
def _weight_gradient_kernel(
    x_ptr, w_ptr, inv_norm_ptr, label_ptr, scale_ptr, threshold_ptr, t_ptr, const_ptr, lse_ptr,
    grad_ptr, out_ptr, rows_total, lo, hi, dim, stride_x, stride_w,
    SCALE, POWER, OFFSET, LIMIT,
    REDUCTION: tl.constexpr, RULE: tl.constexpr, CLAMP: tl.constexpr, ST: tl.constexpr,
    K: tl.constexpr, PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """Program ``class tile`` of the chunk ``[lo, hi)``: ``r_{jk} Σ_i (∂L/∂c_ijk) x̂_i`` for its
    rows of ``out`` (float32 ``[(hi - lo)·K, dim]``, contiguous; owned, so no atomics)."""
    cols = lo + tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = cols < hi
    for n0 in range(0, rows_total, BLOCK_N):
        rows = n0 + tl.arange(0, BLOCK_N)
        row_ok = rows < rows_total
        label, scale, threshold, t, p0, p1 = _row_inputs(
            label_ptr, scale_ptr, threshold_ptr, t_ptr, const_ptr, rows, row_ok, REDUCTION, RULE
        )
        lse, grad = _row_gradient_inputs(lse_ptr, grad_ptr, rows, row_ok, REDUCTION)
        grad_cos, _, best = _tile_gradient(
            x_ptr, w_ptr, inv_norm_ptr, rows, cols, row_ok, col_ok, label, scale, threshold, t,
            p0, p1, lse, grad, dim, stride_x, stride_w, SCALE, POWER, OFFSET, LIMIT,
            REDUCTION, RULE, CLAMP, ST, K, PRECISION, DOT_UPCAST, BLOCK_N, BLOCK_C, BLOCK_D,
        )  # fmt: skip
        for k in tl.static_range(K):
            centers, grad_dot = _sub_center_gradient(
                grad_cos, best, cols, col_ok, inv_norm_ptr, k, K
            )
            grad_dot = grad_dot.to(x_ptr.dtype.element_ty)
            local = centers - lo * K
            for d0 in range(0, dim, BLOCK_D):
                dims = d0 + tl.arange(0, BLOCK_D)
                d_ok = dims < dim
                x = _load_tile(x_ptr, rows.to(tl.int64), row_ok, stride_x, dims, d_ok)
                out = out_ptr + local[:, None] * dim + dims[None, :]
                out_ok = col_ok[:, None] & d_ok[None, :]
                _add_product(out, out_ok, tl.trans(grad_dot), x, PRECISION, DOT_UPCAST)


# ------------------------------------------------------------------------------- launchers
def _precision(dtype: torch.dtype) -> str:
    """IEEE float32 products for float32 inputs (the PyTorch path does not use TF32 either)."""
    return "ieee" if dtype == torch.float32 else "tf32"


def interpreted() -> bool:
    """Whether the kernels were built for Triton's CPU interpreter (``TRITON_INTERPRET=1`` at
    the import of this module)."""
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(_reduce_kernel, InterpretedFunction)


def _dot_upcast(dtype: torch.dtype) -> bool:
    """Whether ``tl.dot`` operands are upcast to float32 inside the kernels: only for half
    inputs under the interpreter, whose ``tl.dot`` multiplies bf16 bit patterns as integers
    (triton-lang/triton#11584, "not supported yet"). Exact: a product of two bf16/fp16 numbers
    is exact in float32, and the GPU's ``tl.dot`` accumulates in float32 too."""
    return dtype != torch.float32 and interpreted()


def _launch_options(dtype: torch.dtype, sub_centers: int, blocks: Blocks) -> dict[str, Any]:
    """The kernels' compile-time arguments and launch options besides the reduction's."""
    return {
        "K": sub_centers, "PRECISION": _precision(dtype), "DOT_UPCAST": _dot_upcast(dtype),
        "BLOCK_N": blocks.n, "BLOCK_C": blocks.c, "BLOCK_D": blocks.d,
        "num_warps": blocks.warps, "num_stages": blocks.stages,
    }  # fmt: skip


def _row_vectors(
    labels: Tensor, scale: Tensor, rule: NonTargetRule
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The per-row inputs, contiguous: labels, scale, threshold, t (the scale stands in for
    those the rule does not read), and the rule's constants (``Tensor[2]`` float32, zeros for a
    rule without them)."""
    labels, scale = labels.contiguous(), scale.contiguous()

    def given(value: Tensor | None) -> Tensor:
        return scale if value is None else value.to(torch.float32).contiguous()

    constants = rule.constants
    if constants is None:
        constants = _zero_constants(scale.device)
    return labels, scale, given(rule.threshold), given(rule.t), given(constants)


_ZERO_CONSTANTS: dict[torch.device, Tensor] = {}


def _zero_constants(device: torch.device) -> Tensor:
    """The constants of a rule without them, ``Tensor[2]`` float32 zeros on ``device``: made
    once per device (the kernels only read it), not once per launch."""
    zeros = _ZERO_CONSTANTS.get(device)
    if zeros is None:
        zeros = _ZERO_CONSTANTS[device] = torch.zeros(2, dtype=torch.float32, device=device)
    return zeros


def _softmax_inputs(labels: Tensor, scale: Tensor, rule: NonTargetRule) -> tuple[Tensor, RowInputs]:
    """The labels and :class:`RowInputs` of the softmax kernels."""
    labels, scale, threshold, t, constants = _row_vectors(labels, scale, rule)
    return labels, RowInputs("softmax", scale, threshold, t, constants, rule=rule.name)


def _check(x_hat: Tensor, weight: Tensor, sub_centers: int) -> None:
    if x_hat.dtype not in SUPPORTED_DTYPES or weight.dtype != x_hat.dtype:
        raise TypeError(
            f"the Triton kernels need x_hat and weight in one of {SUPPORTED_DTYPES}, got "
            f"{x_hat.dtype} and {weight.dtype}"
        )
    if x_hat.stride(1) != 1 or weight.stride(1) != 1:
        raise ValueError("the Triton kernels need x_hat and weight with unit stride along D")
    if weight.shape[0] % sub_centers:
        raise ValueError(f"weight rows {weight.shape[0]} not a multiple of K = {sub_centers}")


def kernel_partials(
    x_hat: Tensor, weight: Tensor, inv_norms: Tensor, labels: Tensor, inputs: RowInputs, *,
    sub_centers: int, chunk_size: int, blocks: Blocks | None = None,
) -> Tensor:  # fmt: skip
    """The forward's per-chunk partial reductions of every row: ``Tensor[2, chunks, N]`` float32
    (``[1, chunks, N]`` for ``"softplus"``), one program per (block of rows, chunk of
    ``chunk_size`` classes); the chunks merged by the caller. Arguments as
    :func:`nontarget_statistics`; ``labels`` contiguous, ``inputs`` the reduction's."""
    _check(x_hat, weight, sub_centers)
    n, dim = x_hat.shape
    classes = weight.shape[0] // sub_centers
    if blocks is None:
        kernel = "statistics" if inputs.reduction == "softmax" else inputs.reduction
        blocks = launch_blocks(
            kernel, x_hat, n, min(chunk_size, classes), dim,
            rule=inputs.rule, sub_centers=sub_centers,
        )  # fmt: skip
    chunks = triton.cdiv(classes, chunk_size)
    outputs = 1 if inputs.reduction == "softplus" else 2
    out = torch.empty(outputs, chunks, n, dtype=torch.float32, device=x_hat.device)
    _reduce_kernel[(triton.cdiv(n, blocks.n), chunks)](
        x_hat, weight, inv_norms, labels, *inputs.pointers(out), out,
        n, classes, dim, chunk_size, x_hat.stride(0), weight.stride(0),
        **inputs.arguments(), **_launch_options(x_hat.dtype, sub_centers, blocks),
    )  # fmt: skip
    return out


def kernel_embedding_gradient(
    x_hat: Tensor, weight: Tensor, inv_norms: Tensor, labels: Tensor, inputs: RowInputs,
    lse: Tensor, grad: Tensor, *, sub_centers: int, chunk_size: int, blocks: Blocks | None = None,
    workspace_bytes: int | None = None,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """The non-target part of ``∂L/∂x̂`` (``Tensor[N, D]``) and the rows' share of
    :func:`_gradient_step` (``Tensor[N]``), float32, as :func:`embedding_gradient` describes
    (the chunks launched in groups within ``workspace_bytes``). ``lse``, ``grad``: float32
    ``Tensor[N]`` (``lse`` not read by the one-vs-all reduction)."""
    _check(x_hat, weight, sub_centers)
    n, dim = x_hat.shape
    classes = weight.shape[0] // sub_centers
    blocks = blocks or default_blocks(n, min(chunk_size, classes), dim)
    if workspace_bytes is None:
        workspace_bytes = EMBEDDING_GRADIENT_WORKSPACE_BYTES
    chunks = triton.cdiv(classes, chunk_size)
    group = max(1, min(chunks, workspace_bytes // max(n * dim * 4, 1)))  # chunks per launch
    device = x_hat.device
    buffer = torch.empty(group, n, dim, dtype=torch.float32, device=device)
    share_buffer = torch.empty(group, n, dtype=torch.float32, device=device)
    grad_x = torch.zeros(n, dim, dtype=torch.float32, device=device)
    share = torch.zeros(n, dtype=torch.float32, device=device)
    options = {**inputs.arguments(), **_launch_options(x_hat.dtype, sub_centers, blocks)}
    for first in range(0, classes, group * chunk_size):
        last = min(first + group * chunk_size, classes)
        launched = triton.cdiv(last - first, chunk_size)
        buffer[:launched].zero_()  # the kernel accumulates into its slice
        # the group's classes as a problem of their own: rows of W and of its inverse norms
        # from `first`, labels shifted by `first` (a label outside the group matches no column)
        _embedding_gradient_kernel[(triton.cdiv(n, blocks.n), launched)](
            x_hat, weight[first * sub_centers :], inv_norms[first * sub_centers :],
            labels - first, *inputs.pointers(grad), lse, grad, buffer, share_buffer,
            n, last - first, dim, chunk_size, x_hat.stride(0), weight.stride(0), **options,
        )  # fmt: skip
        grad_x += buffer[:launched].sum(dim=0)
        share += share_buffer[:launched].sum(dim=0)
    return grad_x, share


def kernel_weight_gradient(
    x_hat: Tensor, weight: Tensor, inv_norms: Tensor, labels: Tensor, inputs: RowInputs,
    lse: Tensor, grad: Tensor, *, sub_centers: int, start: int, stop: int,
    out: Tensor | None = None, blocks: Blocks | None = None,
) -> Tensor:  # fmt: skip
    """The non-target part of ``r_{jk}·Σ_i (∂L/∂c_ijk) x̂_i`` for the classes ``[start, stop)``
    as :func:`weight_gradient` describes, float32 ``[(stop - start)·K, D]``, into ``out``
    (contiguous float32, zeroed here) if given. Arguments as :func:`kernel_embedding_gradient`.
    """
    _check(x_hat, weight, sub_centers)
    n, dim = x_hat.shape
    rows = (stop - start) * sub_centers
    if out is None:
        out = torch.zeros(rows, dim, dtype=torch.float32, device=x_hat.device)
    else:
        if out.dtype != torch.float32 or not out.is_contiguous() or out.shape != (rows, dim):
            raise ValueError(f"out must be a contiguous float32 tensor of shape ({rows}, {dim})")
        out.zero_()
    blocks = blocks or default_blocks(n, stop - start, dim)
    _weight_gradient_kernel[(triton.cdiv(stop - start, blocks.c),)](
        x_hat, weight, inv_norms, labels, *inputs.pointers(grad), lse, grad, out,
        n, start, stop, dim, x_hat.stride(0), weight.stride(0),
        **inputs.arguments(), **_launch_options(x_hat.dtype, sub_centers, blocks),
    )  # fmt: skip
    return out


# ------------------------------------------------------------------- the softmax's launchers
def nontarget_statistics(
    x_hat: Tensor,
    weight: Tensor,
    inv_norms: Tensor,
    labels: Tensor,
    scale: Tensor,
    rule: NonTargetRule,
    *,
    sub_centers: int,
    chunk_size: int,
    blocks: Blocks | None = None,
) -> tuple[Tensor, Tensor]:
    """Per-row ``(max, Σexp)`` of the non-target logits ``z_ij = s_i g_i(c_ij)``, ``j ≠ y_i``.

    One program per (block of rows, chunk of ``chunk_size`` classes); the chunks' statistics are
    merged exactly in PyTorch (``O(N·C/chunk_size)`` floats).

    Args:
        x_hat: ``Tensor[N, D]`` normalized embeddings, in the GEMM dtype (float32/bf16/fp16).
        weight: ``Tensor[C·K, D]`` raw centers, same dtype as ``x_hat``.
        inv_norms: ``Tensor[C·K]`` float32, ``1/max(‖w‖, eps)``.
        labels: ``Tensor[N]`` int64 in ``[0, C)``.
        scale: ``Tensor[N]`` float32 per-row scale ``s_i``.
        rule: the non-target rule.
        sub_centers: ``K``.
        chunk_size: classes per program.
        blocks: tile sizes; default :func:`default_blocks`.

    Returns:
        ``(max, Σexp)``, ``Tensor[N]`` float32 each, as
        :func:`~marginface.executors._online_softmax.merge_statistics` would give.
    """
    labels, inputs = _softmax_inputs(labels, scale, rule)
    row_max, exp_sum = kernel_partials(
        x_hat, weight, inv_norms, labels, inputs,
        sub_centers=sub_centers, chunk_size=chunk_size, blocks=blocks,
    )  # fmt: skip
    merged_max = row_max.amax(dim=0)  # (N,)
    shift = torch.where(torch.isfinite(merged_max), merged_max, torch.zeros_like(merged_max))
    return merged_max, (exp_sum * torch.exp(row_max - shift)).sum(dim=0)


def embedding_gradient(
    x_hat: Tensor, weight: Tensor, inv_norms: Tensor, labels: Tensor, scale: Tensor,
    rule: NonTargetRule, lse: Tensor, grad: Tensor, *, sub_centers: int, chunk_size: int,
    blocks: Blocks | None = None, workspace_bytes: int | None = None,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """The non-target part of ``∂L/∂x̂`` and of ``∂L/∂s`` (per-row scale).

    .. math:: \\frac{\\partial L}{\\partial \\hat x_i} = \\sum_{j\\ne y_i}
              \\gamma_i p_{ij} s_i g_i'(c_{ij})\\, r_{jk^*} w_{jk^*},\\qquad
              \\frac{\\partial L}{\\partial s_i} = \\sum_{j\\ne y_i} \\gamma_i p_{ij} g_i(c_{ij})

    with ``p_ij = exp(z_ij - LSE_i)`` and ``k*`` the winning sub-center. Arguments as
    :func:`nontarget_statistics`, plus ``lse``, ``grad``: ``Tensor[N]`` float32 (``LSE_i``
    including the target, and the upstream gradient ``γ_i``). Each program writes its own
    float32 slice ``[N, D]`` of a buffer (one slice per chunk, summed afterwards: no atomics, a
    deterministic sum); the classes are launched in groups of ``G`` chunks so that the buffer
    ``[G, N, D]`` stays within ``workspace_bytes`` (default
    :data:`EMBEDDING_GRADIENT_WORKSPACE_BYTES`, 64 MiB; at least one chunk). One launch for
    all ``C/chunk_size`` chunks would need ``C/chunk_size·N·D·4`` bytes: 1.9 GB at
    C = 10M, N = D = 512 with 5461-class chunks.

    Returns:
        ``(Tensor[N, D], Tensor[N])``, float32.
    """
    labels, inputs = _softmax_inputs(labels, scale, rule)
    return kernel_embedding_gradient(
        x_hat, weight, inv_norms, labels, inputs, lse, grad, sub_centers=sub_centers,
        chunk_size=chunk_size, blocks=blocks, workspace_bytes=workspace_bytes,
    )  # fmt: skip


def weight_gradient(
    x_hat: Tensor, weight: Tensor, inv_norms: Tensor, labels: Tensor, scale: Tensor,
    rule: NonTargetRule, lse: Tensor, grad: Tensor, *, sub_centers: int, start: int, stop: int,
    out: Tensor | None = None, blocks: Blocks | None = None,
) -> Tensor:  # fmt: skip
    """The non-target part of ``r_{jk}·Σ_i (∂L/∂c_ijk) x̂_i`` for the classes ``[start, stop)``
    (the weight gradient before the projection through ``w/‖w‖``).

    Arguments as :func:`embedding_gradient`. ``out``: a contiguous float32
    ``Tensor[(stop - start)·K, D]`` to accumulate into (zeroed here), e.g. the rows of the
    weight's own gradient; default a new one.

    Returns:
        ``out``, float32 ``[(stop - start)·K, D]``.
    """
    labels, inputs = _softmax_inputs(labels, scale, rule)
    return kernel_weight_gradient(
        x_hat, weight, inv_norms, labels, inputs, lse, grad, sub_centers=sub_centers,
        start=start, stop=stop, out=out, blocks=blocks,
    )  # fmt: skip
