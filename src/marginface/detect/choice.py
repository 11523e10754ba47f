"""Choosing a detector by name or file: ``"mtcnn"`` (or a folder/wheel of MTCNN's weights), or an
SCRFD/RetinaFace ``.onnx`` file."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from .boxes import Faces

__all__ = ["Detector", "DetectorSpec", "load_detector"]


class Detector(Protocol):
    """What the front end needs of a detector: ``detect(images) -> list[Faces]``, one per
    ``uint8[H, W, 3]`` RGB image, best score first."""

    def detect(self, images: object) -> list[Faces]:
        """The faces of each image."""
        ...


@dataclass(frozen=True)
class DetectorSpec:
    """One detector and all its options, as every photo command (``detect``, ``align``,
    ``convert --detector``, ``embed``/``gallery``/``search`` on photos) takes them;
    :func:`load_detector` builds it. Picklable, so worker processes can build their own.

    Attributes:
        name: ``"mtcnn"``, a folder or wheel of MTCNN's weights, or an SCRFD/RetinaFace
            ``.onnx`` file. Default: ``"mtcnn"``.
        min_face_size: MTCNN's smallest face, pixels (> 0). Default: 20.
        input_size: the ONNX detector's ``(width, height)`` when the file leaves it open.
            Default: ``(640, 640)``.
        score_threshold: the ONNX detector's face score threshold. Default: 0.5.
        device: where MTCNN runs (``"cpu"``, ``"cuda"``...; None: CPU). Default: None.

    Raises:
        TypeError: ``name`` is not a string or path.
        ValueError: ``min_face_size`` <= 0, or ``input_size`` not two sides >= 1.
    """

    name: str | os.PathLike[str] = "mtcnn"
    min_face_size: float = 20.0
    input_size: tuple[int, int] = (640, 640)
    score_threshold: float = 0.5
    device: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, (str, os.PathLike)):
            raise TypeError(f"name must be 'mtcnn' or a path, got {self.name!r}")
        if not self.min_face_size > 0:
            raise ValueError(f"min_face_size must be > 0, got {self.min_face_size}")
        sides = tuple(self.input_size)
        if len(sides) != 2 or any(int(v) != v or v < 1 for v in sides):
            raise ValueError(f"input_size must be two sides >= 1, got {self.input_size!r}")
        object.__setattr__(self, "input_size", (int(sides[0]), int(sides[1])))


def load_detector(
    spec: str | os.PathLike[str] | Detector | DetectorSpec = "mtcnn",
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
            (:class:`.SCRFD`), an object with a ``detect`` method (returned as is), or a
            :class:`DetectorSpec` (its name and options; the keyword options are then unused).
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
    if isinstance(spec, DetectorSpec):
        return load_detector(
            spec.name,
            device=spec.device,
            min_face_size=spec.min_face_size,
            input_size=spec.input_size,
            score_threshold=spec.score_threshold,
        )
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
