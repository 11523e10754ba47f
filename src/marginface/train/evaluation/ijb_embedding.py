"""A model's embeddings of IJB-B / IJB-C's aligned crops, as they are and flipped, and their
``.npz`` cache.

Each crop (:class:`~marginface.data.ijb.AlignedIjbImages`: aligned on its five landmarks,
112×112, RGB) is scaled to the model's ``(x / 255 - mean[c]) / std[c]`` (insightface's
``(x / 255 - 0.5) / 0.5`` unless the model's description says otherwise) and embedded as it is
and flipped left-right by the caller's ``embed`` callable (any backbone, any embedding size)
through the one embedder (:func:`~marginface.inference.embedder.embed_batch`), in batches,
decoding and aligning in ``workers`` processes. The embeddings are cached in a ``.npz`` file so
another evaluation (flip, norm score or detector score switched) does not embed again. The
model's whole evaluation is :func:`~marginface.train.evaluation.ijb_evaluation.ijb_results`.
"""

from __future__ import annotations

import hashlib
import os
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from ...data.ijb import AlignedIjbImages, IjbLayout

__all__ = [
    "INSIGHTFACE_MEAN",
    "INSIGHTFACE_STD",
    "Embed",
    "embed_ijb_images",
    "run_embedder",
]

INSIGHTFACE_MEAN = 0.5
INSIGHTFACE_STD = 0.5
"""insightface's pixel normalisation, ``(x / 255 - 0.5) / 0.5``: the default of a model whose
description says nothing else."""


def _numbers(value: float | tuple[float, ...]) -> str:
    """A mean or std as the cache key writes it (``0.5`` or ``0.48,0.45,0.41``, ``repr`` digits)."""
    return ",".join(repr(float(v)) for v in (value if isinstance(value, tuple | list) else [value]))


Embed = Callable[[torch.Tensor], torch.Tensor]
"""``float32[B, 3, 112, 112]`` RGB, normalised (insightface's: in [-1, 1]) → ``[B, D]``."""


def _names_digest(names: list[str], key: str) -> str:
    return hashlib.sha256("\n".join([key, *names]).encode("utf-8")).hexdigest()


