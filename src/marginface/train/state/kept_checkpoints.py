"""The older checkpoints a run keeps (``train --keep K``), newest last in name order.

With ``keep = K > 1`` a run folder holds, besides its newest checkpoint (``checkpoint.pt`` or
``checkpoint/``), a folder ``checkpoints/`` of earlier ones, each named for its position
(:func:`~marginface.train.state.layout.position_label`: ``epoch-0002-step-0000013.pt``, or a
folder of that name for a sharded checkpoint). Every entry arrived there complete: a file
written atomically (then hard-linked as ``checkpoint.pt``), or a sharded folder moved there
after its swap. :func:`~marginface.train.state.run_state.read_saved_run` falls back to them, newest
first, when the newest checkpoint is damaged. ``keep = 1`` (the default) keeps no folder.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from .layout import KEPT_NAME, KEPT_SUFFIX, POSITION_PREFIX

__all__ = ["kept_checkpoints", "link_as", "prune_kept"]


def _position_name(path: Path) -> str:
    return path.name.removesuffix(KEPT_SUFFIX)


def kept_checkpoints(run_dir: str | Path) -> list[Path]:
    """The kept checkpoints of ``run_dir``, newest first (files ``*.pt`` and sharded folders
    named ``epoch-*``; temporaries and anything else are ignored)."""
    folder = Path(run_dir) / KEPT_NAME
    if not folder.is_dir():
        return []
    entries = [
        path
        for path in folder.iterdir()
        if path.name.startswith(POSITION_PREFIX)
        and ((path.is_file() and path.name.endswith(KEPT_SUFFIX)) or path.is_dir())
    ]
    return sorted(entries, key=_position_name, reverse=True)


def prune_kept(run_dir: str | Path, count: int) -> None:
    """Delete all but the newest ``count`` kept checkpoints of ``run_dir``."""
    for path in kept_checkpoints(run_dir)[max(count, 0) :]:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def link_as(source: Path, target: Path) -> None:
    """Make ``target`` a hard link to ``source``, atomically (a link under a temporary name,
    renamed over ``target``): a reader sees the old file or the new one, never neither. On a
    file system without hard links, a copy."""
    temporary = target.with_name(f".{target.name}.{os.getpid()}.link.tmp")
    temporary.unlink(missing_ok=True)
    try:
        os.link(source, temporary)
    except OSError:  # no hard links here (some network and FUSE file systems)
        try:
            shutil.copyfile(source, temporary)
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise
    os.replace(temporary, target)
