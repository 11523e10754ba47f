"""The chunk loop on the Triton kernels (:mod:`~marginface.executors.triton_kernels`).

Plain functions with the same contract as the PyTorch passes of
:mod:`~marginface.executors.chunk_loop`, which calls them when the call chose the Triton
kernels (:func:`~marginface.executors.backend.choose_backend`, once per call). The
kernels see only what is elementwise per logit; the non-target rule reaches them as a
:class:`~marginface.executors.triton_kernels.NonTargetRule` (:func:`kernel_rule`).
:mod:`triton` is imported only when one of these functions runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ..margins.rules import declared_rule
from ._online_softmax import empty_statistics, merge_statistics
from .chunk_workspace import ChunkWorkspace
from .kernel_options import NonTargetRule

__all__ = [
    "BACKWARDS",
    "GRADIENT_TILE_BYTES",
    "TILE_CLASS_MULTIPLE",
    "TRITON_BACKWARD",
    "WEIGHT_GRADIENT_WORKSPACE_BYTES",
    "add_parts",
    "gradient_tile_ranges",
    "kernel_backward",
    "kernel_reduce",
    "kernel_rule",
    "tile_backward",
    "triton_gradient",
    "triton_row_statistics",
    "triton_statistics",
    "weight_gradient_ranges",
]


def kernel_rule(
    kind: str, parameters: dict[str, Tensor], rows: int, device: torch.device
) -> NonTargetRule:
    """The rule ``kind`` with the margin's ``parameters``
    (:meth:`~marginface.margins.base.Margin.nontarget_kernel_parameters`) as the kernels'
    :class:`~marginface.executors.kernel_options.NonTargetRule`, as its declaration
    (:data:`~marginface.margins.rules.NONTARGET_RULES`) says: a per-row ``threshold`` and a
    per-row ``t`` (scalars, ``[N]`` or ``[N, 1]``) as float32 ``[N]`` vectors, the scalars of
    ``t`` (``[a, b]``, ``[α, σ]``, ``[m]``, ``[m, straight]``) as the float32 ``constants``
    (zero-padded to 2). ``ValueError`` naming an unknown ``kind`` and the known ones.

    No value is read back to the host (the constants stay tensors on ``device``).
    """
    declared = declared_rule(kind)

    def per_row(name: str) -> Tensor:  # (N,) float32
        value = torch.as_tensor(parameters[name], dtype=torch.float32, device=device)
        return value.reshape(-1).expand(rows).contiguous()

    constants = None
    if declared.constants:
        t = torch.as_tensor(parameters["t"], dtype=torch.float32, device=device).reshape(-1)
        constants = torch.zeros(2, dtype=torch.float32, device=device)
        constants[: t.numel()] = t  # (2,): [a, b], [α, σ], [m, 0] or [m, straight]
    return NonTargetRule(
        threshold=per_row("threshold") if declared.threshold else None,
        t=per_row("t") if declared.row_t else None,
        kind=kind,
        constants=constants,
    )


# --------------------------------------------------------------------------- the host loop
Launcher = Callable[..., Any]
"""A kernel launcher of :mod:`~marginface.executors.triton_kernels` (or of a reduction's module):
``(x_hat, weight[c·K, D], inv_norms[c·K], labels[N], *arguments, sub_centers=K, ...) ->
result``, the labels in the columns of those centers (outside: not among them); the forward's
and the ``∂x̂`` launchers take ``chunk_size=``, the ``∂W`` launcher ``start=, stop=, out=``."""


def _chunk_rows(chunks: ChunkWorkspace, start: int, stop: int) -> tuple[Tensor, Tensor]:
    """The centers of the loop's classes ``[start, stop)`` in the GEMM dtype (a sample's
    gathered) and their inverse norms, ``(Tensor[c·K, D], Tensor[c·K])``."""
    k = chunks.k
    inv_norms = chunks.inv_norms[start * k : stop * k].contiguous()  # (c·K,)
    return chunks.weight_rows(start, stop), inv_norms


def _chunk_inputs(chunks: ChunkWorkspace, start: int, stop: int) -> tuple[Tensor, Tensor, Tensor]:
    """What a launch over the loop's classes ``[start, stop)`` of a sample reads: the chunk's
    gathered centers, their inverse norms (:func:`_chunk_rows`) and the labels shifted to the
    chunk's columns."""
    return *_chunk_rows(chunks, start, stop), chunks.labels - start


