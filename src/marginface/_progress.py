"""Progress output shared by every command: a tqdm bar on a terminal, a log line every few
seconds anywhere else (no carriage returns in a log file), nothing with ``--quiet``.

:func:`track` (a ``for`` loop) and :class:`Progress` (a counter) show the progress of any long
loop (embedding a test set or a ``.bin`` set, converting a folder, IJB images) as the innermost
:func:`progress_output` block says: the command line sets it from ``--quiet``, ``--progress``
and ``--progress-seconds``, a training run from its own ``progress``; outside any block (the
library used from Python) nothing is shown. In ``"lines"`` mode logger ``marginface.progress``
writes, at level INFO, every ``interval`` seconds::

    lfw (flipped): 12/24 batches (50%)  0:03:10 elapsed  eta 0:03:10

A training run's epochs show the same way (:class:`ProgressReporter`, one
:class:`EpochProgress` per epoch): a bar per epoch on a terminal; elsewhere logger
``marginface.train.progress`` writes one line every ``interval`` seconds and at the end of
every epoch (a redrawn bar in a file, CI or a cluster job's log, would leave thousands of
carriage-return lines per run)::

    epoch 3/30  step 12/28  loss 1.2345  2345 img/s  eta 0:00:05 (run 0:02:10)

``loss`` is the epoch's running mean over samples, ``img/s`` the epoch's training throughput,
``eta`` the rest of the epoch and, in brackets, of the run, evaluations included (the training
seconds per step so far in this process times the steps left, plus each evaluation left at the
time of the last one of its kind).

This module imports neither torch nor the rest of the package (``--help`` stays quick).
"""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal, TextIO, TypeVar

__all__ = [
    "BAR_DELAY_SECONDS",
    "DEFAULT_PROGRESS_SECONDS",
    "FORWARD_ONLY_SPEEDUP",
    "PROGRESS_MODES",
    "EpochProgress",
    "Mode",
    "Progress",
    "ProgressReporter",
    "ProgressSettings",
    "check_progress_seconds",
    "counting",
    "format_duration",
    "progress_callback",
    "progress_output",
    "progress_settings",
    "resolve_progress_mode",
    "track",
]

logger = logging.getLogger("marginface.progress")
training_logger = logging.getLogger("marginface.train.progress")
"""The epochs' lines (:class:`EpochProgress`), under the name they have always had."""

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


def check_progress_seconds(progress_seconds: Any, name: str = "progress_seconds") -> float:
    """``progress_seconds`` (seconds between two progress lines) as a float; ``name`` is the
    argument the error names (default ``"progress_seconds"``).

    Raises:
        ValueError: naming ``name`` unless the value is a finite number >= 0 (a bool is not a
            number of seconds).
    """
    if isinstance(progress_seconds, bool) or not (
        isinstance(progress_seconds, int | float)
        and math.isfinite(progress_seconds)
        and progress_seconds >= 0
    ):
        raise ValueError(f"{name} must be a finite number >= 0, got {progress_seconds!r}")
    return float(progress_seconds)


def format_duration(seconds: float) -> str:
    """``H:MM:SS`` (``?`` for an unknown or infinite duration)."""
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    whole = round(seconds)
    return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


BAR_DELAY_SECONDS = 2.0
"""A :func:`track` bar appears only once its loop has run this long (a short loop shows
nothing)."""


@dataclass(frozen=True)
class ProgressSettings:
    """What :func:`track` shows: ``mode`` (one of :data:`PROGRESS_MODES`, or a bool as
    :func:`resolve_progress_mode` takes it) and ``interval``, the seconds between two lines
    in ``"lines"`` mode."""

    mode: bool | str = "none"
    interval: float = DEFAULT_PROGRESS_SECONDS


_settings = ProgressSettings()


def progress_settings() -> ProgressSettings:
    """The settings :func:`track` follows now (the innermost :func:`progress_output`)."""
    return _settings


@contextmanager
def progress_output(
    mode: bool | str = "auto", interval: float = DEFAULT_PROGRESS_SECONDS
) -> Iterator[ProgressSettings]:
    """Within the block, :func:`track` shows progress as ``mode`` says (``"auto"``: a bar
    when stderr is a terminal, else a log line every ``interval`` seconds; ``"none"`` or
    False: nothing); the previous settings come back after it. The library's default, outside
    any block, is ``"none"``.

    Raises:
        ValueError: a ``mode`` not in :data:`PROGRESS_MODES`, or a bad ``interval`` (named).
    """
    global _settings
    resolve_progress_mode(mode)  # ValueError naming a bad mode, before the block
    settings = ProgressSettings(mode, check_progress_seconds(interval))
    previous, _settings = _settings, settings
    try:
        yield settings
    finally:
        _settings = previous


