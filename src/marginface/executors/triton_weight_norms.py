"""The weight rows' inverse norms in one Triton launch, read in the weight's own dtype.

:class:`~marginface.executors.chunk_workspace.ChunkWorkspace` calls :func:`inverse_norms` for a
CUDA weight whose norms its PyTorch path would take block by block (a bf16/fp16 weight into
float32, or a Partial FC sample's rows): one program per block of rows reads them (through the
sample's row index, when given), accumulates ``Σ_d w_d²`` in float32 and writes
``1 / max(‖w‖, eps)``; no converted or gathered copy of the weight is made. Importing this
module imports :mod:`triton`; the same ``TRITON_INTERPRET`` rule as the other kernels applies.
"""

# Compile-time (tl.constexpr) kernel arguments are UPPER_CASE, Triton's convention.
# ruff: noqa: N803

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

__all__ = ["NORM_ROWS", "inverse_norms"]

NORM_ROWS = 32
"""Weight rows per program of :func:`inverse_norms`."""


@triton.jit
def _inverse_norms_kernel(
    w_ptr, index_ptr, out_ptr, rows, dim, stride, EPS,
    INDEXED: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """Program ``block of rows``: ``out[r] = 1 / max(sqrt(Σ_d w[src(r), d]²), EPS)`` (float32),
    ``src(r) = index[r]`` when ``INDEXED`` else ``r``."""
    positions = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    ok = positions < rows
    source = positions.to(tl.int64)
    if INDEXED:
        source = tl.load(index_ptr + positions, mask=ok, other=0).to(tl.int64)
    total = tl.zeros((BLOCK_R,), tl.float32)
    for d0 in range(0, dim, BLOCK_D):
        dims = d0 + tl.arange(0, BLOCK_D)
        mask = ok[:, None] & (dims < dim)[None, :]
        w = tl.load(w_ptr + source[:, None] * stride + dims[None, :], mask=mask, other=0.0)
        w = w.to(tl.float32)
        total += tl.sum(w * w, axis=1)
    tl.store(out_ptr + positions, 1.0 / tl.maximum(tl.sqrt(total), EPS), mask=ok)


def inverse_norms(weight: Tensor, eps: float, index: Tensor | None = None) -> Tensor:
    """``1 / max(‖w_r‖, eps)`` of the rows of ``weight``, float32.

    Args:
        weight: ``Tensor[R, D]`` (any float dtype) with unit stride along D.
        eps: the norm's floor (:data:`~marginface.executors.dense.NORMALIZE_EPS`).
        index: ``int64[S]`` rows of ``weight`` to take (a Partial FC sample's, in order), or
            None (default): every row.

    Returns:
        ``Tensor[S]`` (``Tensor[R]`` without ``index``) float32.
    """
    if weight.dim() != 2 or weight.stride(1) != 1:
        raise ValueError(
            f"weight must be a 2-D tensor with unit stride along D, got shape "
            f"{tuple(weight.shape)} strides {weight.stride()}"
        )
    rows = weight.shape[0] if index is None else index.shape[0]
    dim = weight.shape[1]
    out = torch.empty(rows, dtype=torch.float32, device=weight.device)
    if rows:
        indexed = index is not None
        _inverse_norms_kernel[(triton.cdiv(rows, NORM_ROWS),)](
            weight, index.contiguous() if indexed else out, out, rows, dim, weight.stride(0),
            float(eps), INDEXED=indexed, BLOCK_R=NORM_ROWS,
            BLOCK_D=max(16, min(128, triton.next_power_of_2(dim))),
        )  # fmt: skip
    return out
