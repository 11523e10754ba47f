"""Sub-center ArcFace's clean-up of a trained run (what ``marginface outliers`` and
``marginface train --drop-non-dominant`` do): the training set's embeddings, the samples farther
than a threshold angle from their class's dominant sub-center (a CSV), and a new run that
continues with one center per class.

The training set is the run's own (its dataset, with its ``limit`` subset, its ``exclude``
list not applied), embedded without flipping; a sample's ``index`` is its position in that set,
the position ``exclude`` counts. An in-memory set is embedded from its arrays; a streamed one
(insightface's ``train.rec``) is read in order through a ``DataLoader`` (``workers``), holding
only the ``N × D`` embeddings.
"""

from __future__ import annotations

import csv
import io
import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .._atomic import atomic_write_text
from .._validation import check_real
from ..data import DatasetBundle, ImageSet
from ..data.base import StreamedImageSet
from ..subcenters import PAPER_OUTLIER_DEGREES, Outliers
from .build import load_bundle
from .config import TrainConfig, config_from_dict
from .distributed import resolve_device
from .embeddings import extract_dataset_embeddings, extract_embeddings
from .state.loaded_run import LoadedRun, load_run

__all__ = [
    "OUTLIERS_CSV_COLUMNS",
    "continue_with_dominant_centers",
    "run_outliers",
    "training_embeddings",
    "write_outliers_csv",
]

logger = logging.getLogger(__name__)

OUTLIERS_CSV_COLUMNS = ("index", "label", "class_name", "angle_degrees", "dominant_sub_center")
"""The columns of the outliers CSV, one row per flagged training sample."""


def training_embeddings(
    run: LoadedRun,
    bundle: DatasetBundle,
    *,
    device: torch.device | str = "cpu",
    workers: int | None = None,
) -> tuple[Tensor, Tensor]:
    """``(embeddings[N, D] float32, labels[N] int64)`` of the run's training set (no flip), in
    the set's order: row ``i`` is the sample at position ``i`` (what ``exclude`` counts).

    An in-memory set is embedded from its arrays; a streamed one (insightface's ``train.rec``)
    is read in order through a ``DataLoader`` with ``workers`` processes (None: the run's
    ``config.workers``), ``config.eval_batch_size`` images at a time, its flips off: only the
    ``N × D`` embeddings are held.

    Raises:
        TypeError: the training set is neither in memory nor streamed.
        ValueError: a record cannot be read or decoded (file and record named), or a streamed
            item's label differs from its record header's.
    """
    train = bundle.train
    batch_size = run.config.eval_batch_size
    if isinstance(train, ImageSet):
        embeddings = extract_embeddings(
            run.model, train.images, batch_size=batch_size, device=device, desc="training set"
        )
    elif isinstance(train, StreamedImageSet):
        workers = run.config.workers if workers is None else workers
        logger.info(
            "embedding %d training images of %r streamed from disk (%d workers)",
            len(train),
            bundle.name,
            workers,
        )
        embeddings = extract_dataset_embeddings(
            run.model,
            train.unaugmented().dataset,
            batch_size=batch_size,
            device=device,
            workers=workers,
            labels=train.labels,
            desc="training set",
        )
    else:
        raise TypeError(
            f"the training set of dataset {bundle.name!r} is a {type(train).__name__}; "
            "sub-center clean-up embeds an ImageSet (in memory) or a StreamedImageSet (from disk)"
        )
    return embeddings, torch.as_tensor(np.asarray(train.labels), dtype=torch.int64)


