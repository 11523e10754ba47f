"""How ``marginface convert`` framed the images it wrote, and the check that a training set and
its verification sets were framed alike.

``convert`` writes beside each output a small JSON record, ``<stem>.convert.json``
(``train.convert.json`` beside ``train.rec``, ``lfw.convert.json`` beside ``lfw.bin``)::

    {"crop": 150, "image_size": 112, "source": "lfw-deepfunneled.tgz"}

``crop`` is the centred square crop in source pixels before resizing (``null``: the whole
image, centre-cropped to a square). A training set converted without a crop next to a ``.bin``
converted with ``--crop 150`` (``convert --pairs``' default, LFW's face region) shows the model
faces at another scale than the ones it is judged on: :func:`warn_framing` says so when the
``insightface`` dataset is loaded. Files written by other tools (insightface's own ``.rec`` and
``.bin``) have no record and are not compared.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = [
    "FRAMING_SUFFIX",
    "framing_mismatches",
    "framing_path",
    "read_framing",
    "warn_framing",
    "write_framing",
]

logger = logging.getLogger(__name__)

FRAMING_SUFFIX = ".convert.json"
"""The suffix of the framing record beside a converted file (replacing its own suffix)."""


def framing_path(path: str | os.PathLike[str]) -> Path:
    """The framing record of the converted file ``path``: ``OUT/train.rec`` →
    ``OUT/train.convert.json``, ``lfw.bin`` → ``lfw.convert.json``."""
    path = Path(path)
    return path.with_name(path.stem + FRAMING_SUFFIX)


def write_framing(
    path: str | os.PathLike[str],
    *,
    crop: int | None,
    image_size: int,
    source: str,
    detector: str | None = None,
) -> Path:
    """Write the framing record of the converted file ``path`` atomically.

    Args:
        path: the converted file (``train.rec`` or a ``.bin``).
        crop: centred square crop in source pixels before resizing, or None (whole image).
        image_size: side of the stored images in pixels.
        source: where the images came from (a folder or archive), for the reader.
        detector: how faces were detected and aligned (``convert --detector``, e.g. ``"mtcnn,
            largest face, float64 alignment"``), or None (centre crops); recorded only when set.

    Returns:
        The record's path (:func:`framing_path`).
    """
    from .._atomic import atomic_write_text

    record: dict[str, Any] = {"crop": crop, "image_size": image_size, "source": source}
    if detector is not None:
        record["detector"] = detector
    return atomic_write_text(framing_path(path), json.dumps(record, indent=2) + "\n")


def read_framing(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The framing record of the converted file ``path``, or None when there is none (a file
    not written by ``convert``) or it cannot be read (logged at DEBUG: the record is advisory)."""
    record_path = framing_path(path)
    if not record_path.is_file():
        return None
    try:
        record = json.loads(record_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        logger.debug("ignoring unreadable framing record %s: %s", record_path, error)
        return None
    if not isinstance(record, dict) or "crop" not in record:
        logger.debug("ignoring framing record %s without a crop", record_path)
        return None
    return record


def _crop_text(crop: Any, detector: Any = None) -> str:
    if detector is not None:
        return f"--detector ({detector})"
    return "no crop (the whole image)" if crop is None else f"--crop {crop}"


def framing_mismatches(root: str | os.PathLike[str], set_names: Iterable[str]) -> list[str]:
    """One sentence per verification set of ``root`` (``<name>.bin``, ``set_names``) whose
    framing record names another crop than the training set's (``train.rec``); empty when
    they agree or a record is missing."""
    root = Path(root)
    train = read_framing(root / "train.rec")
    if train is None:
        return []
    found = []
    for name in set_names:
        record = read_framing(root / f"{name}.bin")
        framed = (record.get("detector"), record["crop"]) if record is not None else None
        if framed is not None and framed != (train.get("detector"), train["crop"]):
            found.append(
                f"{name}.bin was converted with {_crop_text(record['crop'], framed[0])}, "
                f"train.rec with {_crop_text(train['crop'], train.get('detector'))}"
            )
    return found


def warn_framing(root: str | os.PathLike[str], set_names: Iterable[str]) -> list[str]:
    """Log a warning when the training set and verification sets of ``root`` were framed
    differently (:func:`framing_mismatches`), naming the ``convert`` command that frames them
    alike. Returns the mismatches."""
    found = framing_mismatches(root, set_names)
    if found:
        logger.warning(
            "%s in %s: the faces are framed differently in training and in verification, which "
            "lowers the verification accuracy; convert both with the same crop (marginface "
            "convert SRC %s --crop N for the training folder, or convert --pairs FILE SRC "
            "OUT.bin --crop N, 0 for none)",
            "; ".join(found),
            root,
            root,
        )
    return found
