"""Triton kernels for the one-vs-all (binary) reduction: the ``N×C`` logits stay on chip.

Importing this module imports :mod:`triton` (and :mod:`~marginface.executors.triton_kernels`,
whose cosine tile it reuses); :mod:`~marginface.executors.binary_loop` imports it only when a
call runs on the kernels. Under Triton's CPU interpreter, ``TRITON_INTERPRET=1`` must be set
before the first import, as for the softmax kernels.

Per entry ``(i, j)``, with ``c_ij`` the (sub-center max-pooled) cosine, the binary margins'
non-target logit is, for the rules the kernels compile in
(:class:`~marginface.executors.binary_rule.BinaryRule`),

.. math::
    z_{ij} = s\\,\\big(2u^t - 1 + \\mu\\big) + \\beta b,\\qquad u = \\max\\big(\\tfrac{c_{ij}+1}{2},
    0\\big)

(SphereFace2: ``t``, ``μ = m`` for variant C else 0, ``β = 1``; UniFace: ``t = 1`` so that
``2u - 1 = c``, ``μ = 0``, ``β = -1``), optionally clamped to ``[-L, L]``. The forward sums
``softplus(z_ij)`` over the non-target columns per row and chunk (summed in PyTorch); the
backward recomputes each tile, ``∂L/∂c_ij = γ_i w_- σ(z_ij) ∂z_ij/∂c_ij`` (``s`` for the
straight-through gradient), routed to the winning sub-center, and accumulates ``∂x̂``, ``∂W`` and
the rows' ``Σ_j γ_i w_- σ(z_ij) ∂z_ij/∂b``.
"""

# Compile-time (tl.constexpr) kernel arguments are UPPER_CASE, Triton's convention.
# ruff: noqa: N803

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor

from .binary_rule import BinaryRule
from .chunk_workspace import ChunkWorkspace
from .kernel_options import Blocks, default_blocks
from .triton_dispatch import kernel_backward, kernel_reduce
from .triton_kernels import _check, _cosine_tile, _dot_upcast, _precision

__all__ = [
    "binary_embedding_gradient",
    "binary_sums",
    "binary_weight_gradient",
    "triton_binary_sums",
    "triton_nontarget_gradient",
]

EMBEDDING_GRADIENT_WORKSPACE_BYTES = 64 * 2**20
"""Bound on :func:`binary_embedding_gradient`'s float32 buffer of per-chunk partial sums."""


@triton.jit
def _binary_logit(cos, SCALE, POWER, OFFSET, BIAS, LIMIT, CLAMP: tl.constexpr, ST: tl.constexpr):
    """``(z, ∂z/∂c, inside)`` elementwise (``inside``: not clamped)."""
    u = tl.maximum((cos + 1.0) * 0.5, 0.0)
    positive = u > 0.0
    log_u = tl.log(tl.where(positive, u, 1.0))
    power_u = tl.where(positive, tl.exp(POWER * log_u), 0.0)
    z = SCALE * (2.0 * power_u - 1.0 + OFFSET) + BIAS
    if ST:
        slope = tl.full(cos.shape, 1.0, tl.float32) * SCALE
    else:  # t·u^{t-1}: at u = 0 it is 1 for t = 1, else 0
        at_zero = tl.where(POWER == 1.0, 1.0, 0.0)
        slope = SCALE * tl.where(positive, POWER * tl.exp((POWER - 1.0) * log_u), at_zero)
    inside = tl.full(cos.shape, 1, tl.int1)
    if CLAMP:
        inside = (z >= -LIMIT) & (z <= LIMIT)
        z = tl.minimum(tl.maximum(z, -LIMIT), LIMIT)
    return z, slope, inside


