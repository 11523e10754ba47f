"""Atomic checkpoints: write to a temporary file in the same folder, fsync, then rename."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

__all__ = ["CheckpointError", "load_checkpoint", "save_checkpoint"]


class CheckpointError(ValueError):
    """A checkpoint that is missing, unreadable or from another configuration."""


def save_checkpoint(state: dict[str, Any], path: str | Path) -> Path:
    """``torch.save(state)`` to ``path`` atomically: a crash leaves the previous file intact."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with tmp.open("wb") as handle:
            torch.save(state, handle)
            handle.flush()
            os.fsync(handle.fileno())
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def load_checkpoint(path: str | Path, *, map_location: str | torch.device = "cpu") -> dict:
    """Load a checkpoint written by :func:`save_checkpoint`; :class:`CheckpointError` if it is
    missing or corrupt."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path}")
    try:
        state = torch.load(path, map_location=map_location, weights_only=False)
    except Exception as error:  # torch raises several kinds for a truncated/corrupt file
        raise CheckpointError(f"checkpoint {path} is corrupt or unreadable: {error}") from error
    if not isinstance(state, dict) or "model" not in state or "loss" not in state:
        raise CheckpointError(f"{path} is not a marginface checkpoint")
    return state
