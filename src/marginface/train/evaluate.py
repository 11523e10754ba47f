"""Evaluate a trained run: closed-set accuracy, pair verification and open-set retrieval."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .._atomic import atomic_write_text
from ..data import DatasetBundle, PairSet
from ..evaluation import (
    ErrorVersusReject,
    VerificationMetrics,
    bin_set_metrics,
    closed_set_accuracy,
    error_versus_reject,
    pair_quality,
    pair_scores,
    retrieval_metrics,
    sample_pairs,
    verification_metrics,
)
from .embeddings import extract_embeddings
from .run import load_bundle, load_run, resolve_device

__all__ = [
    "ERC_REPORTED_FRACTIONS",
    "EVALUATION_NAME",
    "Evaluation",
    "evaluate_pairs",
    "evaluate_run",
    "magnitude_quality_curve",
    "verification_pairs",
    "write_evaluation",
]

EVALUATION_NAME = "evaluation.json"

ERC_REPORTED_FRACTIONS = (0.1, 0.2, 0.3, 0.5)
"""Rejected fractions whose accuracy a MagFace run's metrics list (``erc_accuracy@reject=0.10``
...); the whole curve is :attr:`Evaluation.erc`."""


@dataclass
class Evaluation:
    """What :func:`evaluate_run` measured.

    Attributes:
        metrics: scalar metrics by name: ``accuracy`` (closed-set, NaN for open-set data),
            ``verification_accuracy`` (10-fold), ``verification_accuracy_std``, ``auc``,
            ``eer``, ``tar@far=1e-03``..., ``precision_at_1``, ``map_at_r``, ``pairs``.
        embeddings: ``float32[N, D]`` of the test images (flip-averaged if asked).
        labels: ``int64[N]``.
        fpr, tpr: the ROC curve of the pairs.
        erc: for a MagFace run, the error-versus-reject curve of the pairs with the feature
            magnitude as quality (:func:`magnitude_quality_curve`); None otherwise.
    """

    metrics: dict[str, float]
    embeddings: np.ndarray
    labels: np.ndarray
    fpr: np.ndarray = field(default_factory=lambda: np.zeros(0))
    tpr: np.ndarray = field(default_factory=lambda: np.zeros(0))
    erc: ErrorVersusReject | None = None


def verification_pairs(bundle: DatasetBundle, *, num_pairs: int = 6000, seed: int = 0) -> PairSet:
    """The verification pairs of ``bundle``'s test set: its own (LFW's ``pairs.txt``,
    Omniglot's), else ``min(num_pairs, all pairs)`` balanced pairs drawn with ``seed``."""
    if bundle.pairs is not None:
        return bundle.pairs
    labels = np.asarray(bundle.test.labels)
    return sample_pairs(labels, min(num_pairs, len(labels) * (len(labels) - 1) // 2), seed)


def evaluate_pairs(embeddings: np.ndarray, pairs: PairSet) -> VerificationMetrics:
    """Verification of ``pairs`` on test ``embeddings`` ``(N, D)`` by cosine similarity.

    The threshold of each fold is the best one on the other folds (LFW protocol). When every
    pair carries one fold id (LFW evaluated on a single test fold: the other folds' identities
    trained the model, so their pairs cannot choose the threshold), the pairs are split into
    10 stratified sub-folds instead, each judged at the threshold best on the other nine.
    """
    scores = pair_scores(embeddings, pairs.index)
    folds = pairs.fold if len(np.unique(pairs.fold)) >= 2 else None
    return verification_metrics(scores, pairs.same, folds=folds)


def magnitude_quality_curve(embeddings: np.ndarray, pairs: PairSet) -> ErrorVersusReject:
    """MagFace's feature magnitude as a quality score: verification accuracy of ``pairs`` as the
    lowest-quality fraction is rejected (:func:`~marginface.evaluation.error_versus_reject`),
    a pair's quality being the smaller of its two embeddings' norms ``‖x‖`` (the embeddings as
    evaluated: flip-averaged when the evaluation flips), the threshold fixed at the one of
    highest accuracy on all pairs."""
    magnitudes = np.linalg.norm(np.asarray(embeddings, dtype=np.float64), axis=1)  # (N,)
    quality = pair_quality(magnitudes, pairs.index)  # (P,)
    scores = pair_scores(embeddings, pairs.index)  # (P,)
    return error_versus_reject(scores, pairs.same, quality)


def _is_magface(loss: Any) -> bool:
    from ..margins import MagFaceMargin

    return isinstance(getattr(loss, "margin", None), MagFaceMargin)


def evaluate_run(
    run_dir: str | Path,
    *,
    device: str = "auto",
    flip: bool | None = None,
    bundle: DatasetBundle | None = None,
    num_pairs: int = 6000,
    seed: int = 0,
) -> Evaluation:
    """Evaluate the checkpoint in ``run_dir`` on its dataset's test set.

    Args:
        device: ``auto`` (CUDA when present), ``cpu``, ``cuda``...
        flip: flip-averaged embeddings; None (default): the run's ``flip`` setting.
        bundle: the dataset if already loaded (else reloaded from the run's configuration).
        num_pairs: pairs sampled (balanced, 10 folds) when the dataset brings none. Default: 6000.
        seed: seed of that sampling.
    """
    run = load_run(run_dir, device=resolve_device(device))
    config = run.config
    if bundle is None:
        bundle = load_bundle(config)
    test = bundle.test
    if len(test) == 0 and bundle.verification:
        return _evaluate_verification_sets(run, bundle, config)
    dev = next(run.model.parameters()).device
    embeddings = extract_embeddings(
        run.model,
        test.images,
        batch_size=config.eval_batch_size,
        device=dev,
        flip=config.flip if flip is None else flip,
    ).numpy()
    labels = np.asarray(test.labels)
    metrics: dict[str, float] = {"accuracy": math.nan}
    if not bundle.open_set:
        centers = run.loss.weight.detach().float().cpu()
        metrics["accuracy"] = closed_set_accuracy(
            embeddings, labels, centers, sub_centers=getattr(run.loss, "sub_centers", 1)
        )
    pairs = verification_pairs(bundle, num_pairs=num_pairs, seed=seed)
    verification = evaluate_pairs(embeddings, pairs)
    for key, value in verification.as_dict().items():
        name = "verification_accuracy" if key == "accuracy" else key
        if name == "accuracy_std":
            name = "verification_accuracy_std"
        metrics[name] = math.nan if value is None else float(value)
    metrics["pairs"] = float(len(pairs))
    metrics.update({k: float(v) for k, v in retrieval_metrics(embeddings, labels).items()})
    erc = magnitude_quality_curve(embeddings, pairs) if _is_magface(run.loss) else None
    if erc is not None:
        curve = erc.as_dict()
        for fraction in ERC_REPORTED_FRACTIONS:
            key = f"erc_accuracy@reject={fraction:.2f}"
            metrics[key] = curve[key]
    return Evaluation(metrics, embeddings, labels, verification.fpr, verification.tpr, erc)


def _evaluate_verification_sets(run: Any, bundle: DatasetBundle, config: Any) -> Evaluation:
    """Datasets judged by verification sets only (insightface's ``.bin``): each set's metrics
    by :func:`~marginface.evaluation.bin_set_metrics` (insightface's rule, plus marginface's
    midpoint search and the ROC's TAR@FAR); the curves of the first set."""
    import torch

    device = next(run.model.parameters()).device
    metrics: dict[str, float] = {}
    first: tuple[np.ndarray, Any] | None = None
    for name, verification in bundle.verification.items():
        as_is, flipped = (
            extract_embeddings(
                run.model,
                verification.images,
                batch_size=config.eval_batch_size,
                device=device,
                transform=transform,
            ).numpy()
            for transform in (
                verification.model_input,
                lambda batch, v=verification: torch.flip(v.model_input(batch), dims=(3,)),
            )
        )
        values, roc = bin_set_metrics(as_is, flipped, verification.pairs)
        metrics.update({f"{name}_{key}": value for key, value in values.items()})
        if first is None:
            first = ((as_is + flipped) / 2, roc)  # flip-averaged, as before
    embeddings, roc = first
    labels = np.zeros(embeddings.shape[0], dtype=np.int64)
    metrics["accuracy"] = math.nan
    return Evaluation(metrics, embeddings, labels, roc.fpr, roc.tpr)


def write_evaluation(evaluation: Evaluation, path: str | Path) -> Path:
    """Write ``evaluation.metrics`` as JSON (NaN as null), atomically."""
    path = Path(path)
    clean: dict[str, Any] = {
        k: (None if isinstance(v, float) and not math.isfinite(v) else v)
        for k, v in evaluation.metrics.items()
    }
    return atomic_write_text(path, json.dumps(clean, indent=2, sort_keys=True) + "\n")