@triton.jit
def _sums_kernel(
    x_ptr, w_ptr, inv_norm_ptr, label_ptr, out_ptr,
    rows_total, classes, dim, chunk, stride_x, stride_w,
    SCALE, POWER, OFFSET, BIAS, LIMIT,
    K: tl.constexpr, CLAMP: tl.constexpr, ST: tl.constexpr, PRECISION: tl.constexpr,
    DOT_UPCAST: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr,
    BLOCK_D: tl.constexpr,
):  # fmt: skip
    """Program ``(row block, chunk)``: each row's ``Σ_{j≠y} softplus(z_ij)`` over the chunk."""
    pid_n = tl.program_id(0)
    pid_c = tl.program_id(1)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < rows_total
    label = tl.load(label_ptr + rows, mask=row_ok, other=-1)
    total = tl.zeros((BLOCK_N,), tl.float32)
    lo = pid_c * chunk
    hi = tl.minimum(lo + chunk, classes)
    for c0 in range(lo, hi, BLOCK_C):
        cols = c0 + tl.arange(0, BLOCK_C)
        col_ok = cols < hi
        cos, _ = _cosine_tile(
            x_ptr, w_ptr, inv_norm_ptr, rows, cols, row_ok, col_ok, dim, stride_x, stride_w,
            K, PRECISION, DOT_UPCAST, BLOCK_N, BLOCK_C, BLOCK_D,
        )  # fmt: skip
        z, _, _ = _binary_logit(cos, SCALE, POWER, OFFSET, BIAS, LIMIT, CLAMP, ST)
        keep = row_ok[:, None] & col_ok[None, :] & (cols[None, :] != label[:, None])
        softplus = tl.maximum(z, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(z)))
        total += tl.sum(tl.where(keep, softplus, 0.0), axis=1)
    tl.store(out_ptr + pid_c.to(tl.int64) * rows_total + rows, total, mask=row_ok)


@triton.jit
def _cosine_gradient(cos, keep, row_grad, SCALE, POWER, OFFSET, BIAS, LIMIT,
                     CLAMP: tl.constexpr, ST: tl.constexpr):  # fmt: skip
    """``∂L/∂c`` of a tile (0 where not ``keep``) and its rows' ``Σ_j ∂L/∂z_ij·∂z_ij/∂b / β``
    (``row_grad = γ_i w_-``)."""
    z, slope, inside = _binary_logit(cos, SCALE, POWER, OFFSET, BIAS, LIMIT, CLAMP, ST)
    grad_z = tl.where(keep & inside, tl.sigmoid(z) * row_grad[:, None], 0.0)
    return grad_z * slope, tl.sum(grad_z, axis=1)


@triton.jit
def _embedding_gradient_kernel(
    x_ptr, w_ptr, inv_norm_ptr, label_ptr, grad_ptr, grad_x_ptr, grad_b_ptr,
    rows_total, classes, dim, chunk, stride_x, stride_w,
    SCALE, POWER, OFFSET, BIAS, LIMIT,
    K: tl.constexpr, CLAMP: tl.constexpr, ST: tl.constexpr, PRECISION: tl.constexpr,
    DOT_UPCAST: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr,
    BLOCK_D: tl.constexpr,
):  # fmt: skip
    """Program ``(row block, chunk)``: the chunk's share of ``∂L/∂x̂`` (its own slice of a
    float32 buffer, no atomics) and of each row's bias gradient."""
    pid_n = tl.program_id(0)
    pid_c = tl.program_id(1)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < rows_total
    label = tl.load(label_ptr + rows, mask=row_ok, other=-1)
    row_grad = tl.load(grad_ptr + rows, mask=row_ok, other=0.0)
    grad_b = tl.zeros((BLOCK_N,), tl.float32)
    base = grad_x_ptr + pid_c.to(tl.int64) * rows_total * dim
    lo = pid_c * chunk
    hi = tl.minimum(lo + chunk, classes)
    for c0 in range(lo, hi, BLOCK_C):
        cols = c0 + tl.arange(0, BLOCK_C)
        col_ok = cols < hi
        cos, best = _cosine_tile(
            x_ptr, w_ptr, inv_norm_ptr, rows, cols, row_ok, col_ok, dim, stride_x, stride_w,
            K, PRECISION, DOT_UPCAST, BLOCK_N, BLOCK_C, BLOCK_D,
        )  # fmt: skip
        keep = row_ok[:, None] & col_ok[None, :] & (cols[None, :] != label[:, None])
        grad_cos, partial = _cosine_gradient(
            cos, keep, row_grad, SCALE, POWER, OFFSET, BIAS, LIMIT, CLAMP, ST
        )
        grad_b += partial
        for k in tl.static_range(K):
            centers = cols.to(tl.int64) * K + k
            inv_norm = tl.load(inv_norm_ptr + centers, mask=col_ok, other=0.0)
            grad_dot = tl.where(best == k, grad_cos, 0.0) * inv_norm[None, :]
            grad_dot = grad_dot.to(w_ptr.dtype.element_ty)
            for d0 in range(0, dim, BLOCK_D):
                dims = d0 + tl.arange(0, BLOCK_D)
                d_ok = dims < dim
                w = tl.load(
                    w_ptr + centers[:, None] * stride_w + dims[None, :],
                    mask=col_ok[:, None] & d_ok[None, :],
                    other=0.0,
                )
                out = base + rows[:, None].to(tl.int64) * dim + dims[None, :]
                out_ok = row_ok[:, None] & d_ok[None, :]
                acc = tl.load(out, mask=out_ok, other=0.0)
                if DOT_UPCAST:
                    acc = tl.dot(grad_dot.to(tl.float32), w.to(tl.float32), acc)
                else:
                    acc = tl.dot(grad_dot, w, acc, input_precision=PRECISION)
                tl.store(out, acc, mask=out_ok)
    tl.store(grad_b_ptr + pid_c.to(tl.int64) * rows_total + rows, grad_b, mask=row_ok)


