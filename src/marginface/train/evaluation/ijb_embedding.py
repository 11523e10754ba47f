"""A model's embeddings of IJB-B / IJB-C's aligned crops, as they are and flipped, and their
``.npz`` cache.

Each crop (:class:`~marginface.data.ijb.AlignedIjbImages`: aligned on its five landmarks,
112×112, RGB) is scaled to the model's ``(x / 255 - mean[c]) / std[c]`` (insightface's
``(x / 255 - 0.5) / 0.5`` unless the model's description says otherwise) and embedded as it is
and flipped left-right by the caller's ``embed`` callable (any backbone, any embedding size)
through the one embedder (:func:`~marginface.inference.embedder.embed_batch`), in batches,
decoding and aligning in ``workers`` processes. The embeddings are cached in a ``.npz`` file
(the one embedding cache, :mod:`marginface.inference.embedding_cache`: keyed by the weights'
identity, the crops' alignment and normalisation, the flip test and the images' names) so
another evaluation (flip, norm score or detector score switched) does not embed again; a file
of the cache's earlier format (its ``names_digest`` only) is still read back. The
model's whole evaluation is :func:`~marginface.train.evaluation.ijb_evaluation.ijb_results`.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable

import numpy as np
import torch

from ...data.ijb import AlignedIjbImages, IjbLayout
from ...inference.embedding_cache import (
    CachedEmbeddings,
    EmbeddingKey,
    names_fingerprint,
    read_embedding_cache,
    write_embedding_cache,
)

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


def _ijb_key(
    names: list[str],
    cache_key: str,
    alignment: str,
    mean: float | tuple[float, ...],
    std: float | tuple[float, ...],
) -> EmbeddingKey:
    """The one cache's key of these crops' embeddings
    (:class:`~marginface.inference.embedding_cache.EmbeddingKey`): ``cache_key`` as the
    weights, the crops' alignment and template, 112×112 RGB and the pixels' ``mean``/``std``
    as the preprocessing, no autocast, the flip test, the images' names in their order."""
    preprocessing = {
        "alignment": alignment,
        "template": "eval_ijbc" if alignment == "insightface" else "arcface",
        "colour": "rgb",
        "input_size": [112, 112],
        "mean": [float(v) for v in (mean if isinstance(mean, tuple | list) else [mean])],
        "std": [float(v) for v in (std if isinstance(std, tuple | list) else [std])],
    }
    return EmbeddingKey(cache_key, preprocessing, "None", True, names_fingerprint(names))


def _legacy_digest(
    names: list[str],
    cache_key: str,
    alignment: str,
    mean: float | tuple[float, ...],
    std: float | tuple[float, ...],
) -> str:
    """The ``names_digest`` that files of the cache's earlier format (no ``__key__``) were
    keyed by; kept in the new files too, so both read each other's."""
    # features cached before the insightface arithmetic existed were float64 crops: same key;
    # "insightface" crops made before its template became eval_ijbc.py's (70.72990417, not
    # 70.72989655) are not read back: a new key
    suffix = {"float64": "", "insightface": "|align=insightface|template=eval_ijbc"}[alignment]
    if (mean, std) != (INSIGHTFACE_MEAN, INSIGHTFACE_STD):  # insightface's: the keys of old caches
        suffix += f"|mean={_numbers(mean)}|std={_numbers(std)}"
    return _names_digest(names, f"{cache_key}{suffix}")


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
    key = _ijb_key(layout.names, cache_key, alignment, mean, std)
    digest = _legacy_digest(layout.names, cache_key, alignment, mean, std)
    if cache is not None:
        found = read_embedding_cache(
            cache,
            key,
            rows=len(layout.names),
            legacy=lambda stored: str(stored["names_digest"]) == digest,
        )
        if found is not None and found.flipped is not None:
            return found.embeddings, found.flipped
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
        write_embedding_cache(
            cache,
            key,
            CachedEmbeddings(embeddings, flips),
            extras={"names_digest": np.asarray(digest)},
        )
    return embeddings, flips


def run_embedder(model: torch.nn.Module, device: torch.device | str) -> Embed:
    """A model as an ``embed`` callable: eval mode, inputs moved to ``device``."""
    model.eval()

    def embed(x: torch.Tensor) -> torch.Tensor:
        return model(x.to(device))

    return embed
