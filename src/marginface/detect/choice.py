"""Choosing a detector by name or file: ``"mtcnn"`` (or a folder/wheel of MTCNN's weights), or an
SCRFD/RetinaFace ``.onnx`` file."""

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
    input_size: tuple[int, int] = (640, 640),
    score_threshold: float = 0.5,
) -> Detector:
    """A detector from ``spec``.

    Args:
        spec: ``"mtcnn"`` (MTCNN with facenet-pytorch's weights: the installed package's, else
            those in marginface's cache, :func:`~.weights_cache.locate_mtcnn_weights`), a
            folder or wheel holding MTCNN's weights, an SCRFD/RetinaFace ``.onnx`` file
            (:class:`.SCRFD`), or an object with a ``detect`` method (returned as is).
        device: where MTCNN runs (the ONNX file runs on onnxruntime's CPU provider).
            Default: CPU.
        min_face_size: MTCNN's smallest face, pixels. Default: 20.
        input_size: the ONNX detector's ``(width, height)`` when the file leaves it open.
            Default: ``(640, 640)``.
        score_threshold: the ONNX detector's score threshold. Default: 0.5.

    Raises:
        ValueError: an unknown name or a file that is no detector (named);
            :class:`~.weights.WeightsError` (a ValueError): ``"mtcnn"`` and no weights found
            (the message says how to get them).
    """
    if hasattr(spec, "detect"):
        return spec  # type: ignore[return-value]
    from .mtcnn import MTCNN

    if isinstance(spec, str) and spec.lower() == "mtcnn":
        from .weights_cache import locate_mtcnn_weights

        weights = locate_mtcnn_weights()
        return MTCNN(weights, device=device, min_face_size=min_face_size)  # type: ignore[arg-type]
    if not isinstance(spec, (str, os.PathLike)):
        raise TypeError(f"detector must be 'mtcnn', a path or a detector, got {spec!r}")
    path = Path(spec)
    if path.suffix.lower() == ".onnx":
        from .scrfd import SCRFD

        return SCRFD(path, input_size=input_size, score_threshold=score_threshold)
    if path.suffix.lower() == ".whl" or path.is_dir():
        return MTCNN(path, device=device, min_face_size=min_face_size)  # type: ignore[arg-type]
    raise ValueError(
        f"detector must be 'mtcnn', MTCNN's weights (a folder or facenet-pytorch's wheel) "
        f"or an SCRFD/RetinaFace .onnx file, "
        f"got {str(spec)!r}"
    )
