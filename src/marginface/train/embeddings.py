"""Embedding extraction in batches: of images in memory (optionally averaged with the
horizontally flipped image's, or with those kept apart), or of a dataset streamed from disk
through a ``DataLoader``. Each batch goes through
:func:`~marginface.inference.embedder.embed_batch`, the one embedder and its flip test."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from .._progress import Progress, track
from ..inference.embedder import embed_batch

__all__ = ["extract_dataset_embeddings", "extract_embeddings", "extract_embeddings_and_flipped"]


def _embedded_batches(
    model: nn.Module,
    images: np.ndarray | Tensor,
    *,
    batch_size: int,
    device: torch.device | str,
    flip: bool,
    channels_last: bool,
    amp_dtype: torch.dtype | None,
    transform: Callable[[Tensor], Tensor] | None,
    desc: str,
) -> tuple[list[Tensor], list[Tensor]]:
    """The loop of :func:`extract_embeddings` and :func:`extract_embeddings_and_flipped`: each
    batch of ``batch_size`` images through :func:`~marginface.inference.embedder.embed_batch`
    (its flip test), the model in eval mode and given back its mode. Returns the batches'
    ``f(x)`` and, with ``flip``, ``f(flip_w(x))`` (else an empty list), each ``float32[B, D]``
    on the CPU."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size!r}")
    if images.ndim != 4:
        raise ValueError(f"images must have shape (N, C, H, W), got {tuple(images.shape)}")
    was_training = model.training
    model.eval()
    device = torch.device(device)
    outputs: list[Tensor] = []
    mirrors: list[Tensor] = []
    try:
        starts = range(0, images.shape[0], batch_size)
        for start in track(starts, desc, unit="batches"):
            out, mirrored = embed_batch(
                model,
                images[start : start + batch_size],
                normalise=transform,
                flip=flip,
                device=device,
                amp_dtype=amp_dtype,
                channels_last=channels_last,
            )  # (B, D) each
            outputs.append(out.cpu())
            if mirrored is not None:
                mirrors.append(mirrored.cpu())
    finally:
        model.train(was_training)
    if not outputs:
        raise ValueError("images is empty (N = 0)")
    return outputs, mirrors


@torch.no_grad()
def extract_embeddings(
    model: nn.Module,
    images: np.ndarray | Tensor,
    *,
    batch_size: int = 1024,
    device: torch.device | str = "cpu",
    flip: bool = False,
    channels_last: bool = False,
    amp_dtype: torch.dtype | None = None,
    transform: Callable[[Tensor], Tensor] | None = None,
    desc: str = "embedding",
) -> Tensor:
    """Embeddings ``Tensor[N, D]`` (float32, on CPU, not normalized) of ``images[N, C, H, W]``.

    The model is put in eval mode (and restored to its previous mode afterwards).
    ``flip=True`` returns ``(f(x) + f(flip_w(x))) / 2``, the usual test-time augmentation of
    face verification. ``transform`` maps each batch (on ``device``) to model input, e.g.
    ``uint8`` images to normalized floats
    (:meth:`~marginface.data.base.VerificationSet.model_input`). ``desc`` names the loop's
    progress (:func:`~marginface._progress.track`, shown under a
    :func:`~marginface._progress.progress_output` block: the command line, a training run).

    Raises:
        ValueError: ``batch_size < 1``; ``images`` not 4-D, or empty.
    """
    outputs, mirrors = _embedded_batches(
        model,
        images,
        batch_size=batch_size,
        device=device,
        flip=flip,
        channels_last=channels_last,
        amp_dtype=amp_dtype,
        transform=transform,
        desc=desc,
    )
    if flip:
        outputs = [(out + mirrored) / 2 for out, mirrored in zip(outputs, mirrors, strict=True)]
    return torch.cat(outputs)


