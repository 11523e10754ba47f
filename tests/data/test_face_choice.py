"""The face-choice rules of select_faces on boxes made by hand: ``subject`` (whole, large and
central; the default) against ``largest`` and ``central``, and subject_scores restated."""

from __future__ import annotations

import numpy as np
import pytest

from marginface.data.face_photos import (
    DEFAULT_FACES,
    FACE_CHOICES,
    select_faces,
    subject_scores,
)
from marginface.detect import Faces


def _faces(*boxes: tuple[float, float, float, float]) -> Faces:
    b = np.asarray(boxes, np.float32).reshape(-1, 4)
    return Faces(b, np.linspace(0.99, 0.9, len(b)).astype(np.float32), np.zeros((len(b), 5, 2)))


def test_the_issue_photo_the_woman_in_the_middle_not_the_man_cut_off():
    """The photo of issue 47: a man cut off at the frame's left edge (box x1 = -54, larger)
    and the woman the photo is of, in the middle."""
    shape = (600, 800, 3)  # H, W
    man = (-54.0, 120.0, 186.0, 420.0)  # 240 x 300, 54 px outside the frame
    woman = (330.0, 160.0, 530.0, 410.0)  # 200 x 250, whole, central
    faces = _faces(man, woman)
    assert select_faces(faces, shape, "largest") == [0]
    assert select_faces(faces, shape, "subject") == [1]
    assert select_faces(faces, shape, "central") == [1]


def test_a_large_whole_face_beats_a_small_one_nearer_the_centre():
    """A bystander's small face just at the centre (the subject leaning aside) loses to the
    subject's face, four times larger and a little off centre: central alone picks wrong."""
    shape = (250, 250, 3)
    subject = (70.0, 60.0, 170.0, 180.0)  # centre (120, 120), 100 x 120
    bystander = (115.0, 115.0, 140.0, 145.0)  # centre (127.5, 130), 25 x 30
    faces = _faces(bystander, subject)
    assert select_faces(faces, shape, "central") == [0]
    assert select_faces(faces, shape, "subject") == [1]


def test_subject_scores_restated():
    shape = (100, 200, 3)  # H = 100, W = 200
    boxes = [(-20.0, 10.0, 20.0, 50.0), (90.0, 30.0, 110.0, 70.0)]
    got = subject_scores(_faces(*boxes), shape)
    # face 0: 40 x 40 box, 20 x 40 inside (x 0..20): inside 0.5, visible side sqrt(800)
    # face 1: 20 x 40, whole: inside 1, side sqrt(800); equal sides: size 1 for both
    half_diagonal = np.hypot(200, 100) / 2
    centre0 = 1 - np.hypot(10 - 100, 30 - 50) / half_diagonal
    centre1 = 1 - np.hypot(100 - 100, 50 - 50) / half_diagonal
    np.testing.assert_allclose(got, [0.5 * centre0, 1.0 * centre1])
    assert got[1] == 1.0


def test_a_face_wholly_outside_scores_zero_and_ties_go_to_the_first():
    shape = (100, 100, 3)
    outside = (-50.0, -50.0, -10.0, -10.0)
    twin = (30.0, 30.0, 70.0, 70.0)
    faces = _faces(outside, twin, twin)
    scores = subject_scores(faces, shape)
    assert scores[0] == 0 and scores[1] == scores[2]
    assert select_faces(faces, shape, "subject") == [1]
    assert select_faces(Faces.empty(), shape, "subject") == []


def test_choices_and_default():
    assert DEFAULT_FACES == "subject" and FACE_CHOICES[0] == "subject"
    faces = _faces((0.0, 0.0, 10.0, 10.0), (20.0, 20.0, 40.0, 40.0))
    assert select_faces(faces, (50, 50, 3), "all") == [0, 1]
    with pytest.raises(ValueError, match="faces"):
        select_faces(faces, (50, 50, 3), "biggest")
