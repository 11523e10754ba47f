"""Evaluate a backbone and its head: closed-set accuracy, pair verification, open-set retrieval
and the verification sets; one function (:func:`evaluate_model`) serves the trainer's per-epoch
row and ``marginface evaluate`` (:func:`evaluate_run`)."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn

from ..._progress import progress_callback
from ...data import DatasetBundle, PairSet
from ...evaluation import (
    BinVerificationMetrics,
    ErrorVersusReject,
    VerificationMetrics,
    bin_set_metrics,
    bin_verification_metrics,
    pair_scores,
    retrieval_metrics,
    sample_pairs,
    verification_metrics,
)
from ...inference.embedding_cache import CachedEmbeddings
from ..build import load_bundle
from ..distributed import rank_slice, resolve_device
from ..embedding_store import EmbeddingStore, stored_embeddings
from ..embeddings import extract_embeddings, extract_embeddings_and_flipped
from ..state.loaded_run import LoadedRun, load_run
from .ijb_evaluation import (
    IjbSet,
    ijb_history_metrics,
    ijb_results,
)
from .quality import (
    ERC_REPORTED_FRACTIONS,
    magnitude_quality_curve,
    norm_is_quality,
    quality_metrics,
)

__all__ = [
    "ERC_REPORTED_FRACTIONS",
    "Evaluation",
    "ScoredPairs",
    "as_is_and_flipped",
    "closed_set_predictions",
    "evaluate_model",
    "evaluate_pairs",
    "evaluate_run",
    "magnitude_quality_curve",
    "norm_is_quality",
    "verification_pairs",
    "verification_set_metrics",
    "verification_set_results",
    "write_evaluation",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ScoredPairs:
    """The pairs of one verification set with their cosine scores, for the report's
    genuine/impostor histograms and 2-D projection.

    Attributes:
        scores: ``float64[P]`` cosine similarity of each pair (flip-summed embeddings for a
            ``.bin`` set: ``cos = 1 - d / 2`` of insightface's squared distance ``d``).
        same: ``bool[P]``, True for genuine pairs.
        thresholds: ``{rule: cosine threshold}``, the mean of the folds' thresholds of each
            rule measured: a ``.bin`` set's ``"insightface grid"`` (``1 - t / 2`` of its mean
            squared-L2 grid threshold ``t``) and ``"midpoint"`` (marginface's search); test
            pairs' ``"midpoint"``.
        index: ``int64[P, 2]`` rows of :attr:`Evaluation.embeddings` of each pair, or None
            when those embeddings are not this set's.
    """

    scores: np.ndarray
    same: np.ndarray
    thresholds: dict[str, float]
    index: np.ndarray | None = None


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
        erc: when the margin declares its feature norm a quality score (:func:`norm_is_quality`,
            MagFace), the error-versus-reject curve of the pairs with the feature magnitude as
            quality (:func:`magnitude_quality_curve`); None otherwise.
        pairs: ``{set: ScoredPairs}``: the verification pairs scored (``"test pairs"`` for
            open-set test data, each ``.bin`` set by name); empty for closed-set runs.
    """

    metrics: dict[str, float]
    embeddings: np.ndarray
    labels: np.ndarray
    fpr: np.ndarray = field(default_factory=lambda: np.zeros(0))
    tpr: np.ndarray = field(default_factory=lambda: np.zeros(0))
    erc: ErrorVersusReject | None = None
    pairs: dict[str, ScoredPairs] = field(default_factory=dict)


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


@torch.no_grad()
def closed_set_predictions(head: nn.Module, embeddings: Tensor) -> Tensor:
    """The class of largest cosine ``argmax_j cos θ_ij`` of every row of ``embeddings[N, D]``,
    ``int64[N]`` (sub-centers pooled by the head). With a sharded head (all ranks call it)
    every rank's classes take part; ties go to the lowest class index, as ``argmax`` on one
    process."""
    cosine = head.cosine(embeddings)  # (N, c): this rank's classes when sharded
    if getattr(head, "shard", None) is None:
        return cosine.argmax(dim=1)
    if cosine.shape[1]:
        values, index = cosine.max(dim=1)  # (N,), (N,)
    else:
        values = torch.full((cosine.shape[0],), -math.inf, device=cosine.device)
        index = torch.zeros(cosine.shape[0], dtype=torch.int64, device=cosine.device)
    index = index + head.class_range[0]
    world = dist.get_world_size()
    every_value = [torch.empty_like(values) for _ in range(world)]
    every_index = [torch.empty_like(index) for _ in range(world)]
    dist.all_gather(every_value, values.contiguous())
    dist.all_gather(every_index, index.contiguous())
    best = torch.stack(every_value).argmax(dim=0)  # (N,) the first rank holding the max
    return torch.stack(every_index).gather(0, best.unsqueeze(0)).squeeze(0)


@torch.no_grad()
def _closed_set(
    head: nn.Module, embeddings: Tensor, labels: np.ndarray, *, with_loss: bool
) -> tuple[float, float]:
    """``(accuracy, val_loss)`` of the test ``embeddings[N, D]`` (on the head's device): the
    share whose class of largest cosine is their own, and (``with_loss``, else NaN) the head's
    loss of all rows (each rank passes its share of the rows when the head is sharded)."""
    y = torch.as_tensor(labels, device=embeddings.device)  # (N,)
    val_loss = math.nan
    if with_loss:
        head.eval()
        if getattr(head, "shard", None) is not None:
            mine = rank_slice(torch.arange(len(y)), dist.get_rank(), dist.get_world_size())
            val_loss = float(head(embeddings[mine], y[mine]))  # the whole set's loss
        else:
            val_loss = float(head(embeddings, y))
    accuracy = float((closed_set_predictions(head, embeddings) == y).double().mean())
    return accuracy, val_loss


def as_is_and_flipped(
    model: nn.Module,
    verification: Any,
    *,
    batch_size: int,
    device: torch.device | str,
    amp_dtype: torch.dtype | None = None,
    channels_last: bool = False,
    name: str = "verification set",
    store: EmbeddingStore | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The embeddings ``float32[2P, D]`` of a verification set's images as they are and
    mirrored left-right (insightface's flip test keeps both: its XNorm and its Accuracy-Flip
    read them separately), both from one pass of the one embedder's flip test
    (:func:`~marginface.train.embeddings.extract_embeddings_and_flipped`); ``name`` labels the
    progress (``"lfw (flipped too)"``) and, with a ``store``, the kept embeddings
    (``RUN/embeddings/bin_<name>.npz``, reused when they are these weights',
    :mod:`~marginface.train.embedding_store`)."""

    def compute() -> CachedEmbeddings:
        as_is, flipped = extract_embeddings_and_flipped(
            model,
            verification.images,
            batch_size=batch_size,
            device=device,
            amp_dtype=amp_dtype,
            channels_last=channels_last,
            transform=verification.model_input,
            desc=f"{name} (flipped too)",
        )
        return CachedEmbeddings(as_is.numpy(), flipped.numpy())

    pairs = verification.pairs
    kept = stored_embeddings(
        store, f"bin_{name}", compute, flip=True, amp_dtype=amp_dtype,
        data=(verification.images, pairs.index, pairs.same),
    )  # fmt: skip
    assert kept.flipped is not None  # flip=True
    return kept.embeddings, kept.flipped


def verification_set_results(
    model: nn.Module,
    bundle: DatasetBundle,
    *,
    batch_size: int,
    device: torch.device | str,
    amp_dtype: torch.dtype | None = None,
    channels_last: bool = False,
    store: EmbeddingStore | None = None,
) -> dict[str, tuple[np.ndarray, BinVerificationMetrics]]:
    """Each verification set of ``bundle`` (insightface's ``.bin``): its flip-averaged
    embeddings ``float32[2P, D]`` and insightface's numbers
    (:func:`~marginface.evaluation.bin_verification_metrics`: Accuracy-Flip on the squared-L2
    grid, 10 folds), by set name: the numbers ``marginface evaluate`` reports for the set. A set
    whose grid was too coarse (``coarse_folds``) logs one INFO line saying so (the run prints
    it beside the set's accuracy). ``store``: keep (or reuse) the embeddings
    (:func:`as_is_and_flipped`)."""
    results: dict[str, tuple[np.ndarray, BinVerificationMetrics]] = {}
    for name, verification in bundle.verification.items():
        as_is, flipped = as_is_and_flipped(
            model,
            verification,
            batch_size=batch_size,
            device=device,
            amp_dtype=amp_dtype,
            channels_last=channels_last,
            name=name,
            store=store,
        )
        order = np.asarray(verification.pairs.index).reshape(-1)  # (2P,) a_0, b_0, a_1, ...
        metrics = bin_verification_metrics(
            as_is[order], verification.pairs.same, flipped=flipped[order]
        )
        logger.debug("[%s] accuracy-flip: %.5f+-%.5f", name, metrics.accuracy, metrics.accuracy_std)
        if metrics.grid_too_coarse:  # the number printed beside it measures the grid
            logger.info(
                "[%s] insightface's 0.01 threshold grid is too coarse for these embeddings "
                "(%d of %d folds: no grid threshold beats one answer for every pair): its "
                "accuracy %.5f measures the grid, not the model; marginface evaluate gives the "
                "finer midpoint search's (%s_accuracy_midpoint)",
                name,
                metrics.coarse_folds,
                metrics.fold_accuracies.shape[0],
                metrics.accuracy,
                name,
            )
        results[name] = ((as_is + flipped) / 2, metrics)
    return results


def verification_set_metrics(
    results: dict[str, tuple[np.ndarray, BinVerificationMetrics]],
) -> dict[str, float]:
    """``<set>_accuracy`` and ``<set>_accuracy_std`` of :func:`verification_set_results` (the
    trainer's per-epoch and every-``verify_every``-steps columns)."""
    row: dict[str, float] = {}
    for name, (_, metrics) in results.items():
        row[f"{name}_accuracy"] = float(metrics.accuracy)
        row[f"{name}_accuracy_std"] = float(metrics.accuracy_std)
    return row


def evaluate_model(
    model: nn.Module,
    head: nn.Module,
    bundle: DatasetBundle,
    *,
    flip: bool,
    batch_size: int,
    device: torch.device | str,
    amp_dtype: torch.dtype | None = None,
    channels_last: bool = False,
    pairs: PairSet | None = None,
    num_pairs: int = 6000,
    seed: int = 0,
    summary: bool = False,
    ijb: IjbSet | None = None,
    ijb_due: bool = True,
    store: EmbeddingStore | None = None,
) -> Evaluation:
    """Evaluate a backbone and its head on ``bundle``'s test set: the one evaluation behind
    the trainer's per-epoch row and ``marginface evaluate``.

    The test images' embeddings ``x`` (``flip``: averaged with the mirrored image's) give:

    * closed-set data: ``accuracy``, the share of test images whose class of largest cosine
      ``argmax_j cos θ_j`` is their own (the scale ``s`` does not change it);
    * the verification of the test pairs (``pairs``, else :func:`verification_pairs`) by
      cosine, 10 folds, each judged at the threshold best on the others (LFW's protocol):
      ``verification_accuracy``, ``verification_accuracy_std``, ``auc``, ``eer``,
      ``tar@far=...``; ``pairs``; retrieval ``precision_at_1``, ``map_at_r``
      (Musgrave et al., ECCV 2020); for a head whose margin declares its feature norm a
      quality score (:func:`norm_is_quality`: MagFace) the accuracy as the lowest-quality
      pairs are rejected (:func:`magnitude_quality_curve`);
    * an empty test set with verification sets (insightface's ``.bin``): each set's metrics
      by :func:`~marginface.evaluation.bin_set_metrics` (docs/evaluation.md).

    Args:
        model: the backbone (put in eval mode while embedding, then restored).
        head: the :class:`~marginface.head.MarginSoftmaxLoss` (its class centers; sharded
            heads are evaluated over every rank, which all call this function).
        bundle: the dataset.
        flip: average each embedding with the horizontally mirrored image's.
        batch_size: images per forward pass.
        device: where the model and head live.
        amp_dtype: autocast dtype of the forward passes (None: full precision).
        channels_last: feed the model channels-last images.
        pairs: the test pairs; None: :func:`verification_pairs` ``(bundle, num_pairs, seed)``.
        num_pairs: pairs sampled when the dataset brings none. Default: 6000.
        seed: seed of that sampling. Default: 0.
        summary: only what the trainer logs per epoch: ``val_loss`` (the head's loss of the
            test set) and ``accuracy`` for closed-set data, ``verification_accuracy`` and
            ``auc`` (with NaN ``val_loss`` and ``accuracy``) for open-set data, both NaN for an
            empty test set.
        ijb: an IJB-B/C dataset (:class:`~marginface.train.evaluation.ijb_evaluation.IjbSet`): its
            columns ``ijbc_tar@far=1e-06`` ... ``1e-01`` and, with the 1:N files,
            ``ijbc_<gallery>_rank1`` and ``ijbc_<gallery>_tpir@fpir=1e-01`` are added
            (:func:`~marginface.train.evaluation.ijb_evaluation.ijb_history_metrics`: the numbers
            ``marginface ijb`` gives for these weights; embedded in full precision, flipped,
            in batches of ``batch_size``; with ``ijb.distributed`` every rank calls this and
            embeds its share, rank 0 alone gets the values). None (default): no IJB.
        ijb_due: evaluate ``ijb`` now; False: its columns are NaN (an epoch between two IJB
            evaluations keeps the columns of the log in place). Default: True.
        store: keep the embeddings of the test set and of the verification sets in the run
            folder, and reuse the ones kept for these weights
            (:class:`~marginface.train.embedding_store.EmbeddingStore`). Default: None.

    Returns:
        The :class:`Evaluation` (metrics, embeddings ``float32[N, D]``, labels, ROC, ERC).
    """
    evaluation = _test_set_evaluation(
        model,
        head,
        bundle,
        flip=flip,
        batch_size=batch_size,
        device=device,
        amp_dtype=amp_dtype,
        channels_last=channels_last,
        pairs=pairs,
        num_pairs=num_pairs,
        seed=seed,
        summary=summary,
        store=store,
    )
    if ijb is not None:
        result = None
        if ijb_due:
            result = ijb_results(
                model,
                ijb.layout,
                device=device,
                batch_size=batch_size,
                workers=ijb.workers,
                progress=progress_callback(f"{ijb.target} (flipped too)", unit="images"),
                distributed=ijb.distributed,
                mean=ijb.mean,
                std=ijb.std,
            )  # None on the ranks other than 0
        evaluation.metrics.update(ijb_history_metrics(result, ijb))
    return evaluation


def _test_set_evaluation(
    model: nn.Module,
    head: nn.Module,
    bundle: DatasetBundle,
    *,
    flip: bool,
    batch_size: int,
    device: torch.device | str,
    amp_dtype: torch.dtype | None,
    channels_last: bool,
    pairs: PairSet | None,
    num_pairs: int,
    seed: int,
    summary: bool,
    store: EmbeddingStore | None,
) -> Evaluation:
    """:func:`evaluate_model` without the IJB columns."""
    test = bundle.test
    if len(test) == 0:
        if summary or not bundle.verification:
            return Evaluation({"val_loss": math.nan, "accuracy": math.nan}, *_no_embeddings())
        return _bin_sets_evaluation(
            model,
            bundle,
            batch_size=batch_size,
            device=device,
            amp_dtype=amp_dtype,
            channels_last=channels_last,
            store=store,
        )
    labels = np.asarray(test.labels)

    def compute() -> CachedEmbeddings:
        options = dict(batch_size=batch_size, device=device, channels_last=channels_last)
        if not flip:
            embedded = extract_embeddings(
                model, test.images, amp_dtype=amp_dtype, desc="test set", **options
            )  # (N, D) on the CPU
            return CachedEmbeddings(embedded.numpy())
        as_is, flipped = extract_embeddings_and_flipped(  # (N, D) each, on the CPU
            model, test.images, amp_dtype=amp_dtype, desc="test set (flip-averaged)", **options
        )
        return CachedEmbeddings(as_is.numpy(), flipped.numpy())

    # flip: (f(x) + f(flip_w(x))) / 2, the same float32 operations as extract_embeddings'
    embeddings = stored_embeddings(
        store, "test", compute, flip=flip, amp_dtype=amp_dtype, data=(test.images, labels)
    ).averaged()
    embedded = torch.from_numpy(embeddings)
    metrics: dict[str, float] = {"val_loss": math.nan} if summary else {}
    metrics["accuracy"] = math.nan
    if not bundle.open_set:
        accuracy, val_loss = _closed_set(head, embedded.to(device), labels, with_loss=summary)
        metrics["accuracy"] = accuracy
        if summary:
            metrics["val_loss"] = val_loss
            return Evaluation(metrics, embeddings, labels)
    if pairs is None:
        pairs = verification_pairs(bundle, num_pairs=num_pairs, seed=seed)
    verification = evaluate_pairs(embeddings, pairs)
    if summary:
        metrics["verification_accuracy"] = float(verification.accuracy)
        metrics["auc"] = float(verification.auc)
        return Evaluation(metrics, embeddings, labels, verification.fpr, verification.tpr)
    for key, value in verification.as_dict().items():
        name = "verification_accuracy" if key == "accuracy" else key
        if name == "accuracy_std":
            name = "verification_accuracy_std"
        metrics[name] = math.nan if value is None else float(value)
    metrics["pairs"] = float(len(pairs))
    metrics.update({k: float(v) for k, v in retrieval_metrics(embeddings, labels).items()})
    erc, quality = quality_metrics(head, embeddings, pairs)  # a norm that is a quality score
    metrics.update(quality)
    scored = {}
    if bundle.open_set:
        scored["test pairs"] = ScoredPairs(
            pair_scores(embeddings, pairs.index),
            np.asarray(pairs.same, dtype=bool),
            {"midpoint": float(verification.threshold)},
            np.asarray(pairs.index, dtype=np.int64),
        )
    return Evaluation(metrics, embeddings, labels, verification.fpr, verification.tpr, erc, scored)


def _bin_sets_evaluation(
    model: nn.Module,
    bundle: DatasetBundle,
    *,
    batch_size: int,
    device: torch.device | str,
    amp_dtype: torch.dtype | None,
    channels_last: bool,
    store: EmbeddingStore | None,
) -> Evaluation:
    """Datasets judged by verification sets only (insightface's ``.bin``): each set's metrics
    by :func:`~marginface.evaluation.bin_set_metrics` (insightface's rule, plus marginface's
    midpoint search and the ROC's TAR@FAR) from the embeddings of the images as they are and
    mirrored; the curves and the flip-averaged embeddings of the first set."""
    metrics: dict[str, float] = {}
    first: tuple[np.ndarray, Any] | None = None
    scored: dict[str, ScoredPairs] = {}
    for name, verification in bundle.verification.items():
        as_is, flipped = as_is_and_flipped(
            model,
            verification,
            batch_size=batch_size,
            device=device,
            amp_dtype=amp_dtype,
            channels_last=channels_last,
            name=name,
            store=store,
        )
        values, roc = bin_set_metrics(as_is, flipped, verification.pairs)
        metrics.update({f"{name}_{key}": value for key, value in values.items()})
        index = np.asarray(verification.pairs.index, dtype=np.int64)
        scored[name] = ScoredPairs(
            pair_scores(as_is + flipped, index),  # the flip-summed features' cosines
            np.asarray(verification.pairs.same, dtype=bool),
            {  # insightface's squared-L2 grid threshold t as a cosine: 1 - t / 2
                "insightface grid": 1.0 - values["threshold"] / 2.0,
                "midpoint": float(roc.threshold),
            },
            index if first is None else None,
        )
        if first is None:
            first = ((as_is + flipped) / 2, roc)  # flip-averaged
    embeddings, roc = first
    labels = np.zeros(embeddings.shape[0], dtype=np.int64)
    metrics["accuracy"] = math.nan
    return Evaluation(metrics, embeddings, labels, roc.fpr, roc.tpr, pairs=scored)


def _no_embeddings() -> tuple[np.ndarray, np.ndarray]:
    return np.zeros((0, 0), dtype=np.float32), np.zeros(0, dtype=np.int64)


def evaluate_run(
    run_dir: str | Path | LoadedRun,
    *,
    device: str = "auto",
    flip: bool | None = None,
    bundle: DatasetBundle | None = None,
    num_pairs: int = 6000,
    seed: int = 0,
    reuse_embeddings: bool = False,
) -> Evaluation:
    """Evaluate the checkpoint of a run on its dataset's test set (:func:`evaluate_model`:
    closed-set accuracy, verification of the pairs, retrieval; the verification sets when
    the test set is empty).

    Args:
        run_dir: the run folder, or the run already loaded (:func:`load_run`; it is then
            evaluated where it is, and ``device`` is not used).
        device: ``auto`` (CUDA when present), ``cpu``, ``cuda``...
        flip: flip-averaged embeddings; None (default): the run's ``flip`` setting.
        bundle: the dataset if already loaded (else reloaded from the run's configuration).
        num_pairs: pairs sampled (balanced, 10 folds) when the dataset brings none. Default: 6000.
        seed: seed of that sampling.
        reuse_embeddings: read the embeddings kept in ``RUN/embeddings`` when they are the
            checkpoint's (the run's last evaluation wrote them; the weights' fingerprint
            decides), embed what is missing, stale or damaged and keep it there
            (:mod:`~marginface.train.embedding_store`). Default: False.
    """
    run = (
        run_dir
        if isinstance(run_dir, LoadedRun)
        else load_run(run_dir, device=resolve_device(device))
    )
    config = run.config
    if bundle is None:
        bundle = load_bundle(config)
    return evaluate_model(
        run.model,
        run.head,
        bundle,
        flip=config.flip if flip is None else flip,
        batch_size=config.eval_batch_size,
        device=next(run.model.parameters()).device,
        num_pairs=num_pairs,
        seed=seed,
        store=EmbeddingStore.for_model(run.run_dir, run.model, epoch=run.epoch)
        if reuse_embeddings
        else None,
    )


def write_evaluation(evaluation: Evaluation, path: str | Path) -> Path:
    """Write ``evaluation.metrics`` to ``path`` as JSON (NaN as null), atomically, through
    :func:`marginface.train.state.results.write_results_file` (a run's own file:
    :func:`~marginface.train.state.results.update_results`, which keeps ``ijb``'s numbers)."""
    from ..state.results import write_results_file

    return write_results_file(path, evaluation.metrics)
