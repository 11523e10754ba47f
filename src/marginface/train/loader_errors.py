"""Errors raised inside ``DataLoader`` worker processes, as one line."""

from __future__ import annotations

from typing import Any

__all__ = ["next_batch"]


def next_batch(loader: Any) -> Any:
    """The next batch of a DataLoader iterator; an error raised in a worker process (a corrupt
    record, say) is re-raised with its own one-line message instead of the worker's traceback.

    Raises:
        StopIteration: the loader is exhausted.
        ValueError / OSError: as raised by the dataset (in the main process or a worker).
    """
    try:
        return next(loader)
    except (ValueError, OSError) as error:
        text = str(error)
        if "DataLoader worker process" not in text:
            raise
        last = [line for line in text.splitlines() if line.strip()][-1].strip()
        prefix = f"{type(error).__name__}: "
        raise type(error)(last[len(prefix) :] if last.startswith(prefix) else last) from None