@triton.jit
def _weight_gradient_kernel(
    x_ptr, w_ptr, inv_norm_ptr, label_ptr, grad_ptr, out_ptr,
    rows_total, lo, hi, dim, stride_x, stride_w,
    SCALE, POWER, OFFSET, BIAS, LIMIT,
    K: tl.constexpr, CLAMP: tl.constexpr, ST: tl.constexpr, PRECISION: tl.constexpr,
    DOT_UPCAST: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr,
    BLOCK_D: tl.constexpr,
):  # fmt: skip
    """Program ``class tile`` of ``[lo, hi)``: ``r_{jk} Σ_i (∂L/∂c_ijk) x̂_i`` into its rows of
    ``out`` (float32 ``[(hi - lo)·K, dim]``; owned, no atomics)."""
    pid = tl.program_id(0)
    cols = lo + pid * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = cols < hi
    for n0 in range(0, rows_total, BLOCK_N):
        rows = n0 + tl.arange(0, BLOCK_N)
        row_ok = rows < rows_total
        label = tl.load(label_ptr + rows, mask=row_ok, other=-1)
        row_grad = tl.load(grad_ptr + rows, mask=row_ok, other=0.0)
        cos, best = _cosine_tile(
            x_ptr, w_ptr, inv_norm_ptr, rows, cols, row_ok, col_ok, dim, stride_x, stride_w,
            K, PRECISION, DOT_UPCAST, BLOCK_N, BLOCK_C, BLOCK_D,
        )  # fmt: skip
        keep = row_ok[:, None] & col_ok[None, :] & (cols[None, :] != label[:, None])
        grad_cos, _ = _cosine_gradient(
            cos, keep, row_grad, SCALE, POWER, OFFSET, BIAS, LIMIT, CLAMP, ST
        )
        for k in tl.static_range(K):
            centers = cols.to(tl.int64) * K + k
            inv_norm = tl.load(inv_norm_ptr + centers, mask=col_ok, other=0.0)
            grad_dot = tl.where(best == k, grad_cos, 0.0) * inv_norm[None, :]
            grad_dot = grad_dot.to(x_ptr.dtype.element_ty)
            local = centers - lo * K
            for d0 in range(0, dim, BLOCK_D):
                dims = d0 + tl.arange(0, BLOCK_D)
                d_ok = dims < dim
                x = tl.load(
                    x_ptr + rows[:, None].to(tl.int64) * stride_x + dims[None, :],
                    mask=row_ok[:, None] & d_ok[None, :],
                    other=0.0,
                )
                out = out_ptr + local[:, None] * dim + dims[None, :]
                out_ok = col_ok[:, None] & d_ok[None, :]
                acc = tl.load(out, mask=out_ok, other=0.0)
                if DOT_UPCAST:
                    acc = tl.dot(tl.trans(grad_dot.to(tl.float32)), x.to(tl.float32), acc)
                else:
                    acc = tl.dot(tl.trans(grad_dot), x, acc, input_precision=PRECISION)
                tl.store(out, acc, mask=out_ok)


def _rule_arguments(rule: BinaryRule) -> tuple[dict, dict]:
    scalars = {
        "SCALE": float(rule.scale),
        "POWER": float(rule.power),
        "OFFSET": float(rule.offset),
        "BIAS": float(rule.bias_term),
        "LIMIT": float(rule.clamp or 0.0),
    }
    flags = {"CLAMP": rule.clamp is not None, "ST": bool(rule.straight_through)}
    return scalars, flags


