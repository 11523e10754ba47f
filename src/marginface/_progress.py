"""Progress output shared by every command: a tqdm bar on a terminal, a log line every few
seconds anywhere else (no carriage returns in a log file), nothing with ``--quiet``.

:func:`track` (a ``for`` loop) and :class:`Progress` (a counter) show the progress of any long
loop (embedding a test set or a ``.bin`` set, converting a folder, IJB images) as the innermost
:func:`progress_output` block says: the command line sets it from ``--quiet``, ``--progress``
and ``--progress-seconds``, a training run from its own ``progress``; outside any block (the
library used from Python) nothing is shown. In ``"lines"`` mode logger ``marginface.progress``
writes, at level INFO, every ``interval`` seconds::

    lfw (flipped): 12/24 batches (50%)  0:03:10 elapsed  eta 0:03:10

A training run's epochs, steps and ETA are :mod:`marginface.train.progress`'s. This module
imports neither torch nor the rest of the package (``--help`` stays quick).
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
    "PROGRESS_MODES",
    "Mode",
    "Progress",
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
