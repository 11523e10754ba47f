"""The one cache of embeddings on disk, and its one key.

An embedding depends on the model's weights, the images, the preprocessing between them, the
precision the model runs in and the flip test; the device, batch size and memory format change
it by float32 rounding only. :class:`EmbeddingKey` names exactly those parts:

- ``weights``: the weights' content (:func:`model_fingerprint`: every tensor of the
  ``state_dict``, :func:`~marginface.inference.fingerprint.weights_fingerprint`; an ONNX
  graph's file bytes), never a file's name or time, so a copy of the weights reuses;
- ``preprocessing``: what is done to the pixels before the model (:func:`preprocessing_of` a
  model description: ``mean``, ``std``, colour order, input size, ``face_crop``; the IJB
  crops' alignment; a training run's dataset transform), JSON values;
- ``precision``: the autocast dtype (``"None"``: none) or the dtype the model runs in;
- ``flip``: whether the mirrored images' features are kept too;
- ``images``: the images' identity (:func:`~marginface.inference.fingerprint.data_fingerprint`
  of an array, :func:`names_fingerprint` of file names).

The file (``.npz``, written atomically) holds ``__key__`` (JSON text: ``format``, the key's
five parts, and ``notes`` that are not part of the key, e.g. the epoch), ``embeddings``
(``float32[N, D]``, ``f(x)``, the model's raw features) and, with ``flip``, ``flipped``
(``float32[N, D]``, ``f(flip_w(x))``): the flip-averaged ``(f(x) + f(flip_w(x))) / 2`` and
the plain ``f(x)`` both come from it (:class:`CachedEmbeddings`), so a file kept with the
flip test also answers a request without it. Reading (:func:`read_embedding_cache`): a file
of another key is None (logged at INFO, naming what differs); a damaged one (not an archive,
missing arrays, other row counts, non-finite values) is None with a warning naming it; the
caller embeds again and rewrites it (:func:`cached_embeddings`).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import warnings
import zipfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from .fingerprint import weights_fingerprint

__all__ = [
    "FORMAT",
    "CachedEmbeddings",
    "EmbeddingKey",
    "cached_embeddings",
    "file_fingerprint",
    "key_differences",
    "model_fingerprint",
    "names_fingerprint",
    "precision_name",
    "preprocessing_of",
    "read_embedding_cache",
    "write_embedding_cache",
]

logger = logging.getLogger(__name__)

FORMAT = "marginface-embeddings/1"
"""The ``format`` written in every file's ``__key__``."""

_KEY = "__key__"
_PARTS = ("weights", "preprocessing", "precision", "flip", "images")


def _numbers(value: Any) -> list[float]:
    values = value if isinstance(value, tuple | list) else [value]
    return [float(v) for v in values]


def _plain(value: Any) -> Any:
    """``value`` as JSON reads it back (tuples as lists), so a key compares equal to itself
    after a round trip."""
    return json.loads(json.dumps(value, sort_keys=True))


@dataclass(frozen=True)
class EmbeddingKey:
    """What a set of kept embeddings depends on (module docstring).

    Attributes:
        weights: the weights' content fingerprint (:func:`model_fingerprint`, or a caller's
            identity such as ``"onnx:<digest>"``).
        preprocessing: JSON-able mapping, the pixels' way to the model
            (:func:`preprocessing_of`). Default: empty.
        precision: the autocast dtype or the model's dtype (:func:`precision_name`).
            Default: ``"None"`` (no autocast, float32).
        flip: the mirrored images' features are kept too. Default: False.
        images: the images' identity. Default: ``""``.
    """

    weights: str
    preprocessing: Mapping[str, Any] = field(default_factory=dict)
    precision: str = "None"
    flip: bool = False
    images: str = ""

    def as_dict(self) -> dict[str, Any]:
        """The five parts as plain JSON values (what the file's ``__key__`` holds)."""
        return {
            "weights": str(self.weights),
            "preprocessing": _plain(dict(self.preprocessing)),
            "precision": str(self.precision),
            "flip": bool(self.flip),
            "images": str(self.images),
        }

    def to_json(self) -> str:
        """:meth:`as_dict` as JSON text (keys sorted)."""
        return json.dumps(self.as_dict(), sort_keys=True)


def key_differences(
    stored: Mapping[str, Any], wanted: EmbeddingKey, *, ignore: Iterable[str] = ()
) -> list[str]:
    """The parts of ``wanted`` that ``stored`` (a key as :meth:`EmbeddingKey.as_dict` wrote
    it) differs in: ``"weights"``, ``"preprocessing.<name>"``, ``"precision"``, ``"flip"``,
    ``"images"``, in that order; ``ignore``: parts not compared. Empty: the same key."""
    expected = wanted.as_dict()
    skipped = set(ignore)
    differ: list[str] = []
    for part in _PARTS:
        if part in skipped:
            continue
        if part == "preprocessing":
            old = stored.get(part) if isinstance(stored.get(part), dict) else {}
            new = expected[part]
            differ += [
                f"preprocessing.{k}" for k in sorted({*old, *new}) if old.get(k) != new.get(k)
            ]
        elif stored.get(part) != expected[part]:
            differ.append(part)
    return differ