@torch.no_grad()
def extract_embeddings_and_flipped(
    model: nn.Module,
    images: np.ndarray | Tensor,
    *,
    batch_size: int = 1024,
    device: torch.device | str = "cpu",
    channels_last: bool = False,
    amp_dtype: torch.dtype | None = None,
    transform: Callable[[Tensor], Tensor] | None = None,
    desc: str = "embedding (flipped too)",
) -> tuple[Tensor, Tensor]:
    """The two halves of the flip test, kept apart: ``(f(x), f(flip_w(x)))``, each
    ``Tensor[N, D]`` (float32, on CPU, not normalized), of ``images[N, C, H, W]`` in one pass
    (both forward passes of a batch together, the mirror ``x[..., ::-1]`` taken by
    :func:`~marginface.inference.embedder.embed_batch` after ``transform``).

    insightface's verification keeps both (its XNorm and its Accuracy-Flip read them
    separately); their mean is :func:`extract_embeddings` with ``flip=True``. The options are
    :func:`extract_embeddings`'s (same defaults; ``desc``: ``"embedding (flipped too)"``).

    Raises:
        ValueError: ``batch_size < 1``; ``images`` not 4-D, or empty.
    """
    outputs, mirrors = _embedded_batches(
        model,
        images,
        batch_size=batch_size,
        device=device,
        flip=True,
        channels_last=channels_last,
        amp_dtype=amp_dtype,
        transform=transform,
        desc=desc,
    )
    return torch.cat(outputs), torch.cat(mirrors)


@torch.no_grad()
def extract_dataset_embeddings(
    model: nn.Module,
    dataset: Any,
    *,
    batch_size: int = 1024,
    device: torch.device | str = "cpu",
    workers: int = 0,
    labels: np.ndarray | Tensor | None = None,
    channels_last: bool = False,
    amp_dtype: torch.dtype | None = None,
    desc: str = "embedding",
) -> Tensor:
    """Embeddings ``Tensor[N, D]`` (float32, on CPU, not normalized) of a map-style dataset
    read in order, ``batch_size`` items at a time, by a ``DataLoader`` with ``workers`` worker
    processes: a training set streamed from disk (``dataset[i]`` is ``(float32[C, H, W],
    label)``, e.g. :class:`~marginface.data.insightface.InsightFaceDataset`), never held in
    memory (only the ``N × D`` result is, preallocated: 4·N·D bytes).

    The model is put in eval mode (and restored afterwards). ``labels`` (``int64[N]``, e.g.
    the labels read from the record headers): each batch's labels must equal them, so a
    position in the result is the dataset's position. An error raised by the dataset in a
    worker (a corrupt record) is re-raised as one line naming the file and record. ``desc``
    names the loop's progress (:func:`~marginface._progress.Progress`, in images).

    Raises:
        ValueError: ``batch_size < 1``, ``workers < 0``, an empty dataset, a label different
            from ``labels`` (position named), or as the dataset raises.
    """
    from torch.utils.data import DataLoader

    from .loader_errors import next_batch

    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        raise ValueError(f"workers must be an int >= 0, got {workers!r}")
    total = len(dataset)
    if total == 0:
        raise ValueError("the dataset is empty (N = 0)")
    expected = None if labels is None else torch.as_tensor(np.asarray(labels), dtype=torch.int64)
    if expected is not None and expected.shape != (total,):
        raise ValueError(f"labels must have shape ({total},), got {tuple(expected.shape)}")
    device = torch.device(device)
    loader = iter(
        DataLoader(
            dataset,
            batch_size=batch_size,
            shuffle=False,
            num_workers=workers,
            pin_memory=device.type == "cuda",
        )
    )
    was_training = model.training
    model.eval()
    out: Tensor | None = None
    start = 0
    progress = Progress(desc, total, unit="images")
    try:
        while start < total:
            try:
                images, batch_labels = next_batch(loader)
            except StopIteration:
                raise ValueError(
                    f"the dataset yielded {start} items, but its length is {total}"
                ) from None
            stop = start + images.shape[0]
            if expected is not None and not torch.equal(
                batch_labels.to(torch.int64), expected[start:stop]
            ):
                wrong = start + int(
                    (batch_labels.to(torch.int64) != expected[start:stop]).nonzero()[0]
                )
                raise ValueError(
                    f"item {wrong} of the dataset has label {int(batch_labels[wrong - start])}, "
                    f"its record header says {int(expected[wrong])}"
                )
            embedded, _ = embed_batch(
                model,
                images.to(device, non_blocking=True),
                device=None,
                amp_dtype=amp_dtype,
                channels_last=channels_last,
            )  # (B, D)
            if out is None:
                out = torch.empty(total, embedded.shape[1], dtype=torch.float32)
            out[start:stop] = embedded.cpu()
            start = stop
            progress.set(stop)
    finally:
        progress.close()
        model.train(was_training)
        loader = None  # workers stop now, not when a traceback holding this frame is freed
    if out is None:  # pragma: no cover - total > 0 runs the loop at least once
        raise ValueError("the dataset is empty (N = 0)")
    return out
