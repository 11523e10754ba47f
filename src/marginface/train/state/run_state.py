"""Run state: what a run's checkpoint holds, written, read once and restored in one place.

A run's state is the configuration it was trained with, its metadata (image shape, classes,
dataset, world size), the number of completed epochs with their log rows, the backbone's and
the head's weights, and what training needs to continue exactly: the optimizer, the schedule,
the gradient scaler and the random number generators. It is kept in one of two formats
(docs/training.md, docs/distributed.md):

* ``checkpoint.pt``: one file written by one process (:mod:`.checkpoint`: atomic, sealed with
  the sha256 of its bytes, read with ``weights_only``);
* ``checkpoint/``: every rank's share written through ``torch.distributed.checkpoint``
  (:mod:`.sharded_checkpoint`: the files' digests in a JSON sidecar; read back at any world
  size, the class centers resharded).

This module is the only one that chooses between the two:

* :func:`read_saved_run` reads a run's checkpoint once (the file, or the sidecar of the folder
  with its digests checked and DCP's index kept) into a :class:`SavedRun`. The command line's
  ``--resume``, the :class:`~marginface.train.Trainer` and :func:`~marginface.train.load_run`
  all start from it;
* :func:`resumed_config`, :func:`check_resumable` and :func:`run_to_continue` hold the policy
  of which options a resume may change (:data:`RESUMABLE_KEYS`);
* :meth:`SavedRun.restore` puts the state back into a training run's objects at any world size,
  :meth:`SavedRun.load_weights` into an unsharded backbone and head (evaluation, export);
* :func:`save_run_state` writes the state of a completed epoch in the format the world size
  calls for, and removes the other, older one;
* :func:`describe_kept` says what is on disk after a failure and how to go on.

Everything a checkpoint holds besides tensors is assembled by :func:`_plain_state`, so a new
piece of state (a position inside an epoch, a loader's progress) is added in one place and read
back by :meth:`SavedRun.restore`.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from ...head import reshardable_state_dict
from ..config import TrainConfig, config_from_dict
from ..history import read_history
from ..model_input import describe_training_run
from .checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from .class_state import class_state_targets, local_optimizer_state
from .kept_checkpoints import kept_checkpoints, link_as, prune_kept
from .layout import (
    CHECKPOINT_NAME,
    HISTORY_NAME,
    KEPT_NAME,
    KEPT_SUFFIX,
    SHARDED_CHECKPOINT_NAME,
    position_label,
)
from .pending_checkpoint import PendingCheckpoint, copied_state, in_thread
from .sharded_folder import has_sharded_checkpoint, sharded_checkpoint_on_disk
from .step_position import StepPosition, host_rng_state, restore_host_rng_state

if TYPE_CHECKING:  # the sharded folder's reader is imported where a sharded run is read
    from .sharded_checkpoint import ShardedCheckpoint

__all__ = [
    "RESUMABLE_KEYS",
    "RunObjects",
    "SavedRun",
    "check_resumable",
    "describe_kept",
    "has_saved_run",
    "read_saved_run",
    "resumed_config",
    "run_to_continue",
    "save_run_state",
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
        "ijb_dir",
        "ijb_target",
        "ijb_every",
    }
)
"""Configuration keys that may change between an interrupted run and its ``--resume``: where
and how fast it runs, how long, and how it is evaluated; never what is trained."""


@dataclass
class RunObjects:
    """The objects of a training run that its checkpoint saves and restores.

    Attributes:
        model: the backbone (unwrapped: not the ``DistributedDataParallel`` around it).
        head: the :class:`~marginface.head.MarginSoftmaxLoss` holding the class centers
            ``[C·K, D]`` (this rank's block ``[c·K, D]`` when sharded).
        optimizer: over the backbone's and the head's parameters.
        scheduler: the learning-rate schedule (stepped once per optimizer step).
        scaler: the ``torch.amp.GradScaler`` (disabled unless ``amp = "fp16"``).
        device: where the model lives (its CUDA RNG state is saved too).
    """

    model: nn.Module
    head: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    scaler: torch.amp.GradScaler
    device: torch.device


@dataclass
class SavedRun:
    """A run's checkpoint as read by :func:`read_saved_run`.

    Attributes:
        run_dir: the run folder.
        source: the file (``checkpoint.pt``) or folder (``checkpoint/``) read.
        config: the configuration as saved (a dict; keys added to
            :class:`~marginface.train.config.TrainConfig` since are absent).
        meta: ``in_channels``, ``image_size``, ``num_classes``, ``dataset``, ``world_size``.
        epoch: completed epochs.
        history: the log rows of those epochs: the checkpoint's own (so a kill between the
            checkpoint and ``history.csv`` loses nothing); ``history.csv`` for a format-1 file.
        position: where inside epoch ``epoch`` (counted from 0) a step checkpoint was taken
            (:class:`~marginface.train.state.step_position.StepPosition`); None at an epoch's end.
            :meth:`restore` fills in this rank's augmentation generator state.
    """

    run_dir: Path
    source: Path
    config: dict[str, Any]
    meta: dict[str, Any]
    epoch: int
    history: list[dict[str, Any]]
    contents: dict[str, Any] = field(repr=False, default_factory=dict)
    """Everything else the checkpoint holds: the single file's state dicts and RNG, or the
    sharded folder's sidecar (its tensors are read by :meth:`restore` / :meth:`load_weights`)."""
    sharded_checkpoint: ShardedCheckpoint | None = field(repr=False, default=None)
    """The sharded folder as read (sidecar and DCP's index, each read once), or None."""
    position: StepPosition | None = None

    @property
    def sharded(self) -> bool:
        """Whether the ranks of a distributed run wrote it (``checkpoint/`` or a kept folder)."""
        return self.source.is_dir()

    def train_config(self) -> TrainConfig:
        """The saved configuration as a :class:`~marginface.train.config.TrainConfig` (keys added
        since it was written take their defaults)."""
        return config_from_dict(saved_config_values(self.config), source=str(self.source))

    def load_weights(self, model: nn.Module, head: nn.Module) -> None:
        """Load the backbone's and the head's weights into an unsharded ``model`` and ``head``
        (built from :meth:`train_config` and :attr:`meta`); the optimizer state is not read.

        Raises:
            CheckpointError: the weights do not fit the configuration they were saved with.
        """
        try:
            if not self.sharded:
                model.load_state_dict(self.contents["model"])
                head.load_state_dict(self.contents["loss"])
                return
            targets = {f"model/{k}": v for k, v in model.state_dict().items()}
            targets.update({f"loss/{k}": v for k, v in reshardable_state_dict(head).items()})
            self._sharded().load(targets, distributed=False, only_targets=True)
        except RuntimeError as error:
            raise CheckpointError(
                f"checkpoint {self.source} does not match its configuration: {error}"
            ) from error

    def restore(self, objects: RunObjects, *, distributed: bool = False) -> int:
        """Put the saved state into a training run's ``objects``: weights, optimizer state
        (the class centers' part cut to this rank's block when the head is sharded, whatever
        the world size that saved it), schedule, scaler and RNG. All ranks call it.

        Returns:
            The number of completed epochs (the next epoch to train, counted from 0); a step
            checkpoint's :attr:`position` then holds this rank's augmentation state.

        Raises:
            CheckpointError: the state does not fit these objects.
        """
        if self.sharded:
            self._restore_sharded(objects, distributed=distributed)
        else:
            self._restore_file(objects)
        return self.epoch

    def _restore_file(self, objects: RunObjects) -> None:
        state = self.contents
        try:
            objects.model.load_state_dict(state["model"])
            objects.head.load_state_dict(state["loss"])
            objects.optimizer.load_state_dict(
                local_optimizer_state(state["optimizer"], objects.optimizer, objects.head)
            )
        except (RuntimeError, ValueError, KeyError) as error:
            raise CheckpointError(
                f"checkpoint {self.source} does not fit this model: {error}"
            ) from error
        objects.scheduler.load_state_dict(state["scheduler"])
        objects.scaler.load_state_dict(state["scaler"])
        torch.set_rng_state(state["rng"])
        if "cuda_rng" in state and objects.device.type == "cuda":
            torch.cuda.set_rng_state(state["cuda_rng"], objects.device)
        restore_host_rng_state(state.get("host_rng", {}))
        if self.position is not None:
            self.position.augment_state = state.get("augment_rng")

    def _sharded(self) -> ShardedCheckpoint:
        """The sharded folder as :func:`read_saved_run` read it (read now if this
        :class:`SavedRun` was made by hand)."""
        if self.sharded_checkpoint is None:
            from .sharded_checkpoint import read_sharded_checkpoint

            folder = None if self.source.name == SHARDED_CHECKPOINT_NAME else self.source
            self.sharded_checkpoint = read_sharded_checkpoint(self.run_dir, folder=folder)
        return self.sharded_checkpoint

    def _restore_sharded(self, objects: RunObjects, *, distributed: bool) -> None:
        head, optimizer = objects.head, objects.optimizer
        targets: dict[str, Any] = {f"model/{k}": v for k, v in objects.model.state_dict().items()}
        targets.update({f"loss/{k}": v for k, v in reshardable_state_dict(head).items()})
        checkpoint = self._sharded()
        holders, stale = class_state_targets(checkpoint.entries(), targets, optimizer, head)
        if stale:
            logger.warning(
                "checkpoint %s holds the optimizer state of the per-class parameters %s as one "
                "rank's block (a checkpoint written before it was sharded by class): that "
                "state restarts from zero",
                self.source,
                ", ".join(sorted(stale.values())),
            )
        filled = checkpoint.load(targets, distributed=distributed)
        saved = self.contents["optimizer"]
        state: dict[int, dict[str, Any]] = {}
        for key, value in filled.items():
            if key.startswith("optimizer/"):
                _, position, name = key.split("/", 2)
                if int(position) not in stale:
                    state.setdefault(int(position), {})[name] = holders.get(key, value)
        for position, plain in saved.get("state", {}).items():
            if int(position) not in stale:
                state.setdefault(int(position), {}).update(plain)
        try:
            optimizer.load_state_dict({"state": state, "param_groups": saved["param_groups"]})
        except (RuntimeError, ValueError, KeyError) as error:
            raise CheckpointError(
                f"checkpoint {self.source} does not fit this model: {error}"
            ) from error
        objects.scheduler.load_state_dict(self.contents["scheduler"])
        objects.scaler.load_state_dict(self.contents.get("scaler", {}))
        rank = torch.distributed.get_rank() if distributed else 0

        def own(name: str) -> Any:  # this rank's entry, else rank 0's (another world size)
            return filled.get(name.format(rank=rank), filled.get(name.format(rank=0)))

        rng, cuda_rng = own("rng/{rank}"), own("cuda_rng/{rank}")
        if rng is not None:
            torch.set_rng_state(rng)
        if cuda_rng is not None and objects.device.type == "cuda":
            torch.cuda.set_rng_state(cuda_rng, objects.device)
        host = {n: own(f"host_rng/{{rank}}/{n}") for n in ("python", "numpy")}
        restore_host_rng_state({n: v for n, v in host.items() if v is not None})
        if self.position is not None:
            self.position.augment_state = own("augment/{rank}")


