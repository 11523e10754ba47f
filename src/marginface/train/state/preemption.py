"""Preemption: SIGTERM or SIGUSR1 asks a training run to checkpoint and stop between steps.

Clusters warn a job before they kill it: Kubernetes sends SIGTERM and waits
``terminationGracePeriodSeconds`` (30 s by default); Slurm sends SIGTERM, and with
``#SBATCH --signal=USR1@90`` SIGUSR1 90 s before the end of the time limit; torchrun forwards
the signals it handles to its workers (SIGTERM always; SIGUSR1 when listed in
``TORCHELASTIC_SIGNALS_TO_HANDLE``) and kills them 30 s later.

:class:`StopSignals` installs handlers that only set a flag. The trainer looks at it after every
step; in a distributed run the ranks agree with one all-reduce (:func:`agree`), so every rank
stops after the same step even when the signal reached only some of them. The group then writes
a step checkpoint and :class:`TrainingPreemptedError` carries the exit status
(:data:`PREEMPTED_EXIT_CODE`, 143 = 128 + SIGTERM, what a shell reports for a process ended by
SIGTERM, which Slurm's and Kubernetes' requeue rules can match) and a one-line message saying
where the run resumes (docs/training.md, docs/distributed.md).

Further signals while the step finishes change nothing (torchrun sends its SIGTERM twice);
a process that does not stop in time is killed by whoever sent the signal (torchrun after its
``--shutdown-timeout``, Kubernetes after ``terminationGracePeriodSeconds``).
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist

from .step_position import StepPosition

__all__ = [
    "PREEMPTED_EXIT_CODE",
    "STOP_SIGNALS",
    "StopSignals",
    "TrainingPreemptedError",
    "agree",
    "preempted",
]

PREEMPTED_EXIT_CODE = 143
"""The exit status of ``marginface train`` stopped by a signal after its checkpoint (128 + 15,
as for a process ended by SIGTERM)."""

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
"""The signals that ask a run to checkpoint and stop."""


class TrainingPreemptedError(Exception):
    """A signal stopped the run between two steps, after a checkpoint of that position.

    Attributes:
        signal_name: ``"SIGTERM"`` or ``"SIGUSR1"``.
        exit_code: the status the command line exits with (:data:`PREEMPTED_EXIT_CODE`).
    """

    def __init__(self, message: str, *, signal_name: str, exit_code: int = PREEMPTED_EXIT_CODE):
        super().__init__(message)
        self.signal_name = signal_name
        self.exit_code = exit_code


class StopSignals:
    """Context manager: while active, :data:`STOP_SIGNALS` set :attr:`received` instead of
    ending the process; the previous handlers come back on exit. Outside the main thread
    (where Python cannot install handlers) it does nothing and :attr:`installed` is False.

    Args:
        signals: the signals to catch. Default: :data:`STOP_SIGNALS`.
    """

    def __init__(self, signals: tuple[signal.Signals, ...] = STOP_SIGNALS) -> None:
        self.signals = tuple(signals)
        self.received: signal.Signals | None = None
        self.installed = False
        self._previous: dict[signal.Signals, Any] = {}

    def _handle(self, number: int, _frame: FrameType | None) -> None:
        self.received = self.received or signal.Signals(number)  # the first one is reported

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for number in self.signals:
                self._previous[number] = signal.signal(number, self._handle)
            self.installed = True
        return self

    def __exit__(self, *exc: object) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler if handler is not None else signal.SIG_DFL)
        self._previous.clear()
        self.installed = False


def agree(
    flags: list[bool], *, distributed: bool, device: torch.device | str = "cpu"
) -> list[bool]:
    """Each flag true on any rank, the same on every rank (one ``MAX`` all-reduce of
    ``int32[len(flags)]`` when ``distributed``; the flags unchanged otherwise)."""
    if not distributed:
        return list(flags)
    values = torch.tensor([int(bool(f)) for f in flags], dtype=torch.int32, device=device)
    dist.all_reduce(values, op=dist.ReduceOp.MAX)
    return [bool(v) for v in values.tolist()]


def preempted(
    signals: StopSignals, position: StepPosition, steps_per_epoch: int, run_dir: Path
) -> TrainingPreemptedError:
    """The error that ends a run stopped by a signal after the checkpoint of ``position``:
    where it stopped, where its checkpoint is and the command that continues it."""
    name = signals.received.name if signals.received is not None else "a signal"
    return TrainingPreemptedError(
        f"{name} on a rank: stopped after step {position.step} of {steps_per_epoch} of epoch "
        f"{position.epoch + 1} and wrote its checkpoint to {run_dir}; continue with "
        f"`marginface train --out {run_dir} --resume` (or the same command line with "
        "--resume-if-exists)",
        signal_name=name,
    )
