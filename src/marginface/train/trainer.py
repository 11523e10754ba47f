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
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..config import TrainConfig, save_config
from ..data import DatasetBundle
from ..data.augment import build_augmentation
from .checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from .embeddings import extract_embeddings
from .evaluate import evaluate_pairs, verification_pairs
from .history import CSVLogger, TensorBoardLogger, margin_state, read_history
from .optim import build_optimizer, build_scheduler
from .run import (
    CHECKPOINT_NAME,
    CONFIG_NAME,
    HISTORY_NAME,
    build_model_and_loss,
    load_bundle,
    prepare_run_dir,
    resolve_device,
)

__all__ = ["RESUMABLE_KEYS", "Trainer", "TrainingDivergedError", "train"]

logger = logging.getLogger(__name__)

RESUMABLE_KEYS = frozenset(
    {"epochs", "device", "threads", "tensorboard", "eval_batch_size", "flip", "data_dir"}
)
"""Configuration keys that may change between an interrupted run and its ``--resume``."""

EpochCallback = Callable[[dict[str, Any]], None]


class TrainingDivergedError(RuntimeError):
    """The loss became NaN or infinite; the last good checkpoint is left in place."""


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
        progress: show a tqdm bar per epoch (stderr). Default: False.
        callbacks: called with each epoch's log row after its checkpoint is written.

    Use :meth:`fit`.
    """

    def __init__(
        self,
        config: TrainConfig,
        run_dir: str | Path,
        *,
        bundle: DatasetBundle | None = None,
        progress: bool = False,
        callbacks: list[EpochCallback] | None = None,
    ) -> None:
        self.config = config.resolved()  # ValueError for an unknown loss, before any output
        self.run_dir = Path(run_dir)
        self.bundle = bundle
        self.progress = progress
        self.callbacks = list(callbacks or [])
        self.history: list[dict[str, Any]] = []
        self.model: nn.Module | None = None
        self.loss: nn.Module | None = None
        self._pairs = None

    # ---------------------------------------------------------------- setup
    def _setup(self) -> None:
        config = self.config
        if config.threads is not None:
            torch.set_num_threads(config.threads)
        # Denormal floats slow CPU convolutions' backward passes by up to 10× on small images
        # (measured on digits); flushing them to zero changes nothing measurable otherwise.
        torch.set_flush_denormal(True)
        self.device = resolve_device(config.device)
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
        }
        torch.manual_seed(config.seed)
        self.model, self.loss = build_model_and_loss(
            config,
            in_channels=channels,
            image_size=self.meta["image_size"],
            num_classes=train.num_classes,
            device=self.device,
        )
        if config.channels_last:
            self.model = self.model.to(memory_format=torch.channels_last)
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
        )
        if config.amp == "fp16" and self.device.type != "cuda":
            raise ValueError("amp='fp16' needs a CUDA device; use amp='bf16' on CPU")
        self.amp_dtype = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}[config.amp]
        self.scaler = torch.amp.GradScaler("cuda", enabled=config.amp == "fp16")
        self.augmentation = build_augmentation(config.augment)
        self.train_x = torch.as_tensor(train.images)
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
        }
        if self.device.type == "cuda":
            state["cuda_rng"] = torch.cuda.get_rng_state(self.device)
        return state

    def _restore(self, path: Path) -> int:
        state = load_checkpoint(path)
        saved = state["config"]
        current = self.config.to_dict()
        differ = sorted(
            k for k in current if k not in RESUMABLE_KEYS and saved.get(k) != current[k]
        )
        if differ:
            details = ", ".join(f"{k}: {saved.get(k)!r} -> {current[k]!r}" for k in differ)
            raise CheckpointError(
                f"checkpoint {path} is from another configuration ({details}); "
                "use --overwrite to start afresh"
            )
        try:
            self.model.load_state_dict(state["model"])
            self.loss.load_state_dict(state["loss"])
            self.optimizer.load_state_dict(state["optimizer"])
        except (RuntimeError, ValueError, KeyError) as error:
            raise CheckpointError(f"checkpoint {path} does not fit this model: {error}") from error
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        torch.set_rng_state(state["rng"])
        if "cuda_rng" in state and self.device.type == "cuda":
            torch.cuda.set_rng_state(state["cuda_rng"], self.device)
        return int(state["epoch"])

    # ---------------------------------------------------------------- loop
    def _batch(
        self, index: Tensor, augment_generator: torch.Generator | None = None
    ) -> tuple[Tensor, Tensor]:
        images = self.train_x[index].to(self.device, non_blocking=True)
        if self.augmentation is not None and augment_generator is not None:
            images = self.augmentation(images, augment_generator)
        if self.config.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        return images, self.train_y[index].to(self.device, non_blocking=True)

    def _train_epoch(self, epoch: int) -> float:
        config = self.config
        self.model.train()
        self.loss.train()
        order = torch.randperm(len(self.train_x), generator=_epoch_generator(config.seed, epoch))
        augment_generator = _epoch_generator(config.seed, epoch, stream=1)
        steps = range(self.steps_per_epoch)
        if self.progress:
            from tqdm.auto import tqdm

            steps = tqdm(steps, desc=f"epoch {epoch + 1}/{config.epochs}", leave=False)
        total, count = 0.0, 0
        for step in steps:
            index = order[step * config.batch_size : (step + 1) * config.batch_size]
            images, labels = self._batch(index, augment_generator)
            with torch.autocast(
                self.device.type, dtype=self.amp_dtype, enabled=self.amp_dtype is not None
            ):
                embeddings = self.model(images)  # (B, D)
            finite = bool(torch.isfinite(embeddings).all())
            loss = self.loss(embeddings.float(), labels) if finite else None
            value = float(loss.detach()) if finite else math.nan
            if not math.isfinite(value):
                raise TrainingDivergedError(
                    f"loss became {value} at epoch {epoch + 1}, step {step + 1}; the last good "
                    f"checkpoint (epoch {epoch}) is kept in {self.run_dir}. Try a lower lr, "
                    "a warm-up, grad_clip or another scale."
                )
            self.optimizer.zero_grad(set_to_none=True)
            self.scaler.scale(loss).backward()
            if config.grad_clip is not None:
                self.scaler.unscale_(self.optimizer)
                params = [p for g in self.optimizer.param_groups for p in g["params"]]
                torch.nn.utils.clip_grad_norm_(params, config.grad_clip)
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self.scheduler.step()
            total += value * len(index)
            count += len(index)
            if self.progress:
                steps.set_postfix(loss=f"{value:.4f}")
        return total / count

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
        val_loss = float(self.loss(embeddings, labels))
        predicted = self.loss.cosine(embeddings).argmax(dim=1)  # (N,) the seed's SoftmaxHead
        accuracy = float((predicted == labels).double().mean())
        return {"val_loss": val_loss, "accuracy": accuracy}

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
        """
        run_dir = prepare_run_dir(self.run_dir, resume=resume, overwrite=overwrite)
        self._setup()
        start = 0
        checkpoint = run_dir / CHECKPOINT_NAME
        if resume:
            start = self._restore(checkpoint)
        save_config(self.config, run_dir / CONFIG_NAME)
        history_path = run_dir / HISTORY_NAME
        csv_log = CSVLogger(history_path, keep_epochs=start if resume else None)
        self.history = read_history(history_path) if resume and history_path.is_file() else []
        board = TensorBoardLogger(run_dir / "tensorboard") if self.config.tensorboard else None
        try:
            for epoch in range(start, self.config.epochs):
                began = time.perf_counter()
                train_loss = self._train_epoch(epoch)
                seconds = time.perf_counter() - began
                row: dict[str, Any] = {
                    "epoch": epoch + 1,
                    "loss": train_loss,
                    **self._evaluate(),
                    "lr": self.optimizer.param_groups[0]["lr"],
                    "seconds": seconds,
                    **margin_state(self.loss),
                }
                save_checkpoint(self._state(epoch + 1), checkpoint)
                csv_log.log(row)
                if board is not None:
                    board.log(row)
                self.history.append(row)
                logger.info("epoch %d: %s", epoch + 1, row)
                for callback in self.callbacks:
                    callback(row)
        finally:
            if board is not None:
                board.close()
        return self.history


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
