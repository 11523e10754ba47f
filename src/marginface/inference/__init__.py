"""A trained model in use: the description a weights file carries, :class:`FaceModel`
(images → embeddings, verification at a calibrated threshold), embedding a folder, and the
gallery searched by 1:N identification (docs/inference.md).

Above ``models/`` and ``evaluation/``: it opens models through
:func:`~marginface.models.pretrained.load_described_backbone` and the run reader
(:mod:`marginface.train.state.loaded_run` over :mod:`~marginface.train.state.run_state` and
:mod:`~marginface.train.state.layout`, the only modules of ``train/`` it imports), and never
reaches into the training loop (``tests/test_import_graph.py`` checks both).
"""

from ..models.description import ModelDescription
from .calibration import Calibration, calibrate_threshold, threshold_at_far
from .face_model import FaceModel, Verification
from .source import describe_model, open_model, save_description

__all__ = [
    "Calibration",
    "FaceModel",
    "ModelDescription",
    "Verification",
    "calibrate_threshold",
    "describe_model",
    "open_model",
    "save_description",
    "threshold_at_far",
]