def has_saved_run(run_dir: str | Path) -> bool:
    """Whether ``run_dir`` holds a checkpoint to resume from (either format; a sharded
    checkpoint cut short between its two renames is repaired first)."""
    run_dir = Path(run_dir)
    return (
        (run_dir / CHECKPOINT_NAME).is_file()
        or has_sharded_checkpoint(run_dir)
        or bool(kept_checkpoints(run_dir))
    )


def read_saved_run(run_dir: str | Path) -> SavedRun:
    """Read the newest valid checkpoint of ``run_dir``, once, verified: ``checkpoint.pt`` when
    present (a run resumed on one process last wrote it), else the sharded ``checkpoint/``;
    when that one is damaged, the kept ones (``train --keep``, :mod:`.kept_checkpoints`),
    newest first, each refusal logged as a warning.

    Raises:
        CheckpointError: no checkpoint, or no valid one: the newest one's error (one line
            naming the file, see :func:`~marginface.train.load_checkpoint`).
    """
    run_dir = Path(run_dir)
    candidates: list[Path] = []
    newest = run_dir / CHECKPOINT_NAME
    if newest.is_file():
        candidates.append(newest)
    if has_sharded_checkpoint(run_dir):
        candidates.append(run_dir / SHARDED_CHECKPOINT_NAME)
    for kept in kept_checkpoints(run_dir):
        if not (newest.is_file() and kept.is_file() and os.path.samefile(kept, newest)):
            candidates.append(kept)
    if not candidates:
        raise CheckpointError(
            f"no checkpoint in {run_dir} (neither {CHECKPOINT_NAME} nor {SHARDED_CHECKPOINT_NAME}/)"
        )
    first_error: CheckpointError | None = None
    for number, source in enumerate(candidates, 1):
        try:
            saved = _read_one(run_dir, source)
        except CheckpointError as error:
            first_error = first_error or error
            if number < len(candidates):
                logger.warning("%s; trying an older checkpoint", error)
            continue
        if first_error is not None:
            logger.warning("resuming from the older checkpoint %s", source)
        return saved
    assert first_error is not None
    raise first_error