def kernel_reduce(
    chunks: ChunkWorkspace,
    launcher: Launcher,
    arguments: tuple[Any, ...],
    merge: Callable[[Any, Any], Any],
) -> Any:
    """A forward reduction on the kernels: ``launcher(x_gemm, weight, inv_norms, labels,
    *arguments, sub_centers=K, chunk_size=...)`` once over every class (grid over the chunks),
    or with a Partial FC sample once per chunk on its gathered rows, the results merged in
    PyTorch in chunk order (``merge(None, first)`` starts the fold)."""

    def launch(weight: Tensor, inv_norms: Tensor, labels: Tensor, size: int) -> Any:
        return launcher(
            chunks.x_gemm, weight, inv_norms, labels, *arguments,
            sub_centers=chunks.k, chunk_size=size,
        )  # fmt: skip

    if chunks.sample is None:
        return launch(chunks.weight, chunks.inv_norms, chunks.labels, chunks.chunk_size)

    def step(start: int, stop: int, total: Any) -> Any:
        return merge(total, launch(*_chunk_inputs(chunks, start, stop), stop - start))

    return chunks.fold(step, None)


WEIGHT_GRADIENT_WORKSPACE_BYTES = 64 * 2**20
"""Bound on the float32 partial ``∂W`` one weight-gradient launch writes (without a Partial FC
sample): the launch covers as many whole chunks as fit (at least one). At N = D = 512, bf16,
C = 1M the default chunk (5461 classes) gives one launch of 86 programs per chunk, fewer than
an H200's 132 multiprocessors; five chunks per launch give 427."""