def binary_sums(
    x_hat: Tensor,
    weight: Tensor,
    inv_norms: Tensor,
    labels: Tensor,
    rule: BinaryRule,
    *,
    sub_centers: int,
    chunk_size: int,
    blocks: Blocks | None = None,
) -> Tensor:
    """Each row's ``Σ_{j≠y_i} softplus(z_ij)``, ``Tensor[N]`` float32 (one program per block of
    rows and chunk of ``chunk_size`` classes; the chunks' sums added in PyTorch). Arguments as
    :func:`~marginface.executors.triton_kernels.nontarget_statistics`."""
    _check(x_hat, weight, sub_centers)
    n, dim = x_hat.shape
    classes = weight.shape[0] // sub_centers
    blocks = blocks or default_blocks(n, min(chunk_size, classes), dim)
    chunks = triton.cdiv(classes, chunk_size)
    out = torch.empty(chunks, n, dtype=torch.float32, device=x_hat.device)
    scalars, flags = _rule_arguments(rule)
    _sums_kernel[(triton.cdiv(n, blocks.n), chunks)](
        x_hat, weight, inv_norms, labels.contiguous(), out,
        n, classes, dim, chunk_size, x_hat.stride(0), weight.stride(0),
        **scalars, **flags, K=sub_centers, PRECISION=_precision(x_hat.dtype),
        DOT_UPCAST=_dot_upcast(x_hat.dtype),
        BLOCK_N=blocks.n, BLOCK_C=blocks.c, BLOCK_D=blocks.d,
        num_warps=blocks.warps, num_stages=blocks.stages,
    )  # fmt: skip
    return out.sum(dim=0)


