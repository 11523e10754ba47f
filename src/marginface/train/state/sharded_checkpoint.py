"""Checkpoints of distributed runs: every rank writes its share through
``torch.distributed.checkpoint`` (DCP), and any world size reads them back.

Layout, in the run folder::

    checkpoint/              DCP files: tensors only
      .metadata              DCP's index (read with a restricted unpickler, see below)
      __<rank>_0.distcp      each rank's tensors
      marginface.json        everything else, as JSON: format, epoch, config, meta (with the
                             world size), history, scheduler, scaler, optimizer hyperparameters,
                             and the sha256 of every file above

Tensor keys: ``model/<name>`` (replicated), ``loss/<name>`` (the class centers as a DTensor
``[C, K·D]`` sharded on dim 0, each per-class parameter ``[C]`` likewise, the margin's buffers
replicated), ``optimizer/<param>/<key>``
(the state of the class centers and of the per-class parameters, e.g. AdaM-Softmax's margins
``[C]``, laid out like them, sharded by class; the backbone's replicated), and each
rank's own (:data:`PER_RANK_PREFIXES`): ``rng/<rank>``, ``cuda_rng/<rank>``,
``host_rng/<rank>/<name>``, and in a step checkpoint ``augment/<rank>``; the sidecar's
``position`` says where inside its epoch a step checkpoint was taken (else null).

Writing is atomic at the level of the folder: every rank writes into
``.checkpoint.<epoch>.tmp/``; after a barrier rank 0 adds ``marginface.json`` and swaps the
folder in (``checkpoint/`` → ``.checkpoint.old/``, the new one → ``checkpoint/``, the old one
removed). A kill between the two renames is repaired by the next run (:func:`recover`, once,
under a lock, whichever ranks look at the folder at the same time).

Reading is safe: DCP's own reader unpickles ``.metadata`` with plain :mod:`pickle`; here it is
read by an unpickler that admits only DCP's metadata classes, ``torch.Size``, dtypes and paths,
and the tensors themselves with ``weights_only=True`` (DCP's default). Every file's sha256 is
checked against ``marginface.json`` first.

Reading is done once: :func:`read_sharded_checkpoint` reads the sidecar and hashes every file,
keeping the bytes of ``.metadata`` it hashed; the :class:`ShardedCheckpoint` it returns lists
the tensors and loads them (any world size) from that index, never reading ``.metadata`` again.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import pickle
import shutil
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata

from ..._atomic import DISK_FULL_ERRNOS, DiskFullError, atomic_write_text, looks_like_full_disk
from ...head import MarginSoftmaxLoss
from ...head.state import class_state_view, per_class_parameters
from .checkpoint import CheckpointError
from .class_state import class_state_positions
from .kept_checkpoints import prune_kept
from .layout import (
    CHECKPOINT_NAME,
    INDEX_NAME,
    KEPT_NAME,
    REPLACED_SHARDED_NAME,
    SHARDED_CHECKPOINT_NAME,
    SIDECAR_NAME,
    STAGING_PATTERN,
    position_label,
    staging_name,
)
from .pending_checkpoint import PendingCheckpoint
from .sharded_folder import recover

__all__ = [
    "ShardedCheckpoint",
    "center_state_position",
    "checkpoint_entries",
    "load_sharded_tensors",
    "read_sharded_checkpoint",
    "read_sidecar",
    "save_failure",
    "save_sharded_checkpoint",
]

SHARDED_FORMAT = "marginface-sharded-checkpoint"
_SIDECAR_KEYS = ("epoch", "config", "meta", "history", "optimizer", "scheduler", "files")

_SAFE_MODULES = ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem")
_SAFE_GLOBALS = {
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"),
    ("collections", "OrderedDict"),
    ("builtins", "set"),
    ("builtins", "frozenset"),
}


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, stream: Any, path: Path) -> None:
        super().__init__(stream)
        self._path = path

    def find_class(self, module: str, name: str) -> Any:
        if module in _SAFE_MODULES and not name.startswith("__"):
            value = getattr(__import__(module, fromlist=[name]), name, None)
            if isinstance(value, type):
                return value
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        if (module, name) in _SAFE_GLOBALS:
            return getattr(__import__(module, fromlist=[name]), name)
        raise CheckpointError(
            f"refused to load {self._path}: it names {module}.{name}, which a checkpoint "
            "index never holds (it could run code); nothing from it was executed"
        )


def _parse_index(data: bytes, path: Path) -> Metadata:
    """DCP's index from the bytes of ``path`` (``.metadata``), by the restricted unpickler."""
    try:
        metadata = _MetadataUnpickler(io.BytesIO(data), path).load()
    except CheckpointError:
        raise
    except Exception as error:
        raise CheckpointError(f"checkpoint index {path} is unreadable ({error})") from None
    if not isinstance(metadata, Metadata):
        raise CheckpointError(f"{path} is not a checkpoint index")
    return metadata


