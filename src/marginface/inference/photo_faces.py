"""From a raw photo to the face crop a model takes: detect, choose one face, cut it the way the
model's description says (:func:`marginface.data.face_crops.cut_face`).

:class:`FaceCutter` is the :data:`~marginface.inference.images.Aligner` that
``FaceModel(..., detector="mtcnn")`` plugs in: photos of another size than the model's input
go through it, aligned crops of the input size do not. :meth:`FaceCutter.cut` gives the crop
with the face it was cut from (box, landmarks, score): nothing is kept on the cutter between
calls, so the decoding threads of ``embed`` share one cutter safely.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .._validation import check_choice, check_int
from .face_rows import DetectedFace

__all__ = ["FaceCut", "FaceCutter"]


@dataclass(frozen=True, eq=False)
class FaceCut:
    """What :meth:`FaceCutter.cut` returns.

    Attributes:
        crop: ``uint8[size, size, 3]``, the face as the model takes it.
        face: the :class:`~marginface.inference.face_rows.DetectedFace` it was cut from
            (box ``float32[4]``, landmarks ``float32[5, 2]``, score; photo pixels).
    """

    crop: np.ndarray
    face: DetectedFace


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

    def __call__(self, photo: np.ndarray) -> np.ndarray:
        """The chosen face of ``photo`` (``uint8[H, W, 3]`` RGB) as ``uint8[size, size, 3]``
        (:meth:`cut`'s crop)."""
        return self.cut(photo).crop

    def cut(self, photo: np.ndarray) -> FaceCut:
        """Detect the faces of ``photo`` (``uint8[H, W, 3]`` RGB), choose one (``faces``) and
        cut it: the crop and the detector's box, landmarks and score of that face, as the
        detector gave them (``float32``, pixels of ``photo``). Keeps nothing between calls.

        Raises:
            ValueError: no face in the photo ("no face found in a WxH photo").
        """
        from ..data.face_crops import cut_face
        from ..data.face_photos import select_faces

        found = self.detector.detect([photo])[0]
        chosen = select_faces(found, photo.shape, self.faces)
        if not chosen:
            height, width = photo.shape[:2]
            raise ValueError(f"no face found in a {width}x{height} photo")
        k = chosen[0]
        face = DetectedFace(found.boxes[k], found.landmarks[k], float(found.scores[k]))
        crop = cut_face(photo, found.landmarks[k], found.boxes[k], crop=self.crop, size=self.size)
        return FaceCut(crop, face)
