"""The training loop: seeded, resumable bit for bit, with a per-epoch CSV log.

Determinism: the initial weights come from ``torch.manual_seed(config.seed)``; epoch ``e``
shuffles and draws its augmentations with its own generators seeded ``(seed, e)``; dropout
draws from the global RNG, whose state is saved in every checkpoint and restored on resume. So
a run interrupted after epoch ``k`` and resumed ends with the same weights as an uninterrupted
run (same device and threads), also from a step checkpoint (:mod:`.step_position`).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from .._progress import (
    DEFAULT_PROGRESS_SECONDS,
    ProgressReporter,
    check_progress_seconds,
    progress_output,
    resolve_progress_mode,
)
from ..data import DatasetBundle
from ..head.state import per_class_parameters
from .batches import BatchSource, epoch_generator, global_batch
from .build import (
    build_training,
    configure_process,
    flushes_denormals,
    load_bundle,
    load_initial_state,
)
from .config import TrainConfig, save_config
from .distributed import (
    all_ranks_true,
    clip_gradient_norm,
    join_process_group,
    rank_slice,
    resolve_device,
)
from .evaluation.epoch_evaluation import EpochEvaluator
from .failures import (
    TrainingDivergedError,
    TrainingInterrupted,
    diverged,
    first_non_finite,
    training_failures,
)
from .finetune import init_centers_from_class_means, pretrained_state
from .loader_errors import next_batch as _next_batch
from .run_log import EpochCallback, RunLog, run_log_attribute
from .schedule import micro_batches
from .state.checkpoint_writer import CheckpointPolicy, CheckpointWriter
from .state.layout import CONFIG_NAME
from .state.preemption import StopSignals, TrainingPreemptedError
from .state.run_folder import prepare_run_dir, remove_if_empty
from .state.run_state import RESUMABLE_KEYS, RunObjects, SavedRun, run_to_continue
from .state.step_position import EpochTally, StepPosition, seed_host_generators

__all__ = [
    "RESUMABLE_KEYS",
    "Trainer",
    "TrainingDivergedError",
    "TrainingInterrupted",
    "TrainingPreemptedError",
    "flushes_denormals",
    "train",
]

logger = logging.getLogger(__name__)


class Trainer:
    """Train ``config.model`` with ``config.loss`` on ``config.dataset`` into ``run_dir``.

    Args:
        config: the :class:`~marginface.train.config.TrainConfig`. The trainer keeps (as
            ``.config``), uses and saves its :meth:`~marginface.train.config.TrainConfig.resolved`
            copy: ``loss_options`` with the pipeline's per-loss defaults filled in (``scale =
            30`` for every loss that takes a scale), so ``config.toml`` and the checkpoint show
            the options actually used.
        run_dir: the output directory (see :mod:`marginface.train.state.layout`).
        bundle: the dataset, if already loaded (else :func:`load_bundle` ``(config)``).
        progress: training progress on rank 0: ``True`` or ``"auto"``: a tqdm bar per epoch
            when stderr is a terminal, else a log line (logger ``marginface.train.progress``,
            INFO) every ``progress_seconds`` and at the end of every epoch, with step, loss,
            img/s and ETA (:mod:`marginface._progress`); ``"bar"``, ``"lines"``;
            ``False`` or ``"none"``: nothing. The evaluations show their progress the same
            way (:func:`~marginface._progress.track`). Default: False.
        progress_seconds: seconds between two progress lines (>= 0). Default:
            :data:`~marginface._progress.DEFAULT_PROGRESS_SECONDS` (30).
        progress_label: shown before every progress line (``compare``: the loss's name).
        start_message: logged (INFO, the main rank) once the run's data, model and state are
            built, just before the first step (``train``: the recipe it took), so a run that
            cannot start shows only its error; or a function of the run's ``meta`` (``in_channels``,
            ``image_size``, ``num_classes``...) returning that line (or None).
        callbacks: called with each epoch's log row after its checkpoint is written.
        initial_state: ``{"model": state_dict, "loss": state_dict}`` loaded into a fresh
            (not resumed) run before its first step (else ``config.init_from``'s weights, when
            set), e.g. a sub-center run cut to one center
            per class (:func:`~marginface.train.cleaning.continue_with_dominant_centers`);
            ``"loss"`` may be left out (``train --init-from``: a pretrained backbone, new
            class centers). The optimizer and schedule start afresh.
        checkpointing: step checkpoints, how many to keep, background writes, a stop on
            SIGTERM/SIGUSR1 (:class:`~marginface.train.state.checkpoint_writer.CheckpointPolicy`).

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
        progress_label: str = "",
        start_message: str | Callable[[dict[str, Any]], str | None] | None = None,
        callbacks: list[EpochCallback] | None = None,
        initial_state: dict[str, Any] | None = None,
        checkpointing: CheckpointPolicy | None = None,
    ) -> None:
        self.config = config.resolved()  # ValueError for an unknown loss, before any output
        self.run_dir = Path(run_dir)
        self.checkpoints = CheckpointWriter(self.run_dir, checkpointing)
        self._signals = StopSignals()
        self._resume_at: StepPosition | None = None  # a step checkpoint's position, restored
        self._resumed_seconds = 0.0  # training seconds of a resumed epoch before resuming
        self.bundle = bundle
        self.progress = resolve_progress_mode(progress)
        self.progress_seconds = check_progress_seconds(progress_seconds)
        self.progress_label = progress_label
        self.start_message = start_message
        self._reporter = ProgressReporter("none", epochs=1, steps_per_epoch=1)
        self.run_log = RunLog(self.run_dir, callbacks=callbacks)
        self.model: nn.Module | None = None
        self.head: nn.Module | None = None
        self.distributed = False
        self.rank, self.world = 0, 1
        self.forward_model: nn.Module | None = None
        self.initial_state = initial_state

    @property
    def loss(self) -> nn.Module | None:
        """The head (:class:`~marginface.head.MarginSoftmaxLoss`: the class centers and the
        margin), the same object as :attr:`head`; kept for code written before the rename."""
        return self.head

    @loss.setter
    def loss(self, head: nn.Module | None) -> None:
        self.head = head

    @property
    def is_main(self) -> bool:
        """Whether this process writes the run's files (rank 0, or the only process)."""
        return self.rank == 0

    history = run_log_attribute("history", "One row per completed epoch (see :meth:`fit`).")
    callbacks = run_log_attribute("callbacks", "Called with each epoch's row after its checkpoint.")
    step_callbacks = run_log_attribute("step_callbacks", "Called with each verification row.")
    step_verification = run_log_attribute(
        "step_verification", "The verification sets' accuracy every ``verify_every`` steps."
    )

    # ---------------------------------------------------------------- setup
    def _init_distributed(self) -> None:
        """Resolve the device and join torchrun's process group, if launched by torchrun (once
        per :meth:`fit`): the rank, the world size, and the rank's own GPU."""
        placement = join_process_group(resolve_device(self.config.device), self.config.dist_timeout)
        self.device, self.distributed, self.rank, self.world = placement

    def _setup(self) -> None:
        config = self.config
        configure_process(config.threads)  # denormals flushed while fit() runs
        if self.bundle is None:
            self.bundle = load_bundle(config)
        torch.manual_seed(config.seed)
        seed_host_generators(config.seed, self.rank)  # a checkpoint's states replace these
        built = build_training(
            config,
            self.bundle,
            device=self.device,
            world=self.world,
            process_group=dist.group.WORLD if self.distributed else None,
        )
        objects = built.objects
        self.model, self.head, self.optimizer = objects.model, objects.head, objects.optimizer
        self.scheduler, self.scaler = objects.scheduler, objects.scaler
        self.forward_model, self.meta = built.forward_model, built.meta
        self.steps_per_epoch, self.amp_dtype = built.steps_per_epoch, built.amp_dtype
        self.evaluator = EpochEvaluator(
            self.bundle,
            config,
            device=self.device,
            amp_dtype=self.amp_dtype,
            run_dir=self.run_dir if self.is_main else None,
        )
        self.batches = BatchSource(
            self.bundle.train,
            device=self.device,
            augmentation=built.augmentation,
            channels_last=config.channels_last,
        )
        self.images_per_epoch = self.batches.images_per_epoch(
            self.steps_per_epoch, config.batch_size
        )  # the training images of the epoch's global batches

    def _start_weights(self) -> None:
        """A fresh run's first weights: ``initial_state``, else ``config.init_from``'s
        backbone (:func:`~.finetune.pretrained_state`); then, with ``center_init =
        "class-mean"`` and no centers given, the class centers at the class-mean embeddings
        (:func:`~.finetune.init_centers_from_class_means`)."""
        config, state = self.config, self.initial_state
        if state is None and config.init_from is not None:
            weights = pretrained_state(config.init_from, config.model)
            state = {"model": weights, "source": str(config.init_from)}
        load_initial_state(self.model, self.head, state)
        if config.center_init == "class-mean" and not (state and "loss" in state):
            init_centers_from_class_means(
                self.model, self.head, self.bundle.train, batch_size=config.eval_batch_size,
                device=self.device, channels_last=config.channels_last,
            )  # fmt: skip

    def _objects(self) -> RunObjects:
        """What the run's checkpoint saves and restores (:mod:`.run_state`)."""
        return RunObjects(
            self.model, self.head, self.optimizer, self.scheduler, self.scaler, self.device
        )

    def _restore(self, saved: SavedRun) -> int:
        """Continue from ``saved``: the weights, optimizer, schedule, scaler and RNG restored
        (any world size), :attr:`history` its rows. Returns the completed epochs."""
        epoch = saved.restore(self._objects(), distributed=self.distributed)
        self.run_log.history = [dict(row) for row in saved.history]
        self.checkpoints.restored(epoch, saved.position.step if saved.position else 0)
        self._resume_at = saved.position
        return epoch

    def _diverged(self, what: str, epoch: int, step: int | None) -> TrainingDivergedError:
        """:func:`~marginface.train.failures.diverged`, naming the first non-finite parameter."""
        parameter = first_non_finite(self.model, self.head)
        way_forward = self.checkpoints.way_forward()
        return diverged(what, epoch=epoch, step=step, parameter=parameter, way_forward=way_forward)

    # ---------------------------------------------------------------- loop
    def _batch(
        self,
        index: Tensor,
        augment_generator: torch.Generator | None = None,
        loaded: tuple[Tensor, Tensor] | None = None,
    ) -> tuple[Tensor, Tensor]:
        """The images and labels of ``index`` on the device, augmented; ``loaded``: the
        batch a DataLoader already read (streamed datasets; :meth:`.BatchSource.batch`)."""
        return self.batches.batch(index, augment_generator, loaded)

    def _train_epoch(self, epoch: int) -> float:
        config = self.config
        self.model.train()
        self.head.train()
        order = torch.randperm(len(self.batches), generator=epoch_generator(config.seed, epoch))
        augment_generator = epoch_generator(config.seed, epoch, stream=1)
        augment = augment_generator if self.batches.augmentation is not None else None
        tally = EpochTally.resume(epoch, self._resume_at, augment)  # a step checkpoint's sums
        self._resume_at, self._resumed_seconds = None, tally.seconds_before
        loader = self.batches.epoch_loader(
            order, epoch=epoch, steps=self.steps_per_epoch, batch_size=config.batch_size,
            rank=self.rank, world=self.world, workers=config.workers, first_step=tally.step,
        )  # fmt: skip
        progress = self._reporter.epoch(epoch)
        tally.start_clock()
        try:
            for step in range(tally.step, self.steps_per_epoch):
                value, size = self._train_step(epoch, step, order, loader, augment_generator)
                tally.add(value, size)
                progress.update(step, loss=value, mean_loss=tally.mean_loss, images=tally.images)
                self.checkpoints.after_step(  # a step checkpoint when due, a stop on a signal
                    tally, steps_per_epoch=self.steps_per_epoch, signals=self._signals,
                    distributed=self.distributed, device=self.device, save=self._save,
                )  # fmt: skip
        finally:
            progress.close()
        return tally.mean_loss

    def _train_step(
        self, epoch: int, step: int, order: Tensor, loader: Any, augment_generator: torch.Generator
    ) -> tuple[float, int]:
        """One optimizer step; returns the batch's loss and its number of images (the global
        batch's)."""
        config = self.config
        index = global_batch(order, step, config.batch_size)
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
            split = per_class_parameters(self.head).values() if self.distributed else ()
            clip_gradient_norm(
                [p for group in self.optimizer.param_groups for p in group["params"]],
                config.grad_clip,
                sharded=list(split),
            )
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()
        began = self._reporter.clock()
        row = self.evaluator.step_verification(self.model, epoch * self.steps_per_epoch + step + 1)
        if row is not None:  # every verify_every steps
            self._reporter.evaluated("step", self._reporter.clock() - began)
            self.run_log.add_step_verification(row)
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
        loss = self.head(embeddings.float(), labels)  # the global batch's loss
        value = float(loss.detach())
        if not math.isfinite(value):
            raise self._diverged(f"the loss became {value}", epoch, step)
        self.scaler.scale(loss * share if share != 1.0 else loss).backward()
        return value

    def _save(self, epoch: int, position: StepPosition | None = None, wait: bool = False) -> None:
        """Checkpoint ``epoch`` epochs (and ``position``) with :attr:`history`, in the
        background unless ``wait`` (:meth:`.CheckpointWriter.write`)."""
        run = {"config": self.config, "meta": self.meta, "history": self.history}
        self.checkpoints.write(
            self._objects(), epoch=epoch, position=position, distributed=self.distributed,
            wait=wait, **run
        )  # fmt: skip

    def fit(
        self, *, resume: bool | SavedRun = False, overwrite: bool = False
    ) -> list[dict[str, Any]]:
        """Train for ``config.epochs`` epochs (or the rest of them with ``resume``).

        Args:
            resume: continue the run in ``run_dir``: ``True`` reads its checkpoint
                (:func:`~marginface.train.state.run_state.read_saved_run`); a
                :class:`~marginface.train.state.run_state.SavedRun` is that checkpoint already read
                (the command line reads it once to resolve the configuration).
            overwrite: delete the run in ``run_dir`` first.

        Returns the history: one dict per epoch with ``epoch``, ``loss`` (training, mean over
        samples), ``val_loss`` and ``accuracy`` (closed-set, on the test set; NaN for open-set
        datasets, which log ``verification_accuracy`` and ``auc`` of their test pairs),
        ``lr``, ``seconds`` (training time of the epoch) and the margin's scalar buffers
        (CurricularFace's ``t``, AdaCos's ``scale``...).

        Raises:
            OutputExistsError: ``run_dir`` exists and neither ``resume`` nor ``overwrite``.
            CheckpointError: resuming from a missing, corrupt or incompatible checkpoint.
            TrainingDivergedError: the loss became NaN/inf (the last checkpoint is kept).
            TrainingPreemptedError: SIGTERM/SIGUSR1 with ``stop_on_signals`` (after a checkpoint).
            DiskFullError: a checkpoint did not fit (the previous one is kept; the message
                says which and how to go on).
        """
        flushing = flushes_denormals()
        try:
            with self._signals if self.checkpoints.policy.stop_on_signals else nullcontext():
                return self._fit(resume=resume, overwrite=overwrite)
        finally:  # the process's floating-point mode as it was (the trainer flushes denormals)
            torch.set_flush_denormal(flushing)

    def _fit(self, *, resume: bool | SavedRun, overwrite: bool) -> list[dict[str, Any]]:
        self._init_distributed()
        created = not Path(self.run_dir).exists()
        run_dir = prepare_run_dir(
            self.run_dir,
            resume=bool(resume),
            overwrite=overwrite,
            distributed=self.distributed,
        )
        try:
            saved = run_to_continue(run_dir, resume, self.config)  # before building anything
            self._setup()
            self.checkpoints.last_time = time.monotonic()
            start, history = 0, []
            if saved is not None:
                start, history = self._restore(saved), self.history
                del saved  # the checkpoint's tensors are in the run's objects now
            else:
                self._start_weights()
        except BaseException:
            if created and self.is_main:
                remove_if_empty(run_dir)  # a run that could not start leaves no empty folder
            raise
        message = self.start_message
        if callable(message):  # told what was built: the images' channels, size, classes
            message = message(self.meta)
        if message and self.is_main:
            logger.info(message)
        if self.is_main:
            save_config(self.config, run_dir / CONFIG_NAME)
        resumed = self._resume_at  # a step checkpoint: verification rows up to its step
        self.run_log.open(
            history=history,
            completed_steps=start * self.steps_per_epoch + (resumed.step if resumed else 0),
            writes=self.is_main,
            tensorboard=self.config.tensorboard,
        )
        mode = self.progress if self.is_main else "none"
        epoch_images, verification_images = self.evaluator.evaluation_images()
        self._reporter = ProgressReporter(
            mode,
            epochs=self.config.epochs,
            steps_per_epoch=self.steps_per_epoch,
            start_epoch=start,
            interval=self.progress_seconds,
            evaluation_images=epoch_images,
            verify_every=self.config.verify_every if self.bundle.verification else None,
            verification_images=verification_images,
            label=self.progress_label,
        )
        failures = training_failures(  # Ctrl-C, a failed collective: one line, what is kept
            distributed=self.distributed, rank=self.rank, timeout_s=self.config.dist_timeout,
            way_forward=self.checkpoints.way_forward,
        )  # fmt: skip
        try:
            with failures, progress_output(mode, self.progress_seconds):
                for epoch in range(start, self.config.epochs):
                    began = time.perf_counter()
                    train_loss = self._train_epoch(epoch)
                    seconds = self._resumed_seconds + time.perf_counter() - began
                    if first_non_finite(self.model, self.head) is not None:
                        raise self._diverged("", epoch, None)
                    evaluating = self._reporter.clock()
                    row = self.evaluator.epoch_row(
                        self.model, self.head, epoch=epoch + 1, loss=train_loss, seconds=seconds,
                        lr=self.optimizer.param_groups[0]["lr"], images=self.images_per_epoch,
                    )  # fmt: skip
                    self._reporter.evaluated("epoch", self._reporter.clock() - evaluating)
                    self.run_log.add_epoch(row, checkpoint=lambda done=epoch + 1: self._save(done))
                    self.evaluator.keep_embeddings()  # after their checkpoint
                    if self.is_main:
                        logger.debug("epoch %d: %s", epoch + 1, row)
                self.checkpoints.finish()  # a background write: complete before returning
        finally:
            self.checkpoints.abandon()  # after a failure: the previous checkpoint stays
            self.run_log.close()
        return self.history


def train(
    config: TrainConfig,
    run_dir: str | Path,
    *,
    resume: bool | SavedRun = False,
    overwrite: bool = False,
    **kwargs: Any,
) -> Trainer:
    """Build a :class:`Trainer`, :meth:`~Trainer.fit` it, and return it (with ``.model``,
    ``.head`` (also ``.loss``) and ``.history``)."""
    trainer = Trainer(config, run_dir, **kwargs)
    trainer.fit(resume=resume, overwrite=overwrite)
    return trainer
