"""Training progress: a tqdm bar on a terminal, periodic log lines anywhere else, and the ETA.

The other long loops (evaluation, conversion, IJB) show theirs with :func:`track` and
:class:`Progress` (:mod:`marginface._progress`, re-exported here), in the same modes and at
the same interval.

A progress bar redraws itself with carriage returns; in a file (CI, ``nohup``, a cluster
job's log) every redraw stays, thousands per run. So when stderr is not a terminal the
trainer logs one line instead (logger ``marginface.train.progress``, level INFO) every
``interval`` seconds and at the end of every epoch::

    epoch 3/30  step 12/28  loss 1.2345  2345 img/s  eta 0:00:05 (run 0:02:10)

``loss`` is the epoch's running mean over samples, ``img/s`` the epoch's training throughput,
``eta`` the rest of the epoch and, in brackets, of the run, evaluations included
(:class:`ProgressReporter`: the training seconds per step so far in this process times the
steps left, plus each evaluation left at the time of the last one of its kind).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any, Literal

from .._progress import (
    BAR_DELAY_SECONDS,
    DEFAULT_PROGRESS_SECONDS,
    PROGRESS_MODES,
    Mode,
    Progress,
    ProgressSettings,
    check_progress_seconds,
    format_duration,
    progress_callback,
    progress_output,
    progress_settings,
    resolve_progress_mode,
    track,
)

__all__ = [
    "BAR_DELAY_SECONDS",
    "DEFAULT_PROGRESS_SECONDS",
    "FORWARD_ONLY_SPEEDUP",
    "PROGRESS_MODES",
    "EpochProgress",
    "Progress",
    "ProgressReporter",
    "ProgressSettings",
    "check_progress_seconds",
    "format_duration",
    "progress_callback",
    "progress_output",
    "progress_settings",
    "resolve_progress_mode",
    "track",
]

logger = logging.getLogger(__name__)


FORWARD_ONLY_SPEEDUP = 3.0
"""How much faster the evaluation embeds an image than a training step trains on one (a
forward pass against a forward and a backward pass, about twice as long): the ETA's guess of
an evaluation's time before the first one is measured."""