class Progress:
    """The progress of one loop of ``total`` items (None: unknown), shown as
    :func:`progress_settings` say: a tqdm bar on stderr (after :data:`BAR_DELAY_SECONDS`), or
    an INFO line of logger ``marginface.progress`` every ``interval`` seconds::

        lfw (flipped): 12/24 batches (50%)  0:03:10 elapsed  eta 0:03:10

    and, when at least one line was written, a last one at :meth:`close`. Use :func:`track`
    for a ``for`` loop; this class where a callback counts (:meth:`update`, :meth:`set`).

    Args:
        desc: what is being done (``"lfw (flipped)"``, ``"converting"``).
        total: items to do, or None.
        unit: the items' name (``"batches"``, ``"images"``).
        clock: seconds, monotonic (tests pass a fake). Default: ``time.perf_counter``.

    Raises:
        TypeError: ``desc`` or ``unit`` not a string; ValueError: ``total`` not None nor an
            int >= 0 (each named).
    """

    def __init__(
        self,
        desc: str,
        total: int | None = None,
        *,
        unit: str = "items",
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        for name, value in (("desc", desc), ("unit", unit)):
            if not isinstance(value, str):
                raise TypeError(f"{name} must be a string, got {value!r}")
        if total is not None and (
            isinstance(total, bool) or not isinstance(total, int) or total < 0
        ):
            raise ValueError(f"total must be None or an int >= 0, got {total!r}")
        settings = progress_settings()
        self.mode = resolve_progress_mode(settings.mode)
        self.interval = settings.interval
        self.desc, self.total, self.unit, self.clock = desc, total, unit, clock
        self.done = 0
        self.began = self.last_line = clock()
        self.lines = 0
        self.bar: Any = None
        if self.mode == "bar":
            from tqdm.auto import tqdm

            self.bar = tqdm(
                total=total, desc=desc, unit=f" {unit}", leave=False, delay=BAR_DELAY_SECONDS
            )

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def update(self, count: int = 1) -> None:
        """``count`` more items are done."""
        self.set(self.done + count)

    def set(self, done: int) -> None:
        """``done`` items are done in all."""
        step, self.done = done - self.done, done
        if self.mode == "bar":
            self.bar.update(step)
        elif self.mode == "lines":
            now = self.clock()
            if now - self.last_line >= self.interval:
                self.last_line = now
                self._line(now)

    def _line(self, now: float, last: bool = False) -> None:
        elapsed = now - self.began
        if self.total:
            share = f"{self.done}/{self.total} {self.unit} ({100 * self.done // self.total}%)"
            eta = elapsed / max(self.done, 1) * (self.total - self.done)
        else:
            share, eta = f"{self.done} {self.unit}", math.nan
        tail = "done" if last else f"eta {format_duration(eta)}"
        logger.info("%s: %s  %s elapsed  %s", self.desc, share, format_duration(elapsed), tail)
        self.lines += 1

    def close(self) -> None:
        """The loop ended: the bar goes; in ``"lines"`` mode a last line when any was
        written (a loop shorter than the interval stays silent)."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        elif self.mode == "lines" and self.lines:
            self._line(self.clock(), last=True)
            self.lines = 0


T = TypeVar("T")


def track(
    iterable: Iterable[T],
    desc: str,
    *,
    total: int | None = None,
    unit: str = "items",
    clock: Callable[[], float] = time.perf_counter,
) -> Iterator[T]:
    """``iterable``'s items, showing the progress of the loop over them (:class:`Progress`;
    ``total`` defaults to ``len(iterable)`` where it has one).

    Example::

        for batch in track(batches, "lfw (flipped)", unit="batches"):
            ...
    """
    if total is None and hasattr(iterable, "__len__"):
        total = len(iterable)  # type: ignore[arg-type]
    with Progress(desc, total, unit=unit, clock=clock) as progress:
        for item in iterable:
            yield item
            progress.update()


@contextmanager
def counting(desc: str, *, unit: str = "items") -> Iterator[Callable[[int, int], None]]:
    """A ``progress(done, total)`` callback showing :class:`Progress` inside the block (made
    on the first call, so a loop that fails before it shows nothing); the display closes when
    the block ends, an error included.

    Example::

        with counting("embedding", unit="images") as progress:
            embed_folder(model, folder, out, progress=progress)
    """
    shown: list[Progress] = []

    def callback(done: int, total: int) -> None:
        if not shown:
            shown.append(Progress(desc, total, unit=unit))
        shown[0].set(done)

    try:
        yield callback
    finally:
        if shown:
            shown[0].close()


def progress_callback(desc: str, *, unit: str = "items") -> Callable[[int, int], None]:
    """A ``progress(done, total)`` callback (IJB's embedding) showing :class:`Progress`; it
    closes when ``done`` reaches ``total``."""
    state: dict[str, Progress | None] = {"progress": None}

    def callback(done: int, total: int) -> None:
        progress = state["progress"]
        if progress is None:
            progress = state["progress"] = Progress(desc, total, unit=unit)
        progress.set(done)
        if done >= total:
            progress.close()
            state["progress"] = None

    return callback


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

    Raises:
        ValueError: ``interval`` not a finite number >= 0 (named).
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
        self.interval = check_progress_seconds(interval, "interval")
        self.mode = mode
        self.epochs = epochs
        self.steps_per_epoch = steps_per_epoch
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
        training_logger.info(
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
