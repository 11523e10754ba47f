"""MTCNN's weights without facenet-pytorch installed: its three published files fetched once into
marginface's model cache, checked by SHA-256, and found there afterwards.

facenet-pytorch 2.6.0 pins ``torch<2.3``, so it cannot be a dependency of marginface; its three
state dicts (``pnet.pt``, ``rnet.pt``, ``onet.pt``, MIT licence, 28,570 + 403,147 + 1,559,269
bytes) are fetched from its GitHub repository at the 2.6.0 tag (:data:`MTCNN_WEIGHTS_URL`)
by :func:`marginface.models.download.fetch_mtcnn_weights` (over its ``fetch_weights``) into
``<model cache>/mtcnn-facenet-pytorch-2.6.0/`` (``$MARGINFACE_CACHE/models/...``). The SHA-256 of
each (:data:`MTCNN_WEIGHTS_SHA256`) is the one of the files in facenet-pytorch 2.6.0's wheel
(its ``RECORD`` lists the same digests), so a download is accepted only when its bytes are
the published ones.

:func:`locate_mtcnn_weights` is where ``load_detector("mtcnn")`` looks: the installed
facenet-pytorch package first (:func:`~marginface.detect.weights.find_mtcnn_weights`), then the
cache (each file's SHA-256 checked). ``marginface detect --download-weights`` fetches them. This
module reads only files: the face front end never imports the pipeline (``data/``,
``models/``; tests/detect/test_boxes.py), so the cache's place is restated from
:func:`marginface.data.locations.default_cache_dir` (a test holds them equal).
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
        if os.environ.get("MARGINFACE_CACHE"):
            root = Path(os.environ["MARGINFACE_CACHE"]).expanduser()
        else:
            xdg = os.environ.get("XDG_CACHE_HOME")
            root = (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "marginface"
        cache_dir = root / "models"
    return Path(cache_dir).expanduser() / MTCNN_CACHE_NAME


def cached_mtcnn_weights(cache_dir: str | os.PathLike[str] | None = None) -> Path | None:
    """The cache folder when it holds the three files with their published SHA-256, else None
    (a file of other bytes is not used: :func:`fetch_mtcnn_weights` replaces it)."""
    import hashlib

    folder = mtcnn_cache_dir(cache_dir)
    for name in MTCNN_WEIGHT_NAMES:
        path = folder / f"{name}.pt"
        if (
            not path.is_file()
            or hashlib.sha256(path.read_bytes()).hexdigest() != (MTCNN_WEIGHTS_SHA256[name])
        ):
            return None
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
