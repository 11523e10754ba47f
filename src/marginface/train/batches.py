"""The batches of an epoch: its seeded order, each rank's share of every global batch, and the
``DataLoader`` that reads a streamed training set in that order.

Epoch ``e`` of a run seeded ``s`` walks the permutation drawn by :func:`epoch_generator`
``(s, e)``; step ``k`` trains on the global batch ``order[k·B : (k+1)·B]``, of which rank ``r``
of ``W`` takes :func:`~marginface.train.distributed.rank_slice`. The batches therefore depend
on the seed, the epoch and the step only: a resumed run, at any world size, sees the batches an
uninterrupted one would, also when it resumes inside an epoch (at the step of a
:class:`~marginface.train.state.step_position.StepPosition`; docs/training.md, docs/distributed.md).

:class:`BatchSource` turns a step's indices into the tensors the trainer's step trains on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor

from ..data.base import StreamedImageSet
from .distributed import rank_slice

__all__ = ["BatchSource", "epoch_generator", "global_batch", "streamed_batches"]


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


class BatchSource:
    """A training set's batches on the training device, augmented.

    Args:
        train: the training set: an ``ImageSet`` (``images`` ``float32[N, C, H, W]``, read
            once into a tensor and indexed per step) or a
            :class:`~marginface.data.base.StreamedImageSet` (read by a ``DataLoader`` per
            epoch, :meth:`epoch_loader`).
        device: the training device.
        augmentation: ``(images, generator) -> images``, the training-time jitter
            (:func:`~marginface.data.augment.build_augmentation`), or None.
        channels_last: hand the images over in ``torch.channels_last`` memory format.
    """

    def __init__(
        self,
        train: Any,
        *,
        device: torch.device,
        augmentation: Callable[[Tensor, torch.Generator], Tensor] | None = None,
        channels_last: bool = False,
    ) -> None:
        self.train = train
        self.device = device
        self.augmentation = augmentation
        self.channels_last = channels_last
        self.streamed = isinstance(train, StreamedImageSet)
        self.images = None if self.streamed else torch.as_tensor(train.images)
        self.labels = torch.as_tensor(train.labels, dtype=torch.int64)  # int64[N]

    def __len__(self) -> int:
        """The number of training images ``N``."""
        return len(self.labels)

    def images_per_epoch(self, steps: int, batch_size: int) -> int:
        """Training images an epoch of ``steps`` global batches of ``batch_size`` trains on:
        ``min(N, steps · batch_size)``."""
        return min(len(self), steps * batch_size)

    def epoch_loader(
        self,
        order: Tensor,
        *,
        epoch: int,
        steps: int,
        batch_size: int,
        rank: int = 0,
        world: int = 1,
        workers: int = 0,
        first_step: int = 0,
    ) -> Iterator[Any] | None:
        """For a streamed training set, :func:`streamed_batches` over the epoch's steps
        ``first_step``, ..., ``steps - 1`` (this rank's share; pinned memory on CUDA); None for
        images held in memory (:meth:`batch` indexes them)."""
        if not self.streamed:
            return None
        return streamed_batches(
            self.train.dataset,
            order,
            epoch=epoch,
            steps=steps,
            batch_size=batch_size,
            rank=rank,
            world=world,
            workers=workers,
            pin_memory=self.device.type == "cuda",
            first_step=first_step,
        )

    def batch(
        self,
        index: Tensor,
        augment_generator: torch.Generator | None = None,
        loaded: tuple[Tensor, Tensor] | None = None,
    ) -> tuple[Tensor, Tensor]:
        """The images ``float32[b, C, H, W]`` and labels ``int64[b]`` of ``index`` (``int64[b]``)
        on the device, augmented with ``augment_generator`` (when there is an augmentation and
        a generator); ``loaded``: the batch an :meth:`epoch_loader` already read."""
        if loaded is not None:
            images = loaded[0].to(self.device, non_blocking=True)
            labels = loaded[1].to(self.device, dtype=torch.int64, non_blocking=True)
        else:
            images = self.images[index].to(self.device, non_blocking=True)
            labels = self.labels[index].to(self.device, non_blocking=True)
        if self.augmentation is not None and augment_generator is not None:
            images = self.augmentation(images, augment_generator)
        if self.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        return images, labels