def _read_cache(path: Path, digest: str, count: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The embeddings cached in ``path`` when they belong to these images and this model
    (``digest``) and are whole: ``count`` finite rows each. A cache of other images or another
    model is ``None`` silently (it is rewritten); a damaged or foreign file (truncated, not a
    ``.npz``, missing arrays, wrong shapes) is ``None`` with a warning naming it."""
    try:
        with np.load(path, allow_pickle=False) as stored:
            if str(stored["names_digest"]) != digest:
                return None
            embeddings, flipped = stored["embeddings"], stored["flipped"]
    except (OSError, EOFError, KeyError, ValueError, zipfile.BadZipFile) as error:
        reason = f"{type(error).__name__}: {error}".splitlines()[0]
        warnings.warn(f"{path}: damaged embedding cache ({reason}); embedding again", stacklevel=3)
        return None
    whole = (
        embeddings.ndim == 2
        and embeddings.shape[0] == count
        and flipped.shape == embeddings.shape
        and np.isfinite(embeddings).all()
        and np.isfinite(flipped).all()
    )
    if not whole:
        warnings.warn(
            f"{path}: damaged embedding cache (shapes {embeddings.shape} and {flipped.shape} "
            f"for {count} images, or non-finite values); embedding again",
            stacklevel=3,
        )
        return None
    return embeddings, flipped


def embed_ijb_images(
    layout: IjbLayout,
    embed: Embed,
    *,
    batch_size: int = 128,
    workers: int = 0,
    cache: str | os.PathLike[str] | None = None,
    cache_key: str = "",
    progress: Callable[[int, int], None] | None = None,
    alignment: str = "insightface",
    mean: float | tuple[float, ...] = INSIGHTFACE_MEAN,
    std: float | tuple[float, ...] = INSIGHTFACE_STD,
) -> tuple[np.ndarray, np.ndarray]:
    """Embeddings of every image, as it is and flipped: ``(float32[N, D], float32[N, D])``.

    Args:
        layout: :func:`~marginface.data.ijb.read_ijb_layout`.
        embed: the backbone (module docstring); called under ``torch.no_grad``.
        batch_size: images per call (each call also embeds their flips). Default: 128.
        workers: processes reading and aligning images (0: in this process).
        cache: a ``.npz`` file: read when it holds these images' embeddings under the same
            ``cache_key``, else (re)written.
        cache_key: what identifies the model (its weights' fingerprint, an ONNX file's digest).
        progress: called with ``(images done, total)`` after each batch.
        alignment: ``"insightface"`` (eval_ijbc.py's float32 template and estimate: its crops to
            the grey level, :func:`~marginface.data.align.insightface_similarity`) or
            ``"float64"`` (:func:`~marginface.data.align.norm_crop`). Default: insightface.
        mean, std: the model's pixel normalisation, ``(x / 255 - mean[c]) / std[c]`` (one
            number for every channel or one per channel, as
            :class:`~marginface.models.description.ModelDescription` holds them). Default:
            0.5 and 0.5, insightface's ``(x / 255 - 0.5) / 0.5``. Another one is part of the
            cache's key.
    """
    from ..._validation import check_choice
    from ...data.align import ALIGNMENTS

    check_choice("alignment", alignment, ALIGNMENTS)
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if workers < 0:
        raise ValueError(f"workers must be >= 0, got {workers}")
    # features cached before the insightface arithmetic existed were float64 crops: same key;
    # "insightface" crops made before its template became eval_ijbc.py's (70.72990417, not
    # 70.72989655) are not read back: a new key
    suffix = {"float64": "", "insightface": "|align=insightface|template=eval_ijbc"}[alignment]
    if (mean, std) != (INSIGHTFACE_MEAN, INSIGHTFACE_STD):  # insightface's: the keys of old caches
        suffix += f"|mean={_numbers(mean)}|std={_numbers(std)}"
    digest = _names_digest(layout.names, f"{cache_key}{suffix}")
    if cache is not None and Path(cache).is_file():
        cached = _read_cache(Path(cache), digest, len(layout.names))
        if cached is not None:
            return cached
    loader = torch.utils.data.DataLoader(
        AlignedIjbImages(layout, alignment),
        batch_size=batch_size,
        num_workers=workers,
        shuffle=False,
    )
    from ...inference.embedder import embed_batch
    from ...models.description import normalise_pixels

    as_is: list[np.ndarray] = []
    flipped: list[np.ndarray] = []
    done = 0
    with torch.no_grad():
        for batch, problems in loader:
            problem = next((p for p in problems if p), None)
            if problem is not None:
                raise ValueError(problem)
            features, mirrored = embed_batch(  # (B, D) each; the input (B, 3, 112, 112)
                embed,
                batch,
                normalise=lambda pixels: normalise_pixels(pixels, mean, std),
                flip=True,
                device=None,  # embed moves it
            )
            assert mirrored is not None  # flip=True
            as_is.append(features.detach().cpu().numpy())
            flipped.append(mirrored.detach().cpu().numpy())
            done += batch.shape[0]
            if progress is not None:
                progress(done, len(layout.names))
    embeddings, flips = np.concatenate(as_is), np.concatenate(flipped)
    if cache is not None:
        from ..._atomic import atomic_write

        with atomic_write(cache) as stream:
            np.savez(stream, embeddings=embeddings, flipped=flips, names_digest=digest)
    return embeddings, flips


def run_embedder(model: torch.nn.Module, device: torch.device | str) -> Embed:
    """A model as an ``embed`` callable: eval mode, inputs moved to ``device``."""
    model.eval()

    def embed(x: torch.Tensor) -> torch.Tensor:
        return model(x.to(device))

    return embed