def weight_gradient_ranges(chunks: ChunkWorkspace, dim: int) -> list[tuple[int, int]]:
    """The loop's classes ``[start, stop)`` per weight-gradient launch without a sample: ``G``
    whole chunks each, ``G·chunk_size·K·D·4 <=`` :data:`WEIGHT_GRADIENT_WORKSPACE_BYTES`
    (``G >= 1``), the last one shorter."""
    per_chunk = chunks.chunk_size * chunks.k * dim * 4
    return chunks.ranges(max(1, WEIGHT_GRADIENT_WORKSPACE_BYTES // per_chunk) * chunks.chunk_size)


BACKWARDS = ("tiles", "fused")
"""How a backward runs on the kernels: ``"tiles"`` (:func:`tile_backward`: a kernel writes each
class tile's ``∂L/∂(x̂·w)``, the GEMM library multiplies it into ``∂x̂`` and ``∂W``) or
``"fused"`` (the ``∂x̂`` and ``∂W`` kernels of :mod:`~marginface.executors.triton_kernels`, which
multiply on chip and accumulate their outputs in float32 buffers)."""

TRITON_BACKWARD = "tiles"
"""The backward of :func:`kernel_backward`, one of :data:`BACKWARDS` (a module setting, read at
each backward; the benchmarks set it to time one against the other)."""

GRADIENT_TILE_BYTES = 256 * 2**20
"""Bound on the workspace of one class tile of :func:`tile_backward` without a Partial FC
sample: ``G`` (``N·c·K`` elements of the GEMM dtype) and the weight gradient's float32
product ``P`` (``c·K·D`` floats). At N = D = 512, bf16, K = 1: 87,360 classes a tile, 12 tiles
at C = 1M. Each tile costs the host a fixed share of launches: 128 MiB tiles were 1.3x slower
on an H200; 512 MiB ones were 1.19x faster in one run and as fast in another, for twice the
workspace (docs/benchmarks.md, "On an NVIDIA H200")."""


TILE_CLASS_MULTIPLE = 64
"""A class tile's width is a multiple of this many classes (the last tile excepted), and its
``G`` rows are padded to a multiple of 8 elements: leading dimensions the GEMM library's
vectorized kernels take."""


def gradient_tile_ranges(chunks: ChunkWorkspace, dim: int) -> list[tuple[int, int]]:
    """The loop's classes ``[start, stop)`` per class tile of :func:`tile_backward` without a
    sample: the most classes, a multiple of :data:`TILE_CLASS_MULTIPLE` (at least one such
    multiple), with ``c·K·(N·itemsize + 4·D) <=`` :data:`GRADIENT_TILE_BYTES`; the last tile
    shorter."""
    rows, itemsize = chunks.x_gemm.shape[0], chunks.x_gemm.element_size()
    per_class = chunks.k * (rows * itemsize + 4 * dim)
    multiple = TILE_CLASS_MULTIPLE
    return chunks.ranges(max(multiple, GRADIENT_TILE_BYTES // per_class // multiple * multiple))


def tile_backward(
    chunks: ChunkWorkspace,
    launcher: Launcher,
    arguments: tuple[Any, ...],
    grad_x_hat: Tensor,
    grad_weight: Tensor | None,
    add_row_share: Callable[[Tensor], None] | None,
) -> None:
    """A backward pass as gradient tiles and GEMMs (:mod:`~.triton_gradient_tiles`), per class
    tile (the class ranges of :func:`gradient_tile_ranges`; with a Partial FC sample, each
    chunk on its gathered rows): ``G, share = launcher(x_gemm, W_tile, r_tile, labels,
    *arguments, sub_centers=K, out=..., label_offset=start, share=...)`` (``G``:
    ``Tensor[N, c·K]``, the GEMM dtype; the labels unshifted, the tile's first class
    subtracted in the kernel), ``share`` handed to ``add_row_share`` (not summed when that is
    None), ``∂L/∂x̂ += G·W_tile`` (accumulated over the tiles in float32 by one GEMM each, added
    to ``grad_x_hat`` once) and ``∂L/∂W_tile`` from ``P = Gᵀ·x̂`` through the Jacobian of
    ``w/‖w‖`` into the tile's rows of ``grad_weight`` (if given)
    (:func:`~.triton_gradient_tiles.add_float32_product`, ``float32_product``)."""
    from .triton_gradient_tiles import (
        add_float32_product,
        float32_product,
        project_weight_gradient,
    )

    x_gemm, k = chunks.x_gemm, chunks.k
    # float32 products add into a float32 ∂x̂ in place; the others through a float32 total
    in_place = x_gemm.dtype == grad_x_hat.dtype == torch.float32
    total: list[Tensor | None] = [grad_x_hat if in_place else None]

    def step(start: int, stop: int, state: None) -> None:
        weight, inv_norms = _chunk_rows(chunks, start, stop)  # (c·K, D), (c·K,)
        width = weight.shape[0]  # c·K; G's rows padded to a multiple of 8 elements
        padded = -(-width // 8) * 8
        out = chunks.scratch(x_gemm.shape[0], padded, x_gemm.dtype, "tile")[:, :width]
        tile, share = launcher(
            x_gemm, weight, inv_norms, chunks.labels, *arguments, sub_centers=k, out=out,
            label_offset=start, share=add_row_share is not None,
        )  # fmt: skip
        if add_row_share is not None:
            add_row_share(share)
        total[0] = add_float32_product(total[0], tile, weight)
        if grad_weight is None:
            return
        partial = float32_product(tile.t(), x_gemm)  # (c·K, D) float32
        rows = chunks.gradient_rows(grad_weight, start, stop)  # (c·K, D)
        raw = chunks.raw_rows(start, stop)
        if not (rows.is_contiguous() and raw.is_contiguous()):
            chunks.project_into(grad_weight, start, stop, partial)
            return
        project_weight_gradient(partial, raw, inv_norms, rows)
        if chunks.sample is not None:  # each sampled row is written by exactly one chunk
            grad_weight.index_copy_(0, chunks.weight_index(start, stop), rows)

    if chunks.sample is not None:
        chunks.fold(step, None)
    else:
        dim = chunks.x_gemm.shape[1]
        for start, stop in gradient_tile_ranges(chunks, dim):
            step(start, stop, None)
        chunks.release()
    if total[0] is not None and total[0] is not grad_x_hat:
        grad_x_hat.add_(total[0].to(grad_x_hat.dtype))


def kernel_backward(
    chunks: ChunkWorkspace,
    launchers: tuple[Launcher, Launcher, Launcher],
    arguments: tuple[Any, ...],
    grad_x_hat: Tensor,
    grad_weight: Tensor | None,
    add_row_share: Callable[[Tensor], None] | None,
) -> None:
    """A backward pass on the kernels, ``launchers = (embedding, weight_gradient, tile)``
    called with ``(x_gemm, weight, inv_norms, labels, *arguments, sub_centers=K, ...)``: by
    :data:`TRITON_BACKWARD`, :func:`tile_backward` with ``tile``, or the fused kernels:
    ``embedding``'s ``(∂L/∂x̂ part [N, D], a per-row share [N])`` added into ``grad_x_hat``
    and handed to ``add_row_share`` (the softmax's ``∂L/∂s``, the one-vs-all's bias terms),
    and ``weight_gradient``'s float32 partial for the classes ``[start, stop)`` of those
    centers (written into ``out`` if given), projected through ``w/‖w‖`` into every row of
    ``grad_weight`` (if given). Fused, without a sample: one embedding launch over every
    class, then the weight gradient in launches of whole chunks
    (:func:`weight_gradient_ranges`), in place where ``grad_weight`` is contiguous float32;
    with one, per chunk: its rows gathered once, both kernels on them."""
    embedding, weight_gradient, tile = launchers
    if TRITON_BACKWARD not in BACKWARDS:
        raise ValueError(f"TRITON_BACKWARD must be one of {BACKWARDS}, got {TRITON_BACKWARD!r}")
    if TRITON_BACKWARD == "tiles":
        tile_backward(chunks, tile, arguments, grad_x_hat, grad_weight, add_row_share)
        return
    x_gemm, k = chunks.x_gemm, chunks.k
    sampled = chunks.sample is not None

    def add_embedding(weight: Tensor, inv_norms: Tensor, labels: Tensor, size: int) -> None:
        part_x, share = embedding(
            x_gemm, weight, inv_norms, labels, *arguments, sub_centers=k, chunk_size=size
        )
        grad_x_hat.add_(part_x.to(grad_x_hat.dtype))
        if add_row_share is not None:
            add_row_share(share)

    if not sampled:
        add_embedding(chunks.weight, chunks.inv_norms, chunks.labels, chunks.chunk_size)
        if grad_weight is None:
            return

    def step(start: int, stop: int, state: None) -> None:
        if sampled:
            weight, inv_norms, labels = _chunk_inputs(chunks, start, stop)
            add_embedding(weight, inv_norms, labels, stop - start)
            first, last = 0, stop - start
        else:
            weight, inv_norms, labels = chunks.weight, chunks.inv_norms, chunks.labels
            first, last = start, stop
        if grad_weight is None:
            return
        rows = chunks.gradient_rows(grad_weight, start, stop)  # (c·K, D)
        in_place = rows.dtype == torch.float32 and rows.is_contiguous()
        partial = weight_gradient(
            x_gemm, weight, inv_norms, labels, *arguments,
            sub_centers=k, start=first, stop=last, out=rows if in_place else None,
        )  # fmt: skip
        chunks.project_into(grad_weight, start, stop, partial)

    if sampled:
        chunks.fold(step, None)
        return
    for start, stop in weight_gradient_ranges(chunks, grad_weight.shape[1]):
        step(start, stop, None)
    chunks.release()


# --------------------------------------------------------------------------- softmax passes
def triton_statistics(
    chunks: ChunkWorkspace, scale_rows: Tensor, rule: Any
) -> tuple[Tensor, Tensor]:
    """Merged ``(max, Σexp)`` of the non-target logits over every chunk, ``Tensor[N]`` each
    (the kernels' :func:`~marginface.executors.triton_kernels.nontarget_statistics`)."""
    from .triton_kernels import nontarget_statistics

    def merge(total: Any, part: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        if total is None:
            n = chunks.x_hat.shape[0]
            total = empty_statistics(n, dtype=torch.float32, device=scale_rows.device)
        return merge_statistics(total, part)

    return kernel_reduce(chunks, nontarget_statistics, (scale_rows.contiguous(), rule), merge)


def add_parts(total: Tensor | None, part: Tensor) -> Tensor:
    """``merge`` of :func:`kernel_reduce` for partial sums: ``part`` added to ``total``."""
    return part if total is None else total + part


def triton_row_statistics(chunks: ChunkWorkspace, kind: str, threshold: Tensor) -> Tensor:
    """A margin's declared per-row statistics ``kind`` (one of
    :data:`~marginface.margins.base.ROW_STATISTICS_KERNELS`) over every non-target class of
    ``chunks`` (every sampled one) by the kernel of
    :mod:`~marginface.executors.triton_row_statistics`: ``Tensor[k, N]`` float32, as
    :func:`~marginface.executors.chunk_loop.row_statistics` gives. ``threshold``: the rule's
    per-row ``τ`` (``Tensor[N]``)."""
    from .triton_row_statistics import above_threshold_sums

    if kind != "above_threshold":
        raise ValueError(f"kind must be 'above_threshold', got {kind!r}")
    with torch.no_grad():
        threshold = threshold.reshape(-1).to(torch.float32).contiguous()  # (N,)
        return kernel_reduce(chunks, above_threshold_sums, (threshold,), add_parts)


def triton_gradient(
    chunks: ChunkWorkspace,
    arguments: tuple[Tensor, Any, Tensor, Tensor],
    grad_x_hat: Tensor,
    grad_weight: Tensor | None,
    grad_scale: Tensor | None,
) -> None:
    """The backward's pass over the chunks by the kernels: add the non-target part of
    ``∂L/∂x̂`` (and of ``∂L/∂s`` into ``grad_scale``), write every row of ``grad_weight``
    (see :func:`~marginface.executors.chunk_loop.nontarget_gradient`). ``arguments``: the
    softmax launchers' ``(scale, rule, lse, grad)`` (``Tensor[N]`` each but the
    :class:`~marginface.executors.kernel_options.NonTargetRule`)."""
    from .triton_gradient_tiles import gradient_tile
    from .triton_kernels import embedding_gradient, weight_gradient

    def add_scale(share: Tensor) -> None:
        assert grad_scale is not None
        grad_scale.add_(share.to(grad_scale.dtype))

    scale, rule, lse, grad = arguments
    rows = (scale.contiguous(), rule, lse.contiguous(), grad.contiguous())
    launchers = (embedding_gradient, weight_gradient, gradient_tile)
    share = None if grad_scale is None else add_scale  # without ∂L/∂s the share is not summed
    kernel_backward(chunks, launchers, rows, grad_x_hat, grad_weight, share)
