"""The detected face kept with each embedded photo: its box, five landmarks and score, as one
value (:class:`DetectedFace`) and as the arrays and columns the outputs hold.

The rule of every output (``embed``'s ``.npz``/``.parquet``, a gallery's arrays, ``search``'s
results): the face arrays are written when **at least one row** was cut from a photo by a
detector; rows that were not (an aligned crop taken as it is, an image embedded by an earlier
run without detector) are NaN there (``None``/null in JSON and Parquet). An output none of
whose rows was detected has no face arrays at all, byte for byte what it was before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "FACE_ARRAYS",
    "DetectedFace",
    "face_arrays",
    "face_as_dict",
    "faces_from_arrays",
    "has_faces",
]

FACE_ARRAYS = ("boxes", "landmarks", "scores")
"""The arrays' names: ``float32[N, 4]``, ``float32[N, 5, 2]``, ``float32[N]``."""


@dataclass(frozen=True, eq=False)
class DetectedFace:
    """The face a detector found and the crop was cut from, in pixels of the original photo.

    Attributes:
        box: ``float32[4]``, ``(x1, y1, x2, y2)``.
        landmarks: ``float32[5, 2]``, ``(x, y)`` of the eyes, the nose tip, the mouth corners.
        score: the detector's score (a probability in ``[0, 1]`` for MTCNN and SCRFD).
    """

    box: np.ndarray
    landmarks: np.ndarray
    score: float

    def __post_init__(self) -> None:
        box = np.asarray(self.box, dtype=np.float32).reshape(-1)
        landmarks = np.asarray(self.landmarks, dtype=np.float32)
        if box.shape != (4,):
            raise ValueError(f"box must hold 4 numbers (x1, y1, x2, y2), got shape {box.shape}")
        if landmarks.shape != (5, 2):
            raise ValueError(f"landmarks must be (5, 2), got shape {landmarks.shape}")
        object.__setattr__(self, "box", box)
        object.__setattr__(self, "landmarks", landmarks)
        object.__setattr__(self, "score", float(self.score))


def has_faces(faces: Sequence[DetectedFace | None]) -> bool:
    """Whether any row was cut from a detected face (the outputs' rule: then the arrays are
    written)."""
    return any(face is not None for face in faces)


def face_arrays(faces: Sequence[DetectedFace | None]) -> dict[str, np.ndarray]:
    """``{"boxes": float32[N, 4], "landmarks": float32[N, 5, 2], "scores": float32[N]}``, NaN
    in the rows whose face is None."""
    n = len(faces)
    boxes = np.full((n, 4), np.nan, np.float32)
    landmarks = np.full((n, 5, 2), np.nan, np.float32)
    scores = np.full(n, np.nan, np.float32)
    for i, face in enumerate(faces):
        if face is not None:
            boxes[i], landmarks[i], scores[i] = face.box, face.landmarks, face.score
    return {"boxes": boxes, "landmarks": landmarks, "scores": scores}


def faces_from_arrays(
    boxes: Any, landmarks: Any, scores: Any, *, rows: int | None = None
) -> list[DetectedFace | None]:
    """:func:`face_arrays` read back: a :class:`DetectedFace` per row, None where the box is
    NaN.

    Args:
        boxes, landmarks, scores: ``[N, 4]``, ``[N, 5, 2]``, ``[N]``.
        rows: the ``N`` they must have (the file's rows). Default: the boxes'.

    Raises:
        ValueError: shapes that do not match (named).
    """
    boxes = np.asarray(boxes, np.float32)
    landmarks = np.asarray(landmarks, np.float32)
    scores = np.asarray(scores, np.float32)
    n = boxes.shape[0] if rows is None else rows
    for name, array, shape in (
        ("boxes", boxes, (n, 4)),
        ("landmarks", landmarks, (n, 5, 2)),
        ("scores", scores, (n,)),
    ):
        if array.shape != shape:
            raise ValueError(f"{name} must be {shape} for {n} rows, got {array.shape}")
    return [
        None if np.isnan(boxes[i]).any() else DetectedFace(boxes[i], landmarks[i], scores[i])
        for i in range(n)
    ]


def face_as_dict(face: DetectedFace) -> dict[str, Any]:
    """Plain JSON types: ``{"box": [4 floats], "landmarks": [[x, y] x 5], "score"}``."""
    return {
        "box": [float(v) for v in face.box],
        "landmarks": [[float(x), float(y)] for x, y in face.landmarks],
        "score": float(face.score),
    }
