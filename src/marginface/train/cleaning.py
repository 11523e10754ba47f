"""Sub-center ArcFace's clean-up of a trained run (what ``marginface outliers`` and
``marginface train --drop-non-dominant`` do): the training set's embeddings, the samples farther
than a threshold angle from their class's dominant sub-center (a CSV), and a new run that
continues with one center per class.

The training set is the run's own (its dataset, with its ``limit`` subset), embedded without
flipping; a sample's ``index`` is its position in that set.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .._atomic import atomic_write_text
from ..config import TrainConfig, config_from_dict
from ..data import DatasetBundle, ImageSet
from ..subcenters import PAPER_OUTLIER_DEGREES, Outliers
from .embeddings import extract_embeddings
from .run import LoadedRun, load_bundle, load_run, resolve_device

__all__ = [
    "OUTLIERS_CSV_COLUMNS",
    "continue_with_dominant_centers",
    "run_outliers",
    "training_embeddings",
    "write_outliers_csv",
]

OUTLIERS_CSV_COLUMNS = ("index", "label", "class_name", "angle_degrees", "dominant_sub_center")
"""The columns of the outliers CSV, one row per flagged training sample."""


def training_embeddings(
    run: LoadedRun, bundle: DatasetBundle, *, device: torch.device | str = "cpu"
) -> tuple[Tensor, Tensor]:
    """``(embeddings[N, D] float32, labels[N] int64)`` of the run's training set (no flip).

    Raises:
        ValueError: the training set is streamed (RecordIO), which this does not embed.
    """
    train = bundle.train
    if not isinstance(train, ImageSet):
        raise ValueError(
            f"the training set of dataset {bundle.name!r} is streamed from disk; sub-center "
            "clean-up embeds in-memory training sets only"
        )
    embeddings = extract_embeddings(
        run.model, train.images, batch_size=run.config.eval_batch_size, device=device
    )
    return embeddings, torch.as_tensor(np.asarray(train.labels), dtype=torch.int64)


def run_outliers(
    run_dir: str | Path,
    *,
    threshold_degrees: float = PAPER_OUTLIER_DEGREES,
    device: str = "auto",
    bundle: DatasetBundle | None = None,
) -> tuple[Outliers, Tensor, tuple[str, ...]]:
    """The training samples of the run in ``run_dir`` farther than ``threshold_degrees``
    (degrees) from their class's dominant sub-center (any ``K``; with ``K = 1`` the class
    center). Returns ``(outliers, labels[N], class_names)``."""
    run = load_run(run_dir, device=resolve_device(device))
    if bundle is None:
        bundle = load_bundle(run.config, exclude=False)  # positions as config.exclude counts
    dev = next(run.model.parameters()).device
    embeddings, labels = training_embeddings(run, bundle, device=dev)
    outliers = run.loss.find_outliers(
        embeddings.to(run.loss.weight.device), labels, threshold_degrees=threshold_degrees
    )
    return outliers, labels, tuple(bundle.train.class_names)


def write_outliers_csv(
    path: str | Path, outliers: Outliers, labels: Tensor, class_names: tuple[str, ...] = ()
) -> Path:
    """Write one row per flagged sample (:data:`OUTLIERS_CSV_COLUMNS`), atomically; angles in
    degrees with 4 decimals."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(OUTLIERS_CSV_COLUMNS)
    for index in outliers.indices.tolist():
        label = int(labels[index])
        name = class_names[label] if label < len(class_names) else ""
        angle = float(outliers.angles[index])
        writer.writerow([index, label, name, f"{angle:.4f}", int(outliers.dominant[label])])
    return atomic_write_text(Path(path), buffer.getvalue())


def continue_with_dominant_centers(
    run_dir: str | Path,
    overrides: dict[str, Any] | None = None,
    *,
    device: str = "auto",
    bundle: DatasetBundle | None = None,
    drop_outliers: float | None = None,
) -> tuple[TrainConfig, dict[str, dict[str, Any]], Tensor]:
    """What a run that continues the sub-center run in ``run_dir`` with ``K = 1`` starts from.

    The dominant sub-center of every class is found on the run's training set, the head keeps
    only those (:meth:`~marginface.head.MarginSoftmaxLoss.drop_non_dominant_centers`), and the
    configuration is the run's with ``loss_options["sub_centers"] = 1`` and ``overrides``
    applied (e.g. ``{"epochs": 5}``). ``drop_outliers``: an angle in degrees (the paper: 75):
    the training samples farther than it from their class's dominant sub-center are added to
    the new run's ``exclude`` (the paper's clean-up drops them as label noise); None keeps them.

    Returns:
        ``(config, initial_state, dominant[C])``: pass the first two to
        :class:`~marginface.train.Trainer` (``initial_state=``).

    Raises:
        ValueError: the run has one center per class already.
    """
    run = load_run(run_dir, device=resolve_device(device))
    loss = run.loss
    if getattr(loss, "sub_centers", 1) == 1:
        raise ValueError(
            f"the run in {run_dir} has one center per class already (sub_centers = 1); "
            "--drop-non-dominant continues a sub-center run"
        )
    if bundle is None:
        bundle = load_bundle(run.config, exclude=False)  # positions as config.exclude counts
    dev = next(run.model.parameters()).device
    embeddings, labels = training_embeddings(run, bundle, device=dev)
    embeddings = embeddings.to(loss.weight.device)
    dominant = loss.dominant_sub_centers(embeddings, labels)
    flagged: list[int] = []
    if drop_outliers is not None:
        outliers = loss.find_outliers(embeddings, labels, threshold_degrees=drop_outliers)
        flagged = outliers.indices.tolist()
    loss.drop_non_dominant_centers(dominant)
    values = {**run.config.to_dict(), **(overrides or {})}
    values["loss_options"] = {**values.get("loss_options", {}), "sub_centers": 1}
    values["exclude"] = sorted({*values.get("exclude", []), *flagged})
    config = config_from_dict(values, source=f"{run_dir} with --drop-non-dominant")
    state = {
        "model": {k: v.detach().cpu() for k, v in run.model.state_dict().items()},
        "loss": {k: v.detach().cpu() for k, v in loss.state_dict().items()},
    }
    return config, state, dominant
