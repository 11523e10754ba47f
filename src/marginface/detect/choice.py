"""Choosing a detector by name or file: ``"mtcnn"`` (or a folder/wheel of MTCNN's weights)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol

from .boxes import Faces

__all__ = ["Detector", "load_detector"]


class Detector(Protocol):
    """What the front end needs of a detector: ``detect(images) -> list[Faces]``, one per
    ``uint8[H, W, 3]`` RGB image, best score first."""

    def detect(self, images: object) -> list[Faces]:
        """The faces of each image."""
        ...


def load_detector(
    spec: str | os.PathLike[str] | Detector = "mtcnn",
    *,
    device: object = None,
    min_face_size: float = 20.0,
) -> Detector:
    """A detector from ``spec``.

    Args:
        spec: ``"mtcnn"`` (MTCNN with facenet-pytorch's installed weights), a folder or wheel
            holding MTCNN's weights, or an object with a ``detect`` method (returned as is).
        device: where it runs. Default: CPU.
        min_face_size: MTCNN's smallest face, pixels. Default: 20.

    Raises:
        ValueError: an unknown name or a file that is no detector (named).
    """
    if hasattr(spec, "detect"):
        return spec  # type: ignore[return-value]
    from .mtcnn import MTCNN

    if isinstance(spec, str) and spec.lower() == "mtcnn":
        return MTCNN(device=device, min_face_size=min_face_size)  # type: ignore[arg-type]
    if not isinstance(spec, (str, os.PathLike)):
        raise TypeError(f"detector must be 'mtcnn', a path or a detector, got {spec!r}")
    path = Path(spec)
    if path.suffix.lower() == ".onnx":
        raise ValueError(f"{path}: ONNX face detectors (SCRFD/RetinaFace) are not supported yet")
    if path.suffix.lower() == ".whl" or path.is_dir():
        return MTCNN(path, device=device, min_face_size=min_face_size)  # type: ignore[arg-type]
    raise ValueError(
        f"detector must be 'mtcnn' or MTCNN's weights (a folder or facenet-pytorch's wheel), "
        f"got {str(spec)!r}"
    )
