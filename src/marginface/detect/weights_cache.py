"""MTCNN's weights without facenet-pytorch installed: its three published files fetched once into
marginface's model cache, checked by SHA-256, and found there afterwards.

facenet-pytorch 2.6.0 pins ``torch<2.3``, so it cannot be a dependency of marginface; its three
state dicts (``pnet.pt``, ``rnet.pt``, ``onet.pt``, MIT licence, 28,570 + 403,147 + 1,559,269
bytes) are fetched from its GitHub repository at the 2.6.0 tag (:data:`MTCNN_WEIGHTS_URL`)
by :func:`marginface.models.download.fetch_weights` into
``<model cache>/mtcnn-facenet-pytorch-2.6.0/`` (``$MARGINFACE_CACHE/models/...``). The SHA-256 of
each (:data:`MTCNN_WEIGHTS_SHA256`) is the one of the files in facenet-pytorch 2.6.0's wheel
(its ``RECORD`` lists the same digests), so a download is accepted only when its bytes are
the published ones.

:func:`locate_mtcnn_weights` is where ``load_detector("mtcnn")`` looks: the installed
facenet-pytorch package first (:func:`~marginface.detect.weights.find_mtcnn_weights`), then the
cache (each file's SHA-256 checked). ``marginface detect --download-weights`` fetches them.
"""

from __future__ import annotations

import os
from pathlib import Path

from .weights import MTCNN_WEIGHT_NAMES, WeightsError, find_mtcnn_weights

__all__ = [
    "FETCH_HINT",
    "MTCNN_CACHE_NAME",
    "MTCNN_WEIGHTS_SHA256",
    "MTCNN_WEIGHTS_URL",
    "cached_mtcnn_weights",
    "fetch_mtcnn_weights",
    "locate_mtcnn_weights",
    "mtcnn_cache_dir",
]

MTCNN_WEIGHTS_URL = (
    "https://raw.githubusercontent.com/timesler/facenet-pytorch/v2.6.0/data/{name}.pt"
)
"""Where each file is published (``{name}`` is ``pnet``, ``rnet`` or ``onet``)."""

MTCNN_WEIGHTS_SHA256 = {
    "pnet": "a2a71925e0b9996a42f63e47efc1ca19043e69558b5c523b978d611dfae49c8f",
    "rnet": "bbb937de72efc9ef83b186c49f5f558467a1d7e3453a8ece0d71a886633f6a86",
    "onet": "165bfbe42940416ccfb977545cf0e976d5bf321f67083ae2aaaa5c764280118d",
}
"""SHA-256 of facenet-pytorch 2.6.0's ``facenet_pytorch/data/<name>.pt``."""

MTCNN_CACHE_NAME = "mtcnn-facenet-pytorch-2.6.0"
"""The cache's sub-folder holding the three files."""

FETCH_HINT = (
    "marginface detect --download-weights (facenet-pytorch 2.6.0's files, MIT licence, 2 MB, "
    "into the model cache; or pip install --no-deps facenet-pytorch==2.6.0)"
)
"""How to get the weights, said by every command that needs them and finds none."""


def mtcnn_cache_dir(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """``<cache_dir or the model cache>/mtcnn-facenet-pytorch-2.6.0``
    (:func:`marginface.models.download.default_models_dir`)."""
    if cache_dir is None:
        from ..models.download import default_models_dir

        cache_dir = default_models_dir()
    return Path(cache_dir).expanduser() / MTCNN_CACHE_NAME


def cached_mtcnn_weights(cache_dir: str | os.PathLike[str] | None = None) -> Path | None:
    """The cache folder when it holds the three files with their published SHA-256, else None
    (a file of other bytes is not used: :func:`fetch_mtcnn_weights` replaces it)."""
    from ..data.download import file_digest

    folder = mtcnn_cache_dir(cache_dir)
    for name in MTCNN_WEIGHT_NAMES:
        path = folder / f"{name}.pt"
        if not path.is_file() or file_digest(path) != MTCNN_WEIGHTS_SHA256[name]:
            return None
    return folder


def fetch_mtcnn_weights(
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    url: str | None = None,
    progress: bool = True,
    timeout: float = 30.0,
) -> Path:
    """Download the three files into the cache (those already there with the right SHA-256 are
    kept, no network) and return the folder.

    Args:
        cache_dir: the model cache. Default: :func:`marginface.models.download.default_models_dir`.
        url: the address pattern, ``{name}`` standing for ``pnet``/``rnet``/``onet``.
            Default (None): :data:`MTCNN_WEIGHTS_URL` (a mirror may be given; the bytes are checked
            against :data:`MTCNN_WEIGHTS_SHA256` whatever the address).
        progress: show the download's progress. Default: True.
        timeout: seconds to wait for a connection or any byte. Default: 30.

    Raises:
        ValueError: ``url`` without ``{name}``.
        marginface.data.download.ChecksumError, DownloadError: a file that is not the
            published one, or a failed download (nothing kept; one line naming the URL).
    """
    from ..models.download import fetch_weights

    if url is None:
        url = MTCNN_WEIGHTS_URL
    if not isinstance(url, str) or "{name}" not in url:
        raise ValueError(f"url must hold '{{name}}' (pnet, rnet, onet), got {url!r}")
    folder = mtcnn_cache_dir(cache_dir)
    for name in MTCNN_WEIGHT_NAMES:
        fetch_weights(
            url.format(name=name),
            MTCNN_WEIGHTS_SHA256[name],
            cache_dir=folder,
            filename=f"{name}.pt",
            progress=progress,
            timeout=timeout,
        )
    return folder


def locate_mtcnn_weights(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The folder holding MTCNN's weights: the installed facenet-pytorch's ``data/``, else the
    cache (:func:`cached_mtcnn_weights`).

    Raises:
        WeightsError: neither; the message says how to get them (:data:`FETCH_HINT`).
    """
    try:
        return find_mtcnn_weights()
    except WeightsError:
        pass
    cached = cached_mtcnn_weights(cache_dir)
    if cached is not None:
        return cached
    raise WeightsError(
        f"MTCNN's weights are neither installed nor in {mtcnn_cache_dir(cache_dir)}: get them "
        f"with {FETCH_HINT}"
    )
