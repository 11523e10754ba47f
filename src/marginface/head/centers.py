"""The class centers: where they are created (this process's block of classes when sharded),
how they are drawn, and the cosines to them.

Centers are ``Parameter[c·K, D]``, class-major for ``K`` sub-centers, drawn from
``N(0, 0.01²)`` (insightface); only their direction matters.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from ..executors.dense import compute_dtype, normalized_cosine
from ..executors.sharding import ClassShard

CENTER_STD = 0.01
"""Standard deviation of the centers' initial normal draw (insightface's)."""


def new_centers(
    classes: int,
    sub_centers: int,
    embedding_dim: int,
    *,
    device: torch.device | None,
    dtype: torch.dtype | None,
) -> nn.Parameter:
    """An uninitialized ``Parameter[classes·sub_centers, embedding_dim]`` (draw it with
    :func:`reset_centers`)."""
    return nn.Parameter(
        torch.empty(classes * sub_centers, embedding_dim, device=device, dtype=dtype)
    )


def reset_centers(weight: Tensor) -> None:
    """Re-draw ``weight`` in place from ``N(0, CENTER_STD²)``."""
    nn.init.normal_(weight, std=CENTER_STD)


def center_cosine(embeddings: Tensor, weight: Tensor, sub_centers: int) -> Tensor:
    """``cos θ`` of ``Tensor[N, D]`` rows to the centers ``Tensor[C·K, D]``, max-pooled over
    sub-centers: ``Tensor[N, C]``, in float32 (float64 for a float64 input), autocast off."""
    dtype = compute_dtype(embeddings, weight)
    with torch.autocast(device_type=embeddings.device.type, enabled=False):
        return normalized_cosine(embeddings.to(dtype), weight.to(dtype), sub_centers)


SIGNATURE_NAMES = (
    "num_classes",
    "embedding_dim",
    "sub_centers",
    "sample_rate",
    "dtype",
    "margin",
    "margin options",
)
"""What every rank of a class-sharded head must build alike (:func:`create_shard`)."""


def create_shard(group: Any, num_classes: int, signature: tuple[Any, ...]) -> ClassShard:
    """This rank's :class:`~marginface.executors.sharding.ClassShard` of ``num_classes``
    classes over ``group``, after checking (one small collective) that every rank builds the
    same head: ``signature`` holds the values named by :data:`SIGNATURE_NAMES`.

    Raises:
        ValueError: torch.distributed is not initialized, fewer classes than ranks, or the
            ranks' signatures differ (the same error on every rank, naming them).
        TypeError: ``group`` is not a ``ProcessGroup``.
    """
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError(
            "process_group was given but torch.distributed is not initialized; call "
            "torch.distributed.init_process_group first (or pass process_group=None)"
        )
    if not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"process_group must be a torch.distributed ProcessGroup, got {group!r}")
    world = dist.get_world_size(group)
    if num_classes < world:
        raise ValueError(
            f"num_classes = {num_classes} is smaller than the world size {world}: every "
            "rank must own at least one class"
        )
    shard = ClassShard.create(group, num_classes)
    signatures = shard.all_gather_objects(signature)
    if any(other != signatures[0] for other in signatures):
        differ = [
            f"{name}: " + ", ".join(f"rank {r}: {s[i]!r}" for r, s in enumerate(signatures))
            for i, name in enumerate(SIGNATURE_NAMES)
            if len({s[i] for s in signatures}) > 1
        ]
        raise ValueError(f"the ranks build different heads ({'; '.join(differ)})")
    return shard
