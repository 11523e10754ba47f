"""What a training configuration builds: its dataset (:func:`load_bundle`), the backbone and
head (from the run's metadata:
:func:`~marginface.train.state.loaded_run.model_and_loss_for_meta`, which a trained run loaded
back also uses), the optimizer and its schedule, mixed precision and
augmentation, sized for one dataset and one process group.

:class:`~marginface.train.Trainer` calls :func:`build_training` once per :meth:`fit
<marginface.train.Trainer.fit>`, after seeding ``torch.manual_seed(config.seed)``, so the
initial weights depend on the seed only (docs/training.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from ..data import DatasetBundle, ImageSet, load_dataset
from ..data.augment import BatchAugmentation, build_augmentation
from ..data.base import StreamedImageSet
from .config import ConfigValueError, TrainConfig
from .finetune import freeze_stages
from .model_input import convert_bundle
from .optim import build_optimizer, build_scheduler
from .state.loaded_run import model_and_loss_for_meta
from .state.run_state import RunObjects

__all__ = [
    "TrainingSetup",
    "build_training",
    "configure_process",
    "flushes_denormals",
    "load_bundle",
    "load_initial_state",
    "run_meta",
    "steps_per_epoch",
]

AMP_DTYPES: dict[str, torch.dtype | None] = {
    "none": None,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
}
"""``TrainConfig.amp`` → the autocast dtype of the forward passes (None: full precision)."""


@dataclass
class TrainingSetup:
    """What :func:`build_training` made.

    Attributes:
        objects: model, head, optimizer, schedule, scaler and device: what a checkpoint
            saves and restores (:class:`~marginface.train.state.run_state.RunObjects`).
        forward_model: the model the step calls: the model, or the
            ``DistributedDataParallel`` around it in a process group.
        meta: the run's metadata (:func:`run_meta`).
        steps_per_epoch: optimizer steps per epoch (:func:`steps_per_epoch`).
        amp_dtype: autocast dtype (None: full precision).
        augmentation: the training-time jitter, or None.
    """

    objects: RunObjects
    forward_model: nn.Module
    meta: dict[str, Any]
    steps_per_epoch: int
    amp_dtype: torch.dtype | None
    augmentation: BatchAugmentation | None


def steps_per_epoch(num_images: int, batch_size: int) -> int:
    """Optimizer steps per epoch: ``ceil(n / B)``, one fewer when the last batch would hold a
    single image (a batch of one breaks BatchNorm's statistics)."""
    steps = math.ceil(num_images / batch_size)
    if num_images % batch_size == 1 and num_images > 1:
        steps -= 1
    return steps


def run_meta(bundle: DatasetBundle, world: int = 1) -> dict[str, Any]:
    """What a run's checkpoint records beside its configuration, to rebuild the backbone and
    head without the dataset: ``in_channels``, ``image_size`` (an int when square, else
    ``(H, W)``), ``num_classes``, ``dataset`` and the ``world_size`` that trained it."""
    channels, height, width = bundle.train.image_shape
    return {
        "in_channels": channels,
        "image_size": height if height == width else (height, width),
        "num_classes": bundle.train.num_classes,
        "dataset": bundle.name,
        "world_size": world,
    }


def build_training(
    config: TrainConfig,
    bundle: DatasetBundle,
    *,
    device: torch.device,
    world: int = 1,
    process_group: Any = None,
) -> TrainingSetup:
    """Build what ``config`` trains on ``bundle``'s training set.

    Args:
        config: the resolved configuration.
        bundle: the dataset (its training set sizes the head and the schedule).
        device: where the model and head are built.
        world: processes sharing each global batch of ``config.batch_size``.
        process_group: shard the head's classes over this group and wrap the model in
            ``DistributedDataParallel`` (docs/distributed.md); None: one process.

    Raises:
        ValueError: ``batch_size`` (the global batch) below ``world``; no training images;
            ``amp = "fp16"`` off CUDA; ``grad_accumulation > 1`` in a process group; a bad
            optimizer, schedule or augmentation.
    """
    if config.batch_size < world:
        raise ValueError(
            f"batch_size = {config.batch_size} is the global batch and must be >= the "
            f"world size {world}"
        )
    if len(bundle.train) == 0:
        left_out = (
            f" left: exclude leaves out all {len(config.exclude)} of them" if config.exclude else ""
        )
        raise ValueError(f"dataset {config.dataset!r} has no training images{left_out}")
    if config.amp == "fp16" and device.type != "cuda":
        raise ValueError("amp='fp16' needs a CUDA device; use amp='bf16' on CPU")
    meta = run_meta(bundle, world)
    model, head = model_and_loss_for_meta(config, meta, device=device, process_group=process_group)
    # frozen stages (fine-tuning): no gradient, not in the optimizer, BatchNorm statistics kept
    frozen = {id(p) for p in freeze_stages(model, config.freeze_stages)}
    if config.channels_last:
        model = model.to(memory_format=torch.channels_last)
    forward_model = model
    if config.grad_accumulation > 1 and process_group is not None:
        raise ValueError("grad_accumulation > 1 is supported in single-process runs only")
    if config.compile:
        forward_model = torch.compile(model)  # the same parameters
    if process_group is not None:
        from torch.nn.parallel import DistributedDataParallel

        device_ids = [device.index] if device.type == "cuda" else None
        forward_model = DistributedDataParallel(model, device_ids=device_ids)
    steps = steps_per_epoch(len(bundle.train), config.batch_size)
    optimizer = build_optimizer(
        [p for p in model.parameters() if id(p) not in frozen] + list(head.parameters()),
        config.optimizer,
        lr=config.lr,
        weight_decay=config.weight_decay,
        momentum=config.momentum,
    )
    scheduler = build_scheduler(
        optimizer,
        schedule=config.schedule,
        epochs=config.epochs,
        steps_per_epoch=steps,
        warmup_epochs=config.warmup_epochs,
        step_epochs=config.step_epochs,
        gamma=config.gamma,
        power=config.poly_power,
    )
    scaler = torch.amp.GradScaler("cuda", enabled=config.amp == "fp16")
    return TrainingSetup(
        objects=RunObjects(model, head, optimizer, scheduler, scaler, device),
        forward_model=forward_model,
        meta=meta,
        steps_per_epoch=steps,
        amp_dtype=AMP_DTYPES[config.amp],
        augmentation=build_augmentation(config.augment),
    )


def configure_process(threads: int | None) -> None:
    """Set this process up for training: ``threads`` CPU threads (``torch.set_num_threads``;
    None leaves them as they are) and subnormal floats flushed to zero (they slow CPU
    convolutions' backward passes on small images; flushing them changes nothing measurable
    otherwise). :meth:`Trainer.fit <marginface.train.Trainer.fit>` restores the flushing mode
    it found (:func:`flushes_denormals`)."""
    if threads is not None:
        torch.set_num_threads(threads)
    torch.set_flush_denormal(True)


def load_initial_state(model: nn.Module, head: nn.Module, state: dict[str, Any] | None) -> None:
    """Load ``state`` into a fresh run's ``model`` and ``head`` before its first step:
    ``{"model": state_dict, "loss": state_dict}``, ``"loss"`` optional (a pretrained backbone
    with new class centers), ``"source"`` optional (the file the backbone's weights came from:
    ``train --init-from``); None: nothing (``Trainer(initial_state=...)``).

    Raises:
        ValueError: weights that do not fit the model built for this run's data (other keys,
            shapes, channels or integer tensors), in one line naming ``"source"``.
    """
    if state is None:
        return
    if "source" in state:
        from ..models.pretrained import load_backbone_weights

        load_backbone_weights(model, state["model"], source=str(state["source"]))
    else:
        model.load_state_dict(state["model"])
    if "loss" in state:
        head.load_state_dict(state["loss"])


def flushes_denormals() -> bool:
    """Whether this thread's CPU arithmetic flushes subnormal floats to zero (as after
    ``torch.set_flush_denormal(True)``; torch has no getter): ``1e-39·1`` in float32 is 0."""
    tiny = torch.full((1,), 1e-39, dtype=torch.float32)  # subnormal in float32
    return bool((tiny * 1.0).item() == 0.0)


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
    """Load ``config.dataset`` with its options, fed as ``config.model_input`` says
    (:func:`~marginface.train.model_input.convert_bundle`: colour and pixel normalisation of a
    pretrained model); ``config.limit`` keeps a seeded random subset of the training images,
    then ``config.exclude`` (positions in that subset) are left out (``exclude=False``: kept,
    the positions ``config.exclude`` and the outliers CSV refer to).

    Raises:
        ConfigValueError: an ``exclude`` position beyond the training set.
    """
    options: dict[str, Any] = {"seed": config.seed, **config.dataset_options}
    if config.data_dir is not None:
        options["data_dir"] = config.data_dir
    if config.image_size is not None:
        options["image_size"] = config.image_size
    bundle = convert_bundle(load_dataset(config.dataset, **options), config.model_input)
    train = _limit(bundle.train, config.limit, config.seed)
    if exclude and config.exclude:
        train = _exclude(train, config.exclude)
    if train is bundle.train:
        return bundle
    return DatasetBundle(
        bundle.name, train, bundle.test, bundle.pairs, bundle.open_set, bundle.verification
    )