def binary_embedding_gradient(
    x_hat: Tensor,
    weight: Tensor,
    inv_norms: Tensor,
    labels: Tensor,
    rule: BinaryRule,
    grad: Tensor,
    *,
    sub_centers: int,
    chunk_size: int,
    blocks: Blocks | None = None,
) -> tuple[Tensor, Tensor]:
    """The non-target part of ``∂L/∂x̂`` (``Tensor[N, D]``) and each row's
    ``Σ_{j≠y} γ_i w_- σ(z_ij)·[not clamped]`` (``Tensor[N]``; times ``β`` it is the row's
    share of ``∂L/∂b``), float32. ``grad``: ``Tensor[N]``, ``γ_i`` (the upstream gradient).
    Per-chunk partial sums are written to a buffer of at most
    :data:`EMBEDDING_GRADIENT_WORKSPACE_BYTES`, launched in groups of chunks."""
    _check(x_hat, weight, sub_centers)
    n, dim = x_hat.shape
    classes = weight.shape[0] // sub_centers
    blocks = blocks or default_blocks(n, min(chunk_size, classes), dim)
    chunks = triton.cdiv(classes, chunk_size)
    group = max(1, min(chunks, EMBEDDING_GRADIENT_WORKSPACE_BYTES // max(n * dim * 4, 1)))
    device = x_hat.device
    buffer = torch.empty(group, n, dim, dtype=torch.float32, device=device)
    bias_buffer = torch.empty(group, n, dtype=torch.float32, device=device)
    grad_x = torch.zeros(n, dim, dtype=torch.float32, device=device)
    grad_b = torch.zeros(n, dtype=torch.float32, device=device)
    row_grad = (grad.to(torch.float32) * rule.negative_weight).contiguous()
    labels = labels.contiguous()
    scalars, flags = _rule_arguments(rule)
    for first in range(0, classes, group * chunk_size):
        last = min(first + group * chunk_size, classes)
        launched = triton.cdiv(last - first, chunk_size)
        buffer[:launched].zero_()
        _embedding_gradient_kernel[(triton.cdiv(n, blocks.n), launched)](
            x_hat, weight[first * sub_centers :], inv_norms[first * sub_centers :],
            labels - first, row_grad, buffer, bias_buffer,
            n, last - first, dim, chunk_size, x_hat.stride(0), weight.stride(0),
            **scalars, **flags, K=sub_centers, PRECISION=_precision(x_hat.dtype),
            DOT_UPCAST=_dot_upcast(x_hat.dtype),
            BLOCK_N=blocks.n, BLOCK_C=blocks.c, BLOCK_D=blocks.d,
            num_warps=blocks.warps, num_stages=blocks.stages,
        )  # fmt: skip
        grad_x += buffer[:launched].sum(dim=0)
        grad_b += bias_buffer[:launched].sum(dim=0)
    return grad_x, grad_b


def binary_weight_gradient(
    x_hat: Tensor,
    weight: Tensor,
    inv_norms: Tensor,
    labels: Tensor,
    rule: BinaryRule,
    grad: Tensor,
    *,
    sub_centers: int,
    start: int,
    stop: int,
    out: Tensor | None = None,
    blocks: Blocks | None = None,
) -> Tensor:
    """The non-target part of ``r_{jk}·Σ_i (∂L/∂c_ijk) x̂_i`` for the classes ``[start, stop)``
    (before the projection through ``w/‖w‖``), float32 ``[(stop - start)·K, D]``, written into
    ``out`` (contiguous float32, zeroed here) if given."""
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
    row_grad = (grad.to(torch.float32) * rule.negative_weight).contiguous()
    scalars, flags = _rule_arguments(rule)
    _weight_gradient_kernel[(triton.cdiv(stop - start, blocks.c),)](
        x_hat, weight, inv_norms, labels.contiguous(), row_grad, out,
        n, start, stop, dim, x_hat.stride(0), weight.stride(0),
        **scalars, **flags, K=sub_centers, PRECISION=_precision(x_hat.dtype),
        DOT_UPCAST=_dot_upcast(x_hat.dtype),
        BLOCK_N=blocks.n, BLOCK_C=blocks.c, BLOCK_D=blocks.d,
        num_warps=blocks.warps, num_stages=blocks.stages,
    )  # fmt: skip
    return out


def triton_binary_sums(chunks: ChunkWorkspace, rule: BinaryRule) -> Tensor:
    """The forward's pass of :mod:`~marginface.executors.binary_loop` on these kernels: each
    row's ``Σ_{j≠y_i} softplus(z_ij)`` over every class of ``chunks`` (every sampled one: one
    launch per chunk on its gathered rows, the labels shifted to the chunk's columns),
    ``Tensor[N]`` float32 (:func:`~marginface.executors.triton_dispatch.kernel_reduce`)."""

    def launch(weight: Tensor, inv_norms: Tensor, labels: Tensor, size: int) -> Tensor:
        return binary_sums(
            chunks.x_gemm, weight, inv_norms, labels, rule, sub_centers=chunks.k, chunk_size=size
        )

    def merge(total: Tensor | None, part: Tensor) -> Tensor:
        return part if total is None else total + part

    return kernel_reduce(chunks, launch, merge)


def triton_nontarget_gradient(
    chunks: ChunkWorkspace,
    rule: BinaryRule,
    sign: float,
    grad: Tensor,
    grad_x_hat: Tensor,
    grad_weight: Tensor | None,
) -> Tensor:
    """The backward's non-target pass of :mod:`~marginface.executors.binary_loop` on these
    kernels (:func:`~marginface.executors.triton_dispatch.kernel_backward`): adds into
    ``grad_x_hat``, writes ``grad_weight``, returns the non-target share of ``∂L/∂b``
    (``sign``: ``β``). With a Partial FC sample, per chunk: its rows gathered once, both
    kernels on them, its weight gradient stored into its rows of ``grad_weight``."""
    k, x_gemm = chunks.k, chunks.x_gemm
    grad = grad.contiguous()
    bias = [torch.zeros((), dtype=torch.float32, device=grad_x_hat.device)]

    def embedding(weight: Tensor, inv_norms: Tensor, labels: Tensor, size: int) -> Any:
        return binary_embedding_gradient(
            x_gemm, weight, inv_norms, labels, rule, grad, sub_centers=k, chunk_size=size
        )

    def weights(
        weight: Tensor, inv_norms: Tensor, labels: Tensor, first: int, last: int, out: Any
    ) -> Tensor:
        return binary_weight_gradient(
            x_gemm, weight, inv_norms, labels, rule, grad,
            sub_centers=k, start=first, stop=last, out=out,
        )  # fmt: skip

    def add_bias(share: Tensor) -> None:
        bias[0] = bias[0] + share.sum()

    kernel_backward(chunks, embedding, weights, grad_x_hat, grad_weight, add_bias)
    return (bias[0] * sign).to(grad_x_hat.dtype)
