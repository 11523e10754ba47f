"""Training progress: a tqdm bar on a terminal, periodic log lines anywhere else.

A progress bar redraws itself with carriage returns; in a file (CI, ``nohup``, a cluster
job's log) every redraw stays, thousands per run. So when stderr is not a terminal the
trainer logs one line instead (logger ``marginface.train.progress``, level INFO) every
``interval`` seconds and at the end of every epoch::

    epoch 3/30  step 12/28  loss 1.2345  2345 img/s  eta 0:00:05 (run 0:02:10)

``loss`` is the epoch's running mean over samples, ``img/s`` the epoch's training throughput,
``eta`` the rest of the epoch and, in brackets, of the run (from the wall time per step so far
in this process, evaluation included).
"""

from __future__ import annotations

import logging
import math
import sys
import time
from typing import Any, Literal, TextIO

__all__ = [
    "DEFAULT_PROGRESS_SECONDS",
    "PROGRESS_MODES",
    "EpochProgress",
    "ProgressReporter",
    "check_progress_seconds",
    "format_duration",
    "resolve_progress_mode",
]

logger = logging.getLogger(__name__)

DEFAULT_PROGRESS_SECONDS = 30.0
"""Seconds between two progress lines when stderr is not a terminal (plus one per epoch)."""

PROGRESS_MODES = ("auto", "bar", "lines", "none")
"""``auto``: ``bar`` on a terminal, ``lines`` otherwise; ``none``: no progress output."""

Mode = Literal["bar", "lines", "none"]


def resolve_progress_mode(progress: bool | str, stream: TextIO | None = None) -> Mode:
    """The progress output to use: ``True``/``"auto"`` → ``"bar"`` when ``stream`` (default:
    ``sys.stderr``) is a terminal, else ``"lines"``; ``False`` → ``"none"``; ``"bar"``,
    ``"lines"`` and ``"none"`` as given."""
    if progress is True or progress == "auto":
        stream = sys.stderr if stream is None else stream
        isatty = getattr(stream, "isatty", None)
        try:
            return "bar" if callable(isatty) and isatty() else "lines"
        except (OSError, ValueError):  # a closed or detached stream
            return "lines"
    if progress is False:
        return "none"
    if isinstance(progress, str) and progress in PROGRESS_MODES:
        return progress  # type: ignore[return-value]
    raise ValueError(f"progress must be a bool or one of {PROGRESS_MODES}, got {progress!r}")


def check_progress_seconds(progress_seconds: Any) -> float:
    """``progress_seconds`` (seconds between two progress lines) as a float.

    Raises:
        ValueError: naming ``progress_seconds`` unless it is a finite number >= 0 (a bool is
            not a number of seconds).
    """
    if isinstance(progress_seconds, bool) or not (
        isinstance(progress_seconds, int | float)
        and math.isfinite(progress_seconds)
        and progress_seconds >= 0
    ):
        raise ValueError(f"progress_seconds must be a finite number >= 0, got {progress_seconds!r}")
    return float(progress_seconds)


def format_duration(seconds: float) -> str:
    """``H:MM:SS`` (``?`` for an unknown or infinite duration)."""
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    whole = round(seconds)
    return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


class ProgressReporter:
    """The progress of one :meth:`~marginface.train.Trainer.fit`.

    Args:
        mode: ``"bar"``, ``"lines"`` or ``"none"`` (see :func:`resolve_progress_mode`).
        epochs: the run's number of epochs.
        steps_per_epoch: optimizer steps per epoch.
        start_epoch: the first epoch this process trains (0-based; > 0 when resuming).
        interval: seconds between two lines in ``"lines"`` mode (>= 0; 0: every step).
            Default: :data:`DEFAULT_PROGRESS_SECONDS`.
    """

    def __init__(
        self,
        mode: Mode,
        *,
        epochs: int,
        steps_per_epoch: int,
        start_epoch: int = 0,
        interval: float = DEFAULT_PROGRESS_SECONDS,
    ) -> None:
        if not (isinstance(interval, int | float) and interval >= 0 and math.isfinite(interval)):
            raise ValueError(f"interval must be a finite number of seconds >= 0, got {interval!r}")
        self.mode = mode
        self.epochs = epochs
        self.steps_per_epoch = steps_per_epoch
        self.interval = float(interval)
        self.started = time.perf_counter()
        self.steps_at_start = start_epoch * steps_per_epoch

    def epoch(self, epoch: int) -> EpochProgress:
        """The progress of epoch ``epoch`` (0-based)."""
        return EpochProgress(self, epoch)


class EpochProgress:
    """One epoch's progress: call :meth:`update` after every step and :meth:`close` at the end
    (made by :meth:`ProgressReporter.epoch`)."""

    def __init__(self, reporter: ProgressReporter, epoch: int) -> None:
        self.reporter = reporter
        self.epoch = epoch
        self.began = time.perf_counter()
        self.last_line = self.began
        self.bar: Any = None
        if reporter.mode == "bar":
            from tqdm.auto import tqdm

            self.bar = tqdm(
                total=reporter.steps_per_epoch,
                desc=f"epoch {epoch + 1}/{reporter.epochs}",
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
        now = time.perf_counter()
        elapsed = now - self.began
        done = step + 1
        epoch_eta = elapsed / done * (reporter.steps_per_epoch - done)
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
        run_done = self.epoch * reporter.steps_per_epoch + done - reporter.steps_at_start
        run_left = reporter.epochs * reporter.steps_per_epoch - run_done - reporter.steps_at_start
        run_eta = (now - reporter.started) / max(run_done, 1) * run_left
        logger.info(
            "epoch %d/%d  step %d/%d  loss %.4f  %.0f img/s  eta %s (run %s)",
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
