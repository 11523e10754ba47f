"""The face front end: detectors that find faces and their five landmarks in photos.

``MTCNN`` (:mod:`.mtcnn`, networks in :mod:`.mtcnn_nets`, weights in :mod:`.weights`) gives,
per image, a :class:`Faces` (``boxes[K, 4]``, ``scores[K]``, ``landmarks[K, 5, 2]``, best score
first); ``SCRFD`` (:mod:`.scrfd`) runs insightface's SCRFD/RetinaFace ONNX files the same
way; :func:`load_detector` picks one by name or file; :mod:`.boxes` holds the shared types
and NMS. The alignment of the landmarks onto the ArcFace template is
:func:`marginface.data.align.norm_crop`.
"""

from .boxes import Faces, nms, square_boxes
from .choice import Detector, DetectorSpec, load_detector
from .mtcnn import MTCNN
from .scrfd import SCRFD
from .weights import WeightsError, find_mtcnn_weights, read_mtcnn_weights

__all__ = [
    "MTCNN",
    "SCRFD",
    "Detector",
    "DetectorSpec",
    "Faces",
    "WeightsError",
    "find_mtcnn_weights",
    "load_detector",
    "nms",
    "read_mtcnn_weights",
    "square_boxes",
]
