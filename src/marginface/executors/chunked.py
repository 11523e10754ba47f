"""The chunked (fused) executor: margin softmax cross-entropy without the ``N×C`` logits.

The classes are visited in chunks of ``chunk_size``. Each chunk's cosines are one GEMM of the
normalized embeddings with the chunk's raw class centers, scaled per column by the centers'
inverse norms (weight normalization fused: no normalized copy of the weight is ever made). The
margin's non-target hook and scale turn them into logits, the target column is excluded, and the
chunk is reduced to per-row partial statistics ``(max, Σexp)``
(:mod:`~marginface.executors._online_softmax`) that merge exactly across chunks -- or across
processes holding different slices of the classes.

The target cosine is an indexed dot ``x̂_i·w_{y_i}/‖w_{y_i}‖``; the margin is applied to it
exactly, through the margin's own hooks, *before* it enters the log-sum-exp:

.. math:: L_i = \\log\\Big(e^{s_i f(\\cos\\theta_{iy_i})}
          + \\sum_{j\\ne y_i} e^{s_i g(\\cos\\theta_{ij})}\\Big) - s_i f(\\cos\\theta_{iy_i})
          + R(\\|x_i\\|)

The backward recomputes each chunk's cosines (a fourth GEMM; nothing of size ``N×C`` is saved)
and writes each chunk's weight gradient, through ``w/‖w‖``, straight into the weight's gradient.
Extra memory is ``O(N·chunk + chunk·D)`` beyond the weight and its gradient.

Partial FC (``sampled_classes``): the loop runs over the sampled classes only, gathering each
chunk's rows from the whole weight into a reused buffer and writing each chunk's weight gradient
into those rows of one weight-sized gradient (zero elsewhere), so the extra memory stays
``O(N·chunk + chunk·D)``: no copy of the ``S·K×D`` sampled rows, nor of their gradient.

The per-chunk work (GEMM, non-target rule, online log-sum-exp, and the backward's recomputation)
runs either as PyTorch ops (``kernels="torch"``, the reference) or as the Triton kernels of
:mod:`~marginface.executors.triton_kernels` (``kernels="triton"``), which keep each tile of logits
on chip; ``"auto"`` (default) takes Triton for CUDA tensors when triton imports. The N-sized
target math is the same PyTorch code either way.
"""

from __future__ import annotations

import math
import os
from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .._validation import check_choice, check_int
from ..margins.adacos import AdaCosMargin
from ..margins.base import Context, Margin
from ..margins.curricularface import CurricularFaceMargin
from ..margins.filtering import interclass_filter
from ._online_softmax import (
    add_shifted_slice,
    empty_statistics,
    finish_log_sum_exp,
    merge_statistics,
    slice_statistics,
)
from .dense import NORMALIZE_EPS, compute_dtype, row_norms
from .sharding import ClassShard

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "KERNELS",
    "KERNELS_ENV",
    "check_chunkable",
    "check_sampled_classes",
    "chunked_margin_cross_entropy",
    "default_chunk_size",
    "gemm_dtype",
    "scale_in_gemm",
    "sharded_margin_cross_entropy",
    "triton_available",
]

DEFAULT_CHUNK_BYTES = 1 << 24
"""Bytes of the chunk workspace (``N·chunk_size·K`` logits in float32, plus their bf16/fp16
copy when the GEMM runs in half precision, plus a Partial FC sample's gathered rows and their
gradient, ``2·chunk_size·K×D``) when ``chunk_size`` is not given: 16 MiB, i.e. 8192
classes per chunk at N = 512, K = 1 in float32, 5461 with a bf16 weight
(:func:`default_chunk_size`). Measured on a 2-core CPU (N = D = 512, C = 100k): float32 chunks
of 4096 and 16384 classes were 3% and 10% slower than 8192; with a bf16 weight 5461 and 4096
were 2-5% faster than 8192. Bounding the chunk's bytes rather than its classes keeps the
executor's extra memory flat as N grows."""

PROJECTION_BLOCK = 256
"""Weight rows per block when a half-precision weight gradient is projected (see
:func:`_project_into`): its float32 temporaries stay at ``3·256·D`` floats."""

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
"""Environment variable read (at each call) when ``kernels`` is not given: one of
:data:`KERNELS`; unset means ``"auto"``."""

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