def run_outliers(
    run_dir: str | Path,
    *,
    threshold_degrees: float = PAPER_OUTLIER_DEGREES,
    device: str = "auto",
    bundle: DatasetBundle | None = None,
    workers: int | None = None,
) -> tuple[Outliers, Tensor, tuple[str, ...]]:
    """The training samples of the run in ``run_dir`` farther than ``threshold_degrees``
    (degrees) from their class's dominant sub-center (any ``K``; with ``K = 1`` the class
    center). Returns ``(outliers, labels[N], class_names)``. ``workers``: DataLoader
    processes for a streamed training set (None: the run's ``config.workers``)."""
    check_real("threshold_degrees", threshold_degrees, nonnegative=True, at_most=180.0)
    run = load_run(run_dir, device=resolve_device(device))
    if bundle is None:
        bundle = load_bundle(run.config, exclude=False)  # positions as config.exclude counts
    dev = next(run.model.parameters()).device
    embeddings, labels = training_embeddings(run, bundle, device=dev, workers=workers)
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
    workers: int | None = None,
) -> tuple[TrainConfig, dict[str, dict[str, Any]], Tensor]:
    """What a run that continues the sub-center run in ``run_dir`` with ``K = 1`` starts from.

    The dominant sub-center of every class is found on the run's training set, the head keeps
    only those (:meth:`~marginface.head.MarginSoftmaxLoss.drop_non_dominant_centers`), and the
    configuration is the run's with ``loss_options["sub_centers"] = 1`` and ``overrides``
    applied (e.g. ``{"epochs": 5}``). ``drop_outliers``: an angle in degrees (the paper: 75):
    the training samples farther than it from their class's dominant sub-center are added to
    the new run's ``exclude`` (the paper's clean-up drops them as label noise); None keeps them.
    ``workers``: DataLoader processes embedding a streamed training set (None: the new
    configuration's, i.e. ``overrides``' else the run's).

    Returns:
        ``(config, initial_state, dominant[C])``: pass the first two to
        :class:`~marginface.train.Trainer` (``initial_state=``).

    Raises:
        ValueError: the run has one center per class already, ``drop_outliers`` is not an
            angle in ``[0, 180]``, or a bad override (all checked before the embedding pass);
            ``drop_outliers`` leaves no training sample (named as ``--drop-outliers``).
    """
    run = load_run(run_dir, device=resolve_device(device))
    loss = run.loss
    if getattr(loss, "sub_centers", 1) == 1:
        raise ValueError(
            f"the run in {run_dir} has one center per class already (sub_centers = 1); "
            "--drop-non-dominant continues a sub-center run"
        )
    # the new configuration and the threshold are checked before the embedding pass (hours on
    # a web-scale train.rec), so that a bad option fails at once
    values = {**run.config.to_dict(), **(overrides or {})}
    values["loss_options"] = {**values.get("loss_options", {}), "sub_centers": 1}
    source = f"{run_dir} with --drop-non-dominant"
    config = config_from_dict(values, source=source)
    if drop_outliers is not None:
        drop_outliers = check_real("drop_outliers", drop_outliers, nonnegative=True, at_most=180.0)
    if bundle is None:
        bundle = load_bundle(run.config, exclude=False)  # positions as config.exclude counts
    dev = next(run.model.parameters()).device
    if workers is None:
        workers = config.workers
    embeddings, labels = training_embeddings(run, bundle, device=dev, workers=workers)
    embeddings = embeddings.to(loss.weight.device)
    dominant = loss.dominant_sub_centers(embeddings, labels)
    if drop_outliers is not None:
        outliers = loss.find_outliers(embeddings, labels, threshold_degrees=drop_outliers)
        values["exclude"] = sorted({*config.exclude, *outliers.indices.tolist()})
        if len(values["exclude"]) >= len(labels):
            raise ValueError(
                f"--drop-outliers {drop_outliers:g} flags every one of the {len(labels)} training "
                f"samples ({len(outliers.indices)} farther than {drop_outliers:g} degrees from "
                "their class's dominant sub-center, the rest excluded already), leaving nothing "
                "to train on; give a larger angle (the paper: 75)"
            )
        config = config_from_dict(values, source=source)
    loss.drop_non_dominant_centers(dominant)
    state = {
        "model": {k: v.detach().cpu() for k, v in run.model.state_dict().items()},
        "loss": {k: v.detach().cpu() for k, v in loss.state_dict().items()},
    }
    return config, state, dominant
