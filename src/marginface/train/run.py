"""Trained runs loaded back: the backbone and head of a run folder, rebuilt from its checkpoint
(read once) for ``evaluate``, ``plot``, ``export`` and the outliers (the folder's layout:
:mod:`marginface.train.state.layout`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .build import model_and_loss_for_meta
from .config import TrainConfig
from .state.run_state import SavedRun, read_saved_run

__all__ = ["LoadedRun", "load_run"]


@dataclass
class LoadedRun:
    """A trained run: its configuration, backbone and head (eval mode), and metadata."""

    config: TrainConfig
    model: nn.Module
    loss: nn.Module
    """The head (:class:`~marginface.head.MarginSoftmaxLoss`, the class centers); also
    :attr:`head`."""
    meta: dict[str, Any]
    epoch: int
    run_dir: Path
    history: list[dict[str, Any]]
    """The per-epoch rows up to :attr:`epoch`: the checkpoint's own (format >= 2), so a kill
    between the checkpoint and ``history.csv`` loses nothing; ``history.csv`` for format 1."""

    @property
    def head(self) -> nn.Module:
        """The head holding the class centers (the same object as :attr:`loss`)."""
        return self.loss


def load_run(
    run_dir: str | Path, *, device: str | torch.device = "cpu", saved: SavedRun | None = None
) -> LoadedRun:
    """Rebuild the backbone and head of ``run_dir`` from its checkpoint (either format, read
    once), unsharded, in eval mode, on ``device``.

    Args:
        run_dir: the run folder.
        device: where the model and head go. Default: the CPU.
        saved: the checkpoint if already read
        (:func:`~marginface.train.state.run_state.read_saved_run`).

    Raises:
        CheckpointError: the checkpoint is missing, corrupt, or does not fit the configuration
            it claims.
    """
    run_dir = Path(run_dir)
    if saved is None:
        saved = read_saved_run(run_dir)
    config = saved.train_config()
    model, head = model_and_loss_for_meta(config, saved.meta)
    saved.load_weights(model, head)
    model.to(device).eval()
    head.to(device).eval()
    return LoadedRun(config, model, head, saved.meta, saved.epoch, run_dir, saved.history)