def _read_one(run_dir: Path, source: Path) -> SavedRun:
    """The checkpoint ``source`` of ``run_dir`` (a file, or a sharded checkpoint's folder)."""
    if source.is_file():
        state = load_checkpoint(source)
        epoch = int(state["epoch"])
        if "history" in state:
            history = [dict(row) for row in state["history"]][:epoch]
        else:  # format 1: the CSV, cut to the checkpoint's epochs
            csv_path = run_dir / HISTORY_NAME
            history = read_history(csv_path)[:epoch] if csv_path.is_file() else []
        return SavedRun(
            run_dir,
            source,
            dict(state["config"]),
            state["meta"],
            epoch,
            history,
            state,
            position=StepPosition.from_plain(state["position"]) if state.get("position") else None,
        )
    from .sharded_checkpoint import read_sharded_checkpoint  # torch.distributed.checkpoint

    checkpoint = read_sharded_checkpoint(run_dir, folder=source)  # checkpoint/ or a kept one
    sidecar = checkpoint.sidecar
    epoch = int(sidecar["epoch"])
    history = [dict(row) for row in sidecar.get("history", [])][:epoch]
    return SavedRun(
        run_dir,
        checkpoint.folder,
        dict(sidecar["config"]),
        sidecar["meta"],
        epoch,
        history,
        sidecar,
        checkpoint,
        position=StepPosition.from_plain(sidecar["position"]) if sidecar.get("position") else None,
    )


