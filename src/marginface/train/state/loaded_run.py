"""Trained runs loaded back: the backbone and head of a run folder, rebuilt from its checkpoint
(read once) for ``evaluate``, ``plot``, ``export``, the outliers and every inference command
that opens a run folder (:func:`marginface.inference.open_model`; the folder's layout:
:mod:`.layout`).

The backbone and head a configuration describes are built here too
(:func:`build_model_and_loss`, :func:`model_and_loss_for_meta`), the same for a training run
(:func:`marginface.train.build.build_training` calls them) and for a run loaded back. This
module imports nothing of the training loop (``train.trainer``, ``train.build``, the batches,
the optimizer): ``inference/`` may import it (``tests/test_import_graph.py`` checks it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...models import create_model
from ...registry import create_loss
from ..config import TrainConfig
from .run_state import SavedRun, read_saved_run

__all__ = ["LoadedRun", "build_model_and_loss", "load_run", "model_and_loss_for_meta"]


def build_model_and_loss(
    config: TrainConfig,
    *,
    in_channels: int,
    image_size: int | tuple[int, int],
    num_classes: int,
    device: torch.device | str = "cpu",
    process_group: Any = None,
) -> tuple[nn.Module, nn.Module]:
    """The backbone and the loss (with its class centers) the configuration describes; with a
    ``process_group`` the loss's classes are sharded over it (docs/distributed.md)."""
    model = create_model(
        config.model,
        embedding_dim=config.embedding_dim,
        in_channels=in_channels,
        image_size=image_size,
        **config.model_options,
    )
    options = dict(config.loss_options)
    if config.sample_rate != 1.0:
        options["sample_rate"] = config.sample_rate
    if process_group is not None:
        options["process_group"] = process_group
    loss = create_loss(config.loss, num_classes, config.embedding_dim, **options)
    return model.to(device), loss.to(device)


def model_and_loss_for_meta(
    config: TrainConfig,
    meta: dict[str, Any],
    *,
    device: torch.device | str = "cpu",
    process_group: Any = None,
) -> tuple[nn.Module, nn.Module]:
    """:func:`build_model_and_loss` sized by a run's metadata
    (:func:`~marginface.train.build.run_meta`, or a checkpoint's copy of it, where
    ``image_size`` ``(H, W)`` was read back as a list)."""
    size = meta["image_size"]
    return build_model_and_loss(
        config,
        in_channels=meta["in_channels"],
        image_size=tuple(size) if isinstance(size, list) else size,
        num_classes=meta["num_classes"],
        device=device,
        process_group=process_group,
    )


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
