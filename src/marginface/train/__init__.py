"""Training: the loop, what a configuration builds, run state (checkpoints saved, read once and
restored), evaluation, logs, embedding extraction.

Importing the package is cheap: the names below are loaded on first use (PEP 562), so that a
command that needs one submodule (``marginface.train.distributed`` for ``resolve_device``,
``marginface.train.state.layout`` for a file name) does not import the whole trainer, its
sharded checkpoints (``torch.distributed.checkpoint``, which pulls in SymPy) and every loss.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names for type checkers and IDEs; at run time __getattr__ loads them
    from .build import load_bundle
    from .compare import TABLE_COLUMNS, Comparison, compare_losses
    from .distributed import resolve_device
    from .embeddings import extract_dataset_embeddings, extract_embeddings
    from .evaluation.evaluate import (
        Evaluation,
        evaluate_model,
        evaluate_pairs,
        evaluate_run,
        verification_pairs,
        write_evaluation,
    )
    from .history import TensorBoardLogger, margin_state, read_history, write_history
    from .optim import build_optimizer, build_scheduler, lr_factor
    from .state.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
    from .state.layout import EVALUATION_NAME
    from .state.loaded_run import LoadedRun, build_model_and_loss, load_run
    from .state.run_folder import OutputExistsError, prepare_run_dir
    from .state.run_state import RESUMABLE_KEYS, SavedRun, read_saved_run
    from .trainer import Trainer, TrainingDivergedError, train

__all__ = [
    "EVALUATION_NAME",
    "RESUMABLE_KEYS",
    "TABLE_COLUMNS",
    "CheckpointError",
    "Comparison",
    "Evaluation",
    "LoadedRun",
    "OutputExistsError",
    "SavedRun",
    "TensorBoardLogger",
    "Trainer",
    "TrainingDivergedError",
    "build_model_and_loss",
    "build_optimizer",
    "build_scheduler",
    "compare_losses",
    "evaluate_model",
    "evaluate_pairs",
    "evaluate_run",
    "extract_dataset_embeddings",
    "extract_embeddings",
    "load_bundle",
    "load_checkpoint",
    "load_run",
    "lr_factor",
    "margin_state",
    "prepare_run_dir",
    "read_history",
    "read_saved_run",
    "resolve_device",
    "save_checkpoint",
    "train",
    "verification_pairs",
    "write_evaluation",
    "write_history",
]

_SOURCES: dict[str, str] = {
    "load_bundle": ".build",
    "TABLE_COLUMNS": ".compare",
    "Comparison": ".compare",
    "compare_losses": ".compare",
    "resolve_device": ".distributed",
    "extract_dataset_embeddings": ".embeddings",
    "extract_embeddings": ".embeddings",
    "Evaluation": ".evaluation.evaluate",
    "evaluate_model": ".evaluation.evaluate",
    "evaluate_pairs": ".evaluation.evaluate",
    "evaluate_run": ".evaluation.evaluate",
    "verification_pairs": ".evaluation.evaluate",
    "write_evaluation": ".evaluation.evaluate",
    "TensorBoardLogger": ".history",
    "margin_state": ".history",
    "read_history": ".history",
    "write_history": ".history",
    "build_optimizer": ".optim",
    "build_scheduler": ".optim",
    "lr_factor": ".optim",
    "CheckpointError": ".state.checkpoint",
    "load_checkpoint": ".state.checkpoint",
    "save_checkpoint": ".state.checkpoint",
    "EVALUATION_NAME": ".state.layout",
    "LoadedRun": ".state.loaded_run",
    "build_model_and_loss": ".state.loaded_run",
    "load_run": ".state.loaded_run",
    "OutputExistsError": ".state.run_folder",
    "prepare_run_dir": ".state.run_folder",
    "RESUMABLE_KEYS": ".state.run_state",
    "SavedRun": ".state.run_state",
    "read_saved_run": ".state.run_state",
    "Trainer": ".trainer",
    "TrainingDivergedError": ".trainer",
    "train": ".trainer",
}
"""Each public name's submodule, relative to this package."""


def __getattr__(name: str) -> Any:
    """Load a public name on first use from its submodule (:data:`_SOURCES`)."""
    source = _SOURCES.get(name)
    if source is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(source, __name__), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
