"""From a raw photo to the face crop a model takes: detect, choose one face, cut it the way the
model's description says (:func:`marginface.data.face_crops.cut_face`).

:class:`FaceCutter` is the :data:`~marginface.inference.images.Aligner` that
``FaceModel(..., detector="mtcnn")`` plugs in: photos of another size than the model's input
go through it, aligned crops of the input size do not.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._validation import check_choice, check_int

__all__ = ["FaceCutter"]


class FaceCutter:
    """``cutter(photo) -> crop``: the face of a photo, cut as a model takes it.

    Args:
        detector: ``"mtcnn"`` (facenet-pytorch's weights, :mod:`marginface.detect`), an
            insightface SCRFD ``.onnx`` path, or a detector object with ``detect(images)``
            (:func:`marginface.detect.choice.load_detector`).
        crop: the crop kind, one of :data:`~marginface.data.face_crops.CROP_KINDS`
            (a model description's ``face_crop``). Default: ``"arcface"``.
        size: the crop's side in pixels (the model's input side). Default: 112.
        faces: which face of a photo with several: ``"subject"`` (whole, large and central),
            ``"largest"`` or ``"central"`` (:func:`~marginface.data.face_photos.select_faces`).
            Default: ``"subject"``.
        device: where the detector runs. Default: the CPU.

    Attributes:
        last_box, last_landmarks: ``float32[4]`` and ``float32[5, 2]`` of the face cut by the
            last call (photo pixels), or None before any call.

    Raises:
        ValueError: a bad option (named); the detector cannot be loaded. A call on a photo
            without a face raises ``ValueError`` ("no face found ...").
    """

    def __init__(
        self,
        detector: Any = "mtcnn",
        *,
        crop: str = "arcface",
        size: int = 112,
        faces: str = "subject",
        device: Any = None,
    ) -> None:
        from ..data.face_crops import CROP_KINDS
        from ..detect import load_detector

        self.crop = check_choice("crop", crop, CROP_KINDS)
        self.size = check_int("size", size, minimum=2)
        self.faces = check_choice("faces", faces, ("subject", "largest", "central"))
        self.detector = load_detector(detector, device=device)
        self.last_box: np.ndarray | None = None
        self.last_landmarks: np.ndarray | None = None

    def __call__(self, photo: np.ndarray) -> np.ndarray:
        """The chosen face of ``photo`` (``uint8[H, W, 3]`` RGB) as ``uint8[size, size, 3]``."""
        from ..data.face_crops import cut_face
        from ..data.face_photos import select_faces

        found = self.detector.detect([photo])[0]
        chosen = select_faces(found, photo.shape, self.faces)
        if not chosen:
            height, width = photo.shape[:2]
            raise ValueError(f"no face found in a {width}x{height} photo")
        k = chosen[0]
        self.last_box = np.asarray(found.boxes[k], dtype=np.float32)
        self.last_landmarks = np.asarray(found.landmarks[k], dtype=np.float32)
        return cut_face(photo, found.landmarks[k], found.boxes[k], crop=self.crop, size=self.size)