def file_fingerprint(path: str | os.PathLike[str]) -> str:
    """The SHA-256 (hex) of a file's bytes
    (:func:`~marginface.data.download.file_digest`, read 1 MiB at a time)."""
    from ..data.download import file_digest

    return file_digest(path)


def model_fingerprint(module: nn.Module) -> str:
    """The weights' identity of an embedding module: :func:`weights_fingerprint` of its
    ``state_dict``, and for a module running an ONNX graph
    (:class:`~marginface.models.pretrained.OnnxBackbone`, wrapped or not) ``"onnx:"`` and the
    :func:`file_fingerprint` of each graph's file as well (its weights are not a
    ``state_dict``).

    Raises:
        TypeError: ``module`` is not an ``nn.Module`` (named).
    """
    fingerprint = weights_fingerprint(module)
    from ..models.pretrained import OnnxBackbone

    graphs = [file_fingerprint(m.path) for m in module.modules() if isinstance(m, OnnxBackbone)]
    if not graphs:
        return fingerprint
    return "onnx:" + ",".join(graphs) + "|" + fingerprint


def names_fingerprint(names: Iterable[str]) -> str:
    """A BLAKE2b digest (hex) of image names or paths in the order given (the rows' order):
    sort them first for a set of files."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update("\n".join(names).encode("utf-8"))
    return digest.hexdigest()


def precision_name(dtype: torch.dtype | None) -> str:
    """``str(dtype)`` (``"torch.bfloat16"``), ``"None"`` for None: the key's ``precision``."""
    return str(dtype)


def preprocessing_of(description: Any) -> dict[str, Any]:
    """The preprocessing a :class:`~marginface.models.description.ModelDescription` says:
    ``{"mean": [...], "std": [...], "colour", "in_channels", "input_size": [H, W],
    "face_crop"}`` (``mean`` and ``std`` as lists of floats, one per channel or one for
    all)."""
    return {
        "mean": _numbers(description.mean),
        "std": _numbers(description.std),
        "colour": str(description.colour),
        "in_channels": int(description.in_channels),
        "input_size": [int(v) for v in description.image_size],
        "face_crop": description.face_crop,
    }


@dataclass(frozen=True, eq=False)
class CachedEmbeddings:
    """Embeddings as the cache keeps them.

    Attributes:
        embeddings: ``float32[N, D]``, ``f(x)`` (raw features, not normalised).
        flipped: ``float32[N, D]``, ``f(flip_w(x))``, or None without the flip test.
    """

    embeddings: np.ndarray
    flipped: np.ndarray | None = None

    def averaged(self) -> np.ndarray:
        """``(f(x) + f(flip_w(x))) / 2`` (float32) with the flipped half, ``f(x)`` without."""
        if self.flipped is None:
            return self.embeddings
        return (self.embeddings + self.flipped) / np.float32(2)


def _whole(embeddings: np.ndarray, flipped: np.ndarray | None, rows: int | None) -> bool:
    """Whether the arrays read are whole: 2-D floats, ``rows`` rows when given, the halves of
    one shape, every value finite."""
    halves = [embeddings] if flipped is None else [embeddings, flipped]
    return (
        embeddings.ndim == 2
        and (rows is None or embeddings.shape[0] == rows)
        and all(h.shape == embeddings.shape and h.dtype.kind == "f" for h in halves)
        and all(bool(np.isfinite(h).all()) for h in halves)
    )


def _damaged(path: Path, reason: str, report: Callable[[str], None] | None) -> None:
    message = f"{path}: damaged embedding cache, cannot be read ({reason}); embedding again"
    if report is not None:
        report(message)
    else:
        warnings.warn(message, stacklevel=3)