def resumed_config(
    saved: SavedRun, explicit: dict[str, Any], *, spell: Callable[[str], str] = str
) -> TrainConfig:
    """The configuration a ``--resume`` continues with: the saved one, with the options that
    may change (:data:`RESUMABLE_KEYS`) taken from ``explicit`` (what the command line set).

    Args:
        saved: the run, as :func:`read_saved_run` read it.
        explicit: configuration keys given explicitly (repeating a saved value is allowed).
        spell: how a key is named in the message (the command line's ``--batch-size``).

    Raises:
        ValueError: an option outside :data:`RESUMABLE_KEYS` contradicts the saved run (every
            such option named, with the run's value, and the options that may change).
    """
    conflicts = [
        f"{spell(key)} {value!r} (the run has {saved.config.get(key)!r})"
        for key, value in explicit.items()
        if key not in RESUMABLE_KEYS and saved.config.get(key) != value
    ]
    if conflicts:
        allowed = ", ".join(sorted(spell(key) for key in RESUMABLE_KEYS))
        raise ValueError(
            f"--resume continues the run in {saved.run_dir} with its saved configuration; these "
            f"options contradict it: {'; '.join(conflicts)}. Options that may change on "
            f"--resume: {allowed}. To train with other settings, use another --out or "
            "--overwrite."
        )
    values = {**saved_config_values(saved.config)}
    values.update({k: v for k, v in explicit.items() if k in RESUMABLE_KEYS})
    return config_from_dict(values, source=str(saved.source))


