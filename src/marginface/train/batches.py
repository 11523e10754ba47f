"""The batches of an epoch: its seeded order, each rank's share of every global batch, and the
``DataLoader`` that reads a streamed training set in that order.

Epoch ``e`` of a run seeded ``s`` walks the permutation drawn by :func:`epoch_generator`
``(s, e)``; step ``k`` trains on the global batch ``order[k·B : (k+1)·B]``, of which rank ``r``
of ``W`` takes :func:`~marginface.train.distributed.rank_slice`. The batches therefore depend
on the seed, the epoch and the step only: a resumed run, at any world size, sees the batches an
uninterrupted one would, also when it resumes inside an epoch (at the step of a
:class:`~marginface.train.step_position.StepPosition`; docs/training.md, docs/distributed.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

from .distributed import rank_slice

__all__ = ["epoch_generator", "global_batch", "streamed_batches"]


def epoch_generator(seed: int, epoch: int, stream: int = 0) -> torch.Generator:
    """The CPU generator of one epoch: stream 0 shuffles, stream 1 draws augmentations."""
    return torch.Generator().manual_seed(seed * 1_000_003 + epoch + stream * 7_919_000_011)


def global_batch(order: Tensor, step: int, batch_size: int) -> Tensor:
    """The indices ``int64[≤ B]`` of step ``step``'s global batch in the epoch's ``order``."""
    return order[step * batch_size : (step + 1) * batch_size]


def streamed_batches(
    dataset: Any,
    order: Tensor,
    *,
    epoch: int,
    steps: int,
    batch_size: int,
    rank: int = 0,
    world: int = 1,
    workers: int = 0,
    pin_memory: bool = False,
    first_step: int = 0,
) -> Iterator[Any]:
    """An iterator over this rank's share of each of the epoch's global batches
    ``first_step``, ..., ``steps - 1`` of ``dataset`` (a streamed training set, e.g.
    insightface's ``train.rec``), read by a ``DataLoader`` with ``workers`` worker processes; a
    dataset with ``set_epoch`` is told the epoch (its augmentation draws, a function of the
    epoch and the sample, so a loader started at ``first_step`` reads what an uninterrupted
    one would from there)."""
    from torch.utils.data import DataLoader

    inner = getattr(dataset, "dataset", dataset)  # a Subset's dataset (--limit)
    if hasattr(inner, "set_epoch"):
        inner.set_epoch(epoch)
    batches = []
    for step in range(first_step, steps):
        index = global_batch(order, step, batch_size)
        if world > 1:
            index = rank_slice(index, rank, world)
        batches.append(index.tolist())
    loader = DataLoader(dataset, batch_sampler=batches, num_workers=workers, pin_memory=pin_memory)
    return iter(loader)
