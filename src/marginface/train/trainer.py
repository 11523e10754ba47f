"""The training loop: seeded, resumable bit for bit, with a per-epoch CSV log.

Determinism: the initial weights come from ``torch.manual_seed(config.seed)``; epoch ``e``
shuffles and draws its augmentations with its own generators seeded ``(seed, e)``; dropout
draws from the global RNG, whose state is saved in every checkpoint and restored on resume. So
a run interrupted after epoch ``k`` and resumed ends with the same weights as an uninterrupted
run (same device and threads).
"""

from __future__ import annotations

import logging
import math
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from .._atomic import DiskFullError, remove_stale_temporaries
from ..config import TrainConfig, config_from_dict, save_config
from ..data import DatasetBundle
from ..data.augment import build_augmentation
from ..data.base import StreamedImageSet
from ..head import class_rows
from .checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from .distributed import (
    RankFailureError,
    all_ranks_true,
    broadcast_object,
    init_from_environment,
    rank_slice,
    torchrun_environment,
)
from .embeddings import extract_embeddings
from .evaluate import evaluate_pairs, verification_pairs
from .history import TensorBoardLogger, margin_state, read_history, write_history
from .loader_errors import next_batch as _next_batch
from .optim import build_optimizer, build_scheduler
from .progress import DEFAULT_PROGRESS_SECONDS, ProgressReporter, resolve_progress_mode
from .run import (
    CHECKPOINT_NAME,
    CONFIG_NAME,
    HISTORY_NAME,
    OutputExistsError,
    build_model_and_loss,
    load_bundle,
    prepare_run_dir,
    resolve_device,
)
from .schedule import micro_batches
from .sharded_checkpoint import (
    SHARDED_CHECKPOINT_NAME,
    checkpoint_entries,
    has_sharded_checkpoint,
    load_sharded_tensors,
    read_sidecar,
    save_sharded_checkpoint,
)

__all__ = [
    "RESUMABLE_KEYS",
    "Trainer",
    "TrainingDivergedError",
    "TrainingInterrupted",
    "train",
]

logger = logging.getLogger(__name__)

RESUMABLE_KEYS = frozenset(
    {
        "epochs",
        "device",
        "threads",
        "tensorboard",
        "eval_batch_size",
        "flip",
        "data_dir",
        "workers",
        "dist_timeout",
        "verify_every",
        "compile",
        "grad_accumulation",
    }
)
"""Configuration keys that may change between an interrupted run and its ``--resume``."""

EpochCallback = Callable[[dict[str, Any]], None]

VERIFICATION_NAME = "verification.csv"
"""Per-``verify_every``-steps accuracies of the verification sets (rank 0 writes it)."""