def check_resumable(saved: SavedRun, config: TrainConfig) -> None:
    """Refuse to continue ``saved`` with a ``config`` that differs from it in a key outside
    :data:`RESUMABLE_KEYS` (the saved configuration's missing keys take their defaults).

    Raises:
        CheckpointError: naming every differing key with both values.
    """
    before = saved.train_config().to_dict()
    current = config.to_dict()
    differ = sorted(k for k in current if k not in RESUMABLE_KEYS and before.get(k) != current[k])
    if differ:
        details = ", ".join(f"{k}: {before.get(k)!r} -> {current[k]!r}" for k in differ)
        raise CheckpointError(
            f"checkpoint {saved.source} is from another configuration ({details}); "
            "use --overwrite to start afresh"
        )


def saved_config_values(config: dict[str, Any]) -> dict[str, Any]:
    """A saved configuration's values, with ``recipe = "sphere"`` where the run predates
    recipes: every run before them trained with the sphere recipe's defaults, so a key it did
    not save (``image_size`` None is not written to TOML) keeps that meaning instead of taking
    the face recipe's value on a photo dataset."""
    values = dict(config)
    values.setdefault("recipe", "sphere")
    return values


def run_to_continue(
    run_dir: str | Path, resume: bool | SavedRun, config: TrainConfig
) -> SavedRun | None:
    """The saved run a training run continues, checked against its ``config``
    (:func:`check_resumable`) before anything is built, so a refusal costs nothing.

    Args:
        run_dir: the run folder.
        resume: False (a new run: None is returned), True (the checkpoint of ``run_dir`` is
            read, once: :func:`read_saved_run`), or a :class:`SavedRun` already read (the
            command line reads it once to resolve the configuration).
        config: the configuration the run continues with.

    Raises:
        CheckpointError: no checkpoint, a damaged one, or one from another configuration.
    """
    if isinstance(resume, SavedRun):
        saved: SavedRun | None = resume
    else:
        saved = read_saved_run(run_dir) if resume else None
    if saved is not None:
        check_resumable(saved, config)
    return saved


def _plain_state(
    *, epoch: int, config: TrainConfig, meta: dict[str, Any], history: list[dict[str, Any]]
) -> dict[str, Any]:
    """What every checkpoint holds besides the objects' state: progress, log, description."""
    return {
        "epoch": epoch,
        "config": config.to_dict(),
        "meta": meta,
        "history": [dict(row) for row in history],
        "description": describe_training_run(config.to_dict(), meta, history).to_dict(),
    }


