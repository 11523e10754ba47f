"""The evaluation a training run logs: after every epoch its row of ``history.csv`` (test
metrics, verification sets, IJB-B/C when asked), and every ``verify_every`` steps the
verification sets' accuracy. The measurements themselves are
:mod:`marginface.train.evaluation.evaluate`'s
(one code path with ``marginface evaluate``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...data import DatasetBundle, PairSet
from ..config import TrainConfig
from ..distributed import is_distributed
from ..embedding_store import EmbeddingStore
from ..history import margin_state
from .evaluate import (
    evaluate_model,
    verification_pairs,
    verification_set_metrics,
    verification_set_results,
)
from .ijb_evaluation import IjbSet, ijb_set_for

__all__ = ["EpochEvaluator"]


class EpochEvaluator:
    """The evaluation a training run logs: its test metrics after every epoch
    (:func:`evaluate_model`'s summary) and its verification sets' accuracy (after every epoch
    and every ``verify_every`` steps).

    Args:
        bundle: the run's dataset.
        config: the run's :class:`~marginface.train.config.TrainConfig` (its ``eval_batch_size``,
            ``flip`` and ``channels_last``).
        device: where the model and head live.
        amp_dtype: autocast dtype of the forward passes (None: full precision).
        run_dir: where :meth:`epoch_row` keeps the embeddings it computed
            (``RUN/embeddings``, :mod:`~marginface.train.embedding_store`: ``plot`` reads them
            instead of embedding again); None (other ranks): not kept.

    The test pairs of an open-set dataset (:func:`verification_pairs`) are drawn once, at the
    first evaluation. With ``config.ijb_dir`` the IJB folder is read here, before the first
    step (:func:`~marginface.train.evaluation.ijb_evaluation.ijb_set_for`: a bad folder, target or
    model
    input is an error now), and :meth:`test_metrics` adds its columns.
    """

    def __init__(
        self,
        bundle: DatasetBundle,
        config: TrainConfig,
        *,
        device: torch.device,
        amp_dtype: torch.dtype | None = None,
        run_dir: Path | None = None,
    ) -> None:
        self.bundle = bundle
        self.run_dir = run_dir
        self.kept: EmbeddingStore | None = None
        self.config = config
        self.device = device
        self.amp_dtype = amp_dtype
        self._pairs: PairSet | None = None
        channels, height, width = bundle.train.image_shape
        described = None
        if config.ijb_dir is not None:  # the crops enter the model as the run's images do
            from ..model_input import describe_training_run

            meta = {"in_channels": channels, "image_size": height, "dataset": config.dataset}
            described = describe_training_run(config.to_dict(), meta)
        self.ijb: IjbSet | None = ijb_set_for(
            config.ijb_dir,
            config.ijb_target,
            config.ijb_every,
            in_channels=channels,
            image_size=(height, width),
            workers=config.workers,
            distributed=is_distributed(),
            **({} if described is None else {"mean": described.mean, "std": described.std}),
        )

    def evaluation_images(self) -> tuple[int, int]:
        """``(after an epoch, every verify_every steps)``: the images each evaluation embeds,
        flipped copies counted (the test set, flipped when :meth:`test_metrics` flips it, and
        every verification set twice; IJB not counted): the ETA's guess of their time
        before the first is measured (:class:`~marginface._progress.ProgressReporter`)."""
        bundle = self.bundle
        flip = self.config.flip and bundle.open_set
        verification = sum(2 * len(found.images) for found in bundle.verification.values())
        return len(bundle.test) * (2 if flip else 1) + verification, verification

    def test_metrics(
        self,
        model: nn.Module,
        head: nn.Module,
        epoch: int | None = None,
        store: EmbeddingStore | None = None,
    ) -> dict[str, float]:
        """The test metrics after ``epoch`` completed epochs (:func:`evaluate_model`'s
        summary): closed-set ``val_loss`` and ``accuracy`` on unflipped embeddings, or the
        open-set test pairs' ``verification_accuracy`` and ``auc`` with the run's ``flip`` (the
        figures ``marginface evaluate`` gives for this checkpoint); with ``ijb_dir`` the IJB
        columns (values when ``epoch`` is due, :meth:`IjbSet.due`, or ``epoch`` is None; NaN
        otherwise; every rank embeds its share of the IJB images, rank 0 gets the values);
        ``store``: where the test embeddings are kept. Every rank calls it."""
        bundle = self.bundle
        if bundle.open_set and self._pairs is None and len(bundle.test):
            self._pairs = verification_pairs(bundle)
        evaluation = evaluate_model(
            model,
            head,
            bundle,
            flip=self.config.flip and bundle.open_set,
            batch_size=self.config.eval_batch_size,
            device=self.device,
            amp_dtype=self.amp_dtype,
            channels_last=self.config.channels_last,
            pairs=self._pairs,
            summary=True,
            ijb=self.ijb,
            ijb_due=epoch is None
            or (self.ijb is not None and self.ijb.due(epoch, self.config.epochs)),
            store=store,
        )
        return evaluation.metrics

    def verification_sets(
        self, model: nn.Module, store: EmbeddingStore | None = None
    ) -> dict[str, float]:
        """Accuracy ± std (10 folds, flip-summed embeddings, insightface's protocol) of every
        verification set of the dataset (:func:`verification_set_metrics`); ``{}`` when it has
        none. ``store``: where their embeddings are kept."""
        results = verification_set_results(
            model,
            self.bundle,
            batch_size=self.config.eval_batch_size,
            device=self.device,
            amp_dtype=self.amp_dtype,
            channels_last=self.config.channels_last,
            store=store,
        )
        return verification_set_metrics(results)

    def step_verification(self, model: nn.Module, step: int) -> dict[str, Any] | None:
        """The row of ``verification.csv`` after ``step`` optimizer steps (counted from 1 over
        the run) when ``config.verify_every`` divides ``step`` and the dataset has verification
        sets: ``step``, then :meth:`verification_sets` (the model is put back in training
        mode); None at any other step. Every rank calls it."""
        every = self.config.verify_every
        if not (every and self.bundle.verification and step % every == 0):
            return None
        row: dict[str, Any] = {"step": step, **self.verification_sets(model)}
        model.train()
        return row

    def keep_embeddings(self) -> None:
        """Write the embeddings of the last :meth:`epoch_row` into ``run_dir/embeddings``
        (the weights' fingerprint beside them): called once their checkpoint is saved."""
        if self.kept is not None:
            self.kept.flush()
            self.kept = None

    def epoch_row(
        self,
        model: nn.Module,
        head: nn.Module,
        *,
        epoch: int,
        loss: float,
        lr: float,
        seconds: float,
        images: int,
    ) -> dict[str, Any]:
        """The row of ``history.csv`` for ``epoch`` (counted from 1): ``epoch``, the training
        ``loss`` (mean over the epoch's samples), :meth:`test_metrics`,
        :meth:`verification_sets`, ``lr``, ``seconds`` of training, ``images_per_second``
        (``images / seconds``) and the margin's scalar buffers (:func:`.margin_state`). The
        embeddings are held for :meth:`keep_embeddings`."""
        store = None
        if self.run_dir is not None:  # written, never read: the weights just changed
            store = EmbeddingStore.for_model(
                self.run_dir, model, epoch=epoch, read=False, defer=True
            )
        self.kept = store
        return {
            "epoch": epoch,
            "loss": loss,
            **self.test_metrics(model, head, epoch, store),
            **self.verification_sets(model, store),
            "lr": lr,
            "seconds": seconds,
            "images_per_second": images / seconds,
            **margin_state(head),
        }