class SafeFileSystemReader(FileSystemReader):
    """DCP's file reader with ``.metadata`` read by a restricted unpickler; given ``index``
    (the index already read), it hands that out instead of reading the file again."""

    def __init__(self, path: str | Path, *, index: Metadata | None = None) -> None:
        super().__init__(path)
        self._index = index

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if self._index is not None and kwargs.get("rank") is None:
            metadata = self._index
        else:
            path = Path(self._get_metadata_path(kwargs.get("rank")))
            metadata = _parse_index(path.read_bytes(), path)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def _digests(folder: Path, *, kept: dict[str, bytes] | None = None) -> dict[str, str]:
    """The sha256 of every file of ``folder`` but the sidecar, by name; ``kept``: receives the
    bytes hashed of ``.metadata`` (so the index is read from disk once)."""
    result = {}
    for path in sorted(folder.iterdir()):
        if path.is_file() and path.name != SIDECAR_NAME:
            hasher = hashlib.sha256()
            with path.open("rb") as handle:
                if kept is not None and path.name == INDEX_NAME:
                    kept[path.name] = handle.read()
                    hasher.update(kept[path.name])
                else:
                    for block in iter(lambda: handle.read(1 << 20), b""):
                        hasher.update(block)
            result[path.name] = hasher.hexdigest()
    return result


def center_state_position(optimizer: torch.optim.Optimizer, head: nn.Module) -> int | None:
    """The position of the class centers ``head.weight`` among ``optimizer``'s parameters (the
    key of their entry in ``optimizer.state_dict()["state"]``); None when not optimized."""
    weight = getattr(head, "weight", None)
    position = 0
    for group in optimizer.param_groups:
        for parameter in group["params"]:
            if parameter is weight:
                return position
            position += 1
    return None