def save_run_state(
    run_dir: str | Path,
    objects: RunObjects,
    *,
    epoch: int,
    config: TrainConfig,
    meta: dict[str, Any],
    history: list[dict[str, Any]],
    distributed: bool = False,
    position: StepPosition | None = None,
    keep: int = 1,
    asynchronous: bool = False,
    process_group: Any = None,
) -> Path | PendingCheckpoint:
    """Write the state of ``epoch`` completed epochs into ``run_dir``: ``checkpoint.pt`` from
    one process, or every rank's share into ``checkpoint/`` (all ranks call it); either write
    is atomic, and the other format, now older, is removed.

    Args:
        position: the position inside epoch ``epoch`` (counted from 0) of a step checkpoint
            (its ``epoch`` equals ``epoch``); None at an epoch's end.
        keep: how many checkpoints to keep (>= 1): with ``keep`` > 1 the newest ``keep`` stay,
            the older ones in ``checkpoints/`` (:mod:`.kept_checkpoints`).
        asynchronous: copy the state now and write it in a background thread; returns a
            :class:`~marginface.train.state.pending_checkpoint.PendingCheckpoint` (its ``finish``,
            called by every rank, completes it; the previous checkpoint is the run's until
            then). ``process_group``: the gloo group of a sharded background write.

    Returns:
        The checkpoint written (file or folder).

    Raises:
        marginface._atomic.DiskFullError: the disk is full (the previous checkpoint is kept).
        OSError: the folder cannot be written.
    """
    run_dir = Path(run_dir)
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise ValueError(f"keep must be an integer >= 1, got {keep!r}")
    if position is not None and position.epoch != epoch:
        raise ValueError(f"position.epoch {position.epoch} is not epoch {epoch}")
    plain = _plain_state(epoch=epoch, config=config, meta=meta, history=history)
    plain["position"] = position.plain() if position is not None else None
    own: dict[str, Tensor] = {f"host_rng/{k}": v for k, v in host_rng_state().items()}
    if position is not None and position.augment_state is not None:
        own["augment"] = position.augment_state
    if objects.device.type == "cuda":
        own["cuda_rng"] = torch.cuda.get_rng_state(objects.device)
    if distributed:
        from .sharded_checkpoint import save_sharded_checkpoint

        extra = {
            **{k: v for k, v in plain.items() if k != "epoch"},
            "scheduler": objects.scheduler.state_dict(),
            "scaler": objects.scaler.state_dict(),
        }
        return save_sharded_checkpoint(
            run_dir,
            epoch=epoch,
            model=objects.model,
            loss=objects.head,
            optimizer=objects.optimizer,
            extra=extra,
            rank_tensors=own,
            keep=keep,
            asynchronous=asynchronous,
            process_group=process_group,
        )
    state: dict[str, Any] = {
        **plain,
        "model": objects.model.state_dict(),
        "loss": objects.head.state_dict(),
        "optimizer": objects.optimizer.state_dict(),
        "scheduler": objects.scheduler.state_dict(),
        "scaler": objects.scaler.state_dict(),
        "rng": torch.get_rng_state(),
        "host_rng": {k.split("/", 1)[1]: v for k, v in own.items() if k.startswith("host_rng/")},
    }
    if "augment" in own:
        state["augment_rng"] = own["augment"]
    if "cuda_rng" in own:
        state["cuda_rng"] = own["cuda_rng"]
    path = run_dir / CHECKPOINT_NAME
    step = position.step if position is not None else 0

    def write() -> Path:
        if keep > 1:  # written under its position's name, then linked as checkpoint.pt
            kept = run_dir / KEPT_NAME
            kept.mkdir(exist_ok=True)
            written = save_checkpoint(state, kept / f"{position_label(epoch, step)}{KEPT_SUFFIX}")
            link_as(written, path)
            prune_kept(run_dir, keep)
        else:
            save_checkpoint(state, path)
        stale = run_dir / SHARDED_CHECKPOINT_NAME
        if stale.is_dir():
            shutil.rmtree(stale)
        return path

    if not asynchronous:
        return write()
    state = copied_state(state)  # what is written: training goes on changing the tensors
    return PendingCheckpoint(path, in_thread(write))


def describe_kept(run_dir: str | Path, epoch: int | None, step: int = 0) -> str:
    """What the user can do after a failure, true to what is on disk: the checkpoint of
    ``epoch`` completed epochs and ``step`` steps of the next (the last one this process wrote
    or restored; None: none) and the ``--resume`` command, or, when no checkpoint was written,
    that the run starts again with ``--overwrite``. Looks for the checkpoint without reading
    it."""
    run_dir = Path(run_dir)
    if (run_dir / CHECKPOINT_NAME).is_file() or sharded_checkpoint_on_disk(run_dir):
        if epoch is not None and step:
            done = f"the checkpoint after step {step} of epoch {epoch + 1}"
        else:
            done = f"the checkpoint of epoch {epoch}" if epoch else "the last checkpoint"
        return (
            f"{done} is kept in {run_dir}; continue with `marginface train --out "
            f"{run_dir} --resume` (or start again with --overwrite)"
        )
    return (
        "no epoch was completed, so no checkpoint was written; start again with "
        f"`marginface train ... --out {run_dir} --overwrite`"
    )