def read_embedding_cache(
    path: str | os.PathLike[str],
    key: EmbeddingKey,
    *,
    rows: int | None = None,
    legacy: Callable[[Any], bool] | None = None,
    report: Callable[[str], None] | None = None,
) -> CachedEmbeddings | None:
    """The embeddings kept in ``path`` for ``key``, or None.

    A file kept with ``flip`` answers a request without it (its ``embeddings`` half). None,
    logged at INFO naming the file: no file, or one of another key (what differs is named).
    None with a warning naming the file: a damaged file (unreadable, missing arrays, not
    ``rows`` rows when given, halves of different shapes, non-finite values).

    Args:
        path: the ``.npz`` file.
        key: the key wanted.
        rows: the number of images, when known. Default: None (not checked).
        legacy: for a file without ``__key__`` (written before this format): called with the
            open archive, True when it holds these embeddings (its ``embeddings`` and
            ``flipped`` are then read). Default: None (such a file is of another key).
        report: called with the one line that names a damaged file (e.g. a logger's
            ``warning``). Default: None (``warnings.warn``, a ``UserWarning``).
    """
    path = Path(path)
    if not path.is_file():
        return None
    wanted = key.as_dict()
    try:
        with np.load(path, allow_pickle=False) as stored:
            if _KEY in stored.files:
                saved = json.loads(str(stored[_KEY]))
                if not isinstance(saved, dict):
                    raise ValueError("its key is not a JSON object")
                old_flip = saved.get("flip")
                ignore = ("flip",) if old_flip is True and not key.flip else ()
                differ = key_differences(saved, key, ignore=ignore)
                if differ:
                    logger.info(
                        "%s: kept for another key (%s differ): embedding again",
                        path,
                        ", ".join(differ),
                    )
                    return None
                flip = bool(old_flip)
            elif legacy is not None and legacy(stored):
                flip = True
            else:
                logger.info("%s: embeddings of another key: embedding again", path)
                return None
            embeddings = np.asarray(stored["embeddings"])
            flipped = np.asarray(stored["flipped"]) if flip else None
            whole = _whole(embeddings, flipped, rows)
    except (OSError, EOFError, KeyError, ValueError, TypeError, zipfile.BadZipFile) as error:
        reason = f"{type(error).__name__}: {error}".splitlines()[0]
        _damaged(path, reason, report)
        return None
    if not whole:
        shapes = f"{embeddings.shape}" + ("" if flipped is None else f" and {flipped.shape}")
        count = "" if rows is None else f" for {rows} images"
        _damaged(path, f"shapes {shapes}{count}, or non-finite values", report)
        return None
    logger.info("%s: embeddings reused (%s)", path, wanted["weights"][:12])
    return CachedEmbeddings(
        np.asarray(embeddings, np.float32),
        None if flipped is None or not key.flip else np.asarray(flipped, np.float32),
    )


def write_embedding_cache(
    path: str | os.PathLike[str],
    key: EmbeddingKey,
    cached: CachedEmbeddings,
    *,
    notes: Mapping[str, Any] | None = None,
    extras: Mapping[str, np.ndarray] | None = None,
) -> None:
    """Write ``cached`` under ``key`` to ``path`` (atomically; the folder is created).

    Args:
        path: the ``.npz`` file.
        key: its key; ``key.flip`` must match ``cached.flipped`` being given.
        cached: the embeddings (written float32).
        notes: JSON-able facts kept beside the key, not part of it (the epoch). Default: None.
        extras: more arrays written as they are (an older reader's key). Default: None.

    Raises:
        ValueError: ``key.flip`` without ``cached.flipped``, or the reverse.
        OSError: the file cannot be written.
    """
    from .._atomic import atomic_write_bytes

    if key.flip != (cached.flipped is not None):
        raise ValueError(
            f"key.flip is {key.flip} but flipped is "
            f"{'given' if cached.flipped is not None else None}"
        )
    header = {"format": FORMAT, **key.as_dict(), "notes": _plain(dict(notes or {}))}
    arrays = {"embeddings": np.ascontiguousarray(cached.embeddings, dtype=np.float32)}
    if cached.flipped is not None:
        arrays["flipped"] = np.ascontiguousarray(cached.flipped, dtype=np.float32)
    buffer = io.BytesIO()
    np.savez(
        buffer, **{_KEY: np.asarray(json.dumps(header, sort_keys=True))}, **arrays, **(extras or {})
    )
    atomic_write_bytes(Path(path), buffer.getvalue())


def cached_embeddings(
    path: str | os.PathLike[str] | None,
    key: EmbeddingKey,
    compute: Callable[[], CachedEmbeddings],
    *,
    rows: int | None = None,
    legacy: Callable[[Any], bool] | None = None,
    extras: Mapping[str, np.ndarray] | None = None,
) -> CachedEmbeddings:
    """The embeddings of ``key``: read from ``path`` when it holds them
    (:func:`read_embedding_cache`), else ``compute()``'s (float32), written to ``path``
    (:func:`write_embedding_cache`, ``extras`` beside them). ``path`` None: computed, nothing
    read or written.

    Raises:
        OSError: ``path`` cannot be written.
    """
    if path is not None:
        found = read_embedding_cache(path, key, rows=rows, legacy=legacy)
        if found is not None:
            return found
    computed = compute()
    cached = CachedEmbeddings(
        np.ascontiguousarray(computed.embeddings, dtype=np.float32),
        None
        if computed.flipped is None
        else np.ascontiguousarray(computed.flipped, dtype=np.float32),
    )
    if path is not None:
        write_embedding_cache(path, key, cached, extras=extras)
    return cached
