"""Where a run stands inside an epoch, and when to checkpoint there.

A checkpoint written at the end of epoch ``e`` says "``e`` epochs done"; a step checkpoint
(``train --checkpoint-every N`` steps or ``--checkpoint-every-minutes M``) also holds a
:class:`StepPosition`: the epoch in progress, the steps of it already trained, the running sums
of its log row and the state of its augmentation generator. Everything else an exact
continuation needs is either saved with every checkpoint (weights, optimizer, schedule, gradient
scaler, the global torch RNG of each rank: :mod:`.run_state`) or a function of the position:

* the epoch's order is the permutation drawn by
  :func:`~marginface.train.batches.epoch_generator` ``(seed, epoch)`` (the seed is saved in the
  configuration), so step ``k``'s global batch is ``order[k·B : (k+1)·B]`` at any world size;
* each rank's loader position is the step: every rank trains its
  :func:`~marginface.train.distributed.rank_slice` of the same global batch at every step, and a
  streamed training set draws its flips from ``(seed, epoch, index)``;
* gradient accumulation runs all ``grad_accumulation`` micro-batches of a step before its
  optimizer step, so a checkpoint (always taken between steps) is at accumulation phase 0.

A run resumed from a step checkpoint therefore trains the next batch and ends with the weights
of an uninterrupted run, bit for bit on the same world size and device (docs/training.md).

:func:`host_rng_state` / :func:`restore_host_rng_state` carry the Python and NumPy generators
(marginface's training draws from neither; a user's augmentation or callback may);
:func:`seed_host_generators` seeds both from the run's seed and the rank when a run starts, so
two runs of one command draw the same host numbers, as they draw the same torch numbers.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from .layout import position_label

__all__ = [
    "CheckpointInterval",
    "EpochTally",
    "StepPosition",
    "continue_epoch",
    "host_rng_state",
    "restore_host_rng_state",
    "seed_host_generators",
]


@dataclass
class StepPosition:
    """The position of a run inside an epoch.

    Attributes:
        epoch: the epoch in progress, counted from 0 (``epoch`` epochs are complete).
        step: the steps of that epoch already trained (the next step to train, from 0).
        loss_total: Σ over those steps of (the global batch's loss × its images), for the
            epoch's mean training loss.
        images: the images of those steps (global batches).
        seconds: the training seconds of the epoch so far (its log row's ``seconds`` adds up
            the time of every part of an epoch resumed in the middle).
        augment_state: the epoch's augmentation generator's state
            (``torch.Generator.get_state()``, ``uint8[n]``) after ``step`` steps, this rank's;
            None without augmentation.
    """

    epoch: int
    step: int
    loss_total: float = 0.0
    images: int = 0
    seconds: float = 0.0
    augment_state: Tensor | None = None

    def plain(self) -> dict[str, Any]:
        """The position without its tensor, as JSON-friendly numbers."""
        return {
            "epoch": int(self.epoch),
            "step": int(self.step),
            "loss_total": float(self.loss_total),
            "images": int(self.images),
            "seconds": float(self.seconds),
        }

    @classmethod
    def from_plain(cls, plain: dict[str, Any], augment_state: Tensor | None = None) -> StepPosition:
        """The position saved by :meth:`plain` (and its generator state, saved beside it)."""
        return cls(
            epoch=int(plain["epoch"]),
            step=int(plain["step"]),
            loss_total=float(plain.get("loss_total", 0.0)),
            images=int(plain.get("images", 0)),
            seconds=float(plain.get("seconds", 0.0)),
            augment_state=augment_state,
        )

    def label(self) -> str:
        """A name that sorts like the positions: ``epoch-0002-step-0000013`` (2 epochs and 13
        steps done); an epoch's end is step 0 of the next epoch."""
        return position_label(self.epoch, self.step)


def continue_epoch(
    position: StepPosition | None, augment: torch.Generator | None = None
) -> tuple[int, float, int, float]:
    """Where an epoch starts: ``(first step, loss total, images, seconds)``, zeros for a new
    epoch, a step checkpoint's for a resumed one (whose saved state ``augment``, the epoch's
    augmentation generator, is then set to)."""
    if position is None:
        return 0, 0.0, 0, 0.0
    if augment is not None and position.augment_state is not None:
        augment.set_state(position.augment_state)
    return position.step, position.loss_total, position.images, position.seconds


@dataclass
class EpochTally:
    """The epoch in progress: the running sums of its log row, and its :class:`StepPosition`
    after any step (what a step checkpoint saves).

    Attributes:
        epoch: the epoch, counted from 0.
        step: the steps of it trained so far (by this process and, when resumed, before).
        loss_total: Σ over those steps of (the global batch's loss × its images).
        images: the images of those steps (global batches).
        seconds_before: training seconds of the epoch before this process took it up (a step
            checkpoint's; 0 for a new epoch).
        augment: the epoch's augmentation generator, or None without augmentation.
        began: ``time.perf_counter()`` when this process began training the epoch
            (:meth:`start_clock`).
    """

    epoch: int
    step: int = 0
    loss_total: float = 0.0
    images: int = 0
    seconds_before: float = 0.0
    augment: torch.Generator | None = None
    began: float = 0.0

    @classmethod
    def resume(
        cls, epoch: int, position: StepPosition | None, augment: torch.Generator | None = None
    ) -> EpochTally:
        """Epoch ``epoch`` from its first step, or from ``position`` (a step checkpoint's: its
        sums, and its generator state set into ``augment``; :func:`continue_epoch`)."""
        step, loss_total, images, seconds = continue_epoch(position, augment)
        return cls(epoch, step, loss_total, images, seconds, augment, time.perf_counter())

    def start_clock(self) -> None:
        """The epoch's training time counts from now (after its loader started)."""
        self.began = time.perf_counter()

    def add(self, loss: float, images: int) -> None:
        """One more step done: its global batch's mean ``loss`` over ``images`` images."""
        self.loss_total += loss * images
        self.images += images
        self.step += 1

    @property
    def mean_loss(self) -> float:
        """The epoch's mean training loss over its samples so far."""
        return self.loss_total / self.images

    def global_step(self, steps_per_epoch: int) -> int:
        """The optimizer steps done over the run: ``epoch · steps_per_epoch + step``."""
        return self.epoch * steps_per_epoch + self.step

    def position(self) -> StepPosition:
        """Where the epoch stands now: the sums, the training seconds
        (``seconds_before`` + the time since :attr:`began`) and the augmentation generator's
        state."""
        seconds = self.seconds_before + time.perf_counter() - self.began
        state = self.augment.get_state() if self.augment is not None else None
        return StepPosition(self.epoch, self.step, self.loss_total, self.images, seconds, state)


@dataclass(frozen=True)
class CheckpointInterval:
    """When to write a step checkpoint inside an epoch (the end of every epoch checkpoints
    anyway).

    Args:
        steps: after every optimizer step whose number (counted from 1 over the whole run,
            across epochs and resumes) is a multiple of ``steps``, or None. Must be >= 1.
        minutes: whenever ``minutes`` of wall-clock time have passed since the last checkpoint
            (or the start), or None. Must be > 0. Distributed runs take rank 0's clock (the
            ranks agree on every decision).
    """

    steps: int | None = None
    minutes: float | None = None

    def __post_init__(self) -> None:
        if self.steps is not None and (
            isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1
        ):
            raise ValueError(f"checkpoint_every_steps must be an integer >= 1, got {self.steps!r}")
        if self.minutes is not None and (
            isinstance(self.minutes, bool)
            or not isinstance(self.minutes, int | float)
            or not math.isfinite(self.minutes)
            or self.minutes <= 0
        ):
            raise ValueError(
                f"checkpoint_every_minutes must be a finite number > 0, got {self.minutes!r}"
            )

    @property
    def active(self) -> bool:
        """Whether any step checkpoint is asked for."""
        return self.steps is not None or self.minutes is not None

    def due(self, global_step: int, seconds_since: float) -> bool:
        """Whether a checkpoint is due after step ``global_step`` (counted from 1 over the
        run), ``seconds_since`` seconds after the last checkpoint."""
        if self.steps is not None and global_step % self.steps == 0:
            return True
        return self.minutes is not None and seconds_since >= 60.0 * self.minutes


def host_rng_state() -> dict[str, Tensor]:
    """The Python ``random`` and NumPy global generators' states as tensors (for
    ``weights_only`` loading and for ``torch.distributed.checkpoint``): ``python`` int64[626]
    (version, 624 words, position), ``numpy`` int64[627] (624 words, position, has_gauss,
    the cached Gaussian's float64 bits); ``numpy`` is absent without NumPy."""
    version, words, _gauss = random.getstate()
    state = {"python": torch.tensor([version, *words], dtype=torch.int64)}
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy comes with torch's usual installs
        return state
    _name, keys, position, has_gauss, cached = np.random.get_state()
    bits = torch.tensor([float(cached)], dtype=torch.float64).view(torch.int64)
    state["numpy"] = torch.cat(
        [
            torch.as_tensor(keys.astype("int64")),
            torch.tensor([int(position), int(has_gauss)], dtype=torch.int64),
            bits,
        ]
    )
    return state


def host_seed(seed: int, rank: int) -> int:
    """The host generators' seed of rank ``rank`` in a run seeded ``seed``:
    ``seed · 1_000_003 + rank`` reduced to 32 bits (NumPy's legacy seeding takes
    ``0 <= seed < 2**32``); distinct ranks of one run get distinct streams."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {seed!r}")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise ValueError(f"rank must be an int >= 0, got {rank!r}")
    return (seed * 1_000_003 + rank) % 2**32


def seed_host_generators(seed: int, rank: int = 0) -> None:
    """Seed Python's ``random`` and NumPy's global generator with :func:`host_seed`
    (``seed``, ``rank``): a run's host draws (a user's augmentation or callback) repeat from one
    launch of a command to the next and differ between ranks. A resumed run then puts back the
    checkpoint's states (:func:`restore_host_rng_state`), so it continues the same streams."""
    value = host_seed(seed, rank)
    random.seed(value)
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy comes with torch's usual installs
        return
    np.random.seed(value)


def restore_host_rng_state(state: dict[str, Tensor]) -> None:
    """Put back the generators saved by :func:`host_rng_state` (missing entries are left as
    they are)."""
    if "python" in state:
        values = [int(v) for v in state["python"].tolist()]
        random.setstate((values[0], tuple(values[1:]), None))
    if "numpy" in state:
        try:
            import numpy as np
        except ImportError:  # pragma: no cover
            return
        values = state["numpy"]
        keys = values[:624].numpy().astype("uint32")
        position, has_gauss = (int(v) for v in values[624:626].tolist())
        cached = float(values[626:627].view(torch.float64).item())
        np.random.set_state(("MT19937", keys, position, has_gauss, cached))
