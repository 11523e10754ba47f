"""A run folder's life before training: created, refused when taken, replaced only when it holds
a run, kept for ``--resume``; stale temporaries of a killed write removed."""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

import torch

from ..._atomic import remove_stale_temporaries
from ..distributed import broadcast_object, is_distributed
from .checkpoint import CheckpointError
from .layout import CHECKPOINT_NAME, CONFIG_NAME
from .run_state import has_saved_run

__all__ = ["OutputExistsError", "prepare_run_dir", "remove_if_empty"]


class OutputExistsError(FileExistsError):
    """The run directory exists and neither resume nor overwrite was asked for."""


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
