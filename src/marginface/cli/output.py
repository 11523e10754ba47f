"""What the command line writes: logging on stderr, echo, the epoch and verification tables."""

from __future__ import annotations

import argparse
import logging
import sys
from contextlib import AbstractContextManager
from typing import Any


class _StderrHandler(logging.StreamHandler):
    """A handler writing to whatever ``sys.stderr`` is at the time of each record (so a
    redirected or captured stderr receives the lines)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


class _Formatter(logging.Formatter):
    """INFO records as their bare message (progress lines, "downloading ..."); others with
    their level and logger: ``WARNING marginface.data.lfw: ...``."""

    def format(self, record: logging.LogRecord) -> str:
        if record.levelno == logging.INFO:
            return record.getMessage()
        return f"{record.levelname} {record.name}: {super().format(record)}"


def setup_logging(*, quiet: bool = False, verbose: bool = False) -> None:
    """Send the ``marginface`` loggers to stderr: INFO and above by default (progress lines,
    downloads), WARNING and above with ``quiet``, DEBUG with ``verbose`` (``verbose`` wins).
    Other libraries' loggers are left alone. Calling it again replaces the previous set-up."""
    package = logging.getLogger("marginface")
    for handler in list(package.handlers):
        if isinstance(handler, _StderrHandler):
            package.removeHandler(handler)
    handler = _StderrHandler()
    handler.setFormatter(_Formatter("%(message)s"))
    package.addHandler(handler)
    if verbose:
        package.setLevel(logging.DEBUG)
    else:
        package.setLevel(logging.WARNING if quiet else logging.INFO)


def command_progress(args: argparse.Namespace) -> AbstractContextManager[Any]:
    """The block a command runs in: the progress of its long steps
    (:func:`~marginface._progress.track`) shown as ``--progress`` and ``--progress-seconds``
    say (defaults: ``auto``, every 30 s), none with ``--quiet``."""
    from .._progress import DEFAULT_PROGRESS_SECONDS, progress_output

    seconds = getattr(args, "progress_seconds", DEFAULT_PROGRESS_SECONDS)
    return progress_output(progress_mode(args), seconds)


def progress_mode(args: argparse.Namespace) -> str:
    """The progress mode a command's trainer gets: ``--progress``, ``"none"`` with
    ``--quiet``."""
    return "none" if args.quiet else getattr(args, "progress", "auto")


def _echo(args: argparse.Namespace, text: str) -> None:
    if not args.quiet:
        print(text, flush=True)


def _final(args: argparse.Namespace, text: str) -> None:
    """Print a command's last line, the one naming what it wrote (the run folder, the
    report): shown with ``--quiet`` too, so a script learns where its output went."""
    print(text, flush=True)


def _epoch_printer(args: argparse.Namespace, label: str = ""):
    from ..report import format_table

    def callback(row: dict[str, Any]) -> None:
        keys = [k for k in row if k not in ("lr",)]
        line = format_table([row], keys).splitlines()
        prefix = f"[{label}] " if label else ""
        if row["epoch"] == 1:
            _echo(args, prefix + line[0])
        _echo(args, prefix + line[2])

    return callback


def _verification_printer(args: argparse.Namespace):
    """Print each verification set as insightface does: ``[lfw][2000]Accuracy-Flip: a+-s``."""

    def callback(row: dict[str, Any]) -> None:
        for key, value in row.items():
            if key.endswith("_accuracy"):
                name = key[: -len("_accuracy")]
                std = row.get(f"{name}_accuracy_std", float("nan"))
                _echo(args, f"[{name}][{row['step']}]Accuracy-Flip: {value:.5f}+-{std:.5f}")

    return callback
