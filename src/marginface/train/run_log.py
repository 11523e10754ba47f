"""A training run's log: the row of every completed epoch (``history.csv``), the verification
sets' accuracy every ``verify_every`` steps (``verification.csv``), TensorBoard and the user's
callbacks.

The :class:`~marginface.train.Trainer` computes the rows; this module keeps them and writes
them. Only the main process (rank 0) writes files and calls callbacks; every rank keeps the rows
(the checkpoint holds the epochs' rows, and every rank writes its share of a sharded one).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from .history import TensorBoardLogger, read_history, write_history
from .state.layout import HISTORY_NAME, TENSORBOARD_NAME, VERIFICATION_NAME

__all__ = ["EpochCallback", "RunLog", "run_log_attribute"]
"""Per-``verify_every``-steps accuracies of the verification sets (rank 0 writes it)."""

EpochCallback = Callable[[dict[str, Any]], None]
"""Called with a log row (a dict of column name → value)."""


class RunLog:
    """The rows a run logs, and where they go.

    Args:
        run_dir: the run folder (``history.csv``, ``verification.csv``, ``tensorboard/``).
        callbacks: called with each epoch's row once its checkpoint is written (main process).

    Attributes:
        history: one row per completed epoch, in order (``epoch`` counts from 1).
        step_verification: one row per ``verify_every`` steps: ``step`` (optimizer steps
            completed since the run began), then ``<set>_accuracy`` and ``<set>_accuracy_std``
            per verification set.
        callbacks: the epoch callbacks (a list; append to it before :meth:`open`).
        step_callbacks: called with each :attr:`step_verification` row (main process).
    """

    def __init__(self, run_dir: str | Path, *, callbacks: list[EpochCallback] | None = None):
        self.run_dir = Path(run_dir)
        self.callbacks: list[EpochCallback] = list(callbacks or [])
        self.step_callbacks: list[EpochCallback] = []
        self.history: list[dict[str, Any]] = []
        self.step_verification: list[dict[str, Any]] = []
        self.writes = True
        self._board: TensorBoardLogger | None = None

    def open(
        self,
        *,
        history: list[dict[str, Any]],
        completed_steps: int,
        writes: bool,
        tensorboard: bool,
    ) -> None:
        """Start (or continue) the log of a run.

        Args:
            history: the rows of the completed epochs (a resumed run's checkpoint holds them;
                ``[]`` for a new run); copied.
            completed_steps: optimizer steps already done; ``verification.csv``'s rows up to
                that step are kept (a later row belongs to an epoch that is trained again).
            writes: whether this process writes the files and calls the callbacks (rank 0).
            tensorboard: also log every epoch's numbers to ``run_dir/tensorboard``.

        ``history.csv`` is rewritten from ``history`` at once: a CSV cut short by a kill
        between a checkpoint and its row is completed.
        """
        self.history = [dict(row) for row in history]
        self.writes = writes
        self.step_verification = []
        path = self.run_dir / VERIFICATION_NAME
        if completed_steps and path.is_file():
            rows = read_history(path)
            self.step_verification = [row for row in rows if row["step"] <= completed_steps]
        if writes:
            write_history(self.run_dir / HISTORY_NAME, self.history)
            if tensorboard:
                self._board = TensorBoardLogger(self.run_dir / TENSORBOARD_NAME)

    def add_epoch(self, row: dict[str, Any], checkpoint: Callable[[], None]) -> None:
        """Log a completed epoch: append ``row`` to :attr:`history`, call ``checkpoint()``
        (which saves the run with that history; on failure the row is removed again and the
        error raised), then write ``history.csv`` and TensorBoard and call the callbacks.

        The CSV is written after the checkpoint, so it is always a prefix of the checkpoint's
        history (:func:`~marginface.train.history.write_history`).
        """
        self.history.append(row)
        try:
            checkpoint()
        except BaseException:
            self.history.pop()
            raise
        if not self.writes:
            return
        write_history(self.run_dir / HISTORY_NAME, self.history)
        if self._board is not None:
            self._board.log(row)
        for callback in self.callbacks:
            callback(row)

    def add_step_verification(self, row: dict[str, Any]) -> None:
        """Log the verification sets' accuracy after ``row["step"]`` steps: kept, and (main
        process) appended to ``verification.csv`` and passed to :attr:`step_callbacks`."""
        self.step_verification.append(row)
        if self.writes:
            write_history(self.run_dir / VERIFICATION_NAME, self.step_verification)
            for callback in self.step_callbacks:
                callback(row)

    def close(self) -> None:
        """Close TensorBoard's writer (if open)."""
        if self._board is not None:
            self._board.close()
            self._board = None


def run_log_attribute(name: str, doc: str) -> property:
    """A read-only property of an object with a ``run_log`` that returns ``run_log.<name>``
    (the trainer's ``history``, ``callbacks``... kept for code written before :class:`RunLog`)."""
    return property(lambda owner: getattr(owner.run_log, name), doc=doc)
