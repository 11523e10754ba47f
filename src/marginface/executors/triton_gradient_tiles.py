"""The backward as gradient tiles and GEMMs: a Triton kernel writes ``∂L/∂(x̂·w)``, cuBLAS
multiplies.

Importing this module imports :mod:`triton` (and :mod:`~marginface.executors.triton_kernels`,
whose device functions it shares); :mod:`~marginface.executors.triton_dispatch` imports it only
when a backward runs on the kernels. The same ``TRITON_INTERPRET`` rule applies.

Per class tile of the loop, with ``G_{i,jk} = ∂L/∂(x̂_i·w_jk) = r_jk·[k = k*_ij]·∂L/∂c_ij``
(``k*`` the winning sub-center; 0 on the target column):

* :func:`kernel_gradient_tile` recomputes the tile's cosines on chip (the forward's
  ``tl.dot``), applies the reduction's gradient step (:func:`~.triton_rules._gradient_step`:
  the softmax's ``γ_i p_ij s_i g_i'(c_ij)``, the one-vs-all's ``γ_i w_- σ(z_ij) ∂z/∂c``) and
  writes ``G`` (``Tensor[N, c·K]`` in the GEMM dtype: the same rounding the fused kernels apply
  before their products) and the rows' share;
* two GEMMs, float32 accumulation (:func:`float32_product`):
  ``∂L/∂x̂ += G·W_tile`` and ``P = Gᵀ·x̂`` (``Tensor[c·K, D]`` float32);
* :func:`project_weight_gradient` writes ``∂L/∂w_j = P_j - r_j²(w_j·P_j)·w_j`` (the Jacobian of
  ``w/‖w‖``) into the weight gradient's rows in one pass.

The products run on the GEMM library at its tile sizes rather than on small Triton tiles that
accumulate their output in global memory (:mod:`~.triton_kernels`' ``∂x̂`` and ``∂W``
kernels); the price is ``G`` written once and read twice (``N·c·K`` elements of the GEMM dtype
per class tile) and ``P`` (float32) once.
"""

# Compile-time (tl.constexpr) kernel arguments are UPPER_CASE, Triton's convention.
# ruff: noqa: N803

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl
from torch import Tensor

from .dense import NORMALIZE_EPS
from .kernel_options import Blocks, NonTargetRule, RowInputs, launch_blocks
from .triton_kernels import (
    _check,
    _launch_options,
    _row_gradient_inputs,
    _row_inputs,
    _softmax_inputs,
    _sub_center_gradient,
    _tile_gradient,
)

__all__ = [
    "PROJECTION_ROWS",
    "PROJECTION_WIDTH",
    "add_float32_product",
    "float32_product",
    "gradient_tile",
    "kernel_gradient_tile",
    "project_weight_gradient",
]

PROJECTION_ROWS = 16
"""Weight rows per program of :func:`project_weight_gradient`."""

PROJECTION_WIDTH = 1024
"""The longest row (``D``, rounded up to a power of two) :func:`project_weight_gradient` reads
once; a longer one is read twice, 128 elements at a time."""


