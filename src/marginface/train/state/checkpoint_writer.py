"""The trainer's checkpoint writing: when (epoch ends, step intervals), how many are kept,
synchronously or in the background, and what is on disk to say after a failure.

:class:`CheckpointWriter` wraps :func:`~marginface.train.state.run_state.save_run_state` for one
run: it remembers the checkpoint on disk (epoch and step, for the messages of
:func:`~marginface.train.state.run_state.describe_kept`), holds at most one background write
(:class:`~marginface.train.state.pending_checkpoint.PendingCheckpoint`: the next checkpoint, the end
of the run and a stop on a signal finish it first), and turns a full disk into one message
saying which checkpoint is kept.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist

from ..._atomic import DiskFullError
from .layout import CHECKPOINT_NAME, SHARDED_CHECKPOINT_NAME
from .pending_checkpoint import PendingCheckpoint
from .preemption import StopSignals, agree, preempted
from .run_state import RunObjects, describe_kept, save_run_state
from .step_position import CheckpointInterval, EpochTally, StepPosition

__all__ = ["CheckpointPolicy", "CheckpointWriter"]


@dataclass(frozen=True)
class CheckpointPolicy:
    """How a run checkpoints (``Trainer(checkpointing=...)``; the command line's options).

    Attributes:
        every_steps: also checkpoint inside an epoch after every step whose number over the
            run is a multiple of it (``train --checkpoint-every N``). Default: None.
        every_minutes: also checkpoint inside an epoch when this many minutes passed since the
            last checkpoint (``--checkpoint-every-minutes M``). Default: None.
        keep: how many checkpoints to keep, the older in ``checkpoints/`` (``--keep K``,
            :mod:`.kept_checkpoints`). Default: 1.
        asynchronous: copy the state at a checkpoint and write it in a background thread
            (``--async-checkpoint``, :mod:`.pending_checkpoint`). Default: False.
        stop_on_signals: while training, SIGTERM and SIGUSR1 make every rank finish its step,
            write a step checkpoint and raise
            :class:`~marginface.train.state.preemption.TrainingPreemptedError` (:mod:`.preemption`).
            Default: False (``marginface train`` turns it on).
    """

    every_steps: int | None = None
    every_minutes: float | None = None
    keep: int = 1
    asynchronous: bool = False
    stop_on_signals: bool = False

    def __post_init__(self) -> None:
        CheckpointInterval(self.every_steps, self.every_minutes)  # ValueError naming the value
        if isinstance(self.keep, bool) or not isinstance(self.keep, int) or self.keep < 1:
            raise ValueError(f"keep must be an integer >= 1, got {self.keep!r}")

    @property
    def interval(self) -> CheckpointInterval:
        """When a step checkpoint is due."""
        return CheckpointInterval(self.every_steps, self.every_minutes)


class CheckpointWriter:
    """Writes a run's checkpoints into ``run_dir`` as ``policy`` (a :class:`CheckpointPolicy`)
    says."""

    def __init__(self, run_dir: Path, policy: CheckpointPolicy | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.policy = policy or CheckpointPolicy()
        self.interval = self.policy.interval
        self.keep = self.policy.keep
        self.asynchronous = self.policy.asynchronous
        self.kept: tuple[int | None, int] = (None, 0)  # (epochs, steps) of the one on disk
        self.last_time = time.monotonic()
        self._pending: tuple[PendingCheckpoint, int, int] | None = None
        self._group: Any = None  # the gloo group of sharded background writes

    def restored(self, epoch: int, step: int) -> None:
        """The run continues from the checkpoint of ``epoch`` epochs and ``step`` steps."""
        self.kept = (epoch, step)
        self.last_time = time.monotonic()

    def due(self, global_step: int) -> bool:
        """Whether a step checkpoint is due after step ``global_step`` (counted from 1)."""
        return self.interval.due(global_step, time.monotonic() - self.last_time)

    def decide(
        self, global_step: int, signals: StopSignals, distributed: bool, device: Any = "cpu"
    ) -> tuple[bool, bool]:
        """``(checkpoint due, stop asked)`` after step ``global_step`` (counted from 1), the
        same on every rank: one all-reduce when distributed and a signal handler or a
        wall-clock interval could make the ranks differ (a step interval cannot)."""
        due = self.due(global_step)
        stop = signals.received is not None
        if distributed and (signals.installed or self.interval.minutes is not None):
            due, stop = agree([due, stop], distributed=True, device=device)
        return due, stop

    def after_step(
        self,
        tally: EpochTally,
        *,
        steps_per_epoch: int,
        signals: StopSignals,
        distributed: bool,
        device: Any,
        save: Callable[..., None],
    ) -> None:
        """After each optimizer step of ``tally``'s epoch (every rank calls it): when a step
        checkpoint is due or a signal asks to stop (the same on every rank: :meth:`decide`),
        ``save(epoch, position, wait=stop)`` with the epoch's :meth:`EpochTally.position`
        (not at the epoch's last step without a stop: the epoch's end checkpoints), then, on a
        stop, raise :class:`~marginface.train.state.preemption.TrainingPreemptedError`."""
        global_step = tally.global_step(steps_per_epoch)
        due, stop = self.decide(global_step, signals, distributed, device)
        if not (due or stop):
            return
        where = tally.position()
        if where.step < steps_per_epoch or stop:
            save(where.epoch, where, wait=stop)
        if stop:
            raise preempted(signals, where, steps_per_epoch, self.run_dir)

    def way_forward(self) -> str:
        """What the user can do now, true to what is on disk."""
        return describe_kept(self.run_dir, *self.kept)

    def write(
        self,
        objects: RunObjects,
        *,
        epoch: int,
        position: StepPosition | None,
        distributed: bool,
        wait: bool = False,
        **run: Any,
    ) -> None:
        """Checkpoint ``epoch`` completed epochs (and ``position`` inside the next one); all
        ranks call it. ``run``: the ``config``, ``meta`` and ``history`` saved with it. A
        background write still running is finished first; ``wait``: this one too.

        Raises:
            marginface._atomic.DiskFullError: one line naming the file and what is kept.
        """
        self.finish()
        asynchronous = self.asynchronous and not wait
        if asynchronous and distributed and self._group is None:
            self._group = dist.new_group(backend="gloo")  # every rank is here: collective
        step = position.step if position is not None else 0
        name = SHARDED_CHECKPOINT_NAME if distributed else CHECKPOINT_NAME
        written = self._disk_full_said(
            self.run_dir / name,
            lambda: save_run_state(
                self.run_dir,
                objects,
                epoch=epoch,
                distributed=distributed,
                position=position,
                keep=self.keep,
                asynchronous=asynchronous,
                process_group=self._group,
                **run,
            ),
        )
        self.last_time = time.monotonic()
        if isinstance(written, PendingCheckpoint):
            self._pending = (written, epoch, step)
        else:
            self.kept = (epoch, step)

    def finish(self) -> None:
        """Complete the background write, if any (all ranks call it)."""
        if self._pending is None:
            return
        pending, epoch, step = self._pending
        self._pending = None
        self._disk_full_said(pending.path, pending.finish)
        self.kept = (epoch, step)

    def abandon(self) -> None:
        """After a failure: wait for the background write without publishing it."""
        if self._pending is not None:
            self._pending[0].abandon()
            self._pending = None

    def _disk_full_said(self, path: Path, work: Any) -> Any:
        """``work()``; a full disk re-raised naming ``path``, the checkpoint being written
        (``checkpoint.pt``, or the folder ``checkpoint/`` of a sharded run), and what is kept."""
        try:
            return work()
        except DiskFullError as error:
            raise DiskFullError(
                error.errno,
                f"disk full: could not write {path} (free some space); {self.way_forward()}",
                str(path),
            ) from error
