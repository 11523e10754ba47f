"""Training: the loop, what a configuration builds, run state (checkpoints saved, read once and
restored), evaluation, logs, embedding extraction."""

from .build import build_model_and_loss, load_bundle
from .compare import TABLE_COLUMNS, Comparison, compare_losses, draw_run_pictures
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
from .run import LoadedRun, load_run
from .state.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from .state.layout import EVALUATION_NAME
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
    "draw_run_pictures",
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
