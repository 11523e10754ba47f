"""The chunked executor's prologue: what a call decides once, before any chunk is visited.

* the chunk size (:func:`default_chunk_size`, a bound on the workspace's bytes),
* the GEMM dtype (:func:`gemm_dtype`) and whether the scale may ride in the GEMM
  (:func:`scale_in_gemm`),
* the constants of the choice of who runs the per-chunk work (:data:`KERNELS`,
  :data:`KERNELS_ENV`, :data:`TRITON_DTYPES`; the choice itself, once per call, is
  :func:`~marginface.executors.backend.choose_backend`),
* the normalized embeddings ``x̂ = x/‖x‖`` and the per-row scale ``s_i``
  (:func:`scale_per_row`),
* the checks of the arguments that only the chunked executor takes.

Nothing here loops over chunks; :mod:`~marginface.executors.chunk_loop` does.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .._validation import check_int
from ..margins.base import NONTARGET_KERNELS, Margin
from .dense import NORMALIZE_EPS, compute_dtype, row_norms

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "HALF_DTYPES",
    "KERNELS",
    "KERNELS_ENV",
    "MIN_DEFAULT_CHUNK",
    "TRITON_DTYPES",
    "check_chunk_arguments",
    "check_chunkable",
    "check_sampled_classes",
    "chunk_size_for",
    "default_chunk_size",
    "gemm_dtype",
    "nontarget_kernel_of",
    "normalized_with_norms",
    "scale_in_gemm",
    "scale_per_row",
]

DEFAULT_CHUNK_BYTES = 1 << 24
"""Bytes of the chunk workspace (``N·chunk_size·K`` logits in float32, plus their bf16/fp16
copy when the GEMM runs in half precision, plus a Partial FC sample's gathered rows and their
gradient, ``2·chunk_size·K×D``) when ``chunk_size`` is not given: 16 MiB, i.e. 8192 classes
per chunk at N = 512, K = 1 in float32, 5461 with a bf16 weight (:func:`default_chunk_size`).
Bounding the chunk's bytes rather than its classes keeps the executor's extra memory flat as N
grows; the choice of 16 MiB is measured in docs/benchmarks.md."""

MIN_DEFAULT_CHUNK = 64
"""The smallest chunk :func:`default_chunk_size` picks (so a float32 chunk of ``N·K > 65536``
rows exceeds the 16 MiB)."""

HALF_DTYPES = (torch.bfloat16, torch.float16)

KERNELS = ("auto", "torch", "triton")
"""Who runs the per-chunk work: ``"torch"`` (PyTorch ops, any device, the reference),
``"triton"`` (:mod:`~marginface.executors.triton_kernels`; on CPU tensors only under Triton's
interpreter), ``"auto"`` (Triton for CUDA tensors when triton imports and the case is supported,
else PyTorch)."""

KERNELS_ENV = "MARGINFACE_KERNELS"
"""Environment variable read once at the entry of each call that is not given ``kernels``: one
of :data:`KERNELS`; unset (or empty) means ``"auto"``."""

TRITON_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
"""GEMM dtypes the Triton kernels run in (float64 runs on PyTorch)."""


def default_chunk_size(
    rows: int, sub_centers: int = 1, bytes_per_logit: int = 4, bytes_per_center: int = 0
) -> int:
    """Classes per chunk when ``chunk_size`` is None:
    ``DEFAULT_CHUNK_BYTES // (K·(N·bytes_per_logit + bytes_per_center))``, at least
    :data:`MIN_DEFAULT_CHUNK`. ``bytes_per_logit``: 4 in float32, 6 with a bf16/fp16 GEMM (its
    output plus the float32 copy), 8 in float64. ``bytes_per_center``: what the chunk holds per
    weight row besides its logits: 0 when it reads the weight in place, ``2·D·itemsize`` for a
    Partial FC sample (the gathered rows and their gradient). Float32, K = 1: 8192 classes for
    N = 512, 1024 for N = 4096; with a sample of a D = 512 weight, 2730 at N = 512."""
    per_class = sub_centers * (rows * bytes_per_logit + bytes_per_center)
    return max(MIN_DEFAULT_CHUNK, DEFAULT_CHUNK_BYTES // max(1, per_class))


def chunk_size_for(
    x: Tensor, weight: Tensor, sub_centers: int, sample: Tensor | None, chunk_size: int | None
) -> int:
    """``chunk_size`` if given, else :func:`default_chunk_size` for ``x`` (``Tensor[N, D]`` in
    the compute dtype; ``N`` the global batch's when sharded), the GEMM dtype and, for a
    Partial FC ``sample``, the chunk's gathered rows."""
    if chunk_size is not None:
        return chunk_size
    gemm = gemm_dtype(x, weight)
    per_logit = x.dtype.itemsize + (gemm.itemsize if gemm != x.dtype else 0)
    per_center = 0 if sample is None else 2 * weight.shape[1] * weight.dtype.itemsize
    return default_chunk_size(x.shape[0], sub_centers, per_logit, per_center)


TRITON_NONTARGET_KERNELS = NONTARGET_KERNELS
"""The non-target rules of :data:`~marginface.margins.base.NONTARGET_KERNELS` that the Triton
kernels have: all of them (:class:`~marginface.executors.kernel_options.NonTargetRule`). A
margin that declares none (``nontarget_kernel()`` is None) has no Triton path."""


def nontarget_kernel_of(margin: Margin) -> str | None:
    """``margin``'s declared :meth:`~marginface.margins.base.Margin.nontarget_kernel`: one of
    :data:`~marginface.margins.base.NONTARGET_KERNELS` or None; ``ValueError`` naming the
    margin and the value for anything else."""
    kind = margin.nontarget_kernel()
    if kind is not None and kind not in NONTARGET_KERNELS:
        raise ValueError(
            f"margin {type(margin).__name__}'s nontarget_kernel() must be one of "
            f"{NONTARGET_KERNELS} or None, got {kind!r}"
        )
    return kind


def gemm_dtype(embeddings: Tensor, weight: Tensor) -> torch.dtype:
    """The dtype of the chunk GEMMs: the weight's half dtype (bf16/fp16) when the weight is in
    half precision and nothing is float64, else :func:`~marginface.executors.compute_dtype`.

    The log-sum-exp, the margin and the normalizations always run in float32 (or float64).
    """
    accumulate = compute_dtype(embeddings, weight)
    if weight.dtype in HALF_DTYPES and accumulate == torch.float32:
        return weight.dtype
    return accumulate


def scale_in_gemm(gemm: torch.dtype) -> bool:
    """Whether the scale may ride in the chunk GEMM, ``(s·x̂) @ W_chunkᵀ`` (one ``N×c`` multiply
    fewer): not when the GEMM runs in float16. Its raw products ``s·x̂·w_j`` reach ``s·‖w_j‖``
    and float16's largest finite value is 65504, so any center of norm above ``65504/s`` (1023
    at s = 64) would overflow to inf although every logit is within ``±s``. Float16 GEMMs
    multiply ``x̂ @ W_chunkᵀ`` (finite up to norms of 65504) and scale the float32 cosines.
    bf16 has float32's exponent range."""
    return gemm != torch.float16


def check_chunkable(margin: Margin) -> None:
    """Raise ``TypeError`` if ``margin`` is not a :class:`~marginface.margins.Margin`, and
    ``ValueError`` if it cannot run on the chunked executor
    (:meth:`~marginface.margins.base.Margin.runs_chunked` is False: it overrides
    :meth:`~marginface.margins.base.Margin.apply` or ``forward``, which need the whole cosine
    matrix)."""
    if not isinstance(margin, Margin):
        raise TypeError(f"margin must be a marginface Margin, got {type(margin).__name__}")
    if not margin.runs_chunked():
        overridden = [
            name
            for name in ("apply", "forward")
            if getattr(type(margin), name) is not getattr(Margin, name)
        ]
        which = overridden[0] if overridden else "runs_chunked"
        raise ValueError(
            f"margin {type(margin).__name__} overrides Margin.{which}() and cannot run on the "
            "chunked executor, which only sees the hooks prepare/target_cosine/"
            "nontarget_cosine; use impl='dense'"
        )


def check_sampled_classes(sampled_classes: Any, weight: Tensor) -> Tensor | None:
    """``sampled_classes`` as given if it is None or a 1-D int64 tensor on ``weight``'s device;
    raise ``TypeError``/``ValueError`` naming it otherwise. (Its values, sorted distinct classes
    of ``weight``, are not checked: that would cost a host synchronization per step.)"""
    if sampled_classes is None:
        return None
    if not isinstance(sampled_classes, Tensor) or sampled_classes.dtype != torch.int64:
        kind = (
            f"a tensor of dtype {sampled_classes.dtype}"
            if isinstance(sampled_classes, Tensor)
            else type(sampled_classes).__name__
        )
        raise TypeError(f"sampled_classes must be an int64 tensor, got {kind}")
    if sampled_classes.dim() != 1:
        raise ValueError(
            f"sampled_classes must have shape (S,), got {tuple(sampled_classes.shape)}"
        )
    if sampled_classes.device != weight.device:
        raise ValueError(
            f"sampled_classes must be on the weight's device {weight.device}, "
            f"got {sampled_classes.device}"
        )
    return sampled_classes


def check_chunk_arguments(
    weight: Tensor, sub_centers: Any, chunk_size: Any, sampled_classes: Any
) -> tuple[int, int | None, Tensor | None]:
    """``(sub_centers, chunk_size, sampled_classes)`` of a chunked call, checked:
    ``sub_centers >= 1`` dividing the rows of a ``(C·K, D)`` weight, ``chunk_size`` None or
    ``>= 1``, and :func:`check_sampled_classes`; ``TypeError``/``ValueError`` naming the
    argument and the value otherwise."""
    sampled_classes = check_sampled_classes(sampled_classes, weight)
    if chunk_size is not None:
        chunk_size = check_int("chunk_size", chunk_size, minimum=1)
    sub_centers = check_int("sub_centers", sub_centers, minimum=1)
    if weight.dim() != 2 or weight.shape[0] % sub_centers:
        raise ValueError(
            f"weight must have shape (C·K, D) with K = sub_centers = {sub_centers}, "
            f"got {tuple(weight.shape)}"
        )
    return sub_centers, chunk_size, sampled_classes


def normalized_with_norms(x: Tensor) -> tuple[Tensor, Tensor]:
    """``(x̂, ‖x‖)``: ``x / max(‖x_i‖, eps)`` (``Tensor[N, D]``) and the row norms
    (``Tensor[N]``, :func:`~marginface.executors.dense.row_norms`: no overflow for entries
    beyond ~1.8e19 in float32), both differentiable."""
    norms = row_norms(x)  # (N,)
    return x / norms.clamp_min(NORMALIZE_EPS).unsqueeze(1), norms


def scale_per_row(scale: Tensor | float, rows: int, like: Tensor) -> Tensor:
    """A margin context's ``"scale"`` (a float, a 0-dim tensor or ``Tensor[N, 1]``) as
    ``Tensor[N]`` in ``like``'s dtype, keeping its autograd graph (SphereFace's and MagFace's
    ``s·‖x‖`` carry a gradient)."""
    if isinstance(scale, Tensor):
        if scale.dim() == 0:
            return scale.to(like.dtype).expand(rows)
        return scale.to(like.dtype).reshape(rows)
    return torch.full((rows,), float(scale), dtype=like.dtype, device=like.device)
