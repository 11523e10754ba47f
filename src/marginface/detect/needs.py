"""What a photo command needs, checked before it does any work: OpenCV, MTCNN's weights, ONNX
Runtime for an ``.onnx`` detector. Everything missing is said in one line, with the extra to
install (``pip install 'marginface[faces]'``) and how to get MTCNN's weights.

The checks import nothing heavy: a module is looked up with :func:`importlib.util.find_spec`
(found, not run), the weights by their files (:func:`~.weights_cache.locate_mtcnn_weights`).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from .weights import WeightsError

__all__ = ["FACES_EXTRA", "MissingPhotoToolsError", "check_photo_needs", "missing_photo_needs"]

FACES_EXTRA = "pip install 'marginface[faces]'"
"""The extra that brings what the photo commands need (OpenCV, ONNX Runtime, Pillow)."""

_MODULES = {"cv2": "OpenCV (cv2)", "onnxruntime": "ONNX Runtime", "PIL": "Pillow"}


class MissingPhotoToolsError(ImportError):
    """A photo command's needs are missing; the message lists them and how to get them."""


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _detector_kind(detector: object) -> str | None:
    """``"mtcnn"`` (the name), ``"onnx"`` (a ``.onnx`` path), ``"folder"`` (weights given
    by path) or None (a detector object, or none)."""
    if detector is None or hasattr(detector, "detect"):
        return None
    if isinstance(detector, str) and detector.lower() == "mtcnn":
        return "mtcnn"
    if isinstance(detector, (str, os.PathLike)) and Path(detector).suffix.lower() == ".onnx":
        return "onnx"
    return "folder"


def missing_photo_needs(
    detector: object = "mtcnn", *, opencv: bool = True, model: object = None
) -> list[str]:
    """What is missing for a command that detects with ``detector`` (None: no detection),
    with ``opencv`` cuts crops with OpenCV, and runs ``model`` (an ``.onnx`` file needs ONNX
    Runtime; None or another model: nothing); an empty list when nothing is.

    Each item is a short phrase (``"OpenCV (cv2)"``, ``"ONNX Runtime"``, ``"MTCNN's
    weights"``). Pillow is needed to read photos; it is checked too.
    """
    missing = []
    if opencv and not _installed("cv2"):
        missing.append(_MODULES["cv2"])
    if not _installed("PIL"):
        missing.append(_MODULES["PIL"])
    kind = _detector_kind(detector)
    onnx_model = isinstance(model, (str, os.PathLike)) and str(model).lower().endswith(".onnx")
    if (kind == "onnx" or onnx_model) and not _installed("onnxruntime"):
        missing.append(_MODULES["onnxruntime"])
    if kind == "mtcnn":
        from .weights_cache import locate_mtcnn_weights

        try:
            locate_mtcnn_weights()
        except WeightsError:
            missing.append("MTCNN's weights")
    return missing


def check_photo_needs(
    command: str, detector: object = "mtcnn", *, opencv: bool = True, model: object = None
) -> None:
    """Raise :class:`MissingPhotoToolsError` naming everything ``command`` lacks
    (:func:`missing_photo_needs`), in one line: the extra to install, and how to get MTCNN's
    weights when they are missing.

    Args:
        command: the command's name as the user typed it (``"align"``, ``"embed --detector"``).
        detector: ``"mtcnn"``, a ``.onnx`` path, a weights folder, a detector object or None.
        opencv: whether the command cuts crops (OpenCV's ``warpAffine``). Default: True.
        model: the face model the command runs (an ``.onnx`` file needs ONNX Runtime).
            Default: None.
    """
    missing = missing_photo_needs(detector, opencv=opencv, model=model)
    if not missing:
        return
    from .weights_cache import FETCH_HINT

    fixes = [FACES_EXTRA] if any(m != "MTCNN's weights" for m in missing) else []
    if "MTCNN's weights" in missing:
        fixes.append(FETCH_HINT)
    raise MissingPhotoToolsError(
        f"{command} needs {' and '.join(missing)}, not found here: {', then '.join(fixes)}"
    )
