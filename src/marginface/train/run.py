"""Run directories and the model/loss pair a configuration describes.

A run directory holds ``config.toml`` (the resolved configuration), ``history.csv`` (one row per
epoch), ``checkpoint.pt`` (the last completed epoch, written atomically) and, optionally,
``tensorboard/``.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..config import ConfigValueError, TrainConfig, config_from_dict
from ..data import DatasetBundle, ImageSet, load_dataset
from ..data.base import StreamedImageSet
from ..models import create_model
from ..registry import create_loss
from .checkpoint import CheckpointError, load_checkpoint
from .history import read_history
from .sharded_checkpoint import has_sharded_checkpoint

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
    "resolve_device",
]

CONFIG_NAME = "config.toml"
HISTORY_NAME = "history.csv"
CHECKPOINT_NAME = "checkpoint.pt"


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


def prepare_run_dir(run_dir: str | Path, *, resume: bool, overwrite: bool) -> Path:
    """Create ``run_dir``; refuse (:class:`OutputExistsError`) if it exists and is not empty,
    unless ``resume`` (keep it) or ``overwrite`` (delete it first, only if it holds a run's
    ``config.toml`` or ``checkpoint.pt``: never an unrelated folder)."""
    if resume and overwrite:
        raise ValueError("resume and overwrite are mutually exclusive")
    run_dir = Path(run_dir)
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
            if not (run_dir / CHECKPOINT_NAME).is_file() and not has_sharded_checkpoint(run_dir):
                raise CheckpointError(f"cannot resume: no {CHECKPOINT_NAME} in {run_dir}")
            return run_dir
        else:
            raise OutputExistsError(
                f"output directory {run_dir} already exists; pass --resume to continue it or "
                "--overwrite to replace it"
            )
    elif resume:
        raise CheckpointError(f"cannot resume: {run_dir} has no run (no {CHECKPOINT_NAME})")
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


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
    """A trained run: its configuration, backbone and loss (eval mode), and metadata."""

    config: TrainConfig
    model: nn.Module
    loss: nn.Module
    meta: dict[str, Any]
    epoch: int
    run_dir: Path
    history: list[dict[str, Any]]
    """The per-epoch rows up to :attr:`epoch`: the checkpoint's own (format >= 2), so a kill
    between the checkpoint and ``history.csv`` loses nothing; ``history.csv`` for format 1."""


def load_run(run_dir: str | Path, *, device: str | torch.device = "cpu") -> LoadedRun:
    """Rebuild the model and loss of ``run_dir`` from its checkpoint.

    Raises :class:`CheckpointError` when the checkpoint is missing, corrupt, or does not fit
    the configuration it claims.
    """
    run_dir = Path(run_dir)
    if has_sharded_checkpoint(run_dir) and not (run_dir / CHECKPOINT_NAME).is_file():
        return _load_sharded_run(run_dir, device)
    source = run_dir / CHECKPOINT_NAME
    state = load_checkpoint(source)
    model, loss, config = _rebuild(state["config"], state["meta"], source)
    try:
        model.load_state_dict(state["model"])
        loss.load_state_dict(state["loss"])
    except RuntimeError as error:
        raise CheckpointError(
            f"checkpoint in {run_dir} does not match its configuration: {error}"
        ) from error
    epoch = int(state["epoch"])
    if "history" in state:
        history = [dict(row) for row in state["history"]][:epoch]
    else:
        csv_path = run_dir / HISTORY_NAME
        history = read_history(csv_path)[:epoch] if csv_path.is_file() else []
    model.to(device).eval()
    loss.to(device).eval()
    return LoadedRun(config, model, loss, state["meta"], epoch, run_dir, history)


def _rebuild(
    saved: dict[str, Any], meta: dict[str, Any], source: Path
) -> tuple[nn.Module, nn.Module, TrainConfig]:
    """The unsharded model and loss a saved configuration and its metadata describe."""
    config = config_from_dict(dict(saved), source=str(source))
    size = meta["image_size"]
    model, loss = build_model_and_loss(
        config,
        in_channels=meta["in_channels"],
        image_size=tuple(size) if isinstance(size, list) else size,
        num_classes=meta["num_classes"],
    )
    return model, loss, config


def _load_sharded_run(run_dir: Path, device: str | torch.device) -> LoadedRun:
    """:func:`load_run` of a run whose ranks wrote a sharded checkpoint: one process rebuilds
    the unsharded model and loss (the optimizer state is not read)."""
    from ..head import reshardable_state_dict
    from .sharded_checkpoint import SHARDED_CHECKPOINT_NAME, load_sharded_tensors, read_sidecar

    sidecar = read_sidecar(run_dir)
    source = run_dir / SHARDED_CHECKPOINT_NAME
    model, loss, config = _rebuild(sidecar["config"], sidecar["meta"], source)
    targets = {f"model/{k}": v for k, v in model.state_dict().items()}
    targets.update({f"loss/{k}": v for k, v in reshardable_state_dict(loss).items()})
    try:
        load_sharded_tensors(run_dir, targets, distributed=False, only_targets=True)
    except RuntimeError as error:
        raise CheckpointError(
            f"checkpoint {source} does not match its configuration: {error}"
        ) from error
    model.to(device).eval()
    loss.to(device).eval()
    epoch = int(sidecar["epoch"])
    history = [dict(row) for row in sidecar.get("history", [])][:epoch]
    return LoadedRun(config, model, loss, sidecar["meta"], epoch, run_dir, history)
