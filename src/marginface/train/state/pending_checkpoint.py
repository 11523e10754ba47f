"""A checkpoint written in the background (``train --async-checkpoint``).

The state is copied at the step where the checkpoint is taken (the copy is what is written:
training goes on changing the weights), then written by another thread while training
continues. The previous checkpoint stays the valid one until the new one is complete: a single
file is renamed over it only when written and sealed (:func:`~marginface._atomic.atomic_write`),
a sharded checkpoint is swapped in only by :meth:`PendingCheckpoint.finish`, after every rank's
write completed. A kill at any instant of a background write leaves the previous checkpoint.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from torch import Tensor

__all__ = ["PendingCheckpoint", "copied_state", "in_thread"]


class PendingCheckpoint:
    """A checkpoint being written by another thread.

    Args:
        path: the checkpoint once complete (``checkpoint.pt`` or ``checkpoint/``).
        written: the background write (its result or exception).
        publish: what makes the written files the run's checkpoint, called by :meth:`finish`
            after the write (all ranks call it: it may hold collectives); None when the write
            itself publishes.
        failure: turns an exception of the write into the one to raise.
    """

    def __init__(
        self,
        path: Path,
        written: Future,
        publish: Callable[[], None] | None = None,
        failure: Callable[[BaseException], BaseException] | None = None,
    ) -> None:
        self.path = path
        self._written = written
        self._publish = publish
        self._failure = failure
        self._finished = False

    def _wait(self) -> Any:
        try:
            return self._written.result()
        except BaseException as error:  # DCP's CheckpointException is a BaseException
            if self._failure is None or isinstance(error, KeyboardInterrupt | SystemExit):
                raise
            raise self._failure(error) from None

    def finish(self) -> Path:
        """Wait for the write, publish it and return :attr:`path` (once; later calls return
        at once).

        Raises:
            marginface._atomic.DiskFullError, OSError, CheckpointError: the write failed (the
                previous checkpoint is kept).
        """
        if not self._finished:
            self._finished = True
            self._wait()
            if self._publish is not None:
                self._publish()
        return self.path

    def abandon(self) -> None:
        """Wait for the write without publishing it (after a failure elsewhere: the previous
        checkpoint stays the run's); its errors are dropped."""
        if self._finished:
            return
        self._finished = True
        with contextlib.suppress(BaseException):  # the run is failing already
            self._written.result()


def copied_state(value: Any) -> Any:
    """``value`` with every tensor cloned (dicts, lists and tuples rebuilt around them)."""
    if isinstance(value, Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return type(value)((k, copied_state(v)) for k, v in value.items())
    if isinstance(value, list | tuple):
        return type(value)(copied_state(v) for v in value)
    return value


def in_thread(work: Callable[[], Any]) -> Future:
    """Run ``work`` in a new (non-daemon) thread; its result or exception in the future."""
    future: Future = Future()

    def run() -> None:
        try:
            future.set_result(work())
        except BaseException as error:
            future.set_exception(error)

    threading.Thread(target=run, name="marginface-checkpoint", daemon=False).start()
    return future
