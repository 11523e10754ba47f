"""IJB-B / IJB-C evaluation of a backbone: the one function behind ``marginface ijb`` and the
IJB columns of a training run's ``history.csv``.

:func:`ijb_results` embeds the dataset's aligned loose crops (:mod:`marginface.data.ijb`) with
the backbone in eval mode (its mode restored afterwards), as they are and flipped, in full
precision (:mod:`marginface.train.evaluation.ijb_embedding`), and runs the 1:1 and 1:N
protocols (:func:`marginface.evaluation.ijb.evaluate_ijb`). ``marginface ijb`` calls it through
:func:`~marginface.report.ijb_files.evaluate_ijb_to_files`; the trainer
calls it through :func:`~marginface.train.evaluation.evaluate.evaluate_model` with an
:class:`IjbSet`
(``train --ijb-dir DIR --ijb-target IJBC --ijb-every K``) and keeps the summary columns of
:func:`ijb_history_metrics`: the same numbers, under the same keys, as ``marginface ijb RUN``
writes for the same weights.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from ...data.ijb import IJB_TARGETS, IjbLayout, read_ijb_layout
from ...evaluation.ijb import IJB_FAR_TARGETS, IjbResult, evaluate_ijb
from ...inference.embedding_cache import model_fingerprint
from .ijb_embedding import INSIGHTFACE_MEAN, INSIGHTFACE_STD, embed_ijb_images, run_embedder

__all__ = [
    "HISTORY_FPIR",
    "IJB_INPUT",
    "IjbSet",
    "ijb_history_keys",
    "ijb_history_metrics",
    "ijb_results",
    "ijb_set_for",
]

IJB_INPUT = (3, 112, 112)
"""What the backbone receives: RGB ArcFace crops ``float32[B, 3, 112, 112]`` in [-1, 1]."""

HISTORY_FPIR = 0.1
"""The FPIR of the 1:N column of ``history.csv`` (``..._tpir@fpir=1e-01``)."""

_TPIR_COLUMN = f"tpir@fpir={HISTORY_FPIR:.0e}"


@dataclass(frozen=True)
class IjbSet:
    """An IJB-B/C dataset evaluated while training (``TrainConfig.ijb_dir``).

    Attributes:
        layout: the dataset's files, read (:func:`~marginface.data.ijb.read_ijb_layout`).
        target: ``"IJBC"`` or ``"IJBB"``; the columns are prefixed ``ijbc_`` / ``ijbb_``.
        every: evaluate after every ``every``-th epoch and after the last one (>= 1).
        workers: processes reading and aligning the images (0: the training process).
        distributed: every rank of the default process group embeds its share of the
            images (:func:`ijb_results`); rank 0 evaluates.
        mean, std: how the run's images enter its model (its description's; insightface's
            ``(x / 255 - 0.5) / 0.5`` by default), applied to the IJB crops as well.
    """

    layout: IjbLayout
    target: str
    every: int = 1
    workers: int = 0
    distributed: bool = False
    mean: float | tuple[float, ...] = INSIGHTFACE_MEAN
    std: float | tuple[float, ...] = INSIGHTFACE_STD

    @property
    def prefix(self) -> str:
        """The key prefix of the results: ``ijbc_`` or ``ijbb_`` (``marginface ijb``'s)."""
        return f"{self.target.lower()}_"

    def due(self, epoch: int, epochs: int) -> bool:
        """Whether the ``epoch``-th completed epoch (1-based) of ``epochs`` is evaluated:
        ``epoch % every == 0``, or the last epoch."""
        return epoch % self.every == 0 or epoch == epochs


def ijb_set_for(
    ijb_dir: str | os.PathLike[str] | None,
    target: str,
    every: int,
    *,
    in_channels: int,
    image_size: int | tuple[int, int],
    workers: int = 0,
    distributed: bool = False,
    mean: float | tuple[float, ...] = INSIGHTFACE_MEAN,
    std: float | tuple[float, ...] = INSIGHTFACE_STD,
) -> IjbSet | None:
    """The :class:`IjbSet` of a training run, read before its first step (None without
    ``ijb_dir``), so a missing folder or file is an error before any training.

    Args:
        ijb_dir: the IJB folder (``loose_crop/``, ``meta/``), or None.
        target: ``"IJBC"`` or ``"IJBB"``.
        every: evaluate every this many epochs (and after the last).
        in_channels, image_size: the run's input (``run_meta``); IJB crops are RGB 112×112.
        workers: processes reading and aligning the images.
        distributed: the run's ranks share the embedding (:attr:`IjbSet.distributed`).
        mean, std: the run's pixel normalisation (:attr:`IjbSet.mean`).

    Raises:
        ValueError: ``target`` unknown, ``every`` < 1, a model of another input, a bad meta
            file. FileNotFoundError: no folder or a missing meta file.
    """
    if ijb_dir is None:
        return None
    if target not in IJB_TARGETS:
        raise ValueError(f"ijb_target must be one of {', '.join(IJB_TARGETS)}, got {target!r}")
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ValueError(f"ijb_every must be an int >= 1, got {every!r}")
    size = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
    if (in_channels, *size) != IJB_INPUT:
        raise ValueError(
            f"ijb_dir needs a model of 112x112 RGB input (IJB's aligned crops); this run's "
            f"images are {in_channels}x{size[0]}x{size[1]}"
        )
    layout = read_ijb_layout(Path(ijb_dir), target)
    return IjbSet(layout, target, every, workers, distributed, mean, std)


def ijb_results(
    model: nn.Module,
    layout: IjbLayout,
    *,
    device: torch.device | str,
    batch_size: int = 128,
    workers: int = 0,
    cache: str | os.PathLike[str] | None = None,
    cache_key: str = "",
    progress: Callable[[int, int], None] | None = None,
    flip: bool = True,
    norm_score: bool = True,
    detector_score: bool = True,
    label: str = "the model",
    distributed: bool = False,
    gallery_rule: str = "open-set",
    alignment: str = "insightface",
    mean: float | tuple[float, ...] = INSIGHTFACE_MEAN,
    std: float | tuple[float, ...] = INSIGHTFACE_STD,
) -> IjbResult | None:
    """Embed ``layout``'s images with ``model`` and evaluate IJB 1:1 and 1:N (module
    docstring): what ``marginface ijb`` and the trainer's IJB columns compute.

    With ``distributed``, every rank of the default process group calls this with the same
    weights: rank ``r`` of ``W`` embeds the ``r``-th of ``W`` contiguous, nearly equal parts
    of the images (``torch.tensor_split``), rank 0 gathers them in order and evaluates; the
    other ranks return None.

    Args:
        model: the backbone, ``float32[B, 3, 112, 112]`` normalised by ``mean``, ``std`` →
            ``[B, D]``, any ``D``; put in eval mode while embedding, then restored.
        layout: :func:`~marginface.data.ijb.read_ijb_layout`.
        device: where ``model`` lives.
        batch_size: images per forward pass (each batch is also embedded flipped).
        workers: processes reading and aligning the images.
        cache: a ``.npz`` file of the embeddings (read when it matches ``cache_key``), or None.
        cache_key: what identifies the weights in the cache; "" (default) with a ``cache``:
            the weights' own fingerprint
            (:func:`~marginface.inference.embedding_cache.model_fingerprint`: an ONNX graph's
            is its file's), so a cache is
            never read back for other weights.
        progress: called with ``(images done, total)`` after each batch.
        flip, norm_score, detector_score: the protocol's switches (all on: insightface's).
        label: how errors name the model (a run folder, a file).
        distributed: share the embedding over the ranks (above); ``cache`` is then not used.
        gallery_rule: the TPIR rule of G1 and G2: ``"open-set"`` (ours) or
            ``"insightface-per-gallery"`` (:func:`~marginface.evaluation.ijb.evaluate_ijb`).
        alignment: the crops' arithmetic, ``"insightface"`` (default: its crops to the grey
            level) or ``"float64"`` (:func:`~marginface.data.align.norm_crop`).
        mean, std: the model's pixel normalisation, ``(x / 255 - mean[c]) / std[c]``, as its
            :class:`~marginface.models.description.ModelDescription` says. Default: 0.5 and
            0.5, insightface's.

    Raises:
        ValueError: the model cannot embed 112×112 RGB crops (one line naming ``label``), an
            image is missing or unreadable.
    """
    was_training = model.training
    model_embed = run_embedder(model, device)  # eval mode

    def embed(x: torch.Tensor) -> torch.Tensor:
        try:
            return model_embed(x)
        except RuntimeError as error:  # a model for other images (size, channels)
            first_line = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise ValueError(
                f"the model of {label} cannot embed 112x112 RGB face crops: {first_line}"
            ) from None

    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    share = layout
    if world > len(layout.names):
        raise ValueError(f"{len(layout.names)} IJB image(s) cannot be shared by {world} ranks")
    if world > 1:
        mine = torch.arange(len(layout.names)).tensor_split(world)[rank].numpy()  # (n_r,)
        names = [layout.names[i] for i in mine]
        share = dataclasses.replace(layout, names=names, landmarks=layout.landmarks[mine])
    try:
        embeddings, flipped = embed_ijb_images(
            share,
            embed,
            batch_size=batch_size,
            workers=workers,
            cache=cache if world == 1 else None,
            cache_key=cache_key if cache_key or cache is None else model_fingerprint(model),
            progress=progress,
            alignment=alignment,
            mean=mean,
            std=std,
        )
    finally:
        model.train(was_training)
    if world > 1:
        gathered = _gather_to_rank_zero(embeddings, flipped, len(layout.names), device)
        if gathered is None:
            return None
        embeddings, flipped = gathered
    return evaluate_ijb(
        layout,
        embeddings,
        flipped,
        flip=flip,
        norm_score=norm_score,
        detector_score=detector_score,
        gallery_rule=gallery_rule,
    )


def _gather_to_rank_zero(
    embeddings: np.ndarray, flipped: np.ndarray, total: int, device: torch.device | str
) -> tuple[np.ndarray, np.ndarray] | None:
    """Every rank's ``(float32[n_r, D], float32[n_r, D])`` concatenated in rank order on rank
    0 (None elsewhere): one ``dist.gather`` of ``[max n_r, 2D]`` blocks on ``device``."""
    world = dist.get_world_size()
    counts = [len(part) for part in torch.arange(total).tensor_split(world)]  # (W,)
    rows = max(counts)
    block = torch.zeros(rows, 2 * embeddings.shape[1], device=device)  # (max n_r, 2D)
    block[: len(embeddings)] = torch.from_numpy(np.concatenate([embeddings, flipped], axis=1))
    rank_zero = dist.get_rank() == 0
    blocks = [torch.empty_like(block) for _ in range(world)] if rank_zero else None
    dist.gather(block, blocks, dst=0)
    if not rank_zero:
        return None
    both = torch.cat([b[:n] for b, n in zip(blocks, counts, strict=True)]).cpu().numpy()
    dim = embeddings.shape[1]
    return both[:, :dim], both[:, dim:]


def ijb_history_keys(ijb: IjbSet) -> list[str]:
    """The IJB columns of an epoch's row: ``<prefix>tar@far=1e-06`` ... ``1e-01`` (1:1,
    insightface's nearest-point rule) and, per gallery when the 1:N files exist,
    ``<prefix><gallery>_rank1`` and ``<prefix><gallery>_tpir@fpir=1e-01`` (``G1``, ``G2``
    open-set; ``G1+G2`` insightface's rule; IJB-B: ``S1``, ``S2``, ``S1+S2``): a subset of
    ``marginface ijb``'s keys."""
    keys = [f"{ijb.prefix}tar@far={far:.0e}" for far in IJB_FAR_TARGETS]
    galleries = list(ijb.layout.galleries)
    if ijb.layout.probes is not None and galleries:
        for gallery in [*galleries, "+".join(galleries)]:
            keys += [f"{ijb.prefix}{gallery}_{k}" for k in ("rank1", _TPIR_COLUMN)]
    return keys


def ijb_history_metrics(result: IjbResult | None, ijb: IjbSet) -> dict[str, float]:
    """:func:`ijb_history_keys` with the values of ``result`` (``marginface ijb``'s for the
    same weights), NaN where not measured (``result`` None: an epoch IJB skips)."""
    everything: dict[str, Any] = {} if result is None else result.as_dict(ijb.prefix)
    return {key: float(everything.get(key, math.nan)) for key in ijb_history_keys(ijb)}
