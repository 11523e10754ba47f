"""IJB 1:1 TAR@FAR (insightface's nearest-point rule) and 1:N rank/TPIR
(:mod:`marginface.evaluation.ijb.metrics`) against eval_ijbc.py / ijb_1n.py restated by hand."""

from __future__ import annotations

import numpy as np
import pytest

from marginface.evaluation.ijb import (
    ijb_identification,
    ijb_image_features,
    ijb_verification,
    template_features,
)
from tests.evaluation.ijb._by_hand import (
    hand_1n_insightface,
    hand_1n_open_set,
    hand_tar_at_far,
    random_protocol,
)

cv2 = pytest.importorskip("cv2")
sklearn_metrics = pytest.importorskip("sklearn.metrics")
PIL = pytest.importorskip("PIL.Image")


def test_the_nearest_point_rule_on_ties_and_collinear_points():
    # scores with ties and equal steps (scikit-learn drops the collinear middle points)
    rng = np.random.default_rng(1)
    scores = np.round(rng.standard_normal(4000), 1)
    label = (rng.random(4000) < 0.3).astype(int)
    scores[label == 1] += 1.0
    ours = ijb_verification(scores, label == 1, (1e-3, 3e-3, 0.01, 0.05, 0.1, 0.5))
    expected = hand_tar_at_far(label, scores, (1e-3, 3e-3, 0.01, 0.05, 0.1, 0.5))
    assert ours.tar_at_far == pytest.approx(expected)


def test_1_to_n_equals_the_protocol_restated():
    as_is, flipped, faceness, templates, medias, *_, subject_of_template = random_protocol(2)
    x = ijb_image_features(as_is, flipped, faceness)
    ids, pooled = template_features(x, templates, medias)
    subjects = np.array([subject_of_template[t] for t in ids])
    first = np.array([np.flatnonzero(subjects == s)[0] for s in range(30)])  # gallery rows
    probes = np.setdiff1d(np.arange(ids.shape[0]), first)
    # insightface's rule: gallery of every subject (G1 ∪ G2), every probe mated
    result = ijb_identification(
        pooled[probes], subjects[probes], pooled[first], subjects[first], rule="insightface"
    )
    mask = [int(np.flatnonzero(subjects[first] == s)[0]) for s in subjects[probes]]
    ranks, tpir = hand_1n_insightface(pooled[probes], pooled[first], mask)
    assert result.rank[1] == pytest.approx(ranks[1]) and result.rank[5] == pytest.approx(ranks[5])
    assert result.tpir_at_fpir == pytest.approx(tpir)
    # open set: a gallery of half the subjects (G1), the same probes
    half = first[:15]
    open_set = ijb_identification(pooled[probes], subjects[probes], pooled[half], subjects[half])
    assert (open_set.num_mated, open_set.num_non_mated) == (30, 30)
    for fpir in (0.01, 0.1, 0.3):
        expected = hand_1n_open_set(
            pooled[probes], subjects[probes], pooled[half], subjects[half], fpir
        )
        got = ijb_identification(
            pooled[probes], subjects[probes], pooled[half], subjects[half], fpir_targets=(fpir,)
        )
        assert got.tpir_at_fpir[fpir] == pytest.approx(expected)
