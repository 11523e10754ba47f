"""A run folder's sharded checkpoint looked for and repaired, without reading it: what opening
a run needs to know before it reads anything, kept apart from
:mod:`marginface.train.state.sharded_checkpoint` so that this costs no
``torch.distributed.checkpoint`` (which imports ``torch.distributed.tensor`` and, through
``torch.fx``, SymPy: ~0.6 s) when the run holds a single-file ``checkpoint.pt``.

The folder's layout (``checkpoint/``, ``.checkpoint.old/``, ``marginface.json``, the lock
file) is :mod:`marginface.train.state.layout`'s; the swap this repairs is
:func:`marginface.train.state.sharded_checkpoint.save_sharded_checkpoint`'s.
"""

from __future__ import annotations

import contextlib
import fcntl
import shutil
from collections.abc import Iterator
from pathlib import Path

from .layout import REPAIR_LOCK_NAME, REPLACED_SHARDED_NAME, SHARDED_CHECKPOINT_NAME, SIDECAR_NAME

__all__ = ["has_sharded_checkpoint", "recover", "sharded_checkpoint_on_disk"]


def has_sharded_checkpoint(run_dir: str | Path) -> bool:
    """Whether ``run_dir`` holds a complete sharded checkpoint (after :func:`recover`)."""
    recover(run_dir)
    return (Path(run_dir) / SHARDED_CHECKPOINT_NAME / SIDECAR_NAME).is_file()


def sharded_checkpoint_on_disk(run_dir: str | Path) -> bool:
    """Whether a complete sharded checkpoint is in ``run_dir``, in place or set aside by a swap
    cut short (looked for, not read, not repaired)."""
    run_dir = Path(run_dir)
    return any(
        (run_dir / name / SIDECAR_NAME).is_file()
        for name in (SHARDED_CHECKPOINT_NAME, REPLACED_SHARDED_NAME)
    )


@contextlib.contextmanager
def _repair_lock(run_dir: Path) -> Iterator[None]:
    """Exclusive ``flock`` on ``run_dir/.checkpoint.lock`` while one process repairs: the ranks
    of a restarted job all look at the folder before any process group exists, and two repairs
    at once could delete the only complete checkpoint. The lock file stays (removing it would
    let a waiting process lock a file no longer in the folder)."""
    with open(run_dir / REPAIR_LOCK_NAME, "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def recover(run_dir: str | Path) -> None:
    """Repair a kill between the two renames of a checkpoint swap: when ``checkpoint/`` is
    missing or incomplete and ``.checkpoint.old/`` is complete, put the old one back.

    Safe to call from every rank at once (on one host, or on a shared file system with
    ``flock``): one process repairs under a lock, the others then find the repaired folder.
    """
    run_dir = Path(run_dir)
    current, old = run_dir / SHARDED_CHECKPOINT_NAME, run_dir / REPLACED_SHARDED_NAME
    if not old.is_dir():
        return  # nothing set aside: no swap was cut short
    with _repair_lock(run_dir):
        if not old.is_dir():
            return  # another process repaired it while this one waited
        if (current / SIDECAR_NAME).is_file():
            shutil.rmtree(old, ignore_errors=True)
        elif (old / SIDECAR_NAME).is_file():
            if current.exists():
                shutil.rmtree(current)
            old.rename(current)