def _tensor_state(
    model: nn.Module, loss: MarginSoftmaxLoss, optimizer: torch.optim.Optimizer
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(tensors for DCP, optimizer's JSON part)``. The optimizer state of each per-class
    parameter (the centers, AdaM-Softmax's margins) is laid out like the parameter in the
    checkpoint (:func:`~marginface.head.state.class_state_view`): sharded by class."""
    tensors: dict[str, Any] = {f"model/{k}": v for k, v in model.state_dict().items()}
    tensors.update({f"loss/{k}": v for k, v in loss.state_dict().items()})
    state = optimizer.state_dict()
    per_class = per_class_parameters(loss)
    positions = class_state_positions(optimizer, loss)
    plain: dict[str, Any] = {}
    for index, entries in state["state"].items():
        name = positions.get(index)
        for key, value in entries.items():
            if isinstance(value, torch.Tensor):
                if name is not None and value.shape == per_class[name].shape:
                    value = class_state_view(value, loss, name)
                tensors[f"optimizer/{index}/{key}"] = value
            else:
                plain.setdefault(str(index), {})[key] = value
    return tensors, {"param_groups": state["param_groups"], "state": plain}


def save_failure(error: CheckpointException, staging: Path) -> Exception:
    """One exception for DCP's ``CheckpointException`` (every rank's failure with its
    traceback, 80 lines and more): :class:`~marginface._atomic.DiskFullError` naming the file
    when a rank's write found the disk full (an ``ENOSPC``-like errno, or, as the one-process
    write recognises it, torch's zip writer's ``RuntimeError`` "file write failed" / "unexpected
    pos 704 vs 598" with the disk out of space: :func:`~marginface._atomic.looks_like_full_disk`),
    else :class:`OSError` or :class:`~marginface.train.state.checkpoint.CheckpointError` with the
    first failure in a line."""
    failures = sorted(error.failures.items())
    for _, (failure, _trace) in failures:
        cause: BaseException | None = failure
        while cause is not None:
            if isinstance(cause, OSError) and cause.errno in DISK_FULL_ERRNOS:
                where = cause.filename or staging
                return DiskFullError(cause.errno, f"disk full: could not write {where}", str(where))
            cause = cause.__cause__ or cause.__context__
    for _, (failure, _trace) in failures:
        if looks_like_full_disk(failure, staging.parent):  # the errno hidden in the text
            return DiskFullError(
                errno.ENOSPC, f"disk full: could not write {staging}", str(staging)
            )
    if not failures:
        return CheckpointError(f"could not write the sharded checkpoint {staging}")
    rank, (failure, _) = failures[0]
    text = str(failure).splitlines()[0] if str(failure) else type(failure).__name__
    if isinstance(failure, OSError):
        return OSError(failure.errno, f"rank {rank}: {failure.strerror or text}", str(staging))
    return CheckpointError(
        f"could not write the sharded checkpoint {staging}: rank {rank}: "
        f"{type(failure).__name__}: {text}"
    )


def save_sharded_checkpoint(
    run_dir: str | Path,
    *,
    epoch: int,
    model: nn.Module,
    loss: MarginSoftmaxLoss,
    optimizer: torch.optim.Optimizer,
    extra: dict[str, Any],
    rank_tensors: dict[str, torch.Tensor] | None = None,
    keep: int = 1,
    asynchronous: bool = False,
    process_group: dist.ProcessGroup | None = None,
) -> Path | PendingCheckpoint:
    """Write the checkpoint of ``epoch`` (all ranks call it). ``extra`` holds the JSON part
    (config, meta, history, scheduler, scaler, a step position); ``rank_tensors`` this rank's
    own tensors, saved as ``<name>/<rank>`` (names starting with one of
    :data:`PER_RANK_PREFIXES`). With ``keep`` > 1 the checkpoint replaced is moved into
    ``checkpoints/`` (:mod:`.kept_checkpoints`) instead of deleted, and only the newest
    ``keep - 1`` there stay.

    With ``asynchronous``, the tensors are copied now and written by
    ``torch.distributed.checkpoint.async_save`` in a background thread over ``process_group``
    (a gloo group of its own, so its collectives never interleave with training's); the
    returned :class:`~marginface.train.state.pending_checkpoint.PendingCheckpoint`'s ``finish``
    (all ranks call it) swaps the new checkpoint in. Until then the previous one is the run's.

    Returns ``run_dir/checkpoint``, or the pending checkpoint.
    """
    run_dir = Path(run_dir)
    rank = dist.get_rank()
    staging = run_dir / staging_name(epoch)
    if rank == 0:  # a write cut short by a kill (no other is in flight: finished first)
        for stale in run_dir.glob(STAGING_PATTERN):
            if stale.is_dir():
                shutil.rmtree(stale)
    dist.barrier()
    tensors, optimizer_json = _tensor_state(model, loss, optimizer)
    tensors[f"rng/{rank}"] = torch.get_rng_state()
    for name, value in (rank_tensors or {}).items():
        prefix, _, rest = name.partition("/")
        tensors[f"{prefix}/{rank}" + (f"/{rest}" if rest else "")] = value
    final = run_dir / SHARDED_CHECKPOINT_NAME
    sidecar = {
        "format": SHARDED_FORMAT,
        "version": 1,
        "epoch": epoch,
        "world_size": dist.get_world_size(),
        "optimizer": optimizer_json,
        **extra,
    }
    sidecar = json.loads(json.dumps(sidecar))  # a copy: training goes on changing the state

    def publish() -> None:
        dist.barrier()  # every rank's files are written
        if rank == 0:
            _swap_in(run_dir, staging, {**sidecar, "files": _digests(staging)}, keep)
        dist.barrier()

    if asynchronous:
        written = dcp.async_save(tensors, checkpoint_id=staging, process_group=process_group)
        return PendingCheckpoint(
            final, written, publish, failure=lambda error: _save_failure(error, staging)
        )
    try:
        dcp.save(tensors, checkpoint_id=staging)
    except CheckpointException as error:  # a BaseException in torch 2.13: caught here
        raise save_failure(error, staging) from None
    publish()
    return final


def _save_failure(error: BaseException, staging: Path) -> BaseException:
    if isinstance(error, CheckpointException):
        return save_failure(error, staging)
    return error


def _swap_in(run_dir: Path, staging: Path, sidecar: dict[str, Any], keep: int) -> None:
    """Rank 0: seal the written folder ``staging`` with its sidecar and swap it in as
    ``checkpoint/`` (``checkpoint/`` → ``.checkpoint.old/``, ``staging`` → ``checkpoint/``;
    :func:`recover` repairs a kill between the two renames)."""
    final = run_dir / SHARDED_CHECKPOINT_NAME
    atomic_write_text(staging / SIDECAR_NAME, json.dumps(sidecar, indent=1) + "\n")
    old = run_dir / REPLACED_SHARDED_NAME
    if old.exists():
        shutil.rmtree(old)
    if final.exists():
        final.rename(old)
    staging.rename(final)
    if keep > 1 and (old / SIDECAR_NAME).is_file():
        _keep_replaced(run_dir, old, keep - 1)
    shutil.rmtree(old, ignore_errors=True)
    (run_dir / CHECKPOINT_NAME).unlink(missing_ok=True)  # a world-1 checkpoint is older


def _keep_replaced(run_dir: Path, old: Path, count: int) -> None:
    """Move the replaced checkpoint ``old`` into ``checkpoints/`` under its position's name,
    and keep the newest ``count`` there."""
    try:
        sidecar = json.loads((old / SIDECAR_NAME).read_text(encoding="utf-8"))
        position = sidecar.get("position") or {}
        epoch = int(sidecar["epoch"])
        step = int(position.get("step", 0)) if position else 0
    except (OSError, ValueError, KeyError, TypeError):
        return  # unreadable: not worth keeping
    kept = run_dir / KEPT_NAME
    kept.mkdir(exist_ok=True)
    target = kept / position_label(epoch, step)
    if target.exists():
        shutil.rmtree(target)
    old.rename(target)
    prune_kept(run_dir, count)


@dataclass
class ShardedCheckpoint:
    """A sharded checkpoint as :func:`read_sharded_checkpoint` read it, once.

    Attributes:
        folder: ``run_dir/checkpoint`` (or a kept one, :mod:`.kept_checkpoints`).
        sidecar: the JSON part (``marginface.json``): format, epoch, config, meta, history,
            scheduler, scaler, the optimizer's hyperparameters, the files' sha256.
        index_bytes: the bytes of DCP's ``.metadata`` whose sha256 was checked (None when the
            folder has none); parsed at first use by :meth:`index`.
    """

    folder: Path
    sidecar: dict[str, Any]
    index_bytes: bytes | None = field(default=None, repr=False)
    _index: Metadata | None = field(default=None, init=False, repr=False)

    def index(self) -> Metadata:
        """DCP's index (parsed once, by the restricted unpickler).

        Raises:
            CheckpointError: the folder has no index, or one that is not DCP's (nothing from
                it is executed).
        """
        if self._index is None:
            path = self.folder / INDEX_NAME
            if self.index_bytes is None:
                raise CheckpointError(f"checkpoint {self.folder} has no index ({INDEX_NAME})")
            self._index = _parse_index(self.index_bytes, path)
        return self._index

    def entries(self) -> dict[str, tuple[torch.Size, torch.dtype]]:
        """Every tensor of the checkpoint: key → (global shape, dtype)."""
        return _entries(self.index(), self.folder)

    def load(
        self, targets: dict[str, Any], *, distributed: bool, only_targets: bool = False
    ) -> dict[str, Any]:
        """Fill ``targets`` (key → tensor or DTensor, allocated by the caller in the layout it
        wants) from the checkpoint; keys the checkpoint lacks are dropped, keys it has beyond
        ``targets`` are allocated in full (replicated; of the per-rank entries,
        :data:`PER_RANK_PREFIXES`, only rank 0's and this rank's), unless ``only_targets``.
        In a process group every rank calls it. Returns the filled dict."""
        return _load(self.folder, self.index(), targets, distributed, only_targets)


def read_sharded_checkpoint(
    run_dir: str | Path, *, folder: str | Path | None = None
) -> ShardedCheckpoint:
    """Read the sharded checkpoint of ``run_dir`` (or the checkpoint folder ``folder``, e.g. a
    kept one) once (after :func:`recover`): its sidecar, and the sha256 of every file checked
    against it, keeping the index's bytes.

    Raises:
        CheckpointError: missing, not ours, or a file whose sha256 differs (damaged).
    """
    recover(run_dir)
    folder = _folder(run_dir, folder)
    path = folder / SIDECAR_NAME
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {folder}")
    try:
        sidecar = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{path} is damaged ({error})") from None
    if not isinstance(sidecar, dict) or sidecar.get("format") != SHARDED_FORMAT:
        raise CheckpointError(f"{path} is not a marginface checkpoint")
    missing = [key for key in _SIDECAR_KEYS if key not in sidecar]
    if missing:
        raise CheckpointError(f"{path} is incomplete: no {', '.join(missing)}")
    expected = sidecar.get("files", {})
    kept: dict[str, bytes] = {}
    actual = _digests(folder, kept=kept)
    if expected != actual:
        bad = sorted(
            set(expected) ^ set(actual) | {k for k in expected if actual.get(k) != expected[k]}
        )
        raise CheckpointError(
            f"checkpoint {folder} is damaged: {', '.join(bad)} do(es) not match their sha256; "
            "restore it from a copy or start again with --overwrite"
        )
    return ShardedCheckpoint(folder, sidecar, kept.get(INDEX_NAME))


PER_RANK_PREFIXES = ("rng/", "cuda_rng/", "augment/", "host_rng/")
"""Entries saved by every rank under its own number: ``rng/<rank>`` (the global torch
generator; ``cuda_rng/<rank>`` its GPU's), ``augment/<rank>`` (a step position's augmentation
generator),
``host_rng/<rank>/<name>`` (Python's and NumPy's generators)."""


def _wanted_entry(key: str, rank: int) -> bool:
    """Whether a process of rank ``rank`` reads entry ``key``: every shared entry, and of the
    per-rank ones its own and rank 0's (the fallback at another world size)."""
    for prefix in PER_RANK_PREFIXES:
        if key.startswith(prefix):
            owner = key[len(prefix) :].split("/", 1)[0]
            return owner in ("0", str(rank))
    return True


def _folder(run_dir: str | Path, folder: str | Path | None) -> Path:
    """The checkpoint folder: ``folder`` when given, else ``run_dir/checkpoint``."""
    return Path(folder) if folder is not None else Path(run_dir) / SHARDED_CHECKPOINT_NAME


def read_sidecar(run_dir: str | Path, *, folder: str | Path | None = None) -> dict[str, Any]:
    """The JSON part of the sharded checkpoint in ``run_dir`` (or ``folder``), its files'
    digests checked (:func:`read_sharded_checkpoint`'s ``sidecar``).

    Raises:
        CheckpointError: missing, not ours, or a file whose sha256 differs (damaged).
    """
    return read_sharded_checkpoint(run_dir, folder=folder).sidecar


def _entries(index: Metadata, folder: Path) -> dict[str, tuple[torch.Size, torch.dtype]]:
    entries = {}
    for key, item in index.state_dict_metadata.items():
        if not isinstance(item, TensorStorageMetadata):
            raise CheckpointError(f"{folder}: entry {key!r} is not a tensor")
        entries[key] = (item.size, item.properties.dtype)
    return entries


def _load(
    folder: Path,
    index: Metadata,
    targets: dict[str, Any],
    distributed: bool,
    only_targets: bool,
) -> dict[str, Any]:
    """:meth:`ShardedCheckpoint.load` given the parsed ``index`` (DCP's planner reads it from
    the reader, which hands out this one)."""
    filled: dict[str, Any] = {}
    for key, (size, dtype) in _entries(index, folder).items():
        if key in targets:
            filled[key] = targets[key]
        elif only_targets:
            continue
        elif _wanted_entry(key, dist.get_rank() if distributed else 0):
            filled[key] = torch.empty(size, dtype=dtype)
    reader = SafeFileSystemReader(folder, index=index)
    if distributed:
        dcp.load(filled, checkpoint_id=folder, storage_reader=reader)
    else:
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process"
            warnings.filterwarnings("ignore", message=".*single process.*", category=UserWarning)
            dcp.load(filled, checkpoint_id=folder, storage_reader=reader, no_dist=True)
    return filled


def checkpoint_entries(run_dir: str | Path) -> dict[str, tuple[torch.Size, torch.dtype]]:
    """Every tensor of the sharded checkpoint in ``run_dir``: key → (global shape, dtype).
    Reads the index from disk (unverified); a run's restore uses
    :meth:`ShardedCheckpoint.entries` instead."""
    folder = Path(run_dir) / SHARDED_CHECKPOINT_NAME
    return _entries(SafeFileSystemReader(folder).read_metadata(), folder)


def load_sharded_tensors(
    run_dir: str | Path, targets: dict[str, Any], *, distributed: bool, only_targets: bool = False
) -> dict[str, Any]:
    """:meth:`ShardedCheckpoint.load` of the checkpoint in ``run_dir``, its index read from
    disk (unverified, once). Returns the filled dict."""
    folder = Path(run_dir) / SHARDED_CHECKPOINT_NAME
    index = SafeFileSystemReader(folder).read_metadata()
    return _load(folder, index, targets, distributed, only_targets)
