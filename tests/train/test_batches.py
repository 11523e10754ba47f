"""The batches a training step trains on (train/batches.py): :class:`BatchSource` on images
held in memory and on a streamed training set."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from marginface.data.base import ImageSet, StreamedImageSet
from marginface.train.batches import BatchSource, epoch_generator, global_batch


def _images(n: int = 10) -> ImageSet:
    rng = np.random.default_rng(0)
    images = rng.random((n, 1, 4, 4), dtype=np.float32)
    return ImageSet(images, np.arange(n) % 3, ("a", "b", "c"))


class _Items(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        self.n = n
        self.epochs: list[int] = []

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.full((1, 4, 4), float(i)), i % 3

    def set_epoch(self, epoch: int) -> None:
        self.epochs.append(epoch)


def test_a_batch_is_the_indexed_images_and_int64_labels():
    train = _images()
    source = BatchSource(train, device=torch.device("cpu"))
    index = torch.tensor([7, 2, 5])
    images, labels = source.batch(index)
    assert torch.equal(images, torch.as_tensor(train.images)[index])
    assert labels.dtype == torch.int64 and labels.tolist() == [1, 2, 2]
    assert len(source) == 10 and not source.streamed
    assert source.epoch_loader(torch.arange(10), epoch=0, steps=2, batch_size=5) is None


def test_the_augmentation_draws_from_the_given_generator_only():
    calls = []

    def shift(images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        calls.append(generator)
        return images + torch.rand((), generator=generator)

    source = BatchSource(_images(), device=torch.device("cpu"), augmentation=shift)
    index = torch.tensor([0, 1])
    plain, _ = source.batch(index)  # no generator: not augmented
    assert calls == [] and torch.equal(plain, torch.as_tensor(_images().images)[index])
    first, _ = source.batch(index, torch.Generator().manual_seed(3))
    again, _ = source.batch(index, torch.Generator().manual_seed(3))
    assert len(calls) == 2 and torch.equal(first, again) and not torch.equal(first, plain)


def test_channels_last_and_a_batch_already_loaded():
    source = BatchSource(_images(), device=torch.device("cpu"), channels_last=True)
    images, _ = source.batch(torch.tensor([0, 1]))
    assert images.is_contiguous(memory_format=torch.channels_last)
    loaded = (torch.ones(2, 1, 4, 4), torch.tensor([4, 5], dtype=torch.int32))
    images, labels = source.batch(torch.tensor([0, 1]), loaded=loaded)
    assert torch.equal(images, loaded[0]) and labels.dtype == torch.int64
    assert labels.tolist() == [4, 5]


def test_images_per_epoch_counts_the_batches_run():
    source = BatchSource(_images(10), device=torch.device("cpu"))
    assert source.images_per_epoch(2, 4) == 8  # the last image dropped (a batch of one)
    assert source.images_per_epoch(3, 4) == 10


@pytest.mark.parametrize(("rank", "world"), [(0, 1), (1, 2)])
def test_a_streamed_set_reads_this_ranks_share_from_the_first_step(rank, world):
    items = _Items(12)
    train = StreamedImageSet(items, np.arange(12) % 3, shape=(1, 4, 4))
    source = BatchSource(train, device=torch.device("cpu"))
    assert source.streamed and source.images is None and len(source) == 12
    order = torch.randperm(12, generator=epoch_generator(0, 1))
    loader = source.epoch_loader(
        order, epoch=1, steps=3, batch_size=4, rank=rank, world=world, first_step=1
    )
    assert items.epochs == [1]
    for step in (1, 2):
        images, labels = next(loader)
        expected = global_batch(order, step, 4).tensor_split(world)[rank]
        assert images[:, 0, 0, 0].long().tolist() == expected.tolist()
        assert labels.tolist() == (expected % 3).tolist()
    with pytest.raises(StopIteration):
        next(loader)
