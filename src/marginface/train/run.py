"""Run directories, the dataset and the backbone/head pair a configuration describes, and
trained runs loaded back.

A run directory holds ``config.toml`` (the resolved configuration), ``history.csv`` (one row per
epoch), the checkpoint of the last completed epoch (``checkpoint.pt``, or ``checkpoint/`` from
several processes; :mod:`marginface.train.run_state` writes and reads both) and, optionally,
``tensorboard/`` (docs/training.md).
"""

from __future__ import annotations

import contextlib
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from .._atomic import remove_stale_temporaries
from ..config import ConfigValueError, TrainConfig
from ..data import DatasetBundle, ImageSet, load_dataset
from ..data.base import StreamedImageSet
from ..models import create_model
from ..registry import create_loss
from .checkpoint import CheckpointError
from .distributed import broadcast_object, is_distributed
from .run_state import (
    CHECKPOINT_NAME,
    CONFIG_NAME,
    HISTORY_NAME,
    SavedRun,
    has_saved_run,
    read_saved_run,
)

__all__ = [
    "CHECKPOINT_NAME",
    "CONFIG_NAME",
    "HISTORY_NAME",
    "LoadedRun",
    "OutputExistsError",
    "build_model_and_loss",
    "load_bundle",
    "load_run",
    "prepare_run_dir",
    "remove_if_empty",
    "resolve_device",
]


class OutputExistsError(FileExistsError):
    """The run directory exists and neither resume nor overwrite was asked for."""