class ProgressReporter:
    """The progress of one :meth:`~marginface.train.Trainer.fit`, and its ETA.

    The ETA of the run is the training steps left times the training seconds per step so far
    (in this process, evaluation excluded) plus the evaluations left: one after every epoch
    and one every ``verify_every`` steps, each taking as long as the last one of its kind
    (:meth:`evaluated`), or, before the first, ``evaluation_images`` (``verification_images``)
    embedded at :data:`FORWARD_ONLY_SPEEDUP` times the epoch's training throughput.

    Args:
        mode: ``"bar"``, ``"lines"`` or ``"none"`` (see :func:`resolve_progress_mode`).
        epochs: the run's number of epochs.
        steps_per_epoch: optimizer steps per epoch.
        start_epoch: the first epoch this process trains (0-based; > 0 when resuming).
        interval: seconds between two lines in ``"lines"`` mode (>= 0; 0: every step).
            Default: :data:`DEFAULT_PROGRESS_SECONDS`.
        evaluation_images: images the evaluation after an epoch embeds (flipped copies
            counted). Default: 0 (no guess before the first is measured).
        verify_every: steps between two verifications of the ``.bin`` sets (None: none).
        verification_images: images one of those verifications embeds.
        label: shown before every line and in the bar (``compare``/``demo``: the loss).
        clock: seconds, monotonic (tests pass a fake). Default: ``time.perf_counter``.
    """

    def __init__(
        self,
        mode: Mode,
        *,
        epochs: int,
        steps_per_epoch: int,
        start_epoch: int = 0,
        interval: float = DEFAULT_PROGRESS_SECONDS,
        evaluation_images: int = 0,
        verify_every: int | None = None,
        verification_images: int = 0,
        label: str = "",
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if not (isinstance(interval, int | float) and interval >= 0 and math.isfinite(interval)):
            raise ValueError(f"interval must be a finite number of seconds >= 0, got {interval!r}")
        self.mode = mode
        self.epochs = epochs
        self.steps_per_epoch = steps_per_epoch
        self.interval = float(interval)
        self.clock = clock
        self.started = clock()
        self.steps_at_start = start_epoch * steps_per_epoch
        self.stepped = False  # a step was reported
        self.images = {"epoch": evaluation_images, "step": verification_images}
        self.verify_every = verify_every or None
        self.label = label
        self.evaluation_seconds = 0.0  # evaluation time of this process so far
        self.last_evaluation: dict[str, float | None] = {"epoch": None, "step": None}

    def epoch(self, epoch: int) -> EpochProgress:
        """The progress of epoch ``epoch`` (0-based)."""
        return EpochProgress(self, epoch)

    def evaluated(self, kind: Literal["epoch", "step"], seconds: float) -> None:
        """An evaluation took ``seconds``: ``"epoch"``, the one after an epoch; ``"step"``, a
        verification every ``verify_every`` steps. The ETA counts the next ones as long."""
        self.evaluation_seconds += seconds
        self.last_evaluation[kind] = seconds

    def evaluation_estimate(
        self, kind: Literal["epoch", "step"], images_per_second: float
    ) -> float:
        """Seconds the next evaluation of ``kind`` should take: the last one measured, else
        its images at :data:`FORWARD_ONLY_SPEEDUP` × ``images_per_second`` (training)."""
        measured = self.last_evaluation[kind]
        if measured is not None:
            return measured
        if not self.images[kind] or not images_per_second > 0:
            return 0.0
        return self.images[kind] / (FORWARD_ONLY_SPEEDUP * images_per_second)

    def verifications_between(self, first_step: int, last_step: int) -> int:
        """Verifications due after step ``first_step`` up to step ``last_step`` (global
        steps counted from 1)."""
        if self.verify_every is None:
            return 0
        return last_step // self.verify_every - first_step // self.verify_every

    def remaining(
        self,
        epoch: int,
        done: int,
        *,
        epoch_train_seconds: float,
        images: int,
        done_before: int = 0,
    ) -> tuple[float, float]:
        """``(epoch_eta, run_eta)`` in seconds after ``done`` steps of epoch ``epoch``
        (0-based), of which this process trained ``done - done_before`` (a step checkpoint
        resumed after ``done_before``) in ``epoch_train_seconds`` for ``images`` images: the
        steps left at the training seconds per step (the epoch's, and the process's for the
        run) plus the evaluations left (the epoch's own included)."""
        spe = self.steps_per_epoch
        rate = images / epoch_train_seconds if epoch_train_seconds > 0 else 0.0
        epoch_eval = self.evaluation_estimate("epoch", rate)
        step_eval = self.evaluation_estimate("step", rate)
        now_step = epoch * spe + done  # global steps done
        epoch_eta = (
            epoch_train_seconds / max(done - done_before, 1) * (spe - done)
            + epoch_eval
            + self.verifications_between(now_step, (epoch + 1) * spe) * step_eval
        )
        run_done = now_step - self.steps_at_start
        train_seconds = self.clock() - self.started - self.evaluation_seconds
        run_eta = (
            max(train_seconds, 0.0) / max(run_done, 1) * (self.epochs * spe - now_step)
            + (self.epochs - epoch) * epoch_eval
            + self.verifications_between(now_step, self.epochs * spe) * step_eval
        )
        return epoch_eta, run_eta


class EpochProgress:
    """One epoch's progress: call :meth:`update` after every step and :meth:`close` at the end
    (made by :meth:`ProgressReporter.epoch`)."""

    def __init__(self, reporter: ProgressReporter, epoch: int) -> None:
        self.reporter = reporter
        self.epoch = epoch
        self.began = reporter.clock()
        self.evaluation_at_start = reporter.evaluation_seconds
        self.done_before: int | None = None  # steps of the epoch trained before a resume
        self.last_line = self.began
        self.bar: Any = None
        if reporter.mode == "bar":
            from tqdm.auto import tqdm

            label = f"{reporter.label} " if reporter.label else ""
            self.bar = tqdm(
                total=reporter.steps_per_epoch,
                desc=f"{label}epoch {epoch + 1}/{reporter.epochs}",
                leave=False,
            )

    def update(self, step: int, *, loss: float, mean_loss: float, images: int) -> None:
        """Step ``step`` (0-based) of the epoch is done.

        Args:
            loss: the step's loss (shown by the bar).
            mean_loss: the epoch's mean loss over samples so far (shown by the lines).
            images: training images of the epoch so far (of the global batches).
        """
        reporter = self.reporter
        if reporter.mode == "none":
            return
        now = reporter.clock()
        # the epoch's training time: verifications inside the epoch left out
        elapsed = now - self.began - (reporter.evaluation_seconds - self.evaluation_at_start)
        done = step + 1
        if self.done_before is None:  # the first step this process trains in the epoch
            self.done_before = step
            if not reporter.stepped:  # the process's first: the run's steps count from it
                reporter.stepped = True
                reporter.steps_at_start = self.epoch * reporter.steps_per_epoch + step
        epoch_eta, run_eta = reporter.remaining(
            self.epoch,
            done,
            epoch_train_seconds=elapsed,
            images=images,
            done_before=self.done_before,
        )
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(
                loss=f"{loss:.4f}",
                img_s=f"{images / max(elapsed, 1e-9):.0f}",
                eta=f"{epoch_eta:.0f}s",
                refresh=False,
            )
            return
        last = done == reporter.steps_per_epoch
        if not last and now - self.last_line < reporter.interval:
            return
        self.last_line = now
        logger.info(
            "%sepoch %d/%d  step %d/%d  loss %.4f  %.0f img/s  eta %s (run %s)",
            f"[{reporter.label}] " if reporter.label else "",
            self.epoch + 1,
            reporter.epochs,
            done,
            reporter.steps_per_epoch,
            mean_loss,
            images / max(elapsed, 1e-9),
            format_duration(epoch_eta),
            format_duration(run_eta),
        )

    def close(self) -> None:
        """End the epoch (removes the bar)."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