class TrainingDivergedError(RuntimeError):
    """The loss, the embeddings or a parameter became NaN or infinite; the message names the
    parameter (if one is to blame) and says truthfully what is on disk: the last good
    checkpoint, or none when no epoch was completed."""


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C during :meth:`Trainer.fit`; the message says what was kept and how to go on."""


def _epoch_generator(seed: int, epoch: int, stream: int = 0) -> torch.Generator:
    """The CPU generator of one epoch: stream 0 shuffles, stream 1 draws augmentations."""
    return torch.Generator().manual_seed(seed * 1_000_003 + epoch + stream * 7_919_000_011)


class Trainer:
    """Train ``config.model`` with ``config.loss`` on ``config.dataset`` into ``run_dir``.

    Args:
        config: the :class:`~marginface.config.TrainConfig`. The trainer keeps (as
            ``.config``), uses and saves its :meth:`~marginface.config.TrainConfig.resolved`
            copy: ``loss_options`` with the pipeline's per-loss defaults filled in (``scale =
            30`` for every loss that takes a scale), so ``config.toml`` and the checkpoint show
            the options actually used.
        run_dir: the output directory (see :mod:`marginface.train.run`).
        bundle: the dataset, if already loaded (else :func:`load_bundle` ``(config)``).
        progress: training progress on rank 0: ``True`` or ``"auto"``: a tqdm bar per epoch
            when stderr is a terminal, else a log line (logger ``marginface.train.progress``,
            INFO) every ``progress_seconds`` and at the end of every epoch, with step, loss,
            img/s and ETA (:mod:`marginface.train.progress`); ``"bar"``, ``"lines"``;
            ``False`` or ``"none"``: nothing. Default: False.
        progress_seconds: seconds between two progress lines (>= 0). Default:
            :data:`~marginface.train.progress.DEFAULT_PROGRESS_SECONDS` (30).
        callbacks: called with each epoch's log row after its checkpoint is written.
        initial_state: ``{"model": state_dict, "loss": state_dict}`` loaded into a fresh
            (not resumed) run before its first step, e.g. a sub-center run cut to one center
            per class (:func:`~marginface.train.cleaning.continue_with_dominant_centers`);
            ``"loss"`` may be left out (``train --init-from``: a pretrained backbone, new
            class centers). The optimizer and schedule start afresh.

    Use :meth:`fit`.
    """

    def __init__(
        self,
        config: TrainConfig,
        run_dir: str | Path,
        *,
        bundle: DatasetBundle | None = None,
        progress: bool | str = False,
        progress_seconds: float = DEFAULT_PROGRESS_SECONDS,
        callbacks: list[EpochCallback] | None = None,
        initial_state: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        self.config = config.resolved()  # ValueError for an unknown loss, before any output
        self.run_dir = Path(run_dir)
        self.bundle = bundle
        self.progress = resolve_progress_mode(progress)
        if isinstance(progress_seconds, bool) or not (
            isinstance(progress_seconds, int | float)
            and math.isfinite(progress_seconds)
            and progress_seconds >= 0
        ):
            raise ValueError(
                f"progress_seconds must be a finite number >= 0, got {progress_seconds!r}"
            )
        self.progress_seconds = float(progress_seconds)
        self._reporter = ProgressReporter("none", epochs=1, steps_per_epoch=1)
        self.callbacks = list(callbacks or [])
        self.history: list[dict[str, Any]] = []
        self.model: nn.Module | None = None
        self.loss: nn.Module | None = None
        self._pairs = None
        self.distributed = False
        self.rank, self.world = 0, 1
        self.step_verification: list[dict[str, Any]] = []
        self.step_callbacks: list[EpochCallback] = []
        self.forward_model: nn.Module | None = None
        self.initial_state = initial_state

    @property
    def is_main(self) -> bool:
        """Whether this process writes the run's files (rank 0, or the only process)."""
        return self.rank == 0

    # ---------------------------------------------------------------- setup
    def _init_distributed(self) -> None:
        """Resolve the device and join torchrun's process group, if launched by torchrun."""
        self.device = resolve_device(self.config.device)
        self.distributed = init_from_environment(self.device.type, self.config.dist_timeout)
        if self.distributed:
            self.rank, self.world = dist.get_rank(), dist.get_world_size()

    def _setup(self) -> None:
        config = self.config
        if config.threads is not None:
            torch.set_num_threads(config.threads)
        # Denormal floats slow CPU convolutions' backward passes by up to 10× on small images
        # (measured on digits); flushing them to zero changes nothing measurable otherwise.
        # Only while fit() runs: it restores the mode it found.
        torch.set_flush_denormal(True)
        self._init_distributed()
        if self.distributed:
            self.rank, self.world = dist.get_rank(), dist.get_world_size()
            environment = torchrun_environment()
            if self.device.type == "cuda" and environment is not None:
                self.device = torch.device("cuda", environment[2])
            if config.batch_size < self.world:
                raise ValueError(
                    f"batch_size = {config.batch_size} is the global batch and must be >= the "
                    f"world size {self.world}"
                )
        if self.bundle is None:
            self.bundle = load_bundle(config)
        train = self.bundle.train
        if len(train) == 0:
            raise ValueError(f"dataset {config.dataset!r} has no training images")
        channels, height, width = train.image_shape
        self.meta = {
            "in_channels": channels,
            "image_size": height if height == width else (height, width),
            "num_classes": train.num_classes,
            "dataset": self.bundle.name,
            "world_size": self.world,
        }
        torch.manual_seed(config.seed)
        self.model, self.loss = build_model_and_loss(
            config,
            in_channels=channels,
            image_size=self.meta["image_size"],
            num_classes=train.num_classes,
            device=self.device,
            process_group=dist.group.WORLD if self.distributed else None,
        )
        if config.channels_last:
            self.model = self.model.to(memory_format=torch.channels_last)
        self.forward_model = self.model
        if config.grad_accumulation > 1 and self.distributed:
            raise ValueError("grad_accumulation > 1 is supported in single-process runs only")
        if config.compile:
            self.forward_model = torch.compile(self.model)  # the same parameters
        if self.distributed:
            from torch.nn.parallel import DistributedDataParallel

            device_ids = [self.device.index] if self.device.type == "cuda" else None
            self.forward_model = DistributedDataParallel(self.model, device_ids=device_ids)
        n = len(train)
        self.steps_per_epoch = math.ceil(n / config.batch_size)
        if n % config.batch_size == 1 and n > 1:  # a batch of one breaks BatchNorm
            self.steps_per_epoch -= 1
        params = list(self.model.parameters()) + list(self.loss.parameters())
        self.optimizer = build_optimizer(
            params,
            config.optimizer,
            lr=config.lr,
            weight_decay=config.weight_decay,
            momentum=config.momentum,
        )
        self.scheduler = build_scheduler(
            self.optimizer,
            schedule=config.schedule,
            epochs=config.epochs,
            steps_per_epoch=self.steps_per_epoch,
            warmup_epochs=config.warmup_epochs,
            step_epochs=config.step_epochs,
            gamma=config.gamma,
            power=config.poly_power,
        )
        if config.amp == "fp16" and self.device.type != "cuda":
            raise ValueError("amp='fp16' needs a CUDA device; use amp='bf16' on CPU")
        self.amp_dtype = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}[config.amp]
        self.scaler = torch.amp.GradScaler("cuda", enabled=config.amp == "fp16")
        self.augmentation = build_augmentation(config.augment)
        self.streamed = isinstance(train, StreamedImageSet)
        self.train_x = None if self.streamed else torch.as_tensor(train.images)
        self.train_y = torch.as_tensor(train.labels, dtype=torch.int64)

    def _state(self, epoch: int) -> dict[str, Any]:
        state: dict[str, Any] = {
            "epoch": epoch,
            "config": self.config.to_dict(),
            "meta": self.meta,
            "model": self.model.state_dict(),
            "loss": self.loss.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "rng": torch.get_rng_state(),
            "history": [dict(row) for row in self.history],
        }
        if self.device.type == "cuda":
            state["cuda_rng"] = torch.cuda.get_rng_state(self.device)
        return state

    def _restore(self, path: Path) -> int:
        """Load the checkpoint at ``path`` into the model, loss, optimizer, schedule, scaler
        and RNG; set :attr:`history` from it (from ``history.csv`` for a format-1
        checkpoint). Returns the number of completed epochs."""
        if has_sharded_checkpoint(path.parent):
            return self._restore_sharded(path.parent)
        state = load_checkpoint(path)
        self._check_same_config(self._saved_config(state["config"], path), path)
        try:
            self.model.load_state_dict(state["model"])
            self.loss.load_state_dict(state["loss"])
            self.optimizer.load_state_dict(self._local_optimizer_state(state["optimizer"]))
        except (RuntimeError, ValueError, KeyError) as error:
            raise CheckpointError(f"checkpoint {path} does not fit this model: {error}") from error
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        torch.set_rng_state(state["rng"])
        if "cuda_rng" in state and self.device.type == "cuda":
            torch.cuda.set_rng_state(state["cuda_rng"], self.device)
        epoch = int(state["epoch"])
        if "history" in state:
            self.history = [dict(row) for row in state["history"]][:epoch]
        else:  # format 1: the CSV, cut to the checkpoint's epochs
            csv_path = path.parent / HISTORY_NAME
            self.history = read_history(csv_path)[:epoch] if csv_path.is_file() else []
        return epoch

    def _saved_config(self, saved: dict[str, Any], source: Path) -> dict[str, Any]:
        """The saved configuration with the defaults of keys added since it was written."""
        return config_from_dict(dict(saved), source=str(source)).to_dict()

    def _check_same_config(self, saved: dict[str, Any], source: Path) -> None:
        current = self.config.to_dict()
        differ = sorted(
            k for k in current if k not in RESUMABLE_KEYS and saved.get(k) != current[k]
        )
        if differ:
            details = ", ".join(f"{k}: {saved.get(k)!r} -> {current[k]!r}" for k in differ)
            raise CheckpointError(
                f"checkpoint {source} is from another configuration ({details}); "
                "use --overwrite to start afresh"
            )

    def _weight_index(self) -> int | None:
        """The class centers' index in the optimizer's state (None if not optimized)."""
        position = 0
        for group in self.optimizer.param_groups:
            for parameter in group["params"]:
                if parameter is self.loss.weight:
                    return position
                position += 1
        return None

    def _local_optimizer_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """An optimizer state dict saved by one process, with the class centers' state cut to
        this rank's block when the head is sharded."""
        shard = getattr(self.loss, "shard", None)
        index = self._weight_index()
        if shard is None or index is None or index not in state["state"]:
            return state
        k = self.loss.sub_centers
        full = self.loss.num_classes * k
        entries = dict(state["state"][index])
        for key, value in entries.items():
            if isinstance(value, Tensor) and value.dim() == 2 and value.shape[0] == full:
                entries[key] = value[shard.start * k : shard.stop * k].clone()
        return {**state, "state": {**state["state"], index: entries}}

    def _restore_sharded(self, run_dir: Path) -> int:
        """:meth:`_restore` from a checkpoint that ranks wrote through DCP (any world size)."""
        folder = run_dir / SHARDED_CHECKPOINT_NAME
        sidecar = read_sidecar(run_dir)
        self._check_same_config(self._saved_config(sidecar["config"], folder), folder)
        entries = checkpoint_entries(run_dir)
        from ..head import reshardable_state_dict

        targets: dict[str, Any] = {f"model/{k}": v for k, v in self.model.state_dict().items()}
        targets.update({f"loss/{k}": v for k, v in reshardable_state_dict(self.loss).items()})
        index = self._weight_index()
        prefix = f"optimizer/{index}/"
        holders: dict[str, Tensor] = {}
        for key, (size, dtype) in entries.items():
            if key.startswith(prefix) and tuple(size) == tuple(targets["loss/weight"].shape):
                holder = torch.empty_like(self.loss.weight, dtype=dtype)  # (c·K, D)
                holders[key] = holder
                targets[key] = class_rows(holder, self.loss)
        filled = load_sharded_tensors(run_dir, targets, distributed=self.distributed)
        optimizer_json = sidecar["optimizer"]
        state: dict[Any, dict[str, Any]] = {}
        for key, value in filled.items():
            if key.startswith("optimizer/"):
                _, position, name = key.split("/", 2)
                value = holders.get(key, value)
                state.setdefault(int(position), {})[name] = value
        for position, extra in optimizer_json.get("state", {}).items():
            state.setdefault(int(position), {}).update(extra)
        try:
            self.optimizer.load_state_dict(
                {"state": state, "param_groups": optimizer_json["param_groups"]}
            )
        except (RuntimeError, ValueError, KeyError) as error:
            raise CheckpointError(
                f"checkpoint {folder} does not fit this model: {error}"
            ) from error
        self.scheduler.load_state_dict(sidecar["scheduler"])
        self.scaler.load_state_dict(sidecar.get("scaler", {}))
        rng = filled.get(f"rng/{self.rank}", filled.get("rng/0"))
        if rng is not None:
            torch.set_rng_state(rng)
        epoch = int(sidecar["epoch"])
        self.history = [dict(row) for row in sidecar.get("history", [])][:epoch]
        return epoch

    def _first_non_finite(self) -> str | None:
        """The name of the first parameter (``model.<name>`` or ``loss.<name>``) holding a NaN
        or inf, or None."""
        for prefix, module in (("model", self.model), ("loss", self.loss)):
            for name, parameter in module.named_parameters():
                if not bool(torch.isfinite(parameter).all()):
                    return f"{prefix}.{name}"
        return None

    def _way_forward(self) -> str:
        """What the user can do now, true to what is on disk."""
        checkpoint = self.run_dir / CHECKPOINT_NAME
        sharded = has_sharded_checkpoint(self.run_dir)
        if checkpoint.is_file() or sharded:
            try:
                if sharded:
                    epoch = int(read_sidecar(self.run_dir)["epoch"])
                else:
                    epoch = int(load_checkpoint(checkpoint)["epoch"])
            except CheckpointError:
                epoch = None
            done = f"the checkpoint of epoch {epoch}" if epoch else "the last checkpoint"
            return (
                f"{done} is kept in {self.run_dir}; continue with `marginface train --out "
                f"{self.run_dir} --resume` (or start again with --overwrite)"
            )
        return (
            f"no epoch was completed, so no checkpoint was written; start again with "
            f"`marginface train ... --out {self.run_dir} --overwrite`"
        )

    def _diverged(self, what: str, epoch: int, step: int | None) -> TrainingDivergedError:
        where = f"epoch {epoch + 1}" + (f", step {step + 1}" if step is not None else "")
        parameter = self._first_non_finite()
        cause = f"parameter {parameter} became non-finite" if parameter else what
        return TrainingDivergedError(
            f"{cause} at {where}; {self._way_forward()}. Try a lower lr, a warm-up, grad_clip "
            "or another scale."
        )

    # ---------------------------------------------------------------- loop
    def _batch(
        self,
        index: Tensor,
        augment_generator: torch.Generator | None = None,
        loaded: tuple[Tensor, Tensor] | None = None,
    ) -> tuple[Tensor, Tensor]:
        """The images and labels of ``index`` on the device, augmented; ``loaded``: the
        batch a DataLoader already read (streamed datasets)."""
        if loaded is not None:
            images = loaded[0].to(self.device, non_blocking=True)
            labels = loaded[1].to(self.device, dtype=torch.int64, non_blocking=True)
        else:
            images = self.train_x[index].to(self.device, non_blocking=True)
            labels = self.train_y[index].to(self.device, non_blocking=True)
        if self.augmentation is not None and augment_generator is not None:
            images = self.augmentation(images, augment_generator)
        if self.config.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        return images, labels

    def _loader(self, epoch: int, order: Tensor) -> Any:
        """A DataLoader over this rank's share of every global batch of the epoch
        (streamed datasets), with ``config.workers`` worker processes."""
        from torch.utils.data import DataLoader

        dataset = self.bundle.train.dataset
        inner = getattr(dataset, "dataset", dataset)  # a Subset's dataset (--limit)
        if hasattr(inner, "set_epoch"):
            inner.set_epoch(epoch)
        size = self.config.batch_size
        batches = []
        for step in range(self.steps_per_epoch):
            index = order[step * size : (step + 1) * size]
            if self.distributed:
                index = rank_slice(index, self.rank, self.world)
            batches.append(index.tolist())
        return iter(
            DataLoader(
                dataset,
                batch_sampler=batches,
                num_workers=self.config.workers,
                pin_memory=self.device.type == "cuda",
            )
        )

    def _train_epoch(self, epoch: int) -> float:
        config = self.config
        self.model.train()
        self.loss.train()
        order = torch.randperm(len(self.train_y), generator=_epoch_generator(config.seed, epoch))
        loader = self._loader(epoch, order) if self.streamed else None
        augment_generator = _epoch_generator(config.seed, epoch, stream=1)
        progress = self._reporter.epoch(epoch)
        total, count = 0.0, 0
        try:
            for step in range(self.steps_per_epoch):
                value, size = self._train_step(epoch, step, order, loader, augment_generator)
                total += value * size
                count += size
                progress.update(step, loss=value, mean_loss=total / count, images=count)
        finally:
            progress.close()
        return total / count

    def _train_step(
        self,
        epoch: int,
        step: int,
        order: Tensor,
        loader: Any,
        augment_generator: torch.Generator,
    ) -> tuple[float, int]:
        """One optimizer step; returns the batch's loss and its number of images (the global
        batch's)."""
        config = self.config
        index = order[step * config.batch_size : (step + 1) * config.batch_size]
        mine = rank_slice(index, self.rank, self.world) if self.distributed else index
        loaded = _next_batch(loader) if loader is not None else None
        images, labels = self._batch(mine, augment_generator, loaded)
        self.optimizer.zero_grad(set_to_none=True)
        value = 0.0
        # grad_accumulation: forward/backward per micro-batch, losses weighted by their share
        for part_images, part_labels in micro_batches(images, labels, config.grad_accumulation):
            share = part_labels.shape[0] / labels.shape[0]
            value += share * self._forward_backward(part_images, part_labels, share, epoch, step)
        if config.grad_clip is not None:
            self.scaler.unscale_(self.optimizer)
            self._clip_gradients(config.grad_clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()
        completed = epoch * self.steps_per_epoch + step + 1
        if (
            config.verify_every
            and self.bundle.verification
            and (completed % config.verify_every == 0)
        ):
            self._log_step_verification(completed)
        return value, len(index)

    def _forward_backward(
        self, images: Tensor, labels: Tensor, share: float, epoch: int, step: int
    ) -> float:
        """Forward ``images``, add ``share`` × the gradient of their loss; returns the loss."""
        with torch.autocast(
            self.device.type, dtype=self.amp_dtype, enabled=self.amp_dtype is not None
        ):
            embeddings = self.forward_model(images)  # (b, D), this rank's rows
        finite = bool(torch.isfinite(embeddings).all())
        if self.distributed:
            finite = all_ranks_true(finite, self.device)
        if not finite:
            raise self._diverged("the embeddings became non-finite", epoch, step)
        loss = self.loss(embeddings.float(), labels)  # the global batch's loss
        value = float(loss.detach())
        if not math.isfinite(value):
            raise self._diverged(f"the loss became {value}", epoch, step)
        self.scaler.scale(loss * share if share != 1.0 else loss).backward()
        return value

    def _log_step_verification(self, step: int) -> None:
        """Every ``verify_every`` steps: the verification sets' accuracy, logged and (rank 0)
        appended to ``verification.csv`` (step, then one column per set)."""
        row: dict[str, Any] = {"step": step, **self._verify()}
        self.model.train()
        self.step_verification.append(row)
        if self.is_main:
            write_history(self.run_dir / VERIFICATION_NAME, self.step_verification)
            for callback in self.step_callbacks:
                callback(row)

    def _clip_gradients(self, max_norm: float) -> None:
        """Clip the global gradient norm to ``max_norm``; with a sharded head the centers'
        squared norm is summed over ranks (the backbone's gradient is replicated by DDP)."""
        params = [p for g in self.optimizer.param_groups for p in g["params"] if p.grad is not None]
        if not self.distributed:
            torch.nn.utils.clip_grad_norm_(params, max_norm)
            return
        weight = self.loss.weight
        sharded = [p for p in params if p is weight]
        replicated = [p for p in params if p is not weight]
        squares = torch.zeros(2, dtype=torch.float64, device=self.device)
        for p in replicated:
            squares[0] += p.grad.detach().double().pow(2).sum()
        for p in sharded:
            squares[1] += p.grad.detach().double().pow(2).sum()
        sharded_total = squares[1:].clone()
        dist.all_reduce(sharded_total)
        norm = float((squares[0] + sharded_total[0]).sqrt())
        factor = max_norm / (norm + 1e-6)
        if factor < 1:
            for p in params:
                p.grad.detach().mul_(factor)

    def _images_per_epoch(self) -> int:
        """Training images of the global batch per epoch (the batches actually run)."""
        return min(len(self.train_y), self.steps_per_epoch * self.config.batch_size)

    def _prepare_run_dir(self, *, resume: bool, overwrite: bool) -> Path:
        """:func:`prepare_run_dir` on rank 0; the other ranks raise the same error if it
        failed, and wait for it otherwise."""
        failure: tuple[str, str] | None = None
        if self.is_main:
            try:
                prepare_run_dir(self.run_dir, resume=resume, overwrite=overwrite)
                remove_stale_temporaries(self.run_dir)
            except (OSError, ValueError) as error:
                failure = (type(error).__name__, str(error))
                if not self.distributed:
                    raise
        if self.distributed:
            failure = broadcast_object(failure)
            if failure is not None:
                kinds = {"OutputExistsError": OutputExistsError, "CheckpointError": CheckpointError}
                raise kinds.get(failure[0], ValueError)(failure[1])
        return self.run_dir

    def _save(self, epoch: int, checkpoint: Path) -> None:
        """Write the checkpoint of ``epoch``: one file from one process, or every rank's share
        through DCP; the other format, now older, is removed."""
        if not self.distributed:
            save_checkpoint(self._state(epoch), checkpoint)
            stale = self.run_dir / SHARDED_CHECKPOINT_NAME
            if stale.is_dir():
                shutil.rmtree(stale)
            return
        extra = {
            "config": self.config.to_dict(),
            "meta": self.meta,
            "history": [dict(row) for row in self.history],
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
        }
        save_sharded_checkpoint(
            self.run_dir,
            epoch=epoch,
            model=self.model,
            loss=self.loss,
            optimizer=self.optimizer,
            extra=extra,
        )

    def _test_embeddings(self, *, flip: bool) -> Tensor:
        """Embeddings ``float32[N, D]`` (on the CPU) of the test images."""
        return extract_embeddings(
            self.model,
            self.bundle.test.images,
            batch_size=self.config.eval_batch_size,
            device=self.device,
            channels_last=self.config.channels_last,
            amp_dtype=self.amp_dtype,
            flip=flip,
        )

    @torch.no_grad()
    def _evaluate(self) -> dict[str, float]:
        test = self.bundle.test
        if len(test) == 0:
            return {"val_loss": math.nan, "accuracy": math.nan}
        if self.bundle.open_set:
            return self._evaluate_open_set()
        embeddings = self._test_embeddings(flip=False).to(self.device)
        labels = torch.as_tensor(test.labels, device=self.device)
        self.loss.eval()
        if self.distributed:  # each rank passes its share; the loss is the whole set's
            mine = rank_slice(torch.arange(len(labels)), self.rank, self.world)
            val_loss = float(self.loss(embeddings[mine], labels[mine]))
            predicted = self._sharded_argmax(embeddings)
        else:
            val_loss = float(self.loss(embeddings, labels))
            predicted = self.loss.cosine(embeddings).argmax(dim=1)  # (N,) the seed's SoftmaxHead
        accuracy = float((predicted == labels).double().mean())
        return {"val_loss": val_loss, "accuracy": accuracy}

    def _sharded_argmax(self, embeddings: Tensor) -> Tensor:
        """The class of highest cosine for every row, ``Tensor[N]``, over the classes of every
        rank (ties: the lowest class index, as ``argmax`` on one process)."""
        cosine = self.loss.cosine(embeddings)  # (N, c) this rank's classes
        if cosine.shape[1]:
            values, index = cosine.max(dim=1)
        else:
            values = torch.full((cosine.shape[0],), -math.inf, device=cosine.device)
            index = torch.zeros(cosine.shape[0], dtype=torch.int64, device=cosine.device)
        index = index + self.loss.class_range[0]
        every_value = [torch.empty_like(values) for _ in range(self.world)]
        every_index = [torch.empty_like(index) for _ in range(self.world)]
        dist.all_gather(every_value, values.contiguous())
        dist.all_gather(every_index, index.contiguous())
        best = torch.stack(every_value).argmax(dim=0)  # (N,) the first rank holding the max
        return torch.stack(every_index).gather(0, best.unsqueeze(0)).squeeze(0)

    @torch.no_grad()
    def _verify(self) -> dict[str, float]:
        """Accuracy ± std (10 folds, flip-summed embeddings, insightface's protocol through the
        library's verification) of every verification set of the dataset."""
        row: dict[str, float] = {}
        for name, verification in self.bundle.verification.items():
            embeddings = extract_embeddings(
                self.model,
                verification.images,
                batch_size=self.config.eval_batch_size,
                device=self.device,
                channels_last=self.config.channels_last,
                amp_dtype=self.amp_dtype,
                flip=True,
                transform=verification.model_input,
            )
            metrics = evaluate_pairs(embeddings.numpy(), verification.pairs)
            row[f"{name}_accuracy"] = float(metrics.accuracy)
            row[f"{name}_accuracy_std"] = float(metrics.accuracy_std)
            logger.debug(
                "[%s] accuracy-flip: %.5f+-%.5f", name, metrics.accuracy, metrics.accuracy_std
            )
        return row

    def _evaluate_open_set(self) -> dict[str, float]:
        """Open-set test data (new identities): verification of the test pairs instead of a
        closed-set accuracy, with the thresholds of :func:`evaluate_pairs` and the run's
        ``flip`` setting (the figures ``marginface evaluate`` gives for this checkpoint)."""
        if self._pairs is None:
            self._pairs = verification_pairs(self.bundle)
        embeddings = self._test_embeddings(flip=self.config.flip)
        verification = evaluate_pairs(embeddings.numpy(), self._pairs)
        return {
            "val_loss": math.nan,
            "accuracy": math.nan,
            "verification_accuracy": float(verification.accuracy),
            "auc": float(verification.auc),
        }

    def fit(self, *, resume: bool = False, overwrite: bool = False) -> list[dict[str, Any]]:
        """Train for ``config.epochs`` epochs (or the rest of them with ``resume``).

        Returns the history: one dict per epoch with ``epoch``, ``loss`` (training, mean over
        samples), ``val_loss`` and ``accuracy`` (closed-set, on the test set; NaN for open-set
        datasets, which log ``verification_accuracy`` and ``auc`` of their test pairs),
        ``lr``, ``seconds`` (training time of the epoch) and the margin's scalar buffers
        (CurricularFace's ``t``, AdaCos's ``scale``...).

        Raises:
            OutputExistsError: ``run_dir`` exists and neither ``resume`` nor ``overwrite``.
            CheckpointError: resuming from a missing, corrupt or incompatible checkpoint.
            TrainingDivergedError: the loss became NaN/inf (the last checkpoint is kept).
            DiskFullError: a checkpoint did not fit (the previous one is kept; the message
                says which and how to go on).
        """
        flushing = flushes_denormals()
        try:
            return self._fit(resume=resume, overwrite=overwrite)
        finally:  # the process's floating-point mode as it was (the trainer flushes denormals)
            torch.set_flush_denormal(flushing)

    def _fit(self, *, resume: bool, overwrite: bool) -> list[dict[str, Any]]:
        self._init_distributed()
        run_dir = self._prepare_run_dir(resume=resume, overwrite=overwrite)
        self._setup()
        start = 0
        checkpoint = run_dir / CHECKPOINT_NAME
        self.history = []
        if resume:
            start = self._restore(checkpoint)
        elif self.initial_state is not None:
            self.model.load_state_dict(self.initial_state["model"])
            if "loss" in self.initial_state:
                self.loss.load_state_dict(self.initial_state["loss"])
        history_path = run_dir / HISTORY_NAME
        self.step_verification = []
        if resume and (run_dir / VERIFICATION_NAME).is_file():
            done = start * self.steps_per_epoch
            rows = read_history(run_dir / VERIFICATION_NAME)
            self.step_verification = [row for row in rows if row["step"] <= done]
        if self.is_main:
            save_config(self.config, run_dir / CONFIG_NAME)
            write_history(history_path, self.history)  # completes a CSV cut short by a kill
        self._reporter = ProgressReporter(
            self.progress if self.is_main else "none",
            epochs=self.config.epochs,
            steps_per_epoch=self.steps_per_epoch,
            start_epoch=start,
            interval=self.progress_seconds,
        )
        board = None
        if self.config.tensorboard and self.is_main:
            board = TensorBoardLogger(run_dir / "tensorboard")
        try:
            for epoch in range(start, self.config.epochs):
                began = time.perf_counter()
                train_loss = self._train_epoch(epoch)
                seconds = time.perf_counter() - began
                parameter = self._first_non_finite()
                if parameter is not None:
                    raise self._diverged("", epoch, None)
                row: dict[str, Any] = {
                    "epoch": epoch + 1,
                    "loss": train_loss,
                    **self._evaluate(),
                    **self._verify(),
                    "lr": self.optimizer.param_groups[0]["lr"],
                    "seconds": seconds,
                    "images_per_second": self._images_per_epoch() / seconds,
                    **margin_state(self.loss),
                }
                self.history.append(row)
                try:
                    self._save(epoch + 1, checkpoint)
                except BaseException as error:
                    self.history.pop()
                    if isinstance(error, DiskFullError):  # say what is kept and how to go on
                        raise DiskFullError(
                            error.errno,
                            f"disk full: could not write {checkpoint} (free some space); "
                            f"{self._way_forward()}",
                            str(checkpoint),
                        ) from error
                    raise
                if self.is_main:
                    write_history(history_path, self.history)
                    if board is not None:
                        board.log(row)
                    logger.debug("epoch %d: %s", epoch + 1, row)
                    for callback in self.callbacks:
                        callback(row)
        except KeyboardInterrupt:
            raise TrainingInterrupted(f"interrupted; {self._way_forward()}") from None
        except RuntimeError as error:
            if not self.distributed or isinstance(error, TrainingDivergedError):
                raise
            first = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
            raise RankFailureError(
                f"rank {self.rank}: a collective failed (another rank died, raised, or hung past "
                f"--dist-timeout = {self.config.dist_timeout:g} s): {first}; "
                f"{self._way_forward()}"
            ) from error
        finally:
            if board is not None:
                board.close()
        return self.history


def flushes_denormals() -> bool:
    """Whether this thread's CPU arithmetic flushes subnormal floats to zero (as after
    ``torch.set_flush_denormal(True)``; torch has no getter): ``1e-39·1`` in float32 is 0."""
    tiny = torch.full((1,), 1e-39, dtype=torch.float32)  # subnormal in float32
    return bool((tiny * 1.0).item() == 0.0)


def train(
    config: TrainConfig,
    run_dir: str | Path,
    *,
    resume: bool = False,
    overwrite: bool = False,
    **kwargs: Any,
) -> Trainer:
    """Build a :class:`Trainer`, :meth:`~Trainer.fit` it, and return it (with ``.model``,
    ``.loss`` and ``.history``)."""
    trainer = Trainer(config, run_dir, **kwargs)
    trainer.fit(resume=resume, overwrite=overwrite)
    return trainer