def triton_available() -> bool:
    """Whether :mod:`triton` imports (it is optional: ``pip install triton``)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def _resolve_kernels(kernels: str | None, x: Tensor, weight: Tensor, gemm: torch.dtype) -> bool:
    """Whether this call runs the Triton kernels (before the non-target rule is known)."""
    if kernels is None:
        kernels = os.environ.get(KERNELS_ENV, "auto") or "auto"
        if kernels not in KERNELS:
            raise ValueError(f"{KERNELS_ENV} must be one of {KERNELS}, got {kernels!r}")
    if kernels == "torch":
        return False
    supported = gemm in TRITON_DTYPES and weight.dtype == gemm and weight.stride(1) == 1
    if kernels == "auto":
        return x.device.type == "cuda" and supported and triton_available()
    if not triton_available():
        raise ValueError("kernels='triton' needs triton installed (pip install triton)")
    if not supported:
        raise ValueError(
            f"kernels='triton' supports GEMM dtypes {TRITON_DTYPES} with a weight of that dtype "
            f"and unit stride along D, got weight {weight.dtype} (stride {weight.stride()}) and "
            f"GEMM dtype {gemm}; use kernels='torch'"
        )
    if x.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(
            "kernels='triton' on CPU tensors runs only under Triton's interpreter: set "
            "TRITON_INTERPRET=1 before marginface.executors.triton_kernels is first imported"
        )
    return True


def _triton_rule(margin: Margin, context: Context, rows: int, like: Tensor) -> Any:
    """The margin's non-target rule as a
    :class:`~marginface.executors.triton_kernels.NonTargetRule`, or None if the kernels do not
    know it (only the identity and CurricularFace's rule are compiled in)."""
    from .triton_kernels import NonTargetRule

    method = type(margin).nontarget_cosine
    if margin.nontarget_is_identity():
        return NonTargetRule()
    if method is CurricularFaceMargin.nontarget_cosine:
        return _curricular_triton_rule(context["threshold"], context["t"], rows, like.device)
    return None


def _curricular_triton_rule(threshold: Any, t: Any, rows: int, device: torch.device) -> Any:
    """CurricularFace's rule for the kernels: ``threshold`` and ``t`` (scalars, ``[N]`` or
    ``[N, 1]``) as float32 ``[N]`` vectors."""
    from .triton_kernels import NonTargetRule

    threshold = torch.as_tensor(threshold, dtype=torch.float32, device=device)
    t = torch.as_tensor(t, dtype=torch.float32, device=device)
    return NonTargetRule(
        threshold=threshold.reshape(-1).expand(rows).contiguous(),
        t=t.reshape(-1).expand(rows).contiguous(),
    )


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


def _overrides(margin: Margin, name: str) -> bool:
    return getattr(type(margin), name) is not getattr(Margin, name)


def check_chunkable(margin: Margin) -> None:
    """Raise ``ValueError`` if ``margin`` cannot run on the chunked executor.

    A margin runs chunked when it is written through the hooks (:meth:`Margin.prepare`,
    :meth:`Margin.target_cosine`, :meth:`Margin.nontarget_cosine`): a margin that overrides
    :meth:`Margin.apply` or :meth:`Margin.forward` needs the whole cosine matrix.
    """
    if not isinstance(margin, Margin):
        raise TypeError(f"margin must be a marginface Margin, got {type(margin).__name__}")
    for name in ("apply", "forward"):
        if _overrides(margin, name):
            raise ValueError(
                f"margin {type(margin).__name__} overrides Margin.{name}() and cannot run on the "
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


def _row_scale(scale: Tensor | float, rows: int, like: Tensor) -> Tensor:
    """The context's scale as ``Tensor[N]`` in ``like``'s dtype (keeps its autograd graph)."""
    if isinstance(scale, Tensor):
        if scale.dim() == 0:
            return scale.to(like.dtype).expand(rows)
        return scale.to(like.dtype).reshape(rows)
    return torch.full((rows,), float(scale), dtype=like.dtype, device=like.device)


class _Chunks:
    """The chunk loop's shared state: inputs, their normalizations, the chunk GEMM, and the
    pass's workspace.

    Memory: every chunk of a pass writes its ``N×c·K`` GEMM result into the same buffer (one per
    dtype: a second, float32 one when the GEMM runs in bf16/fp16), allocated at the pass's first
    chunk and freed by :meth:`release` at its end. So a pass holds one chunk's logits, not two
    (a fresh ``torch.mm`` per chunk allocates the next chunk while the previous one is still
    referenced), allocates them once instead of once per chunk (glibc raises its mmap
    threshold to the size of a freed block, so repeated 16 MB allocations come from its heap
    and stay resident), and nothing of size ``N×chunk`` outlives a pass: between forward and
    backward only ``N``- and ``C``-vectors and ``x̂`` are kept.

    Partial FC (``sample``: ``int64[S]``, sorted distinct classes of ``weight``): the chunks
    run over the ``S`` sampled classes, and class ``j`` of the loop (a position in ``sample``;
    ``labels`` are such positions too) is row block ``sample[j]`` of the whole ``weight``. Each
    chunk's rows are gathered into one more reused buffer (``chunk·K×D``) and its weight
    gradient is written into the rows of the shard-sized gradient through another
    (:meth:`store_gradient_rows`): no ``S·K×D`` copy of the sampled centers or of their
    gradient exists at any time. ``inv_norms`` is then ``Tensor[S·K]`` (the sampled rows').
    """

    def __init__(
        self,
        x_hat: Tensor,
        weight: Tensor,
        labels: Tensor,
        sub_centers: int,
        chunk_size: int,
        gemm: torch.dtype,
        inv_norms: Tensor | None = None,
        sample: Tensor | None = None,
    ) -> None:
        self.x_hat = x_hat  # (N, D), compute dtype
        self.weight = weight  # (C·K, D), its own dtype
        self.labels = labels  # (N,)
        self.k = sub_centers
        self.sample = sample  # (S,) classes of weight, or None: every class
        self.num_classes = weight.shape[0] // sub_centers if sample is None else sample.shape[0]
        self.chunk_size = chunk_size
        self.gemm = gemm
        self.x_gemm = x_hat.to(gemm)  # (N, D)
        widest = min(chunk_size, self.num_classes) * sub_centers
        self.capacity = x_hat.shape[0] * widest
        self.row_capacity = widest * weight.shape[1]  # a chunk's weight rows
        self._buffers: dict[tuple[torch.dtype, str], Tensor] = {}  # the workspace
        self._gathered: tuple[int, int, Tensor] | None = None  # the gathered chunk's rows
        if inv_norms is None:  # (C·K,) or (S·K,), compute dtype; given: the forward's, reused
            inv_norms = self._inverse_norms(x_hat.dtype)
        self.inv_norms = inv_norms

    def _inverse_norms(self, dtype: torch.dtype) -> Tensor:
        """``1 / max(‖w_j‖, eps)`` of every weight row (of every sampled row), ``Tensor[C·K]``
        (``Tensor[S·K]``) in ``dtype``.

        A weight of another dtype (bf16/fp16 into float32) is converted block by block through
        the workspace: ``vector_norm(weight, dtype=float32)`` would convert all of it at once (a
        float32 copy, twice the size of a bf16 weight). Sampled rows are gathered block by block
        the same way.
        """
        weight = self.weight
        if weight.dtype == dtype and self.sample is None:
            norms = torch.linalg.vector_norm(weight, dim=1)  # (C·K,)
        else:
            k, dim = self.k, weight.shape[1]
            norms = torch.empty(self.num_classes * k, dtype=dtype, device=weight.device)
            block = max(1, self.capacity // (dim * k))  # classes per block
            for start in range(0, self.num_classes, block):
                stop = min(start + block, self.num_classes)
                part = self.raw_rows(start, stop)  # (b·K, D), the weight's dtype
                if part.dtype != dtype:
                    part = self.scratch(part.shape[0], dim, dtype).copy_(part)
                torch.linalg.vector_norm(part, dim=1, out=norms[start * k : stop * k])
            self.release()
        return norms.clamp_min_(NORMALIZE_EPS).reciprocal_()  # in place: C-vectors add up

    def scratch(self, rows: int, cols: int, dtype: torch.dtype, slot: str = "logits") -> Tensor:
        """``Tensor[rows, cols]`` of ``dtype`` (uninitialized) in the pass's buffer for that
        dtype and ``slot``, which holds the widest chunk (:attr:`capacity` elements for the
        ``"logits"``, :attr:`row_capacity` for the ``"rows"`` and ``"gradient"`` of a sample).
        The previous chunk's view is overwritten."""
        size = rows * cols
        buffer = self._buffers.get((dtype, slot))
        if buffer is None or buffer.numel() < size:
            least = self.capacity if slot == "logits" else self.row_capacity
            buffer = torch.empty(max(size, least), dtype=dtype, device=self.x_hat.device)
            self._buffers[(dtype, slot)] = buffer
        return buffer[:size].view(rows, cols)

    def release(self) -> None:
        """Free the workspace (at the end of each pass)."""
        self._buffers.clear()
        self._gathered = None

    def ranges(self) -> list[tuple[int, int]]:
        """Class ranges ``[start, stop)`` of the chunks."""
        step = self.chunk_size
        return [(lo, min(lo + step, self.num_classes)) for lo in range(0, self.num_classes, step)]

    def weight_index(self, start: int, stop: int) -> Tensor:
        """The rows of :attr:`weight` that hold loop classes ``[start, stop)`` (a sample's),
        ``int64[(stop - start)·K]``, class-major."""
        assert self.sample is not None
        classes = self.sample[start:stop]  # (c,)
        if self.k == 1:
            return classes
        offsets = torch.arange(self.k, device=classes.device)
        return (classes.unsqueeze(1) * self.k + offsets).reshape(-1)  # (c·K,)

    def weight_row_of(self, positions: Tensor) -> Tensor:
        """Rows of :attr:`weight` for rows ``positions`` of the loop's classes (``j·K + k``)."""
        if self.sample is None:
            return positions
        return self.sample[positions // self.k] * self.k + positions % self.k

    def raw_rows(self, start: int, stop: int) -> Tensor:
        """The chunk's raw class centers ``Tensor[(stop - start)·K, D]`` in the weight's dtype:
        a slice of :attr:`weight`, or (a sample) its rows gathered into the ``"rows"`` buffer,
        kept until another chunk is gathered."""
        if self.sample is None:
            return self.weight[start * self.k : stop * self.k]
        if self._gathered is None or self._gathered[:2] != (start, stop):
            index = self.weight_index(start, stop)  # (c·K,)
            rows = self.scratch(index.shape[0], self.weight.shape[1], self.weight.dtype, "rows")
            torch.index_select(self.weight, 0, index, out=rows)
            self._gathered = (start, stop, rows)
        return self._gathered[2]

    def weight_rows(self, start: int, stop: int) -> Tensor:
        """The chunk's raw class centers ``Tensor[(stop - start)·K, D]`` in the GEMM dtype."""
        return self.raw_rows(start, stop).to(self.gemm)

    def gradient_rows(self, grad_weight: Tensor, start: int, stop: int) -> Tensor:
        """Where the chunk's weight gradient is computed: its own rows of ``grad_weight``, or (a
        sample) the ``"gradient"`` buffer, ``Tensor[(stop - start)·K, D]`` of its dtype."""
        if self.sample is None:
            return grad_weight[start * self.k : stop * self.k]
        rows = (stop - start) * self.k
        return self.scratch(rows, grad_weight.shape[1], grad_weight.dtype, "gradient")

    def project_into(self, grad_weight: Tensor, start: int, stop: int, partial: Tensor) -> None:
        """Write ``∂L/∂w`` of the chunk's rows given ``partial = r·Σ_i G_ij x̂_i`` (which may be
        :meth:`gradient_rows`, then projected in place):
        ``∂L/∂w_j = partial_j - r_j²(w_j·partial_j)·w_j`` (the Jacobian of ``w/‖w‖``)."""
        lo, hi = start * self.k, stop * self.k
        _project(partial, self.raw_rows(start, stop), self.inv_norms[lo:hi])
        if self.sample is not None:  # each sampled row is written by exactly one chunk
            index = self.weight_index(start, stop)  # (c·K,)
            grad_weight.index_copy_(0, index, partial.to(grad_weight.dtype))
        elif partial.data_ptr() != grad_weight[lo:hi].data_ptr():
            grad_weight[lo:hi] = partial.to(grad_weight.dtype)

    def cosine(
        self,
        start: int,
        stop: int,
        rows: Tensor,
        *,
        argmax: bool = False,
        shift: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """``rows @ ŵ_chunkᵀ``, sub-centers max-pooled: ``Tensor[N, stop - start]``.

        ``rows`` is ``x̂`` (cosines) or ``s·x̂`` (scaled cosines) in the GEMM dtype. With
        ``argmax``, also the winning sub-center of each entry (``Tensor[N, c]``, or None if K = 1).
        With ``shift`` (``Tensor[N]``, K = 1 only), returns ``rows @ ŵᵀ - shift`` in one pass.
        """
        accumulate = self.inv_norms.dtype
        n, width = rows.shape[0], (stop - start) * self.k
        raw = torch.mm(
            rows, self.weight_rows(start, stop).t(), out=self.scratch(n, width, self.gemm)
        )  # (N, c·K), GEMM dtype, in the workspace
        inv_norms = self.inv_norms[start * self.k : stop * self.k]  # (c·K,)
        if raw.dtype != accumulate:  # a half GEMM: promote into the float32 workspace first
            # (an op mixing the dtypes would make a hidden float32 copy of raw)
            raw = self.scratch(n, width, accumulate).copy_(raw)
        if shift is not None and self.k == 1:
            offset = shift.neg().unsqueeze(1)  # (N, 1)
            return torch.addcmul(offset, raw, inv_norms, out=raw), None
        raw = raw.mul_(inv_norms)
        if shift is not None:
            raw = raw.view(raw.shape[0], stop - start, self.k)  # (N, c, K)
            values, index = raw.max(dim=2)
            return values.sub_(shift.unsqueeze(1)), index
        if self.k == 1:
            return raw, None
        pooled = raw.view(raw.shape[0], stop - start, self.k)  # (N, c, K)
        if argmax:
            values, index = pooled.max(dim=2)
            return values, index
        return pooled.amax(dim=2), None

    def nontarget_gradient(
        self,
        *,
        fold: bool,
        identity: bool,
        nontarget: Any,
        rule: Any,
        scale: Tensor,
        lse: Tensor,
        grad: Tensor,
        grad_x_hat: Tensor,
        grad_weight: Tensor | None,
        grad_scale: Tensor | None,
        derivative: Any = None,
        filter_threshold: float = 0.0,
    ) -> None:
        """The backward's pass over the chunks: add the non-target part of ``∂L/∂x̂`` (and of
        ``∂L/∂s`` into ``grad_scale``) in place, write every row of ``grad_weight``.

        ``lse``, ``grad``: ``Tensor[N]``, the log-sum-exp the probabilities are taken against
        and the gradient reaching it (``p_ij·grad_i = e^{z_ij - lse_i}·grad_i``: the full
        log-sum-exp with the loss's gradient, or the non-target one with the gradient reaching
        it). ``nontarget``: the margin's non-target rule, ``cos -> g(cos)`` (differentiable);
        ``identity``: whether it is the identity; ``fold``: identity and a scale without
        gradient (the scale rides in the GEMM); ``rule``: the Triton kernels' rule, or None
        for the PyTorch ops. ``scale``: ``Tensor[N]``. ``derivative``: ``cos -> g'(cos)``
        (elementwise), or None to take the vector-Jacobian product of ``nontarget`` by
        autograd (which does not record inside a custom operator's implementation).
        ``filter_threshold``: inter-class filtering's ``τ`` (0: off); non-target cosines above
        it take the value 0 and no gradient (``fold`` must be False then).
        """
        chunks, k, x_hat = self, self.k, self.x_hat
        accumulate, inv_norms = self.inv_norms.dtype, self.inv_norms
        if fold:
            factor = grad * scale  # (N,), ∂L/∂cos = factor · softmax
            shift = lse - torch.log(factor.abs())  # (N,), +inf where factor = 0
            negative = bool((factor < 0).any())
            scaled_rows = (x_hat * scale.unsqueeze(1)).to(chunks.gemm)  # (N, D)

        if rule is not None:
            if chunks.sample is not None:  # one pass, each chunk's sampled rows gathered once
                _triton_sampled_backward(
                    chunks, rule, scale, lse, grad, grad_x_hat, grad_weight, grad_scale
                )
            else:
                _triton_backward(chunks, rule, scale, lse, grad, grad_x_hat, grad_scale)
                if grad_weight is not None:
                    _triton_weight_gradient(chunks, rule, scale, lse, grad, grad_weight)

        def chunk_gradient(start: int, stop: int) -> None:
            """Add one chunk's non-target part of ``∂L/∂x̂`` (and ``∂L/∂s``), write its rows of
            ``∂L/∂W``. A function, so that every ``N×c`` temporary is freed on return, before the
            next chunk allocates its own."""
            slot_rows, slot_cols = chunks.target_slots(start, stop)
            if fold:
                logits, best = chunks.cosine(start, stop, scaled_rows, argmax=True, shift=shift)
                g_cos = logits.exp_()  # (N, c) = ∂L/∂cos, in the workspace
                if negative:
                    g_cos.mul_(torch.sign(factor).unsqueeze(1))
                g_cos[slot_rows, slot_cols] = 0.0
            else:
                cos, best = chunks.cosine(start, stop, chunks.x_gemm, argmax=True)  # (N, c)
                dirty = None
                if filter_threshold > 0:  # filtered entries: value 0, gradient 0
                    dirty = cos > filter_threshold  # (N, c)
                    cos.masked_fill_(dirty, 0.0)
                with torch.enable_grad():
                    cos_in = cos.requires_grad_(not identity and derivative is None)
                    g = nontarget(cos_in)  # (N, c)
                g_value = g.detach()
                prob = (g_value * scale.unsqueeze(1)).sub_(lse.unsqueeze(1)).exp_()  # (N, c)
                prob[slot_rows, slot_cols] = 0.0
                g_logit = prob.mul_(grad.unsqueeze(1))  # (N, c), ∂L/∂logit
                if grad_scale is not None:
                    grad_scale.add_((g_logit * g_value).sum(dim=1))
                g_g = g_logit.mul_(scale.unsqueeze(1))  # ∂L/∂g
                if identity:
                    g_cos = g_g
                elif derivative is not None:  # g'(cos) given (no autograd inside an operator)
                    g_cos = g_g.mul_(derivative(cos))
                else:  # the vector-Jacobian product with g_g, as the gradient of a scalar
                    # (see the target's below: grad_outputs would import sympy)
                    with torch.enable_grad():
                        objective = torch.dot(g.reshape(-1), g_g.reshape(-1))
                    (g_cos,) = torch.autograd.grad(objective, cos_in)
                if dirty is not None:
                    g_cos = g_cos.masked_fill_(dirty, 0.0)
                del cos, cos_in, g, g_value, prob, g_logit, g_g, dirty
            if best is not None:  # route each class's gradient to its winning sub-center
                pooled = g_cos.new_zeros(g_cos.shape[0], stop - start, k)  # (N, c, K)
                g_cos = pooled.scatter_(2, best.unsqueeze(2), g_cos.unsqueeze(2)).view(
                    g_cos.shape[0], -1
                )  # (N, c·K)
            lo, hi = start * k, stop * k
            centers = chunks.weight_rows(start, stop)  # (c·K, D)
            if chunks.gemm == accumulate:
                g_dot = g_cos.mul_(inv_norms[lo:hi])  # (N, c·K), ∂L/∂(x̂·w)
                grad_x_hat.addmm_(g_dot, centers)
            else:  # scale, then round to the GEMM dtype into its workspace (torch.mul with
                # a bf16 out= would compute into a hidden float32 N×c temporary first)
                g_cos.mul_(inv_norms[lo:hi])
                g_dot = chunks.scratch(g_cos.shape[0], g_cos.shape[1], chunks.gemm).copy_(g_cos)
                grad_x_hat.add_(torch.mm(g_dot, centers))
            if grad_weight is not None:
                if grad_weight.dtype == chunks.gemm:  # write in place (fp32, or a bf16 weight)
                    rows = chunks.gradient_rows(grad_weight, start, stop)  # (c·K, D)
                    partial = torch.mm(g_dot.t(), chunks.x_gemm, out=rows)
                else:
                    partial = torch.mm(g_dot.t(), chunks.x_gemm).to(accumulate)  # (c·K, D)
                chunks.project_into(grad_weight, start, stop, partial)

        if rule is None:
            for start, stop in chunks.ranges():
                chunk_gradient(start, stop)
            chunks.release()

    def target_slots(self, start: int, stop: int) -> tuple[Tensor, Tensor]:
        """Rows whose label lies in ``[start, stop)`` and that label's column in the chunk."""
        inside = (self.labels >= start) & (self.labels < stop)  # (N,)
        rows = inside.nonzero().squeeze(1)  # (r,)
        return rows, self.labels[rows] - start

    def statistics(self, rows: Tensor, transform: Any = None) -> tuple[Tensor, Tensor]:
        """Merged ``(max, Σexp)`` over all chunks of the non-target logits, ``Tensor[N]`` each.

        ``rows``: ``s·x̂`` in the GEMM dtype (logits = scaled cosines) if ``transform`` is None,
        else ``x̂`` and ``transform(cosine_chunk) -> logits_chunk``.
        """
        n = self.x_hat.shape[0]
        stats = empty_statistics(n, dtype=self.inv_norms.dtype, device=self.x_hat.device)
        for start, stop in self.ranges():
            slot_rows, slot_cols = self.target_slots(start, stop)
            if transform is None and self.k == 1 and bool(torch.isfinite(stats[0]).all()):
                # Shift by the running max: no pass for this chunk's own max.
                shifted, _ = self.cosine(start, stop, rows, shift=stats[0])  # (N, c)
                shifted[slot_rows, slot_cols] = float("-inf")  # the target enters separately
                merged = add_shifted_slice(stats, shifted)
                if merged is not None:
                    stats = merged
                    continue
            logits, _ = self.cosine(start, stop, rows)  # (N, c)
            if transform is not None:
                logits = transform(logits)
            logits[slot_rows, slot_cols] = float("-inf")  # the target enters separately
            stats = merge_statistics(stats, slice_statistics(logits))
            del logits  # a transform's output: free it before the next chunk's
        self.release()
        return stats


def _triton_statistics(chunks: _Chunks, scale_rows: Tensor, rule: Any) -> tuple[Tensor, Tensor]:
    """:meth:`_Chunks.statistics` by the Triton kernel: ``(max, Σexp)``, ``Tensor[N]`` each."""
    from .triton_kernels import nontarget_statistics

    if chunks.sample is not None:
        return _triton_sampled_statistics(chunks, scale_rows, rule)

    return nontarget_statistics(
        chunks.x_gemm,
        chunks.weight,
        chunks.inv_norms,
        chunks.labels,
        scale_rows,
        rule,
        sub_centers=chunks.k,
        chunk_size=chunks.chunk_size,
    )


def _adacos_log_b_avg(
    chunks: _Chunks,
    scale: Tensor,
    use_triton: bool,
    shard: ClassShard | None = None,
    threshold: float = 0.0,
) -> Tensor:
    """AdaCos's ``log B_avg = log((1/N) Σ_i Σ_{j≠y_i} e^{s·cos θ_ij})`` from chunked sums
    (merged over the ranks of ``shard``, if any), on the inter-class-filtered cosines when
    ``threshold > 0`` (as the dense path's ``prepare`` sees them)."""
    if threshold > 0:
        n = chunks.x_hat.shape[0]
        scale_rows = _row_scale(scale, n, chunks.x_hat).unsqueeze(1)  # (N, 1)

        def transform(cos: Tensor) -> Tensor:
            return interclass_filter(cos, None, threshold) * scale_rows

        row_max, exp_sum = chunks.statistics(chunks.x_gemm, transform)
    elif use_triton:
        from .triton_kernels import NonTargetRule

        n = chunks.x_hat.shape[0]
        scale_rows = _row_scale(scale, n, chunks.x_hat).contiguous()
        row_max, exp_sum = _triton_statistics(chunks, scale_rows, NonTargetRule())
    elif not scale_in_gemm(chunks.gemm):  # float16: scale the float32 cosines (in place)
        scale_rows = _row_scale(scale, chunks.x_hat.shape[0], chunks.x_hat).unsqueeze(1)
        row_max, exp_sum = chunks.statistics(chunks.x_gemm, lambda cos: cos.mul_(scale_rows))
    else:
        scaled = (chunks.x_hat * scale.to(chunks.x_hat.dtype)).to(chunks.gemm)  # (N, D)
        row_max, exp_sum = chunks.statistics(scaled)
    if shard is not None:
        row_max, exp_sum = shard.merge_statistics((row_max, exp_sum))
    per_row = row_max + torch.log(exp_sum)  # (N,)
    return torch.logsumexp(per_row, dim=0) - math.log(per_row.shape[0])


def _target_cosine(
    x_hat: Tensor, chunks: _Chunks, targets: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """The target cosine of the rows whose target is among the chunks' classes
    (``targets >= 0``), an indexed dot max-pooled over the target's sub-centers; 0 elsewhere.

    Returns:
        ``(cos_raw[N], target_rows[N], owned[N])``: the cosines, the winning row of each owned
        row among the chunks' rows (``j·K + k``, ``j`` a position in the sample if any; 0
        elsewhere) and the owned-row mask.
    """
    weight, inv_norms, k = chunks.weight, chunks.inv_norms, chunks.k
    owned = targets >= 0  # (N,)
    cos_raw = torch.zeros(targets.shape[0], dtype=x_hat.dtype, device=x_hat.device)  # (N,)
    target_rows = torch.zeros_like(targets)  # (N,)
    index = owned.nonzero().squeeze(1)  # (r,)
    if index.numel():
        candidates = targets[index].unsqueeze(1) * k + torch.arange(k, device=targets.device)
        centers = weight[chunks.weight_row_of(candidates)].to(x_hat.dtype)  # (r, K, D)
        cos_k = torch.einsum("nd,nkd->nk", x_hat[index], centers) * inv_norms[candidates]
        values, best = cos_k.max(dim=1)  # (r,)
        cos_raw[index] = values
        target_rows[index] = candidates.gather(1, best.unsqueeze(1)).squeeze(1)
    return cos_raw, target_rows, owned


class _ChunkedMarginCrossEntropy(torch.autograd.Function):
    """``(x[n, D], weight[c·K, D]) -> loss[N]`` (cross-entropy part, without the regularizer).

    ``targets[N]`` is each row's class among these weight rows (``-1`` when another rank owns
    it), ``labels[N]`` its global class (what the margin sees). Without a shard ``n = N`` and
    ``targets`` are the labels; with a :class:`~.sharding.ClassShard`, ``x`` holds this rank's
    rows, which are gathered into the global batch of ``N`` rows first. With ``sample``
    (``int64[S]``, Partial FC's sorted classes of ``weight``), only those classes are computed
    with, read in place, and ``targets`` are positions in ``sample``; the weight's gradient is
    shard-sized, zero outside the sample.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        x: Tensor,
        weight: Tensor,
        targets: Tensor,
        labels: Tensor,
        margin: Margin,
        sub_centers: int,
        chunk_size: int | None,
        gemm: torch.dtype,
        kernels: str | None,
        shard: ClassShard | None,
        sample: Tensor | None,
    ) -> Tensor:
        if shard is not None:
            x = shard.gather_rows(x)  # (N, D), the global batch
        use_triton = _resolve_kernels(kernels, x, weight, gemm)
        threshold = margin.interclass_filtering_threshold  # 0: off
        if threshold > 0 and use_triton:  # the kernels have no filter compiled in
            if kernels == "triton" or os.environ.get(KERNELS_ENV) == "triton":
                raise ValueError(
                    "interclass_filtering_threshold > 0 has no Triton kernel; use "
                    "kernels='torch' (or leave kernels unset)"
                )
            use_triton = False
        accumulate = x.dtype
        n = x.shape[0]
        k = sub_centers
        norms = row_norms(x)  # (N,), no overflow for entries beyond ~1.8e19 in float32
        x_hat = x / norms.clamp_min(NORMALIZE_EPS).unsqueeze(1)  # (N, D)
        if chunk_size is None:  # N is the global batch's
            per_logit = accumulate.itemsize + (gemm.itemsize if gemm != accumulate else 0)
            per_center = 0 if sample is None else 2 * weight.shape[1] * weight.dtype.itemsize
            chunk_size = default_chunk_size(n, k, per_logit, per_center)
        chunks = _Chunks(x_hat, weight, targets, k, chunk_size, gemm, sample=sample)
        inv_norms = chunks.inv_norms  # (C·K,), or (S·K,) for a sample

        # The target cosine: an indexed dot on the rank that owns the target, summed over ranks.
        cos_raw, target_rows, owned = _target_cosine(x_hat, chunks, targets)
        if shard is not None:
            shard.all_sum_(cos_raw)

        # The margin's hooks on a small graph of N-vectors, replayed in backward.
        with torch.enable_grad():
            cos_leaf = cos_raw.detach().requires_grad_(True)
            norms_leaf = norms.detach().requires_grad_(True) if margin.requires_norms else None
            cos_target = cos_leaf.clamp(-1.0, 1.0)
            if isinstance(margin, AdaCosMargin) and margin.training and margin.dynamic:
                with torch.no_grad():
                    log_b_avg = _adacos_log_b_avg(
                        chunks, margin.scale.detach(), use_triton, shard, threshold
                    )
                margin.update_scale(log_b_avg, cos_target.detach())
                context: Context = {"scale": margin.scale_for(norms_leaf)}
            else:
                context = margin.prepare(cos_target, labels, norms_leaf)
            target = margin.adjusted_target_cosine(cos_target, norms_leaf, context)  # (N,)
            row_scale = _row_scale(context["scale"], n, x_hat)  # (N,)
            target_logit = target.to(accumulate) * row_scale  # (N,)

        identity = margin.nontarget_is_identity()
        if not identity:
            for key, value in context.items():
                if key != "scale" and isinstance(value, Tensor) and value.requires_grad:
                    raise ValueError(
                        f"margin {type(margin).__name__}'s context[{key!r}] carries a gradient "
                        "into nontarget_cosine, which the chunked executor cannot propagate; "
                        "use impl='dense'"
                    )
        frozen = {key: v.detach() if isinstance(v, Tensor) else v for key, v in context.items()}
        scale_rows = row_scale.detach()  # (N,)
        fold = identity and not row_scale.requires_grad and threshold == 0 and scale_in_gemm(gemm)
        rule = _triton_rule(margin, frozen, n, x_hat) if use_triton else None
        if use_triton and rule is None:
            if kernels == "triton" or os.environ.get(KERNELS_ENV) == "triton":
                raise ValueError(
                    f"margin {type(margin).__name__}'s nontarget_cosine has no Triton kernel "
                    "(only the identity and CurricularFace's rule); use kernels='torch'"
                )
            use_triton = False

        with torch.no_grad():
            if use_triton:
                stats = _triton_statistics(chunks, scale_rows.contiguous(), rule)
            elif fold:  # logits = (s·x̂) @ ŵᵀ: the scale rides in the GEMM
                stats = chunks.statistics((x_hat * scale_rows.unsqueeze(1)).to(gemm))
            else:

                def transform(cos: Tensor) -> Tensor:
                    if threshold > 0:  # the target column is replaced afterwards
                        cos = cos.masked_fill_(cos > threshold, 0.0)
                    return margin.nontarget_cosine(cos, frozen) * scale_rows.unsqueeze(1)

                stats = chunks.statistics(chunks.x_gemm, transform)
            if shard is not None:
                stats = shard.merge_statistics(stats)
            lse = finish_log_sum_exp(stats, target_logit.detach())  # (N,)

        ctx.save_for_backward(x, weight, norms, x_hat, inv_norms, lse, target_rows, owned)
        ctx.sampled = sample is not None
        ctx.shard = shard
        ctx.chunks = chunks
        ctx.graph = (cos_leaf, norms_leaf, target_logit, row_scale)
        ctx.margin, ctx.frozen, ctx.fold, ctx.identity = margin, frozen, fold, identity
        ctx.threshold = threshold
        ctx.rule = rule  # the Triton kernels' non-target rule, None on the PyTorch path
        return lse - target_logit.detach()

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_loss: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        x, weight, norms, x_hat, inv_norms, lse, target_rows, owned = ctx.saved_tensors
        shard: ClassShard | None = ctx.shard
        chunks: _Chunks = ctx.chunks
        cos_leaf, norms_leaf, target_logit, row_scale = ctx.graph
        accumulate = x.dtype
        grad = grad_loss.to(accumulate)  # (N,)
        scale = row_scale.detach()  # (N,)
        scale_grad = row_scale.requires_grad
        want_weight = ctx.needs_input_grad[1]

        grad_x_hat = torch.zeros_like(x_hat)  # (N, D), ∂L/∂x̂
        grad_weight = None  # (C·K, D): every row (every sampled row) is written by one chunk
        if want_weight:
            grad_weight = torch.zeros_like(weight) if ctx.sampled else torch.empty_like(weight)
        grad_scale = torch.zeros_like(scale) if scale_grad else None  # (N,)
        chunks.nontarget_gradient(
            fold=ctx.fold,
            identity=ctx.identity,
            nontarget=lambda cos: ctx.margin.nontarget_cosine(cos, ctx.frozen),
            rule=ctx.rule,
            scale=scale,
            lse=lse,
            grad=grad,
            grad_x_hat=grad_x_hat,
            grad_weight=grad_weight,
            grad_scale=grad_scale,
            filter_threshold=ctx.threshold,
        )

        # The target: backward through the margin's small graph, then through the indexed dot.
        outputs, seeds = [target_logit], [grad * (torch.exp(target_logit.detach() - lse) - 1.0)]
        if scale_grad:
            if shard is not None:  # each rank summed over its own classes
                shard.all_sum_(grad_scale)
            outputs.append(row_scale)
            seeds.append(grad_scale)
        inputs = [cos_leaf] + ([norms_leaf] if norms_leaf is not None else [])
        # retain_graph: the small graph is kept so that backward can run again (e.g. gradcheck,
        # or retain_graph=True upstream); it holds only N-vectors. The seeds enter as one scalar
        # Σ seed·output (the same vector-Jacobian product): torch.autograd.grad given
        # grad_outputs imports sympy on first use, ~35 MB resident for the process's lifetime.
        with torch.enable_grad():
            objective = sum(torch.dot(out, seed) for out, seed in zip(outputs, seeds, strict=True))
        grads = torch.autograd.grad(objective, inputs, allow_unused=True, retain_graph=True)
        grad_cos = grads[0] if grads[0] is not None else torch.zeros_like(lse)
        index = owned.nonzero().squeeze(1)  # (r,) rows whose target this weight holds
        if index.numel():
            rows = target_rows[index]  # (r,), among the chunks' rows
            coefficient = (grad_cos[index] * inv_norms[rows]).unsqueeze(1)  # (r, 1)
            weight_rows = chunks.weight_row_of(rows)  # (r,), rows of the weight
            centers = weight[weight_rows].to(accumulate)  # (r, D)
            grad_x_hat.index_add_(0, index, coefficient * centers)
            if grad_weight is not None:
                partial = coefficient * x_hat[index]  # (r, D)
                _project_rows_into(grad_weight, weight_rows, partial, centers, inv_norms[rows])

        # Through x̂ = x / max(‖x‖, eps) and through ‖x‖ itself.
        safe = norms > NORMALIZE_EPS
        radial = _row_dot(x_hat, grad_x_hat)  # (N,)
        tangent = grad_x_hat - x_hat * radial.unsqueeze(1)
        grad_x = torch.where(
            safe.unsqueeze(1),
            tangent / norms.clamp_min(NORMALIZE_EPS).unsqueeze(1),
            grad_x_hat / NORMALIZE_EPS,
        )
        leader = shard is None or shard.rank == 0  # terms every rank computed: add them once
        if leader and norms_leaf is not None and len(grads) > 1 and grads[1] is not None:
            grad_x = grad_x + grads[1].unsqueeze(1) * x_hat
        if shard is not None:  # Σ over ranks of each one's share; keep this rank's rows
            grad_x = shard.all_sum_(grad_x.contiguous())[shard.rows].clone()
        return grad_x, grad_weight, None, None, None, None, None, None, None, None, None


def _triton_backward(
    chunks: _Chunks,
    rule: Any,
    scale: Tensor,
    lse: Tensor,
    grad: Tensor,
    grad_x_hat: Tensor,
    grad_scale: Tensor | None,
) -> None:
    """Add the non-target part of ``∂L/∂x̂`` (and of ``∂L/∂s`` if wanted) by the Triton kernel."""
    from .triton_kernels import embedding_gradient

    part_x, part_scale = embedding_gradient(
        chunks.x_gemm,
        chunks.weight,
        chunks.inv_norms,
        chunks.labels,
        scale.contiguous(),
        rule,
        lse.contiguous(),
        grad.contiguous(),
        sub_centers=chunks.k,
        chunk_size=chunks.chunk_size,
    )
    grad_x_hat += part_x.to(grad_x_hat.dtype)
    if grad_scale is not None:
        grad_scale += part_scale.to(grad_scale.dtype)


def _triton_weight_gradient(
    chunks: _Chunks,
    rule: Any,
    scale: Tensor,
    lse: Tensor,
    grad: Tensor,
    grad_weight: Tensor,
) -> None:
    """Write the non-target part of ``∂L/∂W`` chunk by chunk (Triton kernel, then the projection
    through ``w/‖w‖``): float32 rows of ``grad_weight`` are accumulated in place, other dtypes
    through one float32 chunk."""
    from .triton_kernels import weight_gradient

    k = chunks.k
    scale, lse, grad = scale.contiguous(), lse.contiguous(), grad.contiguous()
    for start, stop in chunks.ranges():
        rows = grad_weight[start * k : stop * k]
        in_place = rows.dtype == torch.float32 and rows.is_contiguous()
        partial = weight_gradient(
            chunks.x_gemm,
            chunks.weight,
            chunks.inv_norms,
            chunks.labels,
            scale,
            rule,
            lse,
            grad,
            sub_centers=k,
            start=start,
            stop=stop,
            out=rows if in_place else None,
        )  # (c·K, D), float32
        chunks.project_into(grad_weight, start, stop, partial)


def _triton_sampled_statistics(
    chunks: _Chunks, scale_rows: Tensor, rule: Any
) -> tuple[Tensor, Tensor]:
    """:func:`_triton_statistics` over a sample: one kernel launch per chunk, on the chunk's
    gathered rows (the labels shifted to the chunk's columns), merged in PyTorch."""
    from .triton_kernels import nontarget_statistics

    k = chunks.k
    stats = empty_statistics(chunks.x_hat.shape[0], dtype=torch.float32, device=scale_rows.device)
    for start, stop in chunks.ranges():
        part = nontarget_statistics(
            chunks.x_gemm,
            chunks.weight_rows(start, stop),
            chunks.inv_norms[start * k : stop * k].contiguous(),
            chunks.labels - start,  # outside [0, stop - start): not in this chunk
            scale_rows,
            rule,
            sub_centers=k,
            chunk_size=stop - start,
        )
        stats = merge_statistics(stats, part)
    chunks.release()
    return stats


def _triton_sampled_backward(
    chunks: _Chunks,
    rule: Any,
    scale: Tensor,
    lse: Tensor,
    grad: Tensor,
    grad_x_hat: Tensor,
    grad_weight: Tensor | None,
    grad_scale: Tensor | None,
) -> None:
    """:func:`_triton_backward` and :func:`_triton_weight_gradient` over a sample: per chunk,
    its rows gathered once, both kernels on them, its weight gradient stored into its rows of
    ``grad_weight``."""
    from .triton_kernels import embedding_gradient, weight_gradient

    k = chunks.k
    scale, lse, grad = scale.contiguous(), lse.contiguous(), grad.contiguous()
    for start, stop in chunks.ranges():
        centers = chunks.weight_rows(start, stop)  # (c·K, D), gathered
        inv_norms = chunks.inv_norms[start * k : stop * k].contiguous()  # (c·K,)
        labels = chunks.labels - start  # (N,), the chunk's columns
        part_x, part_scale = embedding_gradient(
            chunks.x_gemm, centers, inv_norms, labels, scale, rule, lse, grad,
            sub_centers=k, chunk_size=stop - start,
        )  # fmt: skip
        grad_x_hat += part_x.to(grad_x_hat.dtype)
        if grad_scale is not None:
            grad_scale += part_scale.to(grad_scale.dtype)
        if grad_weight is None:
            continue
        rows = chunks.gradient_rows(grad_weight, start, stop)  # (c·K, D)
        partial = weight_gradient(
            chunks.x_gemm, centers, inv_norms, labels, scale, rule, lse, grad,
            sub_centers=k, start=0, stop=stop - start,
            out=rows if rows.dtype == torch.float32 else None,
        )  # fmt: skip
        chunks.project_into(grad_weight, start, stop, partial)
    chunks.release()


ROW_DOT_BLOCK = 1024
"""Rows per block of :func:`_row_dot`'s half-precision product (``1024·D`` elements: 1 MB at
D = 512 in bf16)."""


def _row_dot(a: Tensor, b: Tensor) -> Tensor:
    """Row-wise dot products ``Tensor[R, D], Tensor[R, D] -> Tensor[R]`` (in ``a``'s dtype).

    float32/float64: one batched GEMM (``bmm`` of ``R`` 1×D·D×1 products; no ``R×D``
    temporary). bf16/fp16: ``Σ_d a_rd·b_rd`` over blocks of :data:`ROW_DOT_BLOCK` rows, as the
    CPU's half-precision ``bmm`` of such thin products is slow: at R = 8192, D = 512 on the
    2-core CPU 0.64 ms against 6.6 ms (the bf16 weight gradient's projection spent 13% of a
    step in it; C = 1M bf16 step 10.1 -> 8.3 s). (Blocked float32 would be faster too, 0.86 vs
    2.5 ms, but measured 2-5 MB more peak memory under ``torch.compile``.)
    """
    if a.dtype in (torch.float32, torch.float64):
        return torch.bmm(a.unsqueeze(1), b.unsqueeze(2)).view(a.shape[0])
    out = torch.empty(a.shape[0], dtype=a.dtype, device=a.device)  # (R,)
    for start in range(0, a.shape[0], ROW_DOT_BLOCK):
        stop = start + ROW_DOT_BLOCK
        torch.sum(a[start:stop] * b[start:stop], dim=1, out=out[start:stop])
    return out


def _projection_coefficient(rows: Tensor, inv_norms: Tensor, partial: Tensor) -> Tensor:
    """``r²·(w·a)`` per row (0 where ``‖w‖ <= eps``, where normalization is a plain scaling)."""
    inside = inv_norms < 1.0 / NORMALIZE_EPS
    coefficient = _row_dot(rows, partial) * inv_norms * inv_norms
    return torch.where(inside, coefficient, torch.zeros_like(coefficient))


def _project(partial: Tensor, weight_rows: Tensor, inv_norms: Tensor) -> None:
    """Project ``partial = r·Σ_i G_ij x̂_i`` (``Tensor[R, D]``) in place through the Jacobian of
    ``w/‖w‖``: ``partial_j -= r_j²(w_j·partial_j)·w_j``, given the rows ``w`` (``Tensor[R, D]``,
    any dtype) and their ``r`` (``Tensor[R]``)."""
    rows = weight_rows.to(partial.dtype)  # (R, D); a bf16 weight is projected in bf16
    coefficient = _projection_coefficient(rows, inv_norms, partial)  # (R,)
    # With a bf16 partial and a float32 coefficient, addcmul_ computes through float32 copies
    # of its operands: blocks of PROJECTION_BLOCK rows keep those copies small.
    step = max(1, rows.shape[0]) if partial.dtype == coefficient.dtype else PROJECTION_BLOCK
    for a in range(0, rows.shape[0], step):
        b = a + step
        partial[a:b].addcmul_(rows[a:b], coefficient[a:b].unsqueeze(1), value=-1.0)


def _project_rows_into(
    grad_weight: Tensor, index: Tensor, partial: Tensor, rows: Tensor, inv_norms: Tensor
) -> None:
    """:func:`_project_into` for scattered rows ``index`` (repeats accumulate)."""
    coefficient = _projection_coefficient(rows, inv_norms, partial)  # (N,)
    partial = partial - rows * coefficient.unsqueeze(1)
    # index_put_ with accumulate: ~10x faster than index_add_ on CPU for a large destination
    grad_weight.index_put_((index,), partial.to(grad_weight.dtype), accumulate=True)


def chunked_margin_cross_entropy(
    embeddings: Tensor,
    weight: Tensor,
    labels: Tensor,
    margin: Margin,
    *,
    sub_centers: int = 1,
    chunk_size: int | None = None,
    kernels: str | None = None,
    sampled_classes: Tensor | None = None,
) -> Tensor:
    """Per-sample margin softmax cross-entropy, never materializing the ``N×C`` logits.

    Same value and gradients as
    :func:`~marginface.executors.dense.dense_margin_cross_entropy` (up to rounding), with
    ``O(N·chunk_size·K)`` extra memory (one chunk's logits, reused from chunk to chunk).
    Stateful margins update exactly as on the dense path. AdaCos with ``dynamic=True`` in
    training mode takes one extra pass over the classes (its scale must be known before the
    logits are formed). Runs in float32 (float64 if an input is float64); a bf16/fp16 weight is
    multiplied in its own dtype, with fp32 normalization, margin and log-sum-exp.
    Supports one backward (no double backward).

    Args:
        embeddings: ``Tensor[N, D]``, unnormalized.
        weight: ``Tensor[C·K, D]`` class centers, unnormalized, class-major.
        labels: ``Tensor[N]`` int64 in ``[0, C)`` (not checked here; the heads check).
        margin: the margin; see :func:`check_chunkable` for which run chunked.
        sub_centers: ``K >= 1``. Chunks hold whole classes (``chunk_size·K`` weight rows).
        chunk_size: classes per chunk, ``>= 1``. Default: None,
            :func:`default_chunk_size` (a 16 MiB workspace: 8192 classes for N = 512, K = 1
            in float32, 5461 with a bf16 weight; with ``sampled_classes`` and D = 512, 2730
            and 3276).
        kernels: who runs the per-chunk work, one of :data:`KERNELS`. Default: None, read
            from the environment variable :data:`KERNELS_ENV` (``MARGINFACE_KERNELS``; unset
            means ``"auto"``: Triton for CUDA tensors when triton imports, for the identity and
            CurricularFace non-target rules and float32/bf16/fp16 GEMMs; else PyTorch).
            ``"triton"`` raises ``ValueError`` where the kernels cannot run.
        sampled_classes: Partial FC's sample, ``int64[S]``: sorted distinct classes in
            ``[0, C)`` (not checked here; the heads build it). The softmax then runs over these
            ``S`` classes only, ``labels`` are positions in ``sampled_classes`` (in
            ``[0, S)``), and the sampled rows are read from ``weight`` in place, one chunk at a
            time: the same loss and gradients as passing ``weight.view(C, K, D)
            [sampled_classes].reshape(-1, D)``, without that ``S·K×D`` copy or its gradient
            (the weight's gradient is ``Tensor[C·K, D]``, exactly 0 outside the sample).
            Default: None (every class).

    Returns:
        ``Tensor[N]``, float32 (or float64).
    """
    check_chunkable(margin)
    sampled_classes = check_sampled_classes(sampled_classes, weight)
    if chunk_size is not None:
        chunk_size = check_int("chunk_size", chunk_size, minimum=1)
    sub_centers = check_int("sub_centers", sub_centers, minimum=1)
    if kernels is not None:
        kernels = check_choice("kernels", kernels, KERNELS)
    if weight.dim() != 2 or weight.shape[0] % sub_centers:
        raise ValueError(
            f"weight must have shape (C·K, D) with K = sub_centers = {sub_centers}, "
            f"got {tuple(weight.shape)}"
        )
    dtype = compute_dtype(embeddings, weight)
    gemm = gemm_dtype(embeddings, weight)
    from .fused_op import fused_margin_cross_entropy, nontarget_rule

    rule = nontarget_rule(margin)
    with torch.autocast(device_type=embeddings.device.type, enabled=False):
        x = embeddings.to(dtype)
        if rule is not None:  # the custom ops: torch.compile traces them without graph breaks
            loss = fused_margin_cross_entropy(
                x,
                weight,
                labels,
                margin,
                rule,
                sub_centers=sub_centers,
                chunk_size=chunk_size,
                kernels=kernels,
                sampled_classes=sampled_classes,
            )
        else:  # another non-target rule: the autograd Function (a graph break under compile)
            loss = _ChunkedMarginCrossEntropy.apply(
                x, weight, labels, labels, margin, sub_centers, chunk_size, gemm, kernels,
                None, sampled_classes,
            )  # fmt: skip
        norms = row_norms(x) if margin.requires_norms else None  # (N,)
        extra = margin.regularizer(norms)
        if extra is not None:
            loss = loss + extra
    return loss


def sharded_margin_cross_entropy(
    embeddings: Tensor,
    weight: Tensor,
    targets: Tensor,
    labels: Tensor,
    margin: Margin,
    shard: ClassShard,
    *,
    sub_centers: int = 1,
    chunk_size: int | None = None,
    kernels: str | None = None,
    sampled_classes: Tensor | None = None,
) -> Tensor:
    """Per-sample margin softmax cross-entropy of the *global* batch, classes sharded over the
    ranks of ``shard`` (:mod:`~marginface.executors.sharding`).

    Every rank calls it with its own rows; the embeddings are all-gathered, each rank runs the
    chunked executor over its own classes, and the partial results merge by all-reductions, so
    every rank returns the same ``Tensor[N_global]``. No rank holds more than
    ``N_global × chunk_size·K`` logits. The labels were checked and gathered by the caller
    (:meth:`~marginface.executors.sharding.ClassShard.gather_metadata`).

    Args:
        embeddings: ``Tensor[n_r, D]``, this rank's rows (``n_r`` may differ between ranks).
        weight: ``Tensor[c·K, D]``, the centers of this rank's classes.
        targets: ``Tensor[N_global]`` int64, each row's class among ``weight``'s (among
            ``sampled_classes``, if given), ``-1`` where another rank owns it.
        labels: ``Tensor[N_global]`` int64, the global labels (what the margin sees).
        margin: the margin (every margin that runs chunked).
        shard: this rank's :class:`~marginface.executors.sharding.ClassShard` (its ``counts``
            set for this step).
        sub_centers, chunk_size, kernels: as :func:`chunked_margin_cross_entropy`.
        sampled_classes: this rank's Partial FC sample, ``int64[S_r]`` sorted distinct classes
            of ``weight`` (local indices), read in place as in
            :func:`chunked_margin_cross_entropy`; the softmax runs over every rank's sample.
            Default: None (every class).

    Returns:
        ``Tensor[N_global]``, float32 (or float64), identical on every rank. The gradient
        reaching ``embeddings`` is this rank's rows of the gradient of the global loss.
    """
    check_chunkable(margin)
    sampled_classes = check_sampled_classes(sampled_classes, weight)
    dtype = compute_dtype(embeddings, weight)
    gemm = gemm_dtype(embeddings, weight)
    with torch.autocast(device_type=embeddings.device.type, enabled=False):
        x = embeddings.to(dtype)
        loss = _ChunkedMarginCrossEntropy.apply(
            x, weight, targets, labels, margin, sub_centers, chunk_size, gemm, kernels, shard,
            sampled_classes,
        )  # fmt: skip
        norms = row_norms(x) if margin.requires_norms else None  # (n_r,)
        extra = margin.regularizer(norms)  # (n_r,) or None, the same on every rank
        if extra is not None:
            rows = shard.rows
            gathered = shard.gather_rows(extra.detach())  # (N,), only this rank's rows keep
            loss = loss + torch.cat([gathered[: rows.start], extra, gathered[rows.stop :]])
    return loss
