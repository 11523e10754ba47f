"""Class sharding over ``torch.distributed``: who owns which classes, and the collectives.

With a process group of ``W`` ranks, rank ``r`` owns the contiguous block of classes
``[r·B, min((r+1)·B, C))`` with ``B = ⌈C / W⌉`` (``torch.chunk``'s split, which is also how a
DTensor sharded on dim 0 is laid out, so checkpoints reshard through
``torch.distributed.checkpoint``). A class's sub-centers always live on its owner.

Each step, every rank all-gathers the embeddings (and labels) of the global batch; the chunked
executor then runs over the rank's own classes and merges its per-row partial results with the
other ranks' by all-reductions:

* the target cosine ``cos θ_{i,y_i}`` is an indexed dot on the owner of ``y_i`` and an
  all-reduce (sum) elsewhere, so a margin's ``prepare`` sees the global batch's target cosines
  and norms, on every rank, identically;
* the non-target log-sum-exp statistics ``(max, Σexp)`` merge exactly (max, then a rescaled sum);
* in backward, the partial gradients of the gathered embeddings are summed over ranks and each
  rank keeps its own rows.

Local batch sizes may differ between ranks and between steps. Every check that could fail on
one rank only (label range, embedding width, dtype, finiteness) is decided on metadata gathered
from every rank first, so all ranks raise the same error instead of some of them hanging.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = ["ClassShard", "class_partition", "scale_gradient"]

_DTYPE_CODES = {torch.float16: 1, torch.bfloat16: 2, torch.float32: 3, torch.float64: 4}


def class_partition(num_classes: int, world_size: int) -> list[tuple[int, int]]:
    """The class range ``[start, stop)`` of every rank: blocks of ``⌈C / W⌉`` in rank order
    (the last ones may be shorter, or empty when ``C`` is not much larger than ``W``)."""
    block = -(-num_classes // world_size)
    return [
        (min(r * block, num_classes), min((r + 1) * block, num_classes)) for r in range(world_size)
    ]


class _ScaleGradient(torch.autograd.Function):
    """Identity forward; backward multiplies the gradient by ``factor``."""

    @staticmethod
    def forward(ctx, x: Tensor, factor: float) -> Tensor:  # type: ignore[override]
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        return grad * ctx.factor, None


def scale_gradient(x: Tensor, factor: float) -> Tensor:
    """``x`` unchanged, with its gradient multiplied by ``factor`` on the way back.

    The sharded head applies it with ``factor = W`` to the local embeddings: the loss is the
    mean over the global batch, each rank's backbone gradient is its exact share of that
    loss's gradient, and DistributedDataParallel *averages* (sums, then divides by ``W``) the
    backbone gradients over ranks; the factor ``W`` makes that average the gradient of the
    global-batch loss, as one process training on the concatenated batch would compute it.
    """
    if factor == 1:
        return x
    return _ScaleGradient.apply(x, factor)


@dataclass
class ClassShard:
    """This rank's share of a class-sharded head, and the collectives the executor needs.

    Attributes:
        group: the process group (None: the default group).
        rank, world_size: this process's rank in ``group`` and the group's size.
        start, stop: the classes this rank owns, ``[start, stop)``.
        counts: the local batch size of every rank in the current step (set by
            :meth:`gather_metadata`).
    """

    group: dist.ProcessGroup | None
    rank: int
    world_size: int
    start: int
    stop: int
    counts: list[int] = field(default_factory=list)

    @classmethod
    def create(cls, group: dist.ProcessGroup | None, num_classes: int) -> ClassShard:
        """The shard of this process in ``group`` for ``num_classes`` classes."""
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        start, stop = class_partition(num_classes, world)[rank]
        return cls(group, rank, world, start, stop)

    @property
    def rows(self) -> slice:
        """This rank's rows in the gathered global batch of the current step."""
        offset = sum(self.counts[: self.rank])
        return slice(offset, offset + self.counts[self.rank])

    # ------------------------------------------------------------------ collectives
    def all_sum_(self, tensor: Tensor) -> Tensor:
        """Sum ``tensor`` over ranks, in place; returns it."""
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.group)
        return tensor

    def all_max_(self, tensor: Tensor) -> Tensor:
        """Elementwise maximum of ``tensor`` over ranks, in place; returns it."""
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=self.group)
        return tensor

    def all_gather_objects(self, value: object) -> list[object]:
        """``value`` of every rank, in rank order (small Python objects only)."""
        gathered: list[object] = [None] * self.world_size
        dist.all_gather_object(gathered, value, group=self.group)
        return gathered

    def gather_metadata(
        self, embeddings: Tensor, labels: Tensor, num_classes: int
    ) -> list[list[float]]:
        """Gather ``[n, D, dtype, min label, max label, finite]`` of every rank, set
        :attr:`counts`, and raise the same ``ValueError``/``TypeError`` on every rank when any
        rank's batch is bad (naming the rank)."""
        n = int(embeddings.shape[0])
        finite = float(bool(torch.isfinite(embeddings).all())) if n else 1.0
        low = float(labels.min()) if labels.numel() else 0.0
        high = float(labels.max()) if labels.numel() else 0.0
        row = [float(n), float(embeddings.shape[1]), float(_DTYPE_CODES.get(embeddings.dtype, 0))]
        row += [low, high, finite, float(labels.numel())]
        local = torch.tensor(row, dtype=torch.float64, device=embeddings.device)
        table = [torch.empty_like(local) for _ in range(self.world_size)]
        dist.all_gather(table, local, group=self.group)
        rows = [t.tolist() for t in table]
        widths = {int(r[1]) for r in rows}
        if len(widths) > 1:
            detail = ", ".join(f"rank {i}: D = {int(r[1])}" for i, r in enumerate(rows))
            raise ValueError(f"embeddings must have the same width D on every rank ({detail})")
        dtypes = {int(r[2]) for r in rows}
        if len(dtypes) > 1:
            names = {code: str(dtype) for dtype, code in _DTYPE_CODES.items()}
            detail = ", ".join(f"rank {i}: {names.get(int(r[2]), '?')}" for i, r in enumerate(rows))
            raise TypeError(f"embeddings must have the same dtype on every rank ({detail})")
        for i, r in enumerate(rows):
            if int(r[6]) != int(r[0]):
                raise ValueError(
                    f"rank {i}: labels must have one entry per row: {int(r[0])} embeddings, "
                    f"{int(r[6])} labels"
                )
            if r[5] < 1:
                raise ValueError(f"rank {i}: embeddings contain non-finite values (NaN or inf)")
            if r[0] and (r[3] < 0 or r[4] >= num_classes):
                bad = int(r[3]) if r[3] < 0 else int(r[4])
                raise ValueError(
                    f"rank {i}: labels must lie in [0, {num_classes - 1}] for num_classes = "
                    f"{num_classes}, got {bad}"
                )
        if sum(int(r[0]) for r in rows) == 0:
            raise ValueError("the global batch is empty on every rank; a loss needs one sample")
        self.counts = [int(r[0]) for r in rows]
        return rows

    def gather_rows(self, local: Tensor) -> Tensor:
        """Concatenate every rank's rows (``Tensor[n_r, ...]``, sizes :attr:`counts`) into
        ``Tensor[N, ...]`` in rank order. No autograd."""
        largest = max(self.counts)
        padded = local.new_zeros((largest, *local.shape[1:]))
        padded[: local.shape[0]] = local
        parts = [torch.empty_like(padded) for _ in range(self.world_size)]
        dist.all_gather(parts, padded.contiguous(), group=self.group)
        return torch.cat([part[:count] for part, count in zip(parts, self.counts, strict=True)])

    def merge_statistics(self, statistics: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        """Merge per-row ``(max, Σexp)`` of disjoint class slices across ranks (exact)."""
        row_max, exp_sum = statistics
        merged_max = self.all_max_(row_max.clone())
        shift = torch.where(torch.isfinite(merged_max), merged_max, torch.zeros_like(merged_max))
        factor = torch.where(
            torch.isfinite(row_max), torch.exp(row_max - shift), torch.zeros_like(row_max)
        )
        return merged_max, self.all_sum_(exp_sum * factor)
