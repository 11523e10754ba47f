"""Image features, template pooling and pair scores (:mod:`marginface.evaluation.ijb.templates`)
against insightface's eval_ijbc.py restated by hand (``_by_hand.py``), on random features."""

from __future__ import annotations

import numpy as np
import pytest

from marginface.evaluation.ijb import (
    IJB_FAR_TARGETS,
    ijb_identification,
    ijb_image_features,
    ijb_verification,
    template_features,
    template_pair_scores,
)
from tests.evaluation.ijb._by_hand import (
    hand_conservative,
    hand_image_features,
    hand_scores,
    hand_tar_at_far,
    hand_templates,
    random_protocol,
)

cv2 = pytest.importorskip("cv2")
sklearn_metrics = pytest.importorskip("sklearn.metrics")
PIL = pytest.importorskip("PIL.Image")


@pytest.mark.parametrize(
    ("flip", "norm", "det"),
    [(True, True, True), (False, True, True), (True, False, True), (True, True, False)],
)
def test_1_to_1_equals_the_protocol_restated(flip, norm, det):
    as_is, flipped, faceness, templates, medias, p1, p2, label, _ = random_protocol()
    x = ijb_image_features(as_is, flipped, faceness, flip=flip, norm_score=norm, detector_score=det)
    ids, pooled = template_features(x, templates, medias)
    scores = template_pair_scores(ids, pooled, p1, p2, block=16)
    hand_x = hand_image_features(
        np.hstack([as_is, flipped]), faceness, flip=flip, norm=norm, det=det
    )
    hand_feats, hand_ids = hand_templates(hand_x, templates, medias)
    expected = hand_scores(hand_feats, hand_ids, p1, p2)
    np.testing.assert_array_equal(ids, hand_ids)
    np.testing.assert_allclose(pooled, hand_feats, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(scores, expected, rtol=1e-12, atol=1e-13)
    single = template_pair_scores(ids, pooled, p1, p2, block=16, precision="float32")
    np.testing.assert_allclose(single, expected, atol=1e-6)
    # the metrics on the hand-made scores (ours and theirs would round differently apart)
    metrics = ijb_verification(expected, label == 1)
    targets = [1e-3, 1e-2, 1e-1]
    assert metrics.tar_at_far == pytest.approx(hand_tar_at_far(label, expected, IJB_FAR_TARGETS))
    conservative = hand_conservative(label, expected, targets)
    for t in targets:
        assert metrics.tar_at_far_conservative[t] == pytest.approx(conservative[t])
    assert metrics.tar_at_far_conservative[1e-6] is None  # 3600-odd impostor pairs
    assert 0.3 < metrics.tar_at_far[1e-2] < 1.0


def test_pooling_in_small_chunks_and_float32(monkeypatch):
    import marginface.evaluation.ijb.templates as ijb

    as_is, flipped, faceness, templates, medias, *_ = random_protocol(3)
    x = ijb_image_features(as_is, flipped, faceness).astype(np.float32)
    monkeypatch.setattr(ijb, "_CHUNK_ROWS", 5)
    ids, pooled = template_features(x, templates, medias)
    hand_feats, hand_ids = hand_templates(x.astype(np.float64), templates, medias)
    np.testing.assert_array_equal(ids, hand_ids)
    np.testing.assert_allclose(pooled, hand_feats, rtol=1e-12, atol=1e-13)


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="flipped must be given"):
        ijb_image_features(np.ones((3, 4)), None, np.ones(3))
    with pytest.raises(ValueError, match="face_scores must have length 3"):
        ijb_image_features(np.ones((3, 4)), np.ones((3, 4)), np.ones(2))
    with pytest.raises(ValueError, match="first names template 7, which has no image"):
        template_pair_scores(np.array([1, 2]), np.eye(2), np.array([7]), np.array([1]))
    with pytest.raises(ValueError, match="each subject once"):
        ijb_identification(np.eye(2), [1, 2], np.eye(2), [1, 1])
    with pytest.raises(ValueError, match="rule must be"):
        ijb_identification(np.eye(2), [1, 2], np.eye(2), [1, 2], rule="nist")
