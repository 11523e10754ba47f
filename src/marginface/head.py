"""The head: an ``nn.Module`` that owns the class centers and wires one margin to one executor."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ._validation import (
    check_choice,
    check_device,
    check_dtype,
    check_embeddings,
    check_int,
    check_labels,
    check_representable,
)
from .executors.chunked import (
    DEFAULT_CHUNK_SIZE,
    check_chunkable,
    chunked_margin_cross_entropy,
)
from .executors.dense import (
    compute_dtype,
    dense_margin_cross_entropy,
    normalized_cosine,
    row_norms,
)
from .margins.base import Margin

__all__ = ["AUTO_CHUNKED_MIN_LOGITS", "IMPLEMENTATIONS", "REDUCTIONS", "MarginSoftmaxLoss"]

REDUCTIONS = ("mean", "sum", "none")
IMPLEMENTATIONS = ("dense", "chunked", "auto")

AUTO_CHUNKED_MIN_LOGITS = 1 << 24
"""``impl="auto"`` runs chunked once a batch's logit matrix has at least this many entries
(``N·C >= 16M``, 64 MB in fp32, e.g. N = 512 and C >= 32768), on any device. Measured on a
2-core CPU (``benchmarks/bench_fused.py``, N = D = 512): at C = 10k fp32 the dense path was
faster, at C = 100k the chunked one (and it needs ~14 MB instead of ~780 MB)."""


class MarginSoftmaxLoss(nn.Module):
    r"""Margin-based softmax cross-entropy with learnable class centers.

    .. math::
        L = \frac1N\sum_i -\log\frac{e^{\text{logit}_{i,y_i}}}{\sum_j e^{\text{logit}_{ij}}},\qquad
        \text{logit} = \text{margin}\Big(\frac{x_i^\top w_j}{\|x_i\|\|w_j\|},\ y_i\Big)

    Args:
        num_classes: ``C >= 2``.
        embedding_dim: ``D >= 1``.
        margin: the :class:`~marginface.margins.Margin` that turns cosines into logits.
        sub_centers: ``K >= 1`` centers per class, cosine max-pooled over them. Default: 1.
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"`` (``Tensor[N]``).
        impl: the executor. ``"dense"`` (default) materializes the ``N×C`` logits;
            ``"chunked"`` never does (:mod:`marginface.executors.chunked`; raises
            ``ValueError`` for a margin that cannot run chunked); ``"auto"`` picks chunked per
            batch once ``N·C >= AUTO_CHUNKED_MIN_LOGITS`` (16M) and the margin can run chunked, else
            dense.
        chunk_size: classes per chunk of the chunked executor, ``>= 1``. Default: None
            (:data:`~marginface.executors.chunked.DEFAULT_CHUNK_SIZE`).
        device, dtype: where and how the class centers are created.

    Attributes:
        weight: ``Parameter[C·K, D]``, the class centers (class-major for sub-centers),
            initialized ``N(0, 0.01²)`` (insightface); only their direction matters.
        margin: the margin module (its buffers are part of this module's ``state_dict``).
    """

    def __init__(
        self,
        num_classes: int,
        embedding_dim: int,
        margin: Margin,
        *,
        sub_centers: int = 1,
        reduction: str = "mean",
        impl: str = "dense",
        chunk_size: int | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.num_classes = check_int("num_classes", num_classes, minimum=2)
        self.embedding_dim = check_int("embedding_dim", embedding_dim, minimum=1)
        self.sub_centers = check_int("sub_centers", sub_centers, minimum=1)
        self.reduction = check_choice("reduction", reduction, REDUCTIONS)
        self.impl = check_choice("impl", impl, IMPLEMENTATIONS)
        if not isinstance(margin, Margin):
            raise TypeError(f"margin must be a marginface Margin, got {type(margin).__name__}")
        dtype = check_dtype("dtype", dtype)
        device = check_device("device", device)
        compute = torch.float64 if dtype == torch.float64 else torch.float32
        for name, value in vars(margin).items():
            if isinstance(value, float):
                check_representable(name, value, compute)
        if impl == "chunked":
            check_chunkable(margin)
        self.chunk_size = (
            DEFAULT_CHUNK_SIZE
            if chunk_size is None
            else check_int("chunk_size", chunk_size, minimum=1)
        )
        self.margin = margin
        self.weight = nn.Parameter(
            torch.empty(num_classes * sub_centers, embedding_dim, device=device, dtype=dtype)
        )
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Re-draw the class centers from ``N(0, 0.01²)``."""
        nn.init.normal_(self.weight, std=0.01)

    def cosine(self, embeddings: Tensor) -> Tensor:
        """Cosines to every class center, ``Tensor[N, D] -> Tensor[N, C]`` (sub-centers pooled).

        Computed in float32 (float64 for float64 inputs) with autocast disabled.
        """
        check_embeddings(embeddings, self.embedding_dim)
        dtype = compute_dtype(embeddings, self.weight)
        with torch.autocast(device_type=embeddings.device.type, enabled=False):
            return normalized_cosine(embeddings.to(dtype), self.weight.to(dtype), self.sub_centers)

    def logits(self, embeddings: Tensor, labels: Tensor | None = None) -> Tensor:
        """Scaled logits ``Tensor[N, C]``.

        With ``labels``: margin-adjusted, as the loss sees them (in training mode this advances
        stateful margins, like :meth:`forward`). Without: plain ``s·cos θ`` for inference
        (seed 004's eval branch), with the margin's current scale.
        """
        cosine = self.cosine(embeddings)
        norms = row_norms(embeddings.to(cosine.dtype))
        if labels is None:
            return cosine * self.margin.scale_for(norms)
        labels = check_labels(labels, embeddings.shape[0], self.num_classes)
        return self.margin.apply(cosine, labels, norms if self.margin.requires_norms else None)

    def forward(self, embeddings: Tensor, labels: Tensor) -> Tensor:
        """The loss.

        Args:
            embeddings: ``Tensor[N, D]`` (any floating dtype; the math runs in fp32 or fp64).
            labels: ``Tensor[N]`` of class indices in ``[0, C)``, any integer dtype.

        Returns:
            A 0-dim tensor (``"mean"``, ``"sum"``) or ``Tensor[N]`` (``"none"``).
        """
        check_embeddings(embeddings, self.embedding_dim)
        labels = check_labels(labels, embeddings.shape[0], self.num_classes)
        if self.executor(embeddings.shape[0]) == "chunked":
            per_sample = chunked_margin_cross_entropy(
                embeddings,
                self.weight,
                labels,
                self.margin,
                sub_centers=self.sub_centers,
                chunk_size=self.chunk_size,
            )
        else:
            per_sample = dense_margin_cross_entropy(
                embeddings, self.weight, labels, self.margin, sub_centers=self.sub_centers
            )
        if self.reduction == "mean":
            return per_sample.mean()
        if self.reduction == "sum":
            return per_sample.sum()
        return per_sample

    def executor(self, batch_size: int) -> str:
        """The executor a batch of ``batch_size`` rows runs on: ``"dense"`` or ``"chunked"``."""
        if self.impl != "auto":
            return self.impl
        if batch_size * self.num_classes < AUTO_CHUNKED_MIN_LOGITS:
            return "dense"
        try:
            check_chunkable(self.margin)
        except ValueError:
            return "dense"
        return "chunked"

    def extra_repr(self) -> str:
        extra = f", sub_centers={self.sub_centers}" if self.sub_centers > 1 else ""
        return (
            f"num_classes={self.num_classes}, embedding_dim={self.embedding_dim}{extra}, "
            f"reduction={self.reduction!r}, impl={self.impl!r}"
            + (f", chunk_size={self.chunk_size}" if self.impl != "dense" else "")
        )
