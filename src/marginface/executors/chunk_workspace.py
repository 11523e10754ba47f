"""The chunk loop's workspace: the inputs of one call, their normalizations, the chunk GEMM.

A :class:`ChunkWorkspace` holds ``x̂`` (``Tensor[N, D]``), the raw class centers
(``Tensor[C·K, D]``, read in place), their inverse norms ``r_j = 1/max(‖w_j‖, eps)``, the
labels, and one reused buffer per dtype for a chunk's ``N×c·K`` GEMM result. Its
:meth:`~ChunkWorkspace.cosine` gives one chunk's cosines, weight normalization fused as a
per-column scaling (no normalized copy of the weight is ever made), and
:meth:`~ChunkWorkspace.project_into` writes one chunk's weight gradient through the Jacobian of
``w/‖w‖``. Its :meth:`~ChunkWorkspace.fold` is the one loop over the class chunks: every pass
(the softmax's and the one-vs-all's, forward and backward, on PyTorch ops or on the Triton
kernels' gathered chunks) is a step it folds over them; the passes are in
:mod:`~marginface.executors.chunk_loop`, :mod:`~marginface.executors.binary_passes` and
:mod:`~marginface.executors.triton_dispatch`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch
from torch import Tensor

from .dense import NORMALIZE_EPS

__all__ = [
    "PROJECTION_BLOCK",
    "ROW_DOT_BLOCK",
    "ChunkWorkspace",
    "project_scattered_rows",
    "through_normalization",
]

State = TypeVar("State")

PROJECTION_BLOCK = 256
"""Weight rows per block when a half-precision weight gradient is projected (see
:func:`_project`): its float32 temporaries stay at ``3·256·D`` floats."""

ROW_DOT_BLOCK = 1024
"""Rows per block of :func:`_row_dot`'s half-precision product (``1024·D`` elements: 1 MB at
D = 512 in bf16)."""


class ChunkWorkspace:
    """One call's chunk loop state: inputs, their normalizations, the chunk GEMM, and the
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
    (:meth:`gradient_rows`, :meth:`project_into`): no ``S·K×D`` copy of the sampled centers
    or of their gradient exists at any time. ``inv_norms`` is then ``Tensor[S·K]`` (the
    sampled rows').

    ``triton``: the call runs on the Triton kernels; with CUDA tensors the inverse norms are
    then one kernel launch (:meth:`_inverse_norms`).
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
        *,
        triton: bool = False,
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
        self._products: Tensor | None = None  # (N·C·K,), GEMM dtype: kept chunk products
        self._kept: set[int] = set()  # the chunks (by start) whose products are kept
        self.triton = triton  # the call runs on the Triton kernels
        if inv_norms is None:  # (C·K,) or (S·K,), compute dtype; given: the forward's, reused
            inv_norms = self._inverse_norms(x_hat.dtype)
        self.inv_norms = inv_norms

    def _inverse_norms(self, dtype: torch.dtype) -> Tensor:
        """``1 / max(‖w_j‖, eps)`` of every weight row (of every sampled row), ``Tensor[C·K]``
        (``Tensor[S·K]``) in ``dtype``.

        A weight of another dtype (bf16/fp16 into float32) is converted block by block through
        the workspace: ``vector_norm(weight, dtype=float32)`` would convert all of it at once (a
        float32 copy, twice the size of a bf16 weight). Sampled rows are gathered block by block
        the same way. A call on the Triton kernels with CUDA tensors takes one launch of
        :func:`~marginface.executors.triton_weight_norms.inverse_norms` instead (the rows read
        in place, in their own dtype, through the sample's index; float32 sums).
        """
        weight = self.weight
        if weight.dtype == dtype and self.sample is None:
            norms = torch.linalg.vector_norm(weight, dim=1)  # (C·K,)
        elif self.triton and weight.is_cuda and dtype == torch.float32:
            from .triton_weight_norms import inverse_norms

            index = None if self.sample is None else self.weight_index(0, self.num_classes)
            return inverse_norms(weight, NORMALIZE_EPS, index)
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
        """Free the workspace (at the end of each pass; products kept by
        :meth:`keep_products` stay until :meth:`drop_products`)."""
        self._buffers.clear()
        self._gathered = None

    def keep_products(self, store: Tensor) -> None:
        """From now on keep each chunk's GEMM product ``rows @ W_chunkᵀ`` in ``store``
        (``Tensor[≥ N·C·K]`` of the GEMM dtype; chunk ``[start, stop)`` at elements
        ``[N·start·K, N·stop·K)``), so that the next pass over the same chunk reads it instead
        of multiplying again: the row-block tiling's one pass
        (:func:`~marginface.executors.chunk_loop.row_block_pass`). The passes must then
        multiply the same ``rows`` (``x̂`` or ``s·x̂``); :meth:`cosine` never writes into a kept
        product."""
        needed = self.x_hat.shape[0] * self.num_classes * self.k
        if store.dtype != self.gemm or store.numel() < needed:
            raise ValueError(
                f"store must hold {needed} elements of dtype {self.gemm}, "
                f"got {store.numel()} of {store.dtype}"
            )
        self._products = store
        self._kept = set()

    def drop_products(self) -> None:
        """Stop keeping chunk products (:meth:`keep_products`); the store is the caller's."""
        self._products = None
        self._kept = set()

    def ranges(self, step: int | None = None) -> list[tuple[int, int]]:
        """Class ranges ``[start, stop)`` of the chunks, or of ``step`` classes each (the last
        one shorter)."""
        step = step or self.chunk_size
        return [(lo, min(lo + step, self.num_classes)) for lo in range(0, self.num_classes, step)]

    def fold(self, step: Callable[[int, int, State], State], state: State) -> State:
        """The loop over the class chunks, written once: ``state = step(start, stop, state)``
        for each chunk ``[start, stop)`` in order (a reduction's running statistics, a sum, a
        gradient share, or None for a pass that only writes), then :meth:`release`. Returns
        the final ``state``."""
        for start, stop in self.ranges():
            state = step(start, stop, state)
        self.release()
        return state

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

    def row_block(self, start: int, stop: int, chunk_size: int) -> ChunkWorkspace:
        """A workspace over rows ``[start, stop)`` of this one (the same weight, sample and
        inverse norms; chunks of ``chunk_size`` classes): one block of the row-block tiling."""
        return ChunkWorkspace(
            self.x_hat[start:stop],
            self.weight,
            self.labels[start:stop],
            self.k,
            chunk_size,
            self.gemm,
            inv_norms=self.inv_norms,
            sample=self.sample,
            triton=self.triton,
        )

    def add_unprojected(
        self, grad_weight: Tensor, start: int, stop: int, g_dot: Tensor, *, overwrite: bool
    ) -> None:
        """Write (``overwrite``) or add the chunk's ``partial = g_dotᵀ x̂`` (``g_dot``:
        ``Tensor[N, c·K]`` in the GEMM dtype, ``∂L/∂(x̂·w)``) into its rows of ``grad_weight``,
        not yet projected through ``w/‖w‖`` (:meth:`project_rows` does that, once). A sample's
        rows are added with ``index_put_`` (``grad_weight`` must then start at zero)."""
        if self.sample is not None:
            partial = torch.mm(g_dot.t(), self.x_gemm)  # (c·K, D)
            index = self.weight_index(start, stop)  # (c·K,)
            grad_weight.index_put_((index,), partial.to(grad_weight.dtype), accumulate=True)
            return
        rows = grad_weight[start * self.k : stop * self.k]  # (c·K, D)
        if grad_weight.dtype != self.gemm:
            partial = torch.mm(g_dot.t(), self.x_gemm).to(grad_weight.dtype)
            if overwrite:
                rows.copy_(partial)
            else:
                rows.add_(partial)
        elif overwrite:
            torch.mm(g_dot.t(), self.x_gemm, out=rows)
        else:
            rows.addmm_(g_dot.t(), self.x_gemm)

    def project_rows(self, grad_weight: Tensor, start: int, stop: int) -> None:
        """Project the chunk's rows of ``grad_weight`` (written by :meth:`add_unprojected`)
        through the Jacobian of ``w/‖w‖``, in place."""
        if self.sample is None:
            partial = grad_weight[start * self.k : stop * self.k]  # a view: in place
        else:
            partial = grad_weight.index_select(0, self.weight_index(start, stop))
        self.project_into(grad_weight, start, stop, partial)

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
        raw = self._product(start, stop, rows)  # (N, c·K), GEMM dtype
        inv_norms = self.inv_norms[start * self.k : stop * self.k]  # (c·K,)
        out = raw if self._products is None else None  # a kept product is read, not written
        if raw.dtype != accumulate:  # a half GEMM: promote into the float32 workspace first
            # (an op mixing the dtypes would make a hidden float32 copy of raw)
            raw = out = self.scratch(n, width, accumulate).copy_(raw)
        if out is None:
            out = self.scratch(n, width, accumulate)
        if shift is not None and self.k == 1:
            offset = shift.neg().unsqueeze(1)  # (N, 1)
            return torch.addcmul(offset, raw, inv_norms, out=out), None
        raw = torch.mul(raw, inv_norms, out=out)
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

    def filtered_cosine(
        self, start: int, stop: int, threshold: float, *, argmax: bool = False
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """The chunk's cosines ``Tensor[N, c]`` (:meth:`cosine` of ``x̂``, the workspace),
        inter-class filtered: the entries above ``threshold`` (``τ > 0``; 0: off) set to 0,
        value and gradient. Returns them, the winning sub-centers if ``argmax`` (None if
        K = 1), and the filtered entries' mask (``bool[N, c]``, None when nothing is
        filtered) for the gradient."""
        cos, best = self.cosine(start, stop, self.x_gemm, argmax=argmax)  # (N, c)
        dirty = None
        if threshold > 0:
            dirty = cos > threshold  # (N, c)
            cos = cos.masked_fill_(dirty, 0.0)
        return cos, best, dirty

    def _product(self, start: int, stop: int, rows: Tensor) -> Tensor:
        """``rows @ W_chunkᵀ`` (``Tensor[N, c·K]``, GEMM dtype): in the workspace, or in the
        kept products (:meth:`keep_products`), multiplied only the first time."""
        n, width = rows.shape[0], (stop - start) * self.k
        if self._products is None:
            out = self.scratch(n, width, self.gemm)
        else:
            out = self._products[n * start * self.k : n * stop * self.k].view(n, width)
            if start in self._kept:
                return out
            self._kept.add(start)
        return torch.mm(rows, self.weight_rows(start, stop).t(), out=out)

    def target_slots(self, start: int, stop: int) -> tuple[Tensor, Tensor]:
        """Rows whose label lies in ``[start, stop)`` and that label's column in the chunk."""
        inside = (self.labels >= start) & (self.labels < stop)  # (N,)
        rows = inside.nonzero().squeeze(1)  # (r,)
        return rows, self.labels[rows] - start


def _row_dot(a: Tensor, b: Tensor) -> Tensor:
    """Row-wise dot products ``Tensor[R, D], Tensor[R, D] -> Tensor[R]`` (in ``a``'s dtype).

    float32/float64: one batched GEMM (``bmm`` of ``R`` 1×D·D×1 products; no ``R×D``
    temporary). bf16/fp16: ``Σ_d a_rd·b_rd`` over blocks of :data:`ROW_DOT_BLOCK` rows, as the
    CPU's half-precision ``bmm`` of such thin products is slow (docs/benchmarks.md). Blocked
    float32 would hold a little more peak memory under ``torch.compile``, so float32 keeps
    ``bmm``.
    """
    if a.dtype in (torch.float32, torch.float64):
        return torch.bmm(a.unsqueeze(1), b.unsqueeze(2)).view(a.shape[0])
    out = torch.empty(a.shape[0], dtype=a.dtype, device=a.device)  # (R,)
    for start in range(0, a.shape[0], ROW_DOT_BLOCK):
        stop = start + ROW_DOT_BLOCK
        torch.sum(a[start:stop] * b[start:stop], dim=1, out=out[start:stop])
    return out


def through_normalization(x_hat: Tensor, norms: Tensor, grad_x_hat: Tensor) -> Tensor:
    """``∂L/∂x`` from ``∂L/∂x̂`` through ``x̂ = x / max(‖x‖, eps)`` (``Tensor[N, D]`` each,
    ``norms``: ``Tensor[N]``): the tangential part over ``‖x‖``, or ``∂L/∂x̂ / eps`` where
    ``‖x‖ <= eps``. The backward of every chunked path (softmax, one-vs-all, sharded)."""
    safe = norms > NORMALIZE_EPS  # (N,)
    radial = _row_dot(x_hat, grad_x_hat)  # (N,)
    tangent = grad_x_hat - x_hat * radial.unsqueeze(1)  # (N, D)
    return torch.where(
        safe.unsqueeze(1),
        tangent / norms.clamp_min(NORMALIZE_EPS).unsqueeze(1),
        grad_x_hat / NORMALIZE_EPS,
    )


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


def project_scattered_rows(
    grad_weight: Tensor, index: Tensor, partial: Tensor, rows: Tensor, inv_norms: Tensor
) -> None:
    """Add ``∂L/∂w`` of the scattered weight rows ``index`` (``int64[R]``; repeats
    accumulate) into ``grad_weight``, given ``partial = r·Σ G x̂`` (``Tensor[R, D]``), the rows
    ``w`` and their ``r``: as :meth:`ChunkWorkspace.project_into`."""
    coefficient = _projection_coefficient(rows, inv_norms, partial)  # (N,)
    partial = partial - rows * coefficient.unsqueeze(1)
    # index_put_ with accumulate: ~10x faster than index_add_ on CPU for a large destination
    grad_weight.index_put_((index,), partial.to(grad_weight.dtype), accumulate=True)