def resolve_device(name: str) -> torch.device:
    """``"auto"`` → CUDA when available, else CPU; anything else is passed to ``torch.device``
    (``ValueError`` if it names CUDA and none is present)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as error:
        raise ValueError(f"device must be auto, cpu, cuda or cuda:N, got {name!r}") from error
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} was asked for but CUDA is not available")
    return device


def prepare_run_dir(
    run_dir: str | Path, *, resume: bool, overwrite: bool, distributed: bool = False
) -> Path:
    """Create ``run_dir``; refuse (:class:`OutputExistsError`) if it exists and is not empty,
    unless ``resume`` (keep it) or ``overwrite`` (delete it first, only if it holds a run's
    ``config.toml`` or checkpoint: never an unrelated folder). Temporary files that a killed
    write left in the run are removed.

    With ``distributed`` (all ranks call it), rank 0 prepares the folder and the other ranks
    wait for it and raise the same error if it failed.

    Raises:
        OutputExistsError: the folder is taken.
        CheckpointError: ``resume`` and the folder holds no checkpoint.
        ValueError: both ``resume`` and ``overwrite``.
    """
    run_dir = Path(run_dir)
    if not (distributed and is_distributed()):
        _prepare(run_dir, resume=resume, overwrite=overwrite)
        return run_dir
    failure: tuple[str, str] | None = None
    if torch.distributed.get_rank() == 0:
        try:
            _prepare(run_dir, resume=resume, overwrite=overwrite)
        except (OSError, ValueError) as error:
            failure = (type(error).__name__, str(error))
    failure = broadcast_object(failure)
    if failure is not None:
        kinds = {"OutputExistsError": OutputExistsError, "CheckpointError": CheckpointError}
        raise kinds.get(failure[0], ValueError)(failure[1])
    return run_dir


def remove_if_empty(run_dir: str | Path) -> None:
    """Remove ``run_dir`` if it is an empty folder (a run that failed before writing anything,
    in a folder it created); anything else, or a folder another process filled meanwhile, is
    left as it is."""
    with contextlib.suppress(OSError):
        Path(run_dir).rmdir()  # refuses a non-empty folder


def _prepare(run_dir: Path, *, resume: bool, overwrite: bool) -> None:
    if resume and overwrite:
        raise ValueError("resume and overwrite are mutually exclusive")
    if run_dir.exists() and not run_dir.is_dir():
        raise OutputExistsError(f"output path {run_dir} exists and is not a directory")
    if run_dir.is_dir() and any(run_dir.iterdir()):
        if overwrite:
            if not any((run_dir / name).exists() for name in (CONFIG_NAME, CHECKPOINT_NAME)):
                raise OutputExistsError(
                    f"{run_dir} is not empty and does not look like a marginface run (no "
                    f"{CONFIG_NAME} or {CHECKPOINT_NAME}); refusing to delete it"
                )
            shutil.rmtree(run_dir)
        elif resume:
            if not has_saved_run(run_dir):
                raise CheckpointError(f"cannot resume: no {CHECKPOINT_NAME} in {run_dir}")
            remove_stale_temporaries(run_dir)
            return
        else:
            raise OutputExistsError(
                f"output directory {run_dir} already exists; pass --resume to continue it or "
                "--overwrite to replace it"
            )
    elif resume:
        raise CheckpointError(f"cannot resume: {run_dir} has no run (no {CHECKPOINT_NAME})")
    run_dir.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(run_dir)


def _limit(images: Any, limit: int | None, seed: int) -> Any:
    if limit is None or limit >= len(images):
        return images
    rng = torch.Generator().manual_seed(seed)
    keep = torch.randperm(len(images), generator=rng)[:limit].sort().values.numpy()
    return _take(images, keep)


def _take(images: Any, keep: np.ndarray) -> Any:
    """The items ``keep`` (sorted indices) of an in-memory or streamed training set."""
    if isinstance(images, StreamedImageSet):
        return images.subset(keep)
    return ImageSet(images.images[keep], images.labels[keep], images.class_names)


def _exclude(images: Any, positions: list[int]) -> Any:
    """``images`` without the items at ``positions`` (sorted, unique)."""
    if positions[-1] >= len(images):
        raise ConfigValueError(
            "exclude",
            f"exclude names position {positions[-1]} but the training set has {len(images)} "
            "images (positions count from 0, after limit)",
        )
    keep = np.setdiff1d(np.arange(len(images)), np.asarray(positions, dtype=np.int64))
    return _take(images, keep)


def load_bundle(config: TrainConfig, *, exclude: bool = True) -> DatasetBundle:
    """Load ``config.dataset`` with its options; ``config.limit`` keeps a seeded random subset
    of the training images, then ``config.exclude`` (positions in that subset) are left out
    (``exclude=False``: kept, the positions ``config.exclude`` and the outliers CSV refer to).

    Raises:
        ConfigValueError: an ``exclude`` position beyond the training set.
    """
    options: dict[str, Any] = {"seed": config.seed, **config.dataset_options}
    if config.data_dir is not None:
        options["data_dir"] = config.data_dir
    if config.image_size is not None:
        options["image_size"] = config.image_size
    bundle = load_dataset(config.dataset, **options)
    train = _limit(bundle.train, config.limit, config.seed)
    if exclude and config.exclude:
        train = _exclude(train, config.exclude)
    if train is bundle.train:
        return bundle
    return DatasetBundle(
        bundle.name, train, bundle.test, bundle.pairs, bundle.open_set, bundle.verification
    )


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
        saved: the checkpoint if already read (:func:`~marginface.train.run_state.read_saved_run`).

    Raises:
        CheckpointError: the checkpoint is missing, corrupt, or does not fit the configuration
            it claims.
    """
    run_dir = Path(run_dir)
    if saved is None:
        saved = read_saved_run(run_dir)
    config = saved.train_config()
    size = saved.meta["image_size"]
    model, head = build_model_and_loss(
        config,
        in_channels=saved.meta["in_channels"],
        image_size=tuple(size) if isinstance(size, list) else size,
        num_classes=saved.meta["num_classes"],
    )
    saved.load_weights(model, head)
    model.to(device).eval()
    head.to(device).eval()
    return LoadedRun(config, model, head, saved.meta, saved.epoch, run_dir, saved.history)