@triton.jit
def _gradient_tile_kernel(
    x_ptr, w_ptr, inv_norm_ptr, label_ptr, scale_ptr, threshold_ptr, t_ptr, const_ptr, lse_ptr,
    grad_ptr, g_ptr, share_ptr, rows_total, classes, dim, stride_x, stride_w, stride_g,
    label_offset, SCALE, POWER, OFFSET, LIMIT,
    REDUCTION: tl.constexpr, RULE: tl.constexpr, CLAMP: tl.constexpr, ST: tl.constexpr,
    K: tl.constexpr, PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """Program ``(row block, class block)``: its tile of ``G`` (every sub-center's column,
    ``g[i, j·K + k]``, in ``g_ptr``'s dtype) and its rows' share of the gradient step into
    ``share[class block, rows]`` (float32). Row ``i``'s target is column
    ``label[i] - label_offset`` (none where that is outside the tile's classes)."""
    pid_c = tl.program_id(1)
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < rows_total
    cols = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = cols < classes
    label, scale, threshold, t, p0, p1 = _row_inputs(
        label_ptr, scale_ptr, threshold_ptr, t_ptr, const_ptr, rows, row_ok, REDUCTION, RULE
    )
    label = label - label_offset
    lse, grad = _row_gradient_inputs(lse_ptr, grad_ptr, rows, row_ok, REDUCTION)
    grad_cos, share, best = _tile_gradient(
        x_ptr, w_ptr, inv_norm_ptr, rows, cols, row_ok, col_ok, label, scale, threshold, t,
        p0, p1, lse, grad, dim, stride_x, stride_w, SCALE, POWER, OFFSET, LIMIT,
        REDUCTION, RULE, CLAMP, ST, K, PRECISION, DOT_UPCAST, BLOCK_N, BLOCK_C, BLOCK_D,
    )  # fmt: skip
    ok = row_ok[:, None] & col_ok[None, :]
    for k in tl.static_range(K):
        centers, grad_dot = _sub_center_gradient(grad_cos, best, cols, col_ok, inv_norm_ptr, k, K)
        out = g_ptr + rows[:, None].to(tl.int64) * stride_g + centers[None, :]
        tl.store(out, grad_dot.to(g_ptr.dtype.element_ty), mask=ok)
    tl.store(share_ptr + pid_c.to(tl.int64) * rows_total + rows, share, mask=row_ok)


@triton.jit
def _project_kernel(
    partial_ptr, w_ptr, inv_norm_ptr, out_ptr, rows_total, dim, INSIDE,
    BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """Program ``block of weight rows``: ``out = P - c·w`` with ``c = r²(w·P)`` where
    ``r < INSIDE`` (else 0), float32 arithmetic, stored in ``out_ptr``'s dtype (which may be
    ``partial_ptr``: each element is read before it is written). A row that fits one block
    (``BLOCK_D >= dim``) is read once; a longer one twice (the dot product, then the update)."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < rows_total
    base = rows[:, None].to(tl.int64) * dim
    r = tl.load(inv_norm_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)
    if dim <= BLOCK_D:
        dims = tl.arange(0, BLOCK_D)
        ok = row_ok[:, None] & (dims < dim)[None, :]
        p = tl.load(partial_ptr + base + dims[None, :], mask=ok, other=0.0)
        w = tl.load(w_ptr + base + dims[None, :], mask=ok, other=0.0).to(tl.float32)
        coefficient = tl.where(r < INSIDE, tl.sum(p * w, axis=1) * r * r, 0.0)
        value = p - coefficient[:, None] * w
        tl.store(out_ptr + base + dims[None, :], value.to(out_ptr.dtype.element_ty), mask=ok)
    else:
        dot = tl.zeros((BLOCK_R,), tl.float32)
        for d0 in range(0, dim, BLOCK_D):
            dims = d0 + tl.arange(0, BLOCK_D)
            ok = row_ok[:, None] & (dims < dim)[None, :]
            p = tl.load(partial_ptr + base + dims[None, :], mask=ok, other=0.0)
            w = tl.load(w_ptr + base + dims[None, :], mask=ok, other=0.0).to(tl.float32)
            dot += tl.sum(p * w, axis=1)
        coefficient = tl.where(r < INSIDE, dot * r * r, 0.0)
        for d0 in range(0, dim, BLOCK_D):
            dims = d0 + tl.arange(0, BLOCK_D)
            ok = row_ok[:, None] & (dims < dim)[None, :]
            p = tl.load(partial_ptr + base + dims[None, :], mask=ok, other=0.0)
            w = tl.load(w_ptr + base + dims[None, :], mask=ok, other=0.0).to(tl.float32)
            value = p - coefficient[:, None] * w
            tl.store(out_ptr + base + dims[None, :], value.to(out_ptr.dtype.element_ty), mask=ok)


def kernel_gradient_tile(
    x_hat: Tensor, weight: Tensor, inv_norms: Tensor, labels: Tensor, inputs: RowInputs,
    lse: Tensor, grad: Tensor, *, sub_centers: int, out: Tensor | None = None,
    blocks: Blocks | None = None, label_offset: int = 0, share: bool = True,
) -> tuple[Tensor, Tensor | None]:  # fmt: skip
    """``G = ∂L/∂(x̂·wᵀ)`` of the non-target entries over every center of ``weight``
    (``Tensor[N, C·K]`` in ``x_hat``'s dtype, 0 on each row's target class and on the sub-centers
    that did not win) and the rows' share of the gradient step (``Tensor[N]`` float32: the
    softmax's ``∂L/∂s``, the one-vs-all's bias terms; None when ``share`` is False: not summed).
    One program per (block of rows, block of classes). ``out``: a ``Tensor[N, C·K]`` of
    ``x_hat``'s dtype with unit stride along its columns (its rows may be padded) to write ``G``
    into (default a new one). ``label_offset``: the class of ``weight``'s first row, subtracted
    from the labels in the kernel (a class tile of a larger weight, without a shifted copy of
    the labels). Other arguments as
    :func:`~marginface.executors.triton_kernels.kernel_embedding_gradient`."""
    _check(x_hat, weight, sub_centers)
    n, dim = x_hat.shape
    centers = weight.shape[0]
    classes = centers // sub_centers
    if out is None:
        out = torch.empty(n, centers, dtype=x_hat.dtype, device=x_hat.device)
    elif out.dtype != x_hat.dtype or out.shape != (n, centers) or out.stride(1) != 1:
        raise ValueError(
            f"out must be a {x_hat.dtype} tensor of shape ({n}, {centers}) with unit stride "
            f"along its columns, got {out.dtype} {tuple(out.shape)} strides {out.stride()}"
        )
    if blocks is None:
        kernel = "gradient_tile" if inputs.reduction == "softmax" else "binary_gradient_tile"
        blocks = launch_blocks(
            kernel, x_hat, n, classes, dim, rule=inputs.rule, sub_centers=sub_centers
        )
    tiles = triton.cdiv(classes, blocks.c)
    shares = torch.empty(tiles, n, dtype=torch.float32, device=x_hat.device)
    _gradient_tile_kernel[(triton.cdiv(n, blocks.n), tiles)](
        x_hat, weight, inv_norms, labels, *inputs.pointers(grad), lse, grad, out, shares,
        n, classes, dim, x_hat.stride(0), weight.stride(0), out.stride(0), label_offset,
        **inputs.arguments(), **_launch_options(x_hat.dtype, sub_centers, blocks),
    )  # fmt: skip
    return out, shares.sum(dim=0) if share else None


def gradient_tile(
    x_hat: Tensor, weight: Tensor, inv_norms: Tensor, labels: Tensor, scale: Tensor,
    rule: NonTargetRule, lse: Tensor, grad: Tensor, *, sub_centers: int,
    out: Tensor | None = None, blocks: Blocks | None = None, label_offset: int = 0,
    share: bool = True,
) -> tuple[Tensor, Tensor | None]:  # fmt: skip
    """The softmax's gradient tile:

    .. math:: G_{i,jk} = [j \\ne y_i]\\,[k = k^*_{ij}]\\; r_{jk}\\,
              \\gamma_i\\, p_{ij}\\, s_i\\, g_i'(c_{ij}),\\qquad
              \\text{share}_i = \\sum_{j\\ne y_i} \\gamma_i p_{ij} g_i(c_{ij})

    with ``p_ij = exp(s_i g_i(c_ij) - LSE_i)``. Arguments as
    :func:`~marginface.executors.triton_kernels.embedding_gradient` (``lse``, ``grad``:
    ``Tensor[N]`` float32). Returns ``(G, share)`` as :func:`kernel_gradient_tile`."""
    labels, inputs = _softmax_inputs(labels, scale, rule)
    return kernel_gradient_tile(
        x_hat, weight, inv_norms, labels, inputs, lse, grad, sub_centers=sub_centers, out=out,
        blocks=blocks, label_offset=label_offset, share=share,
    )  # fmt: skip


def project_weight_gradient(
    partial: Tensor, weight_rows: Tensor, inv_norms: Tensor, out: Tensor
) -> Tensor:
    """``∂L/∂w`` from ``P = r·Σ_i G_ij x̂_i`` through the Jacobian of ``w/‖w‖``:

    .. math:: \\frac{\\partial L}{\\partial w_j} = P_j - r_j^2 (w_j\\cdot P_j)\\, w_j

    (``P_j`` unchanged where ``r_j >= 1/eps``, i.e. ``‖w_j‖ <= eps``, where normalization is a
    plain scaling), float32 arithmetic, one pass over the rows.

    Args:
        partial: ``Tensor[R, D]`` float32, contiguous.
        weight_rows: ``Tensor[R, D]`` the raw rows ``w_j``, any float dtype, contiguous.
        inv_norms: ``Tensor[R]`` ``r_j``.
        out: ``Tensor[R, D]`` contiguous, any float dtype (the weight gradient's rows; may be
            ``partial`` itself).

    Returns:
        ``out``.
    """
    rows, dim = partial.shape
    for name, value in (("partial", partial), ("weight_rows", weight_rows), ("out", out)):
        if value.shape != (rows, dim) or not value.is_contiguous():
            raise ValueError(f"{name} must be a contiguous tensor of shape ({rows}, {dim})")
    if partial.dtype != torch.float32:
        raise TypeError(f"partial must be float32, got {partial.dtype}")
    if rows:
        # a row of up to PROJECTION_WIDTH elements in one block (read once), else 128 at a time
        width = triton.next_power_of_2(dim)
        block_d = max(16, width if width <= PROJECTION_WIDTH else 128)
        _project_kernel[(triton.cdiv(rows, PROJECTION_ROWS),)](
            partial, weight_rows, inv_norms.contiguous(), out, rows, dim, 1.0 / NORMALIZE_EPS,
            BLOCK_R=PROJECTION_ROWS, BLOCK_D=block_d, num_warps=8,
        )  # fmt: skip
    return out


def add_float32_product(total: Tensor | None, a: Tensor, b: Tensor) -> Tensor:
    """``total + a @ b`` in float32 (``total``: ``Tensor[M, P]`` float32, or None: ``a @ b``),
    one GEMM with the addition in its epilogue: float32 inputs add into ``total`` in place;
    bf16/fp16 on CUDA take the mixed product (``torch.addmm(..., out_dtype=torch.float32)``,
    a new tensor); elsewhere the inputs are upcast (exact) and added in place. Returns the
    sum (``total`` itself, or the new tensor)."""
    if total is None:
        return float32_product(a, b)
    if a.dtype == torch.float32 and b.dtype == torch.float32:
        return total.addmm_(a, b)
    if a.is_cuda and a.dtype == b.dtype:
        added = _mixed("addmm", lambda: torch.addmm(total, a, b, out_dtype=torch.float32))
        if added is not None:
            return added
    return total.addmm_(a.to(torch.float32), b.to(torch.float32))


def float32_product(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b`` accumulated and returned in float32 (``Tensor[M, K] @ Tensor[K, P]``).

    float32 inputs: ``torch.mm``. bf16/fp16 on CUDA: the GEMM library's mixed product
    (``torch.mm(..., out_dtype=torch.float32)``: half inputs, float32 accumulation and output);
    elsewhere, or where that is missing, the inputs upcast (exact: a product of two half
    numbers is exact in float32)."""
    if a.dtype == torch.float32 and b.dtype == torch.float32:
        return torch.mm(a, b)
    if a.is_cuda and a.dtype == b.dtype:
        product = _mixed("mm", lambda: torch.mm(a, b, out_dtype=torch.float32))
        if product is not None:
            return product
    return torch.mm(a.to(torch.float32), b.to(torch.float32))


_MIXED_MISSING: set[str] = set()  # the mixed-precision GEMMs this torch lacks (found at first use)


def _mixed(name: str, gemm: Callable[[], Tensor]) -> Tensor | None:
    """``gemm()`` (a GEMM ``name`` with ``out_dtype=torch.float32``), or None where this torch
    lacks it (remembered: not tried again)."""
    if name in _MIXED_MISSING:
        return None
    try:
        return gemm()
    except (RuntimeError, TypeError, NotImplementedError):
        _MIXED_MISSING.add(name)
        return None
